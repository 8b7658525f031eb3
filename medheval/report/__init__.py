"""Paper-style tables and reports from ``results.json``."""

"""Benchmark data: the canonical schema, load_benchmark, the unit registry, pinned fetch, images by ID, the credentialed guard."""

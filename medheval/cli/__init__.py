"""The ``medheval`` command and the demo (``medheval.cli:entry_point`` is the console script)."""

from medheval.cli.main import build_parser, entry_point, main

__all__ = ["build_parser", "entry_point", "main"]

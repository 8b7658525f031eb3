"""MedHEval-HF: hallucination evaluation and mitigation for medical vision-language models."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_benchmark", "list_benchmarks"]


def __getattr__(name: str) -> Any:
    """Import the heavy entry points (datasets, transformers) only when first used."""
    if name in ("load_benchmark", "list_benchmarks"):
        from medheval.data import benchmarks

        return getattr(benchmarks, name)
    raise AttributeError(f"module 'medheval' has no attribute {name!r}")

"""Models under test: a local HF image-text-to-text model, a model behind an API (``APIBackend``:
OpenAI-compatible servers such as vLLM, Azure OpenAI, Anthropic), or a predictions file.

``HFBackend`` and the tiny model builder import torch/transformers lazily, so
``from medheval.backends import PredictionsFileBackend`` stays light.
"""

from __future__ import annotations

from medheval.backends.base import Backend, BackendError
from medheval.backends.predictions import PredictionsFileBackend

__all__ = ["APIBackend", "Backend", "BackendError", "PredictionsFileBackend", "HFBackend", "build_tiny", "build_tiny_llava"]


def __getattr__(name: str):
    if name == "APIBackend":
        from medheval.backends.api import APIBackend

        return APIBackend
    if name == "HFBackend":
        from medheval.backends.hf import HFBackend

        return HFBackend
    if name == "build_tiny":
        from medheval.backends.tiny_families import build_tiny

        return build_tiny
    if name == "build_tiny_llava":
        from medheval.backends.tiny import build_tiny_llava

        return build_tiny_llava
    raise AttributeError(f"module 'medheval.backends' has no attribute {name!r}")

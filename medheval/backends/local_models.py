# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""One loader for local transformers models: the HF backend (model under test) and the transformers judge.

:func:`load_local_model` takes a Hub id or a local folder and returns ``(model, preprocessor)``:

* ``kind="image-text-to-text"``: ``AutoModelForImageTextToText`` + ``AutoProcessor``;
* ``kind="causal-lm"``: ``AutoModelForCausalLM`` + ``AutoTokenizer``;
* ``kind="auto"``: image-text-to-text when the config has a ``vision_config``, else causal LM.

The model is loaded first (a bad id or path fails on ``config.json`` before the preprocessor's
several files), in ``dtype``, moved to ``device`` and put in eval mode. A path that looks local
(absolute, ``./``, ``~``, or existing) but is not a folder, and any load failure, raise the caller's
error class with a message naming the model and what to do (the offline hint included).
"""

from __future__ import annotations

import os
from typing import Any

KINDS = ("auto", "image-text-to-text", "causal-lm")


def default_dtype_name(device: str) -> str:
    """``"bfloat16"`` on a CUDA device that supports it, else ``"float32"`` (exact and batch-invariant on CPU)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def _local_path(model_id: str, error: type[Exception], what: str = "model") -> str:
    """``model_id`` with ``~`` expanded when it names a local folder; a local-looking non-folder, or a folder
    without ``config.json``, is an error."""
    looks_local = os.path.isabs(model_id) or model_id.startswith((".", "~")) or os.path.exists(model_id)
    if not looks_local:
        return model_id
    path = os.path.expanduser(model_id)
    if not os.path.isdir(path):
        raise error(
            f"model path {model_id!r} is not a directory; pass a local directory holding config.json, "
            "the weights and the processor/tokenizer files (as written by save_pretrained), or a Hub model id"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise error(
            f"{what} folder {model_id!r} has no config.json, so it is not a model folder; pass the folder "
            "save_pretrained wrote (config.json, the weights, the processor/tokenizer files) — a checkpoint in "
            "LLaVA's original layout needs converting first (docs/models.md)"
        )
    return path


def load_local_model(
    model_id: str | os.PathLike,
    *,
    kind: str = "auto",
    dtype: Any,
    device: str,
    error: type[Exception] = RuntimeError,
    processor: Any = None,
    tokenizer: Any = None,
    what: str = "model",
    **kwargs: Any,
) -> tuple[Any, Any]:
    """``(model, preprocessor)`` from a Hub id or local folder (see the module docstring).

    ``processor`` / ``tokenizer``: already built; the one the loaded kind uses is returned instead of
    loading it. ``what`` names the model in errors (e.g. "judge model"). ``kwargs`` go to every
    ``from_pretrained`` call.
    """
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
    )

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    model_id = _local_path(os.fspath(model_id), error, what)
    try:
        if kind == "auto":
            config = AutoConfig.from_pretrained(model_id, **kwargs)
            kind = "image-text-to-text" if getattr(config, "vision_config", None) is not None else "causal-lm"
        if kind == "image-text-to-text":
            model_class, pre_class, preprocessor = AutoModelForImageTextToText, AutoProcessor, processor
        else:
            model_class, pre_class, preprocessor = AutoModelForCausalLM, AutoTokenizer, tokenizer
        model = model_class.from_pretrained(model_id, dtype=dtype, **kwargs)
        if preprocessor is None:
            preprocessor = pre_class.from_pretrained(model_id, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        from huggingface_hub import constants as hub_constants

        offline = bool(hub_constants.HF_HUB_OFFLINE)
        classes = "AutoModelForImageTextToText/AutoProcessor" if kind == "image-text-to-text" else (
            "AutoModelForCausalLM/AutoTokenizer" if kind == "causal-lm" else "AutoConfig")
        raise error(
            f"could not load {what} {model_id!r} with {classes}: {err}\n"
            "Pass a local directory holding the model and its processor/tokenizer files (save_pretrained "
            f"output), or, for a Hub id, download it once with network access (`hf download {model_id}`) and "
            "then run with HF_HUB_OFFLINE=1 so the local cache is used"
            + (" (HF_HUB_OFFLINE is set: the id must already be in the cache)." if offline else ".")
        ) from err
    model.to(device)
    model.eval()
    return model, preprocessor


__all__ = ["KINDS", "default_dtype_name", "load_local_model"]

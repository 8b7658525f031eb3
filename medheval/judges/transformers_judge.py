"""A local transformers model as judge: nothing leaves the machine, so credentialed data is fine.

A directory (or Hub id already in the local cache) holding either a text model
(``AutoModelForCausalLM`` + ``AutoTokenizer``) or an image-text-to-text model
(``AutoModelForImageTextToText`` + ``AutoProcessor``, chosen when the config has a
``vision_config``) — or such objects already built. Prompts go through the chat template
(a plain ``Role: text`` layout when there is none); generation is batched with left padding,
greedy at temperature 0. Each round of corrective follow-ups is batched too. The model is
loaded on the first request that is not answered from the cache.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from medheval.judges.base import Completion, Judge, JudgeError, JudgeResult, _Item

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _fingerprint_dir(path: str) -> str:
    """Names, sizes and modification times of the model folder's files: a re-trained model at the
    same path gets new cache keys."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            stat = os.stat(full)
            digest.update(f"{name}|{stat.st_size}|{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _fingerprint_model(model: Any) -> str:
    """The config plus the first values of every weight tensor of an in-memory model."""
    import torch

    digest = hashlib.sha256(model.config.to_json_string().encode())
    with torch.no_grad():
        for name, param in model.named_parameters():
            digest.update(name.encode())
            digest.update(param.detach().flatten()[:16].to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _plain_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


class TransformersJudge(Judge):
    """A local (in-process) model as judge.

    Args:
        model: a local directory / cached Hub id, or a ``PreTrainedModel`` already built.
        tokenizer, processor: for a model object (a text model needs a tokenizer, an
            image-text-to-text model a processor); loaded from the path otherwise.
        batch_size: prompts per ``generate`` call.
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        dtype: ``"float32"``/``"bfloat16"``/``"float16"``; default float32 on CPU, bfloat16 on CUDA.
        seed: ``torch.manual_seed`` before each batch (matters only when ``temperature > 0``).
        **options: the :class:`~medheval.judges.base.Judge` options (``concurrency``, retries,
            timeouts and rate limits do not apply to a local model).
    """

    backend = "transformers"

    def __init__(self, model: Any, *, tokenizer: Any = None, processor: Any = None, batch_size: int = 8,
                 device: str | None = None, dtype: str | None = None, seed: int = 0, **options: Any):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        options.pop("base_url", None)
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            name = os.path.abspath(os.path.expanduser(path)) if os.path.exists(os.path.expanduser(path)) else path
            self._model = None
            self._fingerprint = _fingerprint_dir(name) if os.path.isdir(name) else "hub-id"
        else:
            self._model = model
            name = getattr(model.config, "_name_or_path", "") or type(model).__name__
            self._fingerprint = _fingerprint_model(model)
        super().__init__(name, base_url=None, **options)
        self._tokenizer = tokenizer
        self._processor = processor
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self._device = device
        self._dtype_name = _DTYPES.get(str(dtype).lower()) if dtype is not None else None
        if dtype is not None and self._dtype_name is None:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
        self._multimodal: bool | None = None if self._model is None else (processor is not None)

    # -- description -----------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return True

    @property
    def credentialed_allowed(self) -> bool:
        return True

    def describe(self) -> dict:
        out = super().describe()
        out.update({
            "endpoint": "local (in-process)",
            "base_url": None,
            "local": True,
            "structured_output": "json (prompted)",
            "batch_size": self.batch_size,
            "model_fingerprint": self._fingerprint,
            "device": self._device,
            "dtype": self._dtype_name,
        })
        for key in ("max_retries", "timeout", "concurrency", "requests_per_minute"):
            out.pop(key, None)
        if self.temperature > 0:
            out["seed"] = self.seed
        if self._model is not None and getattr(self._model.config, "medheval_random_weights", False):
            out["random_weights"] = True
        return out

    def _identity(self) -> dict:
        return {"backend": self.backend, "model": self.model, "fingerprint": self._fingerprint}

    def _params(self) -> dict:
        params = super()._params()
        if self.temperature > 0:
            params["seed"] = self.seed
        return params

    # -- loading --------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        import torch

        if self._device is None:
            self._device = "cuda" if torch.cuda.is_available() else "cpu"
        if self._model is None:
            self._load()
        else:
            if self._dtype_name:
                self._model.to(getattr(torch, self._dtype_name))
            self._model.to(self._device)
            self._model.eval()
        self._multimodal = self._processor is not None and hasattr(self._processor, "image_processor")
        tokenizer = self._text_tokenizer()
        if tokenizer is None:
            raise JudgeError(f"the transformers judge {self.model!r} needs a tokenizer (or processor) to format prompts")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise JudgeError(f"the tokenizer of {self.model!r} has neither a pad nor an eos token")
            tokenizer.pad_token = tokenizer.eos_token

    def _load(self) -> None:
        """Model + tokenizer/processor from the path (:func:`medheval.backends.local_models.load_local_model`, shared
        with the HF backend): image-text-to-text when the config has a ``vision_config``, else causal LM."""
        import torch

        from medheval.backends.local_models import default_dtype_name, load_local_model

        if self._dtype_name is None:
            self._dtype_name = default_dtype_name(self._device)
        model, preprocessor = load_local_model(
            self.model, kind="auto", dtype=getattr(torch, self._dtype_name), device=self._device, error=JudgeError,
            processor=self._processor, tokenizer=self._tokenizer, what="the judge model")
        self._model = model
        if getattr(model.config, "vision_config", None) is not None:
            self._processor = preprocessor
        else:
            self._tokenizer = preprocessor

    def _text_tokenizer(self):
        if self._processor is not None:
            return getattr(self._processor, "tokenizer", self._processor)
        return self._tokenizer

    # -- generation -------------------------------------------------------------------------
    def _format(self, item: _Item) -> tuple[str, bool]:
        """The prompt text, and whether it came from a chat template (which adds its own BOS)."""
        owner = self._processor if self._multimodal else self._text_tokenizer()
        if getattr(owner, "chat_template", None):
            if self._multimodal:
                messages = []
                for index, message in enumerate(item.messages):
                    parts = [{"type": "image"} for _ in item.images] if index == item.image_index else []
                    messages.append({"role": message["role"],
                                     "content": parts + [{"type": "text", "text": message["content"]}]})
            else:
                messages = item.messages
            return owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), True
        return _plain_prompt(item.messages), False

    def _generate(self, batch: list[_Item]) -> list[Completion]:
        import torch

        tokenizer = self._text_tokenizer()
        formatted = [self._format(item) for item in batch]
        texts = [text for text, _ in formatted]
        templated = formatted[0][1]
        if self._multimodal:
            images = [img.to_pil().convert("RGB") for item in batch for img in item.images]
            kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
            if images:
                kwargs["images"] = images
            inputs = self._processor(**kwargs)
        else:
            inputs = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=not templated)
        inputs = inputs.to(self._device)
        if "pixel_values" in inputs and torch.is_floating_point(inputs["pixel_values"]):
            inputs["pixel_values"] = inputs["pixel_values"].to(self._model.dtype)
        gen_kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens, "pad_token_id": tokenizer.pad_token_id}
        if self.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=self.temperature)
            if self.top_p is not None:
                gen_kwargs["top_p"] = self.top_p
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        torch.manual_seed(self.seed)
        with torch.inference_mode():
            out = self._model.generate(**inputs, **gen_kwargs)
        self._bump(requests=1)
        sequences = out.sequences if hasattr(out, "sequences") else out
        new_tokens = sequences[:, inputs["input_ids"].shape[1]:]
        decoded = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        pad = tokenizer.pad_token_id
        completions = []
        for row, text in enumerate(decoded):
            produced = int((new_tokens[row] != pad).sum()) if pad is not None else int(new_tokens.shape[1])
            note = f"the reply was cut off at max_tokens={self.max_tokens}" if produced >= self.max_tokens else None
            completions.append(Completion(text.strip(), int(prompt_lengths[row]), produced, note))
        self._bump(input_tokens=sum(int(n) for n in prompt_lengths),
                   output_tokens=sum(c.output_tokens for c in completions))
        return completions

    def _execute(self, pending: list[_Item], deliver: Callable[[_Item, JudgeResult], None]) -> None:
        self._ensure_loaded()
        todo = list(pending)
        while todo:
            todo.sort(key=lambda it: sum(len(m["content"]) for m in it.messages))  # less padding per batch
            next_round: list[_Item] = []
            for start in range(0, len(todo), self.batch_size):
                batch = todo[start : start + self.batch_size]
                ready = []
                for item in batch:
                    if item.images and not self._multimodal:
                        deliver(item, self._fail(item, f"the judge model {self.model!r} is text-only but the request "
                                                       f"has {len(item.images)} image(s)"))
                    else:
                        ready.append(item)
                if not ready:
                    continue
                for item in ready:
                    item.attempts += 1
                try:
                    completions = self._generate(ready)
                except (RuntimeError, ValueError, TypeError, IndexError) as err:
                    for item in ready:
                        deliver(item, self._fail(item, f"local generation failed: {type(err).__name__}: {err}"))
                    continue
                for item, completion in zip(ready, completions):
                    result = self._handle_reply(item, completion)
                    if result is None:
                        next_round.append(item)
                    else:
                        deliver(item, result)
            todo = next_round


__all__ = ["TransformersJudge"]

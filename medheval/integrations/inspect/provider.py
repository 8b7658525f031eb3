"""``--model medheval/<hub id or folder>``: a local HF vision-language model as an inspect_ai model, run by
our HF backend (:class:`medheval.backends.hf.HFBackend`), optionally with one of our mitigations.

    inspect eval medheval/cxr_vishal -T allow_credentialed=true --model medheval/llava-hf/llava-1.5-7b-hf \
        -M mitigation=vcd:alpha=1,beta=0.1
    inspect eval medheval/mm_vishal --model medheval//models/my-llava -M batch_size=16 -M device=cuda
    inspect eval medheval/mm_vishal --model medheval/tiny-random-llava   # the demo model, random weights, offline

Model args (``-M``): ``mitigation`` (our spec syntax, ``-M mitigation=vcd:alpha=1,beta=0.1``: inspect splits it
at the commas and the list is joined back; or a YAML mapping, ``-M 'mitigation={name: vcd, alpha: 1, beta: 0.1}'``;
:mod:`medheval.integrations.inspect.model_args`; default none),
``batch_size`` (default 8), ``device`` (``cpu``/``cuda``/``cuda:1``; default CUDA when present), ``dtype``
(``float32``/``bfloat16``/``float16``/``auto``), ``batch_wait`` (seconds a short batch waits for more calls;
default 0.05).

The model input is what ``medheval run`` builds: one user turn of image parts and then text, through the
processor's chat template (:meth:`HFBackend.format_chat`), so a sample whose user message carries a split's
prompt (``build_prompt``) and images gets the prediction ``medheval run`` makes. Images come as inspect
``ContentImage`` (inspect inlines them as data URIs before a provider sees them; a local path also works)
and are decoded to RGB, as our image loader does. Decoding is greedy with ``GenerateConfig.max_tokens``
new tokens (default: the backend's 64); sampling settings, stop sequences, several choices and tools
are refused rather than ignored. No token usage is reported (the backend returns text only).

Batching: inspect calls :meth:`MedHEvalModelAPI.generate` once per sample, concurrently. Calls are queued
and one worker runs them ``batch_size`` at a time (calls that share ``max_tokens``), in a thread so the
event loop keeps collecting; a batch shorter than ``batch_size`` waits until no new call came for
``batch_wait`` seconds. Greedy outputs do not depend on the batch (the backend's left padding,
checked by the tests). inspect's adaptive concurrency starts at 20 parallel calls; for ``batch_size``
above that pass ``--max-connections``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from inspect_ai.model import (
    ChatMessage,
    ChatMessageSystem,
    ChatMessageUser,
    ContentImage,
    ContentText,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo
from PIL import Image

from medheval.data.images import ImageDecodeError, check_pixels, open_image

PROVIDER = "medheval"


class ProviderError(ValueError):
    """The provider cannot serve a request or was configured wrongly: the message says what to change."""


def decode_image(image: str) -> Image.Image:
    """An inspect ``ContentImage.image`` (``data:image/...;base64,...`` or a local path) as an RGB image."""
    if image.startswith("data:"):
        header, _, payload = image.partition(",")
        if not header.endswith(";base64"):
            raise ProviderError(f"image data URI {header[:40]!r}... is not base64; pass a base64 data URI or a path")
        data = base64.b64decode(payload)
    elif "://" in image:
        raise ProviderError(f"image {image[:80]!r}: the {PROVIDER} provider reads data URIs and local files only "
                            "(inspect inlines images before a model sees them; download the image first)")
    else:
        path = Path(image)
        if not path.is_file():
            raise ProviderError(f"image file {image!r} does not exist")
        data = path.read_bytes()
    try:
        opened = open_image(io.BytesIO(data), f"image {image[:80]!r}")
    except ImageDecodeError as err:
        raise ProviderError(str(err)) from None
    with opened:
        try:
            check_pixels(opened, f"image {image[:80]!r}")
        except ImageDecodeError as err:
            raise ProviderError(str(err)) from None
        return opened.convert("RGB")


def chat_request(messages: list[ChatMessage]) -> tuple[dict[str, str], list[Image.Image]]:
    """inspect messages → (``{"system", "user"}`` for :meth:`HFBackend.generate_chat`, the images in order).

    System messages join into the system text; user messages give text and images (several user messages
    are one turn). An assistant or tool message (a multi-turn conversation) is refused."""
    system: list[str] = []
    user: list[str] = []
    images: list[Image.Image] = []
    for message in messages:
        if isinstance(message, ChatMessageSystem):
            system.append(message.text)
        elif isinstance(message, ChatMessageUser):
            parts = [ContentText(text=message.content)] if isinstance(message.content, str) else message.content
            for part in parts:
                if isinstance(part, ContentText):
                    user.append(part.text)
                elif isinstance(part, ContentImage):
                    images.append(decode_image(part.image))
                else:
                    raise ProviderError(f"the {PROVIDER} provider reads text and images; got {part.type!r} content")
        else:
            raise ProviderError(f"the {PROVIDER} provider answers one user turn (as `medheval run` prompts); got a "
                                f"{message.role!r} message: multi-turn conversations and tool calls are not supported")
    if not user:
        raise ProviderError(f"the {PROVIDER} provider got no user text to answer")
    return {"system": "\n".join(system), "user": "\n".join(user)}, images


def greedy_overrides(config: GenerateConfig, default_max_tokens: int) -> dict[str, Any]:
    """The backend's per-call settings for ``config``: greedy, ``max_new_tokens = config.max_tokens``.

    Raises :class:`ProviderError` for a setting that greedy decoding would silently ignore."""
    unsupported = {
        "temperature": config.temperature not in (None, 0, 0.0),
        "top_p": config.top_p not in (None, 1, 1.0),
        "top_k": config.top_k is not None,
        "num_choices": config.num_choices not in (None, 1),
        "stop_seqs": bool(config.stop_seqs),
    }
    given = sorted(name for name, bad in unsupported.items() if bad)
    if given:
        raise ProviderError(f"the {PROVIDER} provider decodes greedily, as `medheval run` does; remove {given} from "
                            "the generate config")
    max_tokens = config.max_tokens if config.max_tokens is not None else default_max_tokens
    if max_tokens < 1:
        raise ProviderError(f"max_tokens must be >= 1, got {max_tokens}")
    return {"max_new_tokens": int(max_tokens)}


@dataclass(eq=False)  # calls are told apart by identity (their images would compare pixel by pixel)
class _Call:
    key: str
    request: dict[str, str]
    images: list[Image.Image]
    overrides: dict[str, Any]
    future: asyncio.Future = field(repr=False)


class CallBatcher:
    """Collects concurrent single calls into batches of at most ``batch_size`` calls sharing their settings
    and runs each batch with ``run(requests, images, overrides)`` in a worker thread, one batch at a time."""

    def __init__(self, run: Callable[[list[dict], list[list[Image.Image]], dict], list[str]], batch_size: int,
                 wait: float) -> None:
        self.run = run
        self.batch_size = batch_size
        self.wait = wait
        self.batches: list[int] = []  # the size of every batch run (for tests and logs)
        self._queue: list[_Call] = []
        self._worker: asyncio.Task | None = None

    async def submit(self, request: dict[str, str], images: list[Image.Image], overrides: dict[str, Any]) -> str:
        loop = asyncio.get_running_loop()
        call = _Call(json.dumps(overrides, sort_keys=True), request, images, overrides, loop.create_future())
        self._queue.append(call)
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._worker = loop.create_task(self._work())
        return await call.future

    async def _work(self) -> None:
        while self._queue:
            waiting = len(self._queue)
            while waiting < self.batch_size:  # let the other concurrent calls of this round arrive
                await asyncio.sleep(self.wait)
                if len(self._queue) == waiting:
                    break
                waiting = len(self._queue)
            key = self._queue[0].key
            batch = [call for call in self._queue if call.key == key][: self.batch_size]
            chosen = {id(call) for call in batch}
            self._queue = [call for call in self._queue if id(call) not in chosen]
            batch = [call for call in batch if not call.future.done()]  # a cancelled sample is not generated
            if not batch:
                continue
            self.batches.append(len(batch))
            try:
                outputs = await asyncio.to_thread(self.run, [c.request for c in batch], [c.images for c in batch],
                                                  batch[0].overrides)
            except Exception as error:  # noqa: BLE001 - every call of the batch gets the error
                for call in batch:
                    if not call.future.done():
                        call.future.set_exception(error)
                continue
            for call, output in zip(batch, outputs):
                if not call.future.done():
                    call.future.set_result(output)


class MedHEvalModelAPI(ModelAPI):
    """An inspect model API over :class:`~medheval.backends.hf.HFBackend` (module docstring)."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig = GenerateConfig(), *, mitigation: str | None = None, batch_size: int = 8,
                 device: str | None = None, dtype: str | None = None, batch_wait: float = 0.05,
                 **model_args: Any) -> None:
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)
        if model_args:
            raise ProviderError(f"unknown model arg(s) {sorted(model_args)} for --model {PROVIDER}/{model_name}; "
                                "known: -M mitigation=SPEC, -M batch_size=N, -M device=cpu|cuda, -M dtype=..., "
                                "-M batch_wait=SECONDS")
        from medheval.backends.hf import HFBackend
        from medheval.integrations.inspect.model_args import resolve_mitigation
        from medheval.run.options import TINY_MODEL

        method = resolve_mitigation(mitigation)  # inspect's list of a comma spec joined back (model_args)
        self.mitigation = method.spec() if method is not None else "none"
        common = {"batch_size": int(batch_size), "device": device, "dtype": dtype,
                  "generate_kwargs": {"custom_generate": method} if method is not None else None}
        if model_name == TINY_MODEL:  # the demo model, built in-process as `medheval run --model` builds it
            from medheval.backends.tiny import build_tiny_llava

            model, processor = build_tiny_llava(seed=0)
            model.name_or_path = TINY_MODEL
            self.backend = HFBackend(model, processor, **common)
            self.backend.name = TINY_MODEL
        else:
            self.backend = HFBackend(model_name, **common)
        self.batcher = CallBatcher(self._run_batch, int(batch_size), float(batch_wait))

    def _run_batch(self, requests: list[dict], images: list[list[Image.Image]], overrides: dict) -> list[str]:
        return self.backend.generate_chat(requests, images, overrides=overrides)

    def max_tokens(self) -> int | None:
        return self.backend.max_new_tokens

    def max_connections(self) -> int:
        return max(self.backend.batch_size, 10)

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> ModelOutput:
        if tools:
            raise ProviderError(f"the {PROVIDER} provider does not call tools; got {[tool.name for tool in tools]}")
        request, images = chat_request(input)
        overrides = greedy_overrides(config, self.backend.max_new_tokens)
        completion = await self.batcher.submit(request, images, overrides)
        output = ModelOutput.from_content(model=self.model_name, content=completion)
        output.metadata = {"mitigation": self.mitigation, **overrides,
                           **({"random_weights": True} if self.backend.settings().get("random_weights") else {})}
        return output


@modelapi(name=PROVIDER)
def medheval_provider() -> type[ModelAPI]:
    """The ``medheval`` provider class (registered lazily: torch loads when a model is made)."""
    return MedHEvalModelAPI


__all__ = ["CallBatcher", "MedHEvalModelAPI", "ProviderError", "chat_request", "decode_image", "greedy_overrides",
           "medheval_provider"]

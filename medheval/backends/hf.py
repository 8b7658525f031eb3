"""A local Hugging Face image-text-to-text model as the model under test.

``HFBackend("llava-hf/llava-1.5-7b-hf")`` (Hub id or local directory) loads the model
with ``AutoModelForImageTextToText`` and its ``AutoProcessor``; ``HFBackend(model,
processor)`` takes objects already built (e.g. :func:`medheval.backends.tiny.build_tiny_llava`).

Families (each covered by a tiny random-weight test, :mod:`medheval.backends.tiny_families`): LLaVA-1.5,
LLaVA-NeXT, Qwen2.5-VL, Qwen3-VL, Gemma 3 / MedGemma, InternVL 3/3.5 (HF format), Idefics3 and
SmolVLM. The prompt is the processor's chat template over one user turn (image parts, then the
text); the processor expands each image marker into the family's image tokens and returns the extra tensors it needs
(``image_grid_thw``, ``token_type_ids``, ``pixel_attention_mask``, ``image_sizes``), all passed to
``generate``. Images go to the processor as one list per prompt (several per record are fine).

Generation is batched with left padding, greedy unless ``do_sample=True``, and decodes
only the new tokens. Outputs do not depend on ``batch_size``: the attention mask
and the position ids generated from it make a left-padded row compute what it would
compute alone (checked by the tests on a tiny LLaVA), and a sampled row draws from its own
generator seeded from ``(seed, record id)`` through medheval's decoding loop (:func:`row_sampling`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence

import torch

from medheval.backends.base import BackendError
from medheval.decoding.compiled import compiled_decoding, wanted
from medheval.decoding.loop import DecodingMethod
from medheval.run.prompts import PROMPT_VERSION, build_prompt

AUTO = "auto"
AUTO_CHUNK = 64  # records per runner batch with batch_size="auto" (the backend splits them to fit)
AUTO_MAX = 256


def _free_memory(device: str) -> int:
    """Free bytes on ``device``: CUDA's free memory, else the system's available memory."""
    if str(device).startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        # float32 on CPU (exact, batch-invariant); bfloat16 on GPUs that support it.
        if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise BackendError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'") from None


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_device(device: str) -> None:
    """``--device cuda`` (``cuda:N``) must name a CUDA device torch can see: a one-line error, not a traceback."""
    if not str(device).startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise BackendError(f"--device {device}: torch sees no CUDA device (torch {torch.__version__}, CUDA build "
                           f"{torch.version.cuda or 'none'}); pass --device cpu, or leave --device out to use CUDA "
                           f"only when it is available")
    _, _, index = str(device).partition(":")
    if index.isdigit() and int(index) >= torch.cuda.device_count():
        raise BackendError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible "
                           f"(cuda:0 … cuda:{torch.cuda.device_count() - 1}; CUDA_VISIBLE_DEVICES may hide others)")


def _jsonable(value: Any) -> Any:
    """Settings values as JSON: plain values kept, anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return repr(value)


def load_model_and_processor(model_id: str | os.PathLike, *, dtype: torch.dtype, device: str, **kwargs):
    """``AutoModelForImageTextToText`` + ``AutoProcessor`` from a Hub id or local directory
    (:func:`medheval.backends.local_models.load_local_model`, shared with the transformers judge).

    Raises :class:`BackendError` naming ``model_id`` when it cannot be loaded (offline,
    wrong path, not an image-text-to-text model).
    """
    from medheval.backends.local_models import load_local_model

    return load_local_model(model_id, kind="image-text-to-text", dtype=dtype, device=device, error=BackendError,
                            **kwargs)


def draws_per_row(custom_generate: Any) -> bool:
    """Whether sampling with this ``custom_generate`` goes through our decoding loop, one generator per row
    (:func:`row_sampling`): none given (the plain loop), a mitigation, or a Hub folder of ours."""
    from medheval.decoding.loop import DecodingMethod

    return custom_generate is None or isinstance(custom_generate, (DecodingMethod, str))


def row_sampling(custom_generate: Any, seed: int | Sequence[int], keys: list[str]) -> dict[str, Any]:
    """``generate`` arguments that make each row sample from its own generator, seeded from ``(seed, key)``
    (:mod:`medheval.decoding.sampling`; ``seed``: one for every row, or one per row): our decoding loop (a
    mitigation's, or the plain :class:`~medheval.decoding.loop.DecodingMethod`) with a
    :class:`~medheval.decoding.sampling.RowSampler`. A ``custom_generate`` of another kind (a callable not built
    on the loop) keeps the global torch RNG."""
    from medheval.decoding.loop import DecodingMethod
    from medheval.decoding.sampling import RowSampler, row_seed

    if not draws_per_row(custom_generate):
        return {}
    seeds = [int(seed)] * len(keys) if isinstance(seed, int) else [int(s) for s in seed]
    if len(seeds) != len(keys):
        raise BackendError(f"{len(seeds)} seeds for {len(keys)} rows; give one seed, or one per row")
    sampler = RowSampler([row_seed(s, str(key)) for s, key in zip(seeds, keys)])
    return {"custom_generate": custom_generate if custom_generate is not None else DecodingMethod(), "sampler": sampler}


class HFBackend:
    """A transformers image-text-to-text model (LLaVA, Qwen2-VL, ...), batched and greedy by default.

    Args:
        model: Hub id or local directory (loaded with ``AutoModelForImageTextToText`` and
            ``AutoProcessor``), or an already-built ``PreTrainedModel``.
        processor: the processor for an already-built model (loaded from the model's
            ``name_or_path`` when omitted and that is a local directory).
        batch_size: records per ``model.generate`` call, or ``"auto"``: the largest batch expected to fit the
            device's free memory, per method and generation settings (:meth:`estimate_batch_size`), halved and
            retried on out-of-memory (the runner then hands over :data:`AUTO_CHUNK` records at a time).
        max_new_tokens, do_sample, temperature, top_p: generation settings; temperature
            and top_p only apply when sampling.
        seed: sampling seed: each record samples from its own generator seeded from ``(seed, record id)``
            (:mod:`medheval.decoding.sampling`), so a sampled answer repeats and does not depend on the batch
            (also ``torch.manual_seed(seed)`` before every batch, for anything else random).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default: CUDA when available.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``; default float32 on
            CPU, bfloat16 on GPU. An already-built model is converted only when given.
        generate_kwargs: extra ``model.generate`` keyword arguments (e.g. ``custom_generate``
            of a mitigation); they override the settings above.
        name: model id to record; default: the string given, or the model's ``name_or_path``.
        progress: show a tqdm bar over batches.
        prefix_cache: encode the shared prompt prefix of records with identical images once and
            reuse its KV cache (:mod:`medheval.backends.prefix_cache`; same greedy answers, faster
            when many prompts share images, e.g. Med-StepBench statements of one study).
        chat_template: ``None``/``"model"`` (the processor's chat template), or an upstream LLaVA
            conversation by name: ``vicuna_v1``, ``llava_v1``, ``mistral_instruct``
            (:mod:`medheval.backends.conversation`).
        instruction: record -> text (default :func:`medheval.run.prompts.build_prompt`; a paper protocol's
            own, :mod:`medheval.run.paper_protocols`).
        compile: decode steps on a static cache through ``torch.compile`` (CUDA graphs on CUDA),
            plain decoding and every mitigation alike (:mod:`medheval.decoding.compiled`): ``None`` (default)
            on CUDA only, ``True`` everywhere, ``False`` never (``medheval run --no-compile``). Recorded in
            :meth:`settings` as ``"compile": true`` when on.
    """

    needs_images = True

    def __init__(
        self,
        model: Any,
        processor: Any = None,
        *,
        batch_size: int | str = 8,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        generate_kwargs: dict | None = None,
        name: str | None = None,
        progress: bool = False,
        prefix_cache: bool = False,
        chat_template: str | None = None,
        instruction: Any = None,
        compile: bool | None = None,
    ):
        self.auto_batch = batch_size == AUTO
        if self.auto_batch:
            batch_size = AUTO_CHUNK
        if not isinstance(batch_size, int) or batch_size < 1:
            raise BackendError(f"batch_size must be an integer >= 1 or 'auto', got {batch_size!r}")
        if max_new_tokens < 1:
            raise BackendError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.device = device or _default_device()
        _check_device(self.device)
        if isinstance(model, (str, os.PathLike)):
            torch_dtype = _resolve_dtype(dtype, self.device)
            loaded_model, loaded_processor = load_model_and_processor(model, dtype=torch_dtype, device=self.device)
            self.name = name or os.fspath(model)
            self._source: str | None = os.fspath(model)
            self.model = loaded_model
            self.processor = processor if processor is not None else loaded_processor
            if getattr(self.processor, "image_processor", None) is None:
                raise BackendError(
                    f"AutoProcessor loaded only a {type(self.processor).__name__} for {self.name!r}, no image "
                    "processor: the folder's processor_config.json names a processor class this transformers cannot "
                    "build (a custom class, or one whose video part needs torchvision); install what it needs or "
                    "pass processor=...")
        else:
            self.model = model
            if dtype is not None:
                self.model.to(_resolve_dtype(dtype, self.device))
            self.model.to(self.device)
            self.model.eval()
            if processor is None:
                source = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
                if not source or not os.path.isdir(source):
                    raise BackendError(
                        "HFBackend got a model object without a processor: pass processor=... "
                        "(the model's name_or_path is not a local directory to load one from)"
                    )
                from transformers import AutoProcessor

                processor = AutoProcessor.from_pretrained(source)
            self.processor = processor
            self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
            self._source = getattr(model.config, "_name_or_path", "") or None
        self.batch_size = int(batch_size)
        self.max_new_tokens = int(max_new_tokens)
        self.do_sample = bool(do_sample)
        self.temperature = temperature
        self.top_p = top_p
        self.seed = int(seed)
        self.generate_kwargs = dict(generate_kwargs or {})
        self.progress = progress
        self.prefix_cache = bool(prefix_cache)
        self._prefix_cache = None
        from medheval.backends.conversation import check_template_name

        self.conversation = None if check_template_name(chat_template) in (None, "model") else chat_template
        self.instruction = instruction or build_prompt
        self.compile = compile
        # LLaVA-Med-1.5's grey canvas for grayscale images (medheval.backends.grey_padding); a paper protocol
        # turns it on (medheval.run.paper_protocols.configure_backend)
        self.grey_padding = False
        # LLaVA's tokenizer_image_token: each piece around an image marker tokenized alone
        # (medheval.backends.llava_tokens); a paper protocol turns it on for LLaVA-family models
        self.upstream_tokens = False
        self._auto_sizes: dict[str, int] = {}  # per method and settings: the largest batch that ran
        self._auto_used: list[int] = []  # batch sizes used since take_auto_batch_size()

        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            if self.tokenizer.eos_token is None:
                raise BackendError(
                    f"the tokenizer of {self.name!r} has neither a pad nor an eos token; batched generation "
                    "needs one (set processor.tokenizer.pad_token)"
                )
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._use_chat_template = bool(getattr(self.processor, "chat_template", None))
        # Templates that write the BOS themselves (Gemma 3, Idefics3) must not get a second one from the tokenizer.
        bos_id = self.tokenizer.bos_token_id
        self._tokenizer_adds_bos = bos_id is not None and bos_id in self.tokenizer("a")["input_ids"]
        self._image_token = (
            getattr(self.processor, "image_token", None)
            or getattr(self.tokenizer, "image_token", None)
            or "<image>"
        )

    # -- prompts ----------------------------------------------------------------------
    def format_prompt(self, record: dict, num_images: int) -> str:
        """The full model input text for a record: the conversation template (the processor's chat template,
        a named upstream one, or the LLaVA-1.5 fallback) around ``self.instruction(record)``
        (:func:`medheval.run.prompts.build_prompt` by default)."""
        prompt = self.instruction(record)
        if self.conversation is not None:  # an upstream LLaVA conversation: "<image>\n" per image, then the text
            from medheval.backends.conversation import conversation_template

            return conversation_template(self.conversation).render(f"{self._image_token}\n" * num_images + prompt)
        if self._use_chat_template:
            content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": prompt}]
            messages = [{"role": "user", "content": content}]
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        images = f"{self._image_token}\n" * num_images
        return f"USER: {images}{prompt} ASSISTANT:"

    # -- generation -------------------------------------------------------------------
    def _generation_kwargs(self) -> dict:
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if self.do_sample:
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.top_p is not None:
                kwargs["top_p"] = self.top_p
        else:  # greedy: neutralise sampling knobs a checkpoint's generation_config may carry
            kwargs.update(temperature=None, top_p=None, top_k=None)
        kwargs.update(self.generate_kwargs)
        return kwargs

    def _generate_batch(self, records: list[dict], images: list[list], overrides: dict | None = None) -> list[str]:
        texts = [self.format_prompt(r, len(imgs)) for r, imgs in zip(records, images)]
        questions = [self.instruction(r) for r in records]
        return self._generate_texts(texts, images, records, overrides=overrides, questions=questions)

    def format_chat(self, system: str, user: str, assistant_prefix: str, num_images: int, text_first: bool = False,
                    enable_thinking: bool | None = None) -> str:
        """The model input for a system + user turn whose reply starts with ``assistant_prefix``
        (the model continues that text; a protocol's given stages, e.g. ClinHallu Rep-V). ``text_first``: the
        text part before the image parts (ClinHallu's order); ``enable_thinking`` goes to the chat template
        (templates that read it, e.g. Qwen3)."""
        markers = f"{self._image_token}\n" * num_images
        body = f"{user}\n{markers}".rstrip("\n") if text_first and num_images else f"{markers}{user}"
        if self.conversation is not None:  # a named upstream conversation, its system text replaced by ``system``
            import dataclasses

            from medheval.backends.conversation import conversation_template

            template = conversation_template(self.conversation)
            template = dataclasses.replace(template, system=system) if system else template
            text = template.render(body)
        elif self._use_chat_template:
            parts = [{"type": "image"} for _ in range(num_images)]
            content = [{"type": "text", "text": user}] + parts if text_first else parts + [{"type": "text", "text": user}]
            # content as parts: multimodal templates (llava-hf, Idefics3) drop a plain-string system message
            messages = ([{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []) + [
                {"role": "user", "content": content}]
            kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        else:
            text = f"{system}\n\nUSER: {body} ASSISTANT:" if system else f"USER: {body} ASSISTANT:"
        if not assistant_prefix:
            return text
        # "ASSISTANT: prefix", but "<|im_start|>assistant\nprefix" after a turn header that ends with a newline
        return f"{text}{assistant_prefix}" if text[-1:].isspace() else f"{text} {assistant_prefix}"

    @property
    def per_request_seed(self) -> bool:
        """Whether :meth:`generate_chat` samples each request from its own generator, seeded by the request's
        ``"seed"`` and id, so a reply does not depend on the requests beside it (ClinHallu then batches its
        sampled traces): true when sampling goes through our decoding loop (:func:`draws_per_row`)."""
        return draws_per_row(self.generate_kwargs.get("custom_generate"))

    def generate_chat(self, requests: list[dict], images: list[list] | None = None, *, seed: int | None = None,
                      overrides: dict | None = None) -> list[str]:
        """One reply per request (``{"id", "system", "user", "assistant_prefix"}``, optionally ``"seed"``),
        batched like :meth:`generate`; the reply excludes the prefix. ``seed`` replaces the backend's seed and
        ``overrides`` the generation settings (e.g. sampling at temperature 0.7) for this call; a sampled request
        with its own ``"seed"`` draws from the generator of (its seed, its id), the one a call with that seed
        alone would use (:attr:`per_request_seed`)."""
        images = images if images is not None else [[] for _ in requests]
        if len(images) != len(requests):
            raise BackendError(f"got {len(requests)} requests but {len(images)} image lists; pass one list per request")
        call_seed = self.seed if seed is None else seed

        def replies(chunk: list[dict], chunk_images: list[list], overrides: dict | None) -> list[str]:
            texts = [self._chat_text(request, len(imgs)) for request, imgs in zip(chunk, chunk_images)]
            row_seeds = [r["seed"] if r.get("seed") is not None else call_seed for r in chunk]
            return self._generate_texts(texts, chunk_images, chunk, seed, overrides, row_seeds=row_seeds,
                                        questions=[str(r["user"]) for r in chunk])

        if self.auto_batch and requests:  # the same estimate and out-of-memory back-off as generate()
            first = self._chat_text(requests[0], len(images[0]))
            return self._generate_auto(requests, images, overrides, run_batch=replies, first_text=first)
        outputs: list[str] = []
        for start in range(0, len(requests), self.batch_size):
            end = start + self.batch_size
            outputs.extend(replies(requests[start:end], [list(x) for x in images[start:end]], overrides))
        return outputs

    def _chat_text(self, request: dict, num_images: int) -> str:
        return self.format_chat(request.get("system", ""), request["user"], request.get("assistant_prefix", ""),
                                num_images, bool(request.get("text_first")), request.get("enable_thinking"))

    def pads_grayscale(self) -> bool:
        """Whether grayscale images go to the processor on LLaVA-Med-1.5's grey canvas: :attr:`grey_padding` is on
        and the processor pads to a square (:func:`medheval.backends.grey_padding.square_padding_mean`)."""
        from medheval.backends.grey_padding import square_padding_mean

        return self.grey_padding and square_padding_mean(self.processor) is not None

    def model_images(self, images: list) -> list:
        """``images`` (one record's) as the processor gets them: grayscale ones on their grey canvas when
        :meth:`pads_grayscale`, else unchanged."""
        from medheval.backends.grey_padding import pad_grayscale, square_padding_mean

        mean = square_padding_mean(self.processor) if self.grey_padding else None
        return list(images) if mean is None else [pad_grayscale(image, mean) for image in images]

    def upstream_inputs(self, inputs: Any, texts: Sequence[str]) -> Any:
        """The processor's batch ``inputs`` with ``input_ids`` / ``attention_mask`` rebuilt by LLaVA's chunked
        rule (:func:`medheval.backends.llava_tokens.chunked_inputs`) when :attr:`upstream_tokens` is on, each
        image keeping the number of image tokens the processor gave it; else ``inputs`` unchanged."""
        if not self.upstream_tokens:
            return inputs
        from medheval.backends.llava_tokens import ChunkedTokensError, chunked_inputs

        image_id = self.tokenizer.convert_tokens_to_ids(self._image_token)
        bos = self.tokenizer.bos_token
        if self._tokenizer_adds_bos and bos:  # a template that writes BOS itself: the tokenizer adds it, once
            texts = [text[len(bos):] if text.startswith(bos) else text for text in texts]
        try:
            return chunked_inputs(inputs, texts, self.tokenizer, self._image_token, image_id,
                                  self.tokenizer.pad_token_id)
        except ChunkedTokensError as err:
            raise BackendError(f"upstream chunked tokenization of {self.name!r}: {err}") from err

    def _generate_texts(self, texts: list[str], images: list[list], records: list[dict], seed: int | None = None,
                        overrides: dict | None = None, row_seeds: list[int] | None = None,
                        questions: list[str] | None = None) -> list[str]:
        """The replies to the rendered ``texts``; ``questions``: each row's user text before the template (what a
        method's :meth:`~medheval.decoding.loop.DecodingMethod.question_inputs` reads, e.g. PAI's raw question)."""
        proc_kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
        if any(images):  # one list per prompt: Gemma 3 and Idefics3 need the nesting, the others accept it
            proc_kwargs["images"] = [self.model_images(imgs) for imgs in images]
        bos = self.tokenizer.bos_token
        if self._tokenizer_adds_bos and bos and all(text.startswith(bos) for text in texts):
            proc_kwargs["add_special_tokens"] = False
        try:
            inputs = self.processor(**proc_kwargs)
        except Exception as err:  # noqa: BLE001 - name the records, keep the cause
            ids = [r.get("id") for r in records]
            raise BackendError(f"processor failed on records {ids}: {err}") from err
        inputs = self.upstream_inputs(inputs, texts).to(self.device)
        if "pixel_values" in inputs and torch.is_floating_point(inputs["pixel_values"]):
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        seed = self.seed if seed is None else seed
        torch.manual_seed(seed)
        settings = {**self._generation_kwargs(), **(overrides or {})}
        if settings.get("do_sample"):
            keys = [r.get("id") if r.get("id") is not None else text for r, text in zip(records, texts)]
            settings.update(row_sampling(settings.get("custom_generate"), seed if row_seeds is None else row_seeds,
                                         keys))
        kwargs = self._compiled_kwargs(settings)
        kwargs.update(self._method_inputs(kwargs.get("custom_generate"), questions))
        with torch.inference_mode(), compiled_decoding(self.compile):
            out = self.model.generate(**inputs, **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        new_tokens = sequences[:, inputs["input_ids"].shape[1] :]
        decoded = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [text.strip() for text in decoded]

    def _method_inputs(self, method: Any, questions: list[str] | None) -> dict[str, Any]:
        """``{"method_inputs": ...}`` when ``method`` builds inputs from the question texts (else ``{}``)."""
        build = getattr(method, "question_inputs", None)
        if not callable(build) or questions is None:  # a method that needs them then says so when it runs
            return {}
        extra = build(self.tokenizer, list(questions))
        return {"method_inputs": extra} if extra else {}

    def compiles(self) -> bool:
        """Whether decode steps run compiled on a static cache (``compile=None``: on CUDA only)."""
        with compiled_decoding(self.compile):
            return wanted(self.model)

    def _compiled_kwargs(self, kwargs: dict) -> dict:
        """Plain greedy/sampling goes through medheval's decoding loop when decode steps are compiled
        (``generate``'s own loop does not compile them); beam search stays with ``generate``."""
        if ("custom_generate" in kwargs or (kwargs.get("num_beams") or 1) > 1
                or (kwargs.get("num_return_sequences") or 1) > 1 or not self.compiles()):
            return kwargs
        return {**kwargs, "custom_generate": DecodingMethod()}

    def generate(self, records: list[dict], images: list[list] | None = None, *,
                 overrides: dict | None = None) -> list[str]:
        """One output per record, in order; ``images[i]`` are the PIL images of ``records[i]``.
        ``overrides`` replaces generation settings for this call (e.g. ``{"max_new_tokens": 512}`` for
        reports: :mod:`medheval.run.generation`)."""
        if images is None:
            images = [[] for _ in records]
        if len(images) != len(records):
            raise BackendError(f"got {len(records)} records but {len(images)} image lists; pass one list per record")
        sampling = {**self._generation_kwargs(), **(overrides or {})}.get("do_sample")
        if self.prefix_cache and not sampling:  # sampled rows need the decoding loop's per-row generators
            from medheval.backends.prefix_cache import PrefixCache

            if self._prefix_cache is None or self._prefix_cache.backend is not self:  # copies (run_grid) get their own
                self._prefix_cache = PrefixCache(self)
            return self._prefix_cache.generate(records, [list(x) for x in images], overrides=overrides)
        if self.auto_batch:
            return self._generate_auto(records, images, overrides)
        starts = range(0, len(records), self.batch_size)
        if self.progress and len(records) > self.batch_size:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=f"generate ({self.name})", unit="batch")
        outputs: list[str] = []
        for start in starts:
            end = start + self.batch_size
            outputs.extend(self._generate_batch(records[start:end], [list(x) for x in images[start:end]], overrides))
        return outputs

    # -- --batch-size auto -------------------------------------------------------------
    def _auto_key(self, overrides: dict | None, kind: str = "records") -> str:
        """What a learnt batch size is kept under: the method, the settings, and the kind of prompt (records, or
        chat requests, whose prompts are longer)."""
        method = self.generate_kwargs.get("custom_generate")
        spec = method.spec() if hasattr(method, "spec") else str(method or "none")
        return json.dumps([spec, _jsonable(overrides or {}), kind], sort_keys=True, default=str)

    def estimate_batch_size(self, records: list[dict], images: list[list], overrides: dict | None = None,
                            first_text: str | None = None) -> int:
        """The largest batch expected to fit in the device's free memory (at most :data:`AUTO_MAX`).

        Per record: the KV cache of ``rows x (prompt + new tokens)`` (``rows``: 2 for a two-stream method, the
        beams of OPERA; the static cache's rounding counted), float32 logits and the prefill's activations;
        the first record's prompt (x 1.25; ``first_text``: that prompt already rendered, e.g. a chat request's)
        stands for the batch's. The OOM back-off corrects a wrong guess.
        """
        kwargs = {**self._generation_kwargs(), **(overrides or {})}
        method = kwargs.get("custom_generate")
        rows = int(method.rows_per_record()) if hasattr(method, "rows_per_record") else 1
        rows *= int(kwargs.get("num_beams") or 1) if method is None else 1
        text = first_text if first_text is not None else self.format_prompt(records[0], len(images[0]))
        proc = {"text": [text], "return_tensors": "pt"}
        if images[0]:
            proc["images"] = [list(images[0])]
        prompt = int(self.processor(**proc)["input_ids"].shape[1] * 1.25)
        config = self.model.config.get_text_config()
        layers = int(config.num_hidden_layers)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        width = torch.finfo(self.model.dtype).bits // 8
        tokens = prompt + int(kwargs.get("max_new_tokens") or self.max_new_tokens)
        per_row = (2 * layers * heads * head_dim * width * tokens * (2 if self.compiles() else 1)
                   + 3 * 4 * int(config.vocab_size) + 8 * prompt * int(config.hidden_size) * width)
        return max(1, min(AUTO_MAX, int(0.7 * _free_memory(self.device) // (rows * per_row))))

    def _generate_auto(self, records: list[dict], images: list[list], overrides: dict | None,
                       run_batch: Callable[[list[dict], list[list], dict | None], list[str]] | None = None,
                       first_text: str | None = None) -> list[str]:
        """Batches of the estimated size; on out-of-memory the same records are retried at half the batch.
        Outputs are kept only for batches that finished, so no record is lost or repeated. ``run_batch``: what
        generates one batch (default :meth:`_generate_batch`; chat requests: their replies), ``first_text``: the
        first prompt, rendered (chat requests, which learn their own batch size)."""
        run_batch = run_batch or self._generate_batch
        key = self._auto_key(overrides, "records" if first_text is None else "chat")
        if key not in self._auto_sizes and records:
            self._auto_sizes[key] = self.estimate_batch_size(records, images, overrides, first_text=first_text)
        outputs: list[str] = []
        start = 0
        while start < len(records):
            size = self._auto_sizes[key]
            end = start + size
            try:
                done = run_batch(records[start:end], [list(x) for x in images[start:end]], overrides)
            except torch.OutOfMemoryError:
                if size == 1:
                    raise
                if str(self.device).startswith("cuda"):
                    torch.cuda.empty_cache()
                self._auto_sizes[key] = max(1, size // 2)
                continue
            outputs.extend(done)
            self._auto_used.append(size)
            start = end
        return outputs

    def take_auto_batch_size(self) -> int | None:
        """The batch size ``--batch-size auto`` settled on since the last call (the smallest one used; ``None``
        when nothing was generated), for ``results.json``."""
        used, self._auto_used = self._auto_used, []
        return min(used) if used else None

    # -- recording --------------------------------------------------------------------
    def model_revision(self) -> dict:
        """Which weights answer (:mod:`medheval.backends.revision`): the Hub commit, or the local folder's name;
        kept out of :meth:`settings` so that folders written before it was recorded still resume."""
        from medheval.backends.revision import hf_revision

        return hf_revision(getattr(self, "_source", None), self.model.config)

    def settings(self) -> dict:
        settings = {
            "backend": "hf",
            "model": self.name,
            "batch_size": AUTO if self.auto_batch else self.batch_size,
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "dtype": _jsonable(self.model.dtype),
            # the device type: a data-parallel process's cuda:N and a single process's cuda make the same
            # predictions, so a run folder resumes under either launch mode
            "device": str(self.device).split(":")[0],
            "prompt_version": getattr(self.instruction, "version", PROMPT_VERSION),
            "chat_template": self._use_chat_template,
        }
        if self.conversation is not None:
            settings["conversation_template"] = self.conversation
        if self.generate_kwargs:
            settings["generate_kwargs"] = _jsonable(self.generate_kwargs)
        if self.do_sample:  # per-row generators (medheval.decoding.sampling): folders sampled before them do not resume
            settings["sampler"] = "per_row"
        if self.prefix_cache:
            settings["prefix_cache"] = True
        if self.upstream_tokens:  # other prompt ids than the processor's: a resumed run must match
            settings["tokenization"] = "upstream_chunked"
        if self.pads_grayscale():  # other pixels than a run without it: a resumed run must match
            settings["grey_padding"] = True
        if self.compiles():  # bfloat16 tokens may differ from eager in rounding: a resumed run must match
            settings["compile"] = True
        if getattr(self.model.config, "medheval_random_weights", False):
            settings["random_weights"] = True
        return settings


__all__ = ["HFBackend", "load_model_and_processor"]

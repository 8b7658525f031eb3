"""The shared decoding loop every mitigation plugs into.

:class:`DecodingMethod` is a ``custom_generate`` callable for transformers 5.x::

    out = model.generate(**inputs, max_new_tokens=64, custom_generate=VCD(alpha=1.0))

``generate`` prepares everything as usual (generation config, logits processors such
as repetition penalty / temperature / top-k / top-p, stopping criteria such as max
length and EOS, left-padded attention mask) and then calls the method with
``(model, input_ids, logits_processor=…, stopping_criteria=…, generation_config=…,
**model_kwargs)``. The method's signature also names ``pixel_values`` and
``image_sizes``: transformers then hands those over *raw* instead of pre-encoding them
into ``mm_encoder_outputs``, which is what lets VCD noise the pixels (MedHEval's VCD
never fed its noised image to the model, ``reference/medheval_repo.md`` §8).

:func:`decode` then runs one loop for all methods, the same loop as ``generate``'s own
``_sample``:

1. forward every :class:`~medheval.decoding.streams.StreamGroup`: after the first step
   there is **one** — the clean stream and every contrast stream, 2B rows, one cache (see
   :mod:`~medheval.decoding.streams`); a stream that cannot join keeps its own group;
2. ``scores = method.scores(ctx, logits, outputs)`` — the method's rule on the raw
   next-token logits of each stream (float32);
3. ``scores = logits_processor(input_ids, scores)`` — the user's processors and warpers;
4. arg-max (greedy) or multinomial sampling, as ``generation_config.do_sample`` says —
   the *same* base decoding for every method and for plain ``generate``; with a ``sampler``
   each row draws from its own generator (:mod:`~medheval.decoding.sampling`);
5. finished rows receive ``pad_token_id`` (per-row finish), stopping criteria are
   checked on the clean sequences, and the chosen token is fed to every stream; on CUDA
   "every row has finished" is read one step late, so the host queues the next step while
   the GPU runs this one (:mod:`~medheval.decoding.stopping`; a step run after the end is dropped);
6. after the first step, contrast streams prefilled in their own forward (another prompt
   length, or built from the clean prefill) join the clean group. Such a stream is prefilled
   with the per-token type ids of its own prompt (Gemma 3's ``token_type_ids``, Qwen-VL's
   ``mm_token_type_ids``): its image tokens attend and are positioned as in the clean prompt.

``one_pass = False`` on a method (:meth:`DecodingMethod.two_pass`) gives every contrast stream
its own cache and forward at every step instead: the reference the one-pass path is tested
against, token for token.

Attention hooks a method asks for are installed around the whole loop and removed
afterwards, also on errors. Beam search is not part of this loop (OPERA brings its own).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from typing import Any, ClassVar, Iterator

import torch

from medheval.decoding import compiled, internals, sampling, stopping
from medheval.decoding.hooks import AttentionHook, attention_hooks
from medheval.decoding.streams import PREFILL_ONLY_INPUTS, Stream, StreamGroup, token_type_inputs
from medheval.decoding.visual_tokens import MitigationError


@dataclasses.dataclass
class DecodingContext:
    """Per-call state handed to a method's extension points (a method object itself keeps none).

    Attributes:
        model: the model being decoded.
        generation_config: the prepared ``GenerationConfig``.
        main: the clean stream (prompt, attention mask, ``pixel_values``...).
        batch_size: ``B``.
        step: number of tokens generated so far (0 during the prefill step).
        input_ids: ``[B, T]`` clean sequences so far.
        groups: the stream groups being decoded (``groups[0]`` holds ``main``).
        outputs: per stream name, the latest model output of its group (rows via :meth:`rows`).
        state: free per-call storage for the method (e.g. hooks, chosen layers).
        method_inputs: what the caller passed as ``generate(..., method_inputs=...)`` (e.g. PAI's
            raw-question ids, from :meth:`DecodingMethod.question_inputs`); empty when none.
    """

    model: Any
    generation_config: Any
    main: Stream
    batch_size: int
    step: int = 0
    input_ids: torch.Tensor | None = None
    groups: list[StreamGroup] = dataclasses.field(default_factory=list)
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    method_inputs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def group_of(self, name: str) -> StreamGroup:
        for group in self.groups:
            if name in group.names:
                return group
        raise KeyError(f"no stream named {name!r}; streams: {[n for g in self.groups for n in g.names]}")

    def rows(self, name: str) -> slice:
        """Rows of stream ``name`` in its group's outputs."""
        return self.group_of(name).rows(name)

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.generation_config, "pad_token_id", None)
        if pad is None:
            eos = getattr(self.generation_config, "eos_token_id", None)
            pad = eos[0] if isinstance(eos, (list, tuple)) else eos
        return int(pad) if pad is not None else 0


class DecodingMethod:
    """Base class of the mitigations: a ``custom_generate`` callable with extension points.

    Subclasses are small dataclasses (their fields are the method's settings, all with
    defaults) and override some of:

    - :meth:`check_model` — fail early on what the model alone decides (an option beyond its layer count, an
      internal it lacks): a run calls it once the model loads, before it writes anything;
    - :meth:`check` — fail early, naming what the model's inputs lack;
    - :meth:`contrast_streams` — the extra streams (same prompt → prefilled in the clean batch;
      another prompt → prefilled alone, then joined to the clean batch);
    - :meth:`deferred_streams` — streams that can only be built after the clean prefill
      (e.g. from its attention); prefilled in the same step, then joined to the clean batch;
    - :meth:`hooks` — attention hooks installed for the call;
    - :meth:`forward_kwargs` — extra forward arguments per group (e.g. hidden states); it is
      called right before each group's forward, so it may also switch per-forward state
      (e.g. enable an attention recorder for the clean prefill only); once streams have
      joined the clean group they are forwarded with what it returns for that group;
    - :meth:`scores` — the per-step rule, from raw logits to scores for the processors;
    - :meth:`question_inputs` — per-call inputs built from each row's question text (PAI's raw-question
      stream), which the caller passes as ``generate(..., method_inputs=...)``.

    Calling an instance runs :func:`decode`; :meth:`generate` is the same through
    ``model.generate``.
    """

    name: ClassVar[str] = "none"
    supports_sampling: ClassVar[bool] = True  # decodes with do_sample=True too (OPERA's beam search does not)
    # True: every contrast stream runs in the clean stream's batch and cache (one forward per
    # step); False: each in its own cache and forward (the two-pass reference, see two_pass())
    one_pass: ClassVar[bool] = True
    # False: the method's decode steps always run eager (see medheval.decoding.compiled)
    compiles: ClassVar[bool] = True

    # -- custom_generate entry point ---------------------------------------------------
    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor=None,
        stopping_criteria=None,
        generation_config=None,
        synced_gpus: bool = False,
        streamer=None,
        pixel_values: torch.Tensor | None = None,
        image_sizes: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        sampler: sampling.RowSampler | None = None,
        method_inputs: dict[str, Any] | None = None,
        **model_kwargs,
    ):
        # naming pixel_values/image_sizes/image_grid_thw makes generate hand them over raw (not
        # pre-encoded into mm_encoder_outputs, and Qwen's grid not consumed by the encoder)
        for key, value in (("pixel_values", pixel_values), ("image_sizes", image_sizes),
                           ("image_grid_thw", image_grid_thw)):
            if value is not None:
                model_kwargs[key] = value
        if sampler is not None:  # per-row random streams (medheval.decoding.sampling); OPERA never samples
            model_kwargs["sampler"] = sampler
        if method_inputs:  # named in the signature, so generate hands it over instead of checking it as a model input
            model_kwargs["method_inputs"] = method_inputs
        return self.run_loop(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )

    def run_loop(self, model, input_ids, *, synced_gpus: bool = False, **kwargs):
        """The decoding loop this method runs on (the shared :func:`decode`; OPERA: its beam search)."""
        return decode(self, model, input_ids, **kwargs)

    def two_pass(self) -> "DecodingMethod":
        """A copy decoding every contrast stream in its own cache and forward (the reference path).

        Same settings, same tokens as the one-pass default (up to float rounding); slower.
        """
        clone = copy.copy(self)
        clone.one_pass = False
        return clone

    def generate(self, model, **inputs):
        """``model.generate(**inputs, custom_generate=self)``."""
        return model.generate(**inputs, custom_generate=self)

    def rows_per_record(self) -> int:
        """Rows one record occupies in a decode step (2 for a method with a contrast stream; OPERA: its beams),
        for sizing batches to memory (``--batch-size auto``)."""
        cls = type(self)
        contrast = (cls.contrast_streams is not DecodingMethod.contrast_streams
                    or cls.deferred_streams is not DecodingMethod.deferred_streams)
        return 2 if contrast else 1

    # -- extension points --------------------------------------------------------------
    def check_model(self, model) -> None:
        """Raise :class:`MitigationError` (:class:`MissingInternalError` for an internal) if the method's options
        do not fit ``model`` or it lacks what the method needs, whatever the inputs."""

    def check(self, model, ctx: DecodingContext) -> None:
        """Raise :class:`MissingInternalError` if the inputs lack what the method needs (after :meth:`check_model`)."""

    def question_inputs(self, tokenizer, questions: list[str]) -> dict[str, Any]:
        """Per-call inputs this method builds from each row's question text (the user's text, before any
        conversation template), for ``generate(..., method_inputs=...)``; ``{}`` (the default): none needed."""
        return {}

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        return []

    def deferred_streams(self, ctx: DecodingContext) -> list[Stream]:
        """Called once, right after the clean prefill (``ctx.outputs["main"]`` is set)."""
        return []

    def hooks(self, ctx: DecodingContext) -> list[AttentionHook]:
        return []

    def forward_kwargs(self, ctx: DecodingContext, group: StreamGroup) -> dict[str, Any]:
        return {}

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        """Next-token scores ``[B, V]`` from each stream's raw float32 logits (``logits["main"]``...)."""
        return logits["main"]

    # -- description --------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The method's settings (its dataclass fields), for logs and result files."""
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {}

    def spec(self) -> str:
        """``name:key=value,...`` (the CLI form), parseable by ``medheval.mitigations.get_mitigation``."""
        items = ",".join(f"{k}={spec_value(v)}" for k, v in self.settings().items())
        return f"{self.name}:{items}" if items else self.name


def spec_value(value: Any) -> str:
    """One option value as a mitigation spec writes it: ``none``, ``true``/``false``, a list as ``0/2/4``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        joined = "/".join(spec_value(v) for v in value)
        return joined + "/" if len(value) == 1 else joined  # "4/" parses back to [4]
    return str(value)


def _validate_generation_config(method: DecodingMethod, generation_config) -> None:
    num_beams = getattr(generation_config, "num_beams", 1) or 1
    if num_beams > 1:
        raise MitigationError(
            f"{method.name} decodes greedily or by sampling; num_beams={num_beams} is not supported "
            "(pass num_beams=1; OPERA brings its own beam search)"
        )
    if (getattr(generation_config, "num_return_sequences", 1) or 1) > 1:
        raise MitigationError(
            f"{method.name}: num_return_sequences > 1 is not supported; repeat the inputs in the batch instead"
        )


def _split_kwargs(model_kwargs: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(prefill-only inputs, tensor kwargs for the clean group, plain kwargs for every group)."""
    prefill, tensors, plain = {}, {}, {}
    for key, value in model_kwargs.items():
        if key in PREFILL_ONLY_INPUTS:
            if value is None or (isinstance(value, dict) and not value):
                continue
            prefill[key] = value
        elif torch.is_tensor(value) or isinstance(value, (dict, list, tuple)):
            tensors[key] = value
        else:
            plain[key] = value
    return prefill, tensors, plain


@contextlib.contextmanager
def _maybe_no_grad() -> Iterator[None]:
    if torch.is_grad_enabled():
        with torch.no_grad():
            yield
    else:
        yield


def _join_streams(ctx: DecodingContext, names: set[str]) -> None:
    """Join each prefilled group whose streams are all in ``names`` to the clean group, where it can.

    A group that cannot join (:meth:`StreamGroup.join_refusal`) keeps its own cache; the reason
    is kept in ``ctx.state["separate_streams"]`` (stream name → reason).
    """
    main_group = ctx.groups[0]
    kept = [main_group]
    for group in ctx.groups[1:]:
        reason = main_group.join_refusal(group) if set(group.names) <= names else "its method keeps it separate"
        if reason is None:
            main_group.join(group, ctx.pad_token_id)
        else:
            kept.append(group)
            ctx.state.setdefault("separate_streams", {}).update({n: reason for n in group.names})
    ctx.groups[:] = kept


def decode(
    method: DecodingMethod,
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    streamer=None,
    sampler: sampling.RowSampler | None = None,
    method_inputs: dict[str, Any] | None = None,
    **model_kwargs,
):
    """Run ``method`` on a prepared batch (what ``generate`` hands to a ``custom_generate`` callable).

    ``sampler``: when sampling, row ``b`` draws from its own generator (:class:`~medheval.decoding.sampling.RowSampler`,
    ``model.generate(..., custom_generate=method, sampler=RowSampler.for_keys(seed, ids))``), so a row samples
    the same tokens whatever batch it is in; without one, rows draw from the global torch RNG as in ``generate``.
    ``method_inputs``: per-call inputs the method reads from ``ctx.method_inputs``
    (:meth:`DecodingMethod.question_inputs`).

    Returns what ``generate`` returns: the ``[B, T + new]`` sequences, or a
    ``GenerateDecoderOnlyOutput`` (``sequences``, ``scores``, ``logits`` and the clean stream's
    cache) when ``return_dict_in_generate=True``.
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    generation_config = generation_config if generation_config is not None else model.generation_config
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    stopping_criteria = stopping_criteria if stopping_criteria is not None else StoppingCriteriaList()
    if not stopping_criteria and getattr(generation_config, "max_length", None):
        stopping_criteria.append(internals.max_length_criteria(generation_config.max_length))
    _validate_generation_config(method, generation_config)
    apply_processors = internals.processor_chain(logits_processor)

    past = internals.pop_cache(model_kwargs)
    if internals.cache_length(past) > 0:
        raise MitigationError(f"{method.name} cannot continue from a filled KV cache; start from the prompt")
    attention_mask = model_kwargs.pop("attention_mask", None)
    for key in ("position_ids", "use_cache", "logits_to_keep", "cache_position"):
        model_kwargs.pop(key, None)
    prefill, tensor_kwargs, plain_kwargs = _split_kwargs(model_kwargs)

    batch_size = int(input_ids.shape[0])
    main = Stream("main", input_ids, attention_mask, prefill)
    ctx = DecodingContext(model=model, generation_config=generation_config, main=main,
                          batch_size=batch_size, input_ids=input_ids, method_inputs=dict(method_inputs or {}))
    method.check_model(model)
    method.check(model, ctx)

    extra = method.contrast_streams(ctx)
    names = ["main"] + [s.name for s in extra]
    if len(set(names)) != len(names):
        raise MitigationError(f"{method.name}: stream names must be unique, got {names}")
    one_pass = bool(method.one_pass)
    shared = [s for s in extra if one_pass and s.share_batch is not False and s.same_prompt_as(main)]
    separate = [s for s in extra if not any(s is t for t in shared)]
    # streams prefilled in their own forward that join the clean group after the first step
    joining = {s.name for s in separate if one_pass and s.share_batch is not False}
    main_cache = past if (past is not None and not shared and internals.is_dynamic_cache(past)) else None
    ctx.groups.append(
        StreamGroup(model, [main, *shared], cache=main_cache, common_kwargs={**tensor_kwargs, **plain_kwargs})
    )
    for stream in separate:
        own = token_type_inputs(model, main, stream, tensor_kwargs)
        ctx.groups.append(StreamGroup(model, [stream], common_kwargs={**plain_kwargs, **own}))

    do_sample = bool(getattr(generation_config, "do_sample", False))
    pad_token_id = internals.pad_token_tensor(generation_config)
    has_eos_stopping = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    if has_eos_stopping and pad_token_id is None:
        raise MitigationError("stopping on EOS needs a pad_token_id for the finished rows; set generation_config.pad_token_id")
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)  # once: a host-to-device copy per step would wait for the GPU
    return_dict = bool(getattr(generation_config, "return_dict_in_generate", False))
    keep_scores = return_dict and bool(getattr(generation_config, "output_scores", False))
    keep_logits = return_dict and bool(getattr(generation_config, "output_logits", False))
    all_scores: tuple = ()
    all_logits: tuple = ()

    unfinished = torch.ones(batch_size, dtype=torch.long, device=input_ids.device)
    max_length = getattr(generation_config, "max_length", None)
    finished = stopping.FinishedFlags(stopping.lag_for(
        input_ids.device, streamer=streamer is not None, return_dict=return_dict, global_sampling=do_sample and sampler is None
    ))
    compile_steps = compiled.wanted(model)  # static cache + compiled forward after the first step
    hooks = method.hooks(ctx)
    ctx.state["hooks"] = hooks
    with _maybe_no_grad(), attention_hooks(model, hooks):
        while True:
            logits: dict[str, torch.Tensor] = {}
            index = 0
            while index < len(ctx.groups):
                group = ctx.groups[index]
                for hook in hooks:
                    hook.bind(group)
                first = not group.prefilled
                outputs = group.forward(**method.forward_kwargs(ctx, group))
                for name in group.names:
                    ctx.outputs[name] = outputs
                    logits[name] = outputs.logits[group.rows(name), -1].to(
                        copy=True, dtype=torch.float32, device=input_ids.device
                    )
                if index == 0 and first:
                    deferred = method.deferred_streams(ctx)
                    for stream in deferred:
                        if stream.name in {n for g in ctx.groups for n in g.names}:
                            raise MitigationError(f"{method.name}: duplicate stream name {stream.name!r}")
                        own = token_type_inputs(model, main, stream, tensor_kwargs)
                        ctx.groups.append(StreamGroup(model, [stream], common_kwargs={**plain_kwargs, **own}))
                        if one_pass and stream.share_batch is not False:
                            joining.add(stream.name)
                index += 1
            for hook in hooks:
                hook.bind(None)

            next_scores = method.scores(ctx, logits)
            next_scores = apply_processors(ctx.input_ids, next_scores)
            if keep_scores:
                all_scores += (next_scores,)
            if keep_logits:
                all_logits += (logits["main"],)

            next_tokens = sampling.next_tokens(next_scores, do_sample, sampler)
            if has_eos_stopping:
                next_tokens = next_tokens * unfinished + pad_token_id * (1 - unfinished)

            ctx.input_ids = torch.cat([ctx.input_ids, next_tokens[:, None]], dim=-1)
            for group in ctx.groups:
                group.append(next_tokens)
            if joining:
                _join_streams(ctx, joining)
                joining = set()
            ctx.step += 1
            if streamer is not None:
                streamer.put(next_tokens.cpu())
            unfinished = unfinished & ~stopping_criteria(ctx.input_ids, all_scores if keep_scores else None)
            finished.push(unfinished)
            drop = finished.steps_to_drop(last=bool(max_length) and int(ctx.input_ids.shape[1]) >= max_length)
            if drop is not None:  # read late on CUDA: the steps run after every row finished are dropped
                if drop:
                    ctx.input_ids = ctx.input_ids[:, :-drop]
                break
            if compile_steps and ctx.step == 1:  # every group has its final rows: static cache from here on
                compiled.attach(method, ctx, max_length)
            ctx.outputs.clear()
            del outputs

    if streamer is not None:
        streamer.end()
    if not return_dict:
        return ctx.input_ids
    cache = ctx.groups[0].cache
    if ctx.groups[0].static is not None:
        cache = ctx.groups[0].static.final_cache(batch_size, int(ctx.input_ids.shape[1]) - 1)
    elif cache is not None and len(ctx.groups[0].streams) > 1:
        internals.select_rows(cache, torch.arange(batch_size, device=input_ids.device))
    return internals.decoder_only_output(
        sequences=ctx.input_ids,
        scores=all_scores if keep_scores else None,
        logits=all_logits if keep_logits else None,
        cache=cache,
    )


def generate_from_folder(method_cls: type[DecodingMethod], model, **generate_arguments):
    """The body of a Hub-style ``custom_generate/generate.py``.

    ``model.generate(custom_generate="<folder>", trust_remote_code=True, **kwargs)`` calls the
    folder's ``generate(model=model, **all_generate_arguments)``. The keyword arguments that are
    fields of ``method_cls`` (e.g. ``alpha=1.0``) configure the method; everything else goes
    back to ``model.generate`` with the method as a ``custom_generate`` callable.
    """
    fields = set(inspect.signature(method_cls).parameters)
    method_kwargs = {k: generate_arguments.pop(k) for k in list(generate_arguments) if k in fields}
    method = method_cls(**method_kwargs)
    arguments = {k: v for k, v in generate_arguments.items() if v is not None}
    return internals.generate_entry()(model, custom_generate=method, **arguments)


__all__ = ["DecodingContext", "DecodingMethod", "decode", "generate_from_folder", "spec_value"]

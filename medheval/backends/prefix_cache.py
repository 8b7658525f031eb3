"""Prefix caching for many prompts about the same images (Med-StepBench: ~80 statements per study).

Statements about one study share its images, so their prompts share a token prefix: the chat
template's opening and the image tokens (the prefix ends after the last image token). This encodes
that prefix once (vision tower + language model), keeps its KV cache (``DynamicCache``), and for each
chunk of statements copies the cache (``copy.deepcopy``), repeats it over the chunk
(``DynamicCache.batch_repeat_interleave``) and lets ``generate`` continue from it with only the
statement tokens. Greedy answers equal the one-prompt-per-statement path (tested on a tiny LLaVA).

Layout of one chunk (k statements, suffixes padded *between* prefix and suffix)::

    input_ids      [ prefix (L) | pad ... pad | suffix_i ]
    attention_mask [ 1 ... 1    | 0 ... 0     | 1 ... 1  ]

``generate`` derives position ids from the mask (cumsum - 1), so suffix tokens sit at positions
L, L+1, ... exactly as in the unpadded prompt, and the masked pads are never attended to.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from typing import Any

import torch

from medheval.backends.base import BackendError
from medheval.decoding import internals


def image_key(images: list) -> str:
    """A content key for a list of PIL images (same pixels -> same key)."""
    digest = hashlib.sha1()
    for image in images:
        digest.update(f"{image.mode}{image.size}".encode())
        digest.update(image.tobytes())
    return digest.hexdigest()


def group_by_images(images: list[list]) -> "OrderedDict[str, list[int]]":
    """Record indices grouped by identical image lists, in first-seen order."""
    groups: OrderedDict[str, list[int]] = OrderedDict()
    for index, imgs in enumerate(images):
        groups.setdefault(image_key(imgs), []).append(index)
    return groups


def _common_prefix_length(rows: list[list[int]]) -> int:
    shortest = min(len(row) for row in rows)
    length = 0
    while length < shortest and all(row[length] == rows[0][length] for row in rows):
        length += 1
    return min(length, shortest - 1)  # every statement keeps at least one token of its own


_PLAIN_INPUTS = {"input_ids", "attention_mask", "pixel_values"}


class PrefixCache:
    """Encodes a group's shared prefix once and generates every statement from a copy of its cache.

    Keeps the last ``keep`` prefixes (by image content and prefix tokens), so a study split across
    runner batches is encoded once too.
    """

    def __init__(self, backend: Any, keep: int = 2):
        if "custom_generate" in getattr(backend, "generate_kwargs", {}):
            raise BackendError("prefix caching cannot be combined with a decoding mitigation (custom_generate): "
                               "mitigations change the forward pass over the image tokens; run without --prefix-cache")
        self.backend = backend
        self.keep = keep
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self.prefix_encodings = 0  # how many prefixes were actually encoded (for tests and benchmarks)

    def _process(self, records: list[dict], texts: list[str], imgs: list) -> Any:
        kwargs: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
        if imgs:
            kwargs["images"] = self.backend.model_images(imgs) * len(texts)
        try:
            inputs = self.backend.processor(**kwargs)
        except Exception as err:  # noqa: BLE001 - name the records, keep the cause
            raise BackendError(f"processor failed on records {[r.get('id') for r in records]}: {err}") from err
        upstream = getattr(self.backend, "upstream_inputs", None)
        return upstream(inputs, texts) if upstream is not None else inputs

    def _encode(self, records: list[dict], imgs: list) -> tuple[list[list[int]], Any]:
        """Token ids (image tokens expanded, as the processor makes them) and the group's pixel values.

        The images are preprocessed once: the first prompt goes through the processor; the others are
        tokenized as text and get the first prompt's expanded head (everything up to its last image
        token) when their own head is the same. A prompt where that does not hold goes through the
        processor too, so the ids are always the processor's (under upstream chunked tokenization,
        :attr:`HFBackend.upstream_tokens`, every prompt goes through it and its ids are rebuilt by that rule)."""
        backend = self.backend
        texts = [backend.format_prompt(record, len(imgs)) for record in records]
        first = self._process(records[:1], texts[:1], imgs)
        extra = sorted(set(first) - _PLAIN_INPUTS)
        if extra:  # positions or masks tied to the image layout (M-RoPE, image masks): not reproduced here
            raise BackendError(
                f"--prefix-cache supports models whose processor returns only {sorted(_PLAIN_INPUTS)} (LLaVA-1.5, "
                f"InternVL); {backend.name!r} also needs {extra}: run without --prefix-cache")
        first_ids = first["input_ids"][0][first["attention_mask"][0].bool()].tolist()
        pixel_values = first.get("pixel_values")
        if len(texts) == 1:
            return [first_ids], pixel_values
        if getattr(backend, "upstream_tokens", False):  # the text-only shortcut below would bypass the chunked rule
            rest = self._process(records[1:], texts[1:], imgs)
            return [first_ids] + [rest["input_ids"][i][rest["attention_mask"][i].bool()].tolist()
                                  for i in range(len(texts) - 1)], pixel_values
        raw = backend.tokenizer(texts)["input_ids"]
        image_id = _image_token_id(backend)
        marks = [i for i, token in enumerate(raw[0]) if token == image_id]
        ids: list[list[int] | None] = [first_ids] + [None] * (len(texts) - 1)
        if marks:
            head_raw = raw[0][: marks[-1] + 1]
            tail = len(raw[0]) - len(head_raw)
            if tail and first_ids[-tail:] == raw[0][len(head_raw):]:
                head = first_ids[: len(first_ids) - tail]
                for index in range(1, len(texts)):
                    if raw[index][: len(head_raw)] == head_raw:
                        ids[index] = head + raw[index][len(head_raw):]
        elif raw[0] == first_ids:  # no image tokens: text tokenization is the processor's
            ids = [list(row) for row in raw]
        redo = [index for index, row in enumerate(ids) if row is None]
        if redo:
            again = self._process([records[i] for i in redo], [texts[i] for i in redo], imgs)
            for position, index in enumerate(redo):
                ids[index] = again["input_ids"][position][again["attention_mask"][position].bool()].tolist()
        return ids, pixel_values  # type: ignore[return-value]

    def _prefix(self, key: str, prefix: list[int], pixel_values: Any) -> Any:
        backend = self.backend
        cache_key = (key, tuple(prefix))
        if cache_key in self._cache:
            self._cache.move_to_end(cache_key)
            return self._cache[cache_key]
        model = backend.model
        inputs: dict[str, Any] = {"input_ids": torch.tensor([prefix], device=backend.device)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if pixel_values is not None:
            inputs["pixel_values"] = pixel_values.to(backend.device, model.dtype)
        with torch.inference_mode():
            out = model(**inputs, **internals.cache_keyword(internals.new_cache(model)), use_cache=True)
        self.prefix_encodings += 1
        cache = internals.output_cache(out)
        self._cache[cache_key] = cache
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return cache

    def _generate_chunk(self, prefix: list[int], suffixes: list[list[int]], cache: Any,
                        overrides: dict | None = None) -> list[str]:
        backend = self.backend
        width = max(len(s) for s in suffixes)
        pad = backend.tokenizer.pad_token_id
        rows = [prefix + [pad] * (width - len(s)) + s for s in suffixes]
        masks = [[1] * len(prefix) + [0] * (width - len(s)) + [1] * len(s) for s in suffixes]
        input_ids = torch.tensor(rows, device=backend.device)
        attention_mask = torch.tensor(masks, device=backend.device)
        past = copy.deepcopy(cache)
        if len(suffixes) > 1:
            internals.repeat_rows(past, len(suffixes))
        torch.manual_seed(backend.seed)
        with torch.inference_mode():
            out = backend.model.generate(input_ids=input_ids, attention_mask=attention_mask, **internals.cache_keyword(past),
                                         **{**backend._generation_kwargs(), **(overrides or {})})
        sequences = out.sequences if hasattr(out, "sequences") else out
        decoded = backend.tokenizer.batch_decode(sequences[:, input_ids.shape[1]:], skip_special_tokens=True)
        return [text.strip() for text in decoded]

    def generate(self, records: list[dict], images: list[list], overrides: dict | None = None) -> list[str]:
        """One output per record, in order; records with identical images share one prefix encoding.
        ``overrides``: generation settings for this call (as :meth:`HFBackend.generate`)."""
        outputs: list[str | None] = [None] * len(records)
        for key, indices in group_by_images(images).items():
            group = [records[i] for i in indices]
            imgs = list(images[indices[0]])
            ids, pixel_values = self._encode(group, imgs)
            length = _prefix_length(ids, self.backend)
            prefix = ids[0][:length]
            cache = self._prefix(key, prefix, pixel_values)
            for start in range(0, len(indices), self.backend.batch_size):
                chunk = indices[start:start + self.backend.batch_size]
                suffixes = [ids[indices.index(i)][length:] for i in chunk]
                for i, text in zip(chunk, self._generate_chunk(prefix, suffixes, cache, overrides)):
                    outputs[i] = text
        return [text if text is not None else "" for text in outputs]


def _image_token_id(backend: Any) -> int | None:
    config = backend.model.config
    found = getattr(config, "image_token_id", None)
    return found if found is not None else getattr(config, "image_token_index", None)


def _prefix_length(ids: list[list[int]], backend: Any) -> int:
    """Where the shared prefix ends: right after the last image token (a boundary that does not depend
    on which statements share the batch, so a study split over batches reuses one cache), or, without
    image tokens, the longest common prefix. Every statement keeps at least one token of its own."""
    common = _common_prefix_length(ids) if len(ids) > 1 else len(ids[0]) - 1
    image_id = _image_token_id(backend)
    positions = [i for i, token in enumerate(ids[0]) if token == image_id]
    if positions and positions[-1] + 1 <= common:
        return positions[-1] + 1
    return common


__all__ = ["PrefixCache", "group_by_images", "image_key"]

"""Prompt token ids built the way the LLaVA code bases build them (``tokenizer_image_token``).

An HF processor tokenizes a rendered prompt as one string, ``<image>`` being a special token. LLaVA's
``llava/mm_utils.py`` (LLaVA-Med-1.5 and LLaVA 1.6, the code MedHEval's released scripts ran) instead splits the
prompt on ``"<image>"``, tokenizes every piece on its own (``tokenizer(piece).input_ids``, special tokens on),
keeps the BOS of the first piece only (when the first piece starts with BOS, the first id of every piece is
dropped and that BOS is written once in front) and puts one image index between consecutive pieces.

A sentencepiece-style tokenizer (Llama, Mistral) writes a word-start marker ``▁`` at the start of a string it
tokenizes, so each piece after an image starts with it; for ``"\\nQuestion"`` that is a lone ``▁`` id before the
newline, which a whole-string tokenization of a non-legacy tokenizer (Metaspace ``prepend_scheme="first"``)
does not write. :func:`upstream_image_token_ids` gives the upstream ids; :func:`expand_images` then writes each
image index as the run of image tokens the processor produced for that image (LLaVA-NeXT's count depends on the
image's size), so the result can stand in for the processor's ``input_ids``.
"""

from __future__ import annotations

from typing import Any, Sequence

from medheval.decoding.visual_tokens import left_pad

IMAGE_INDEX = -200  # the placeholder id LLaVA's code puts where an image's features go (IMAGE_TOKEN_INDEX)


class ChunkedTokensError(ValueError):
    """The processor's ids and the prompt text do not agree on the images (count or layout)."""


def upstream_image_token_ids(tokenizer: Any, prompt: str, image_token: str = "<image>",
                             image_index: int = IMAGE_INDEX) -> list[int]:
    """``prompt``'s ids by LLaVA's ``tokenizer_image_token`` rule: each piece between ``image_token`` markers
    tokenized alone, BOS kept from the first piece only, ``image_index`` where each marker was."""
    pieces = [list(tokenizer(piece).input_ids) for piece in prompt.split(image_token)]
    bos = getattr(tokenizer, "bos_token_id", None)
    offset = 1 if pieces and pieces[0] and bos is not None and pieces[0][0] == bos else 0
    ids: list[int] = [pieces[0][0]] if offset else []
    for position, piece in enumerate(pieces):
        if position:
            ids.append(image_index)
        ids.extend(piece[offset:])
    return ids


def image_token_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """The lengths of the runs of consecutive ``image_token_id`` in ``ids`` (one run per image the processor
    expanded)."""
    runs: list[int] = []
    previous = False
    for token in ids:
        current = token == image_token_id
        if current and previous:
            runs[-1] += 1
        elif current:
            runs.append(1)
        previous = current
    return runs


def expand_images(ids: Sequence[int], image_token_id: int, counts: Sequence[int],
                  image_index: int = IMAGE_INDEX) -> list[int]:
    """``ids`` with the k-th ``image_index`` written as ``counts[k]`` copies of ``image_token_id``."""
    marks = sum(1 for token in ids if token == image_index)
    if marks != len(counts):
        raise ChunkedTokensError(f"the prompt has {marks} image marker(s) but the processor expanded {len(counts)} "
                                 "image(s)")
    out: list[int] = []
    images = iter(counts)
    for token in ids:
        out.extend([image_token_id] * next(images) if token == image_index else [token])
    return out


def upstream_input_ids(tokenizer: Any, prompt: str, processor_ids: Sequence[int], image_token: str,
                       image_token_id: int) -> list[int]:
    """The ids to feed for one prompt: :func:`upstream_image_token_ids`, each image expanded to as many image
    tokens as the processor gave it in ``processor_ids`` (one row, padding removed)."""
    ids = upstream_image_token_ids(tokenizer, prompt, image_token)
    return expand_images(ids, image_token_id, image_token_runs(processor_ids, image_token_id))


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (the shorter length when one is a prefix of the other),
    ``None`` when equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def chunked_inputs(inputs: Any, texts: Sequence[str], tokenizer: Any, image_token: str, image_token_id: int,
                   pad_id: int) -> Any:
    """The processor's batch ``inputs`` (``input_ids``, ``attention_mask``, image tensors) with ``input_ids`` and
    ``attention_mask`` rebuilt from ``texts`` by the upstream rule, left-padded; the image tensors are kept.
    Another per-token tensor (same shape as ``input_ids``) cannot be rebuilt, so it is refused."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    others = [key for key, value in inputs.items() if key not in ("input_ids", "attention_mask")
              and getattr(value, "shape", None) == ids.shape]
    if others:
        raise ChunkedTokensError(f"the processor also returns per-token {others}; upstream chunked tokenization "
                                 "rebuilds only input_ids and attention_mask")
    rows = [upstream_input_ids(tokenizer, text, ids[row][mask[row].bool()].tolist(), image_token, image_token_id)
            for row, text in enumerate(texts)]
    inputs["input_ids"], inputs["attention_mask"] = left_pad(rows, pad_id)
    return inputs


__all__ = ["ChunkedTokensError", "IMAGE_INDEX", "chunked_inputs", "expand_images", "first_difference",
           "image_token_runs", "left_pad", "upstream_image_token_ids", "upstream_input_ids"]

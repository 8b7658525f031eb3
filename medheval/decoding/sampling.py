"""Token selection: arg-max, or a multinomial draw from each row's own random stream.

``generate``'s own sampling draws every row of a batch from the one global torch RNG, so a record's
sampled answer depends on which records share its batch, their order and their padding: batch size
changes the numbers. :class:`RowSampler` gives each row its own ``torch.Generator``, seeded from
``(seed, key)`` where the key is the record's id, so a record samples the same tokens alone or at any
position of a batch of any size.

The probabilities come from the scores *after* ``generate``'s logits processors, so temperature,
top-k and top-p mean exactly what they mean in transformers (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, in ``generate``'s order); only the draw changes:

    p_b = softmax(scores_b),    token_b ~ Categorical(p_b)  drawn with generator G(seed, key_b).

The row seed is ``sha256("<seed>\\x00<key>")`` read as a 63-bit integer (stable across processes and
Python versions, unlike ``hash()``).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch


def row_seed(seed: int, key: str) -> int:
    """The generator seed of row ``key`` under run seed ``seed``: the first 8 bytes of
    ``sha256(f"{seed}\\0{key}")``, masked to 63 bits."""
    digest = hashlib.sha256(f"{int(seed)}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


class RowSampler:
    """One random stream per batch row, for one ``generate`` call.

    Args:
        seeds: one generator seed per row (:func:`row_seed`), in batch order.

    The generators are created on the device of the first probabilities drawn from, and advance with
    every draw: build a new sampler for every call (:meth:`for_keys`).
    """

    def __init__(self, seeds: Sequence[int]):
        self.seeds = [int(s) for s in seeds]
        self._generators: list[torch.Generator] | None = None

    @classmethod
    def for_keys(cls, seed: int, keys: Sequence[str]) -> "RowSampler":
        """A sampler whose row ``i`` draws from ``G(seed, keys[i])`` (keys: the records' ids)."""
        return cls([row_seed(seed, str(key)) for key in keys])

    def __len__(self) -> int:
        return len(self.seeds)

    def _streams(self, device: torch.device) -> list[torch.Generator]:
        if self._generators is None:
            self._generators = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        return self._generators

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token id per row (``[B]``) from ``probs`` ``[B, V]``, row ``b`` from its own generator."""
        if probs.dim() != 2 or probs.shape[0] != len(self.seeds):
            raise ValueError(f"RowSampler holds {len(self.seeds)} row generators but got probabilities of shape "
                             f"{tuple(probs.shape)}; build one sampler per batch, one seed per row")
        streams = self._streams(probs.device)
        return torch.cat([torch.multinomial(probs[b : b + 1], num_samples=1, generator=streams[b])[0]
                          for b in range(probs.shape[0])])


def next_tokens(scores: torch.Tensor, do_sample: bool, sampler: RowSampler | None = None) -> torch.Tensor:
    """The next token of every row from processed ``scores`` ``[B, V]``: arg-max when not sampling; else a draw
    from ``softmax(scores)``, per row from ``sampler`` when given, else from the global torch RNG (as
    ``generate``'s own ``_sample``)."""
    if not do_sample:
        return torch.argmax(scores, dim=-1)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    if sampler is None:
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    return sampler.draw(probs)


__all__ = ["RowSampler", "next_tokens", "row_seed"]

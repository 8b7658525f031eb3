"""When the decoding loop stops: "has every row finished?", read one step late on CUDA.

Reading that flag (``unfinished.max() == 0``) as a Python bool makes the host wait for the GPU to finish the
step; the host then builds the next step's inputs while the GPU idles, so a step costs host time + GPU time.
On CUDA the loop instead copies the flag to pinned host memory without blocking and reads it one step later
(:class:`FinishedFlags` with ``lag=1``): the host queues step ``n + 1`` while the GPU runs step ``n``, and a
step costs about ``max(host, GPU)``. When the flag read says every row had already finished, the loop drops the
steps run since (all their tokens are padding), so it returns the sequences the synchronous loop returns.

A decode step reads no other tensor value on the host (``tests/test_decoding_host_reads.py`` counts them on
CPU), so this flag is what serialises host and GPU.

``lag = 0`` (read at once) where an extra step would show or cost something: on CPU (no device to overlap
with), with a streamer (it prints each token as it comes), with ``return_dict_in_generate`` (its scores,
logits and cache would need trimming), when sampling from the global RNG (an extra step would draw from it and
shift every later call's draws), and on the last step the length allows (the static cache ends there).
:func:`finished_flag_lag` overrides the choice (tests run the late read on CPU with it).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import deque
from typing import Iterator

import torch

_LAG: contextvars.ContextVar[int | None] = contextvars.ContextVar("medheval_finished_flag_lag", default=None)


@contextlib.contextmanager
def finished_flag_lag(lag: int | None) -> Iterator[None]:
    """Read the flag ``lag`` steps late in the calls inside (``None``: the default rule, 1 on CUDA, else 0)."""
    if lag is not None and int(lag) < 0:
        raise ValueError(f"the flag lag must be 0 or more, got {lag}")
    token = _LAG.set(None if lag is None else int(lag))
    try:
        yield
    finally:
        _LAG.reset(token)


def lag_for(device: torch.device, *, streamer: bool, return_dict: bool, global_sampling: bool) -> int:
    """Steps to read the flag late for one call (see the module docstring for when it is 0)."""
    if streamer or return_dict or global_sampling:
        return 0
    forced = _LAG.get()
    if forced is not None:
        return forced
    return 1 if device.type == "cuda" else 0


class FinishedFlags:
    """The per-step "every row has finished" flags of one call, read ``lag`` steps late.

    After each step the loop calls :meth:`push` with its ``unfinished`` rows, then :meth:`steps_to_drop`:
    ``None`` = go on; ``k`` = stop and drop the last ``k`` steps (they ran after every row had finished).
    """

    def __init__(self, lag: int):
        self.lag = int(lag)
        self.pending: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()
        self.reads = 0  # flags read on the host (one per step)

    def push(self, unfinished: torch.Tensor) -> None:
        """Record this step's flag (on CUDA: copied to pinned memory, not waited for)."""
        done = unfinished.max() == 0
        if done.is_cuda and self.lag:
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(done, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((host, event))
        else:
            self.pending.append((done, None))

    def _read(self) -> bool:
        flag, event = self.pending.popleft()
        if event is not None:
            event.synchronize()  # waits for the step that set the flag, not for the ones queued after it
        self.reads += 1
        return bool(flag)

    def steps_to_drop(self, *, last: bool = False) -> int | None:
        """``None``: go on; else stop and drop that many of the latest steps. ``last``: the length allows no
        further step, so every pending flag is read now."""
        while self.pending and (last or len(self.pending) > self.lag):
            if self._read():
                drop = len(self.pending)
                self.pending.clear()
                return drop
        return None


__all__ = ["FinishedFlags", "finished_flag_lag", "lag_for"]

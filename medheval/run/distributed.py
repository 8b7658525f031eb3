"""Data-parallel runs: ``accelerate launch run_eval.py ...`` shards records across processes.

One launch is one run. The main process (rank 0) holds the output folder's lock
(:class:`medheval.run.outputs.OutputLock`), prepares the splits first (downloads, ``datasets`` cache; the
others prepare after it), checks ``run.json`` and writes every summary file; every
process (main included) generates its shard of each split into its own append-only log
``predictions.rank{r}.jsonl``. After each split all processes meet; the main process merges the part
logs into ``predictions.jsonl`` in the dataset's record order (atomic rewrite, duplicates by
(id, model, mitigation) dropped), deletes the part logs only after that write, and scores.

Sharding: the split's records still to do are cut into batches of ``--batch-size`` exactly as a
single process would cut them; batch ``b`` goes to rank ``b % world_size``. Every ``generate`` call
therefore sees the same records as in a single-process run, so the merged ``predictions.jsonl``
equals a single-process run's (greedy decoding, or sampling with the per-batch seed).

Resume: at start the main process merges part logs a killed run left behind, then every process
reads ``predictions.jsonl`` and shards what is left (any number of processes, one included).

Failures: processes meet at sync points (:meth:`Group.together`) where each reports whether its step
failed; a failure on one rank becomes a clear error on every rank. A process that dies outright
makes the others' next sync fail at once (and ``accelerate launch``/``torchrun`` stops them); a
process that hangs makes the others fail after ``MEDHEVAL_DP_TIMEOUT`` seconds (default 4 h).

Exit: a launched process ends through :func:`end_process`: streams flushed, exit handlers run (the process groups
destroyed), then ``os._exit``, without the interpreter's teardown, where torch's C++ destructors of gloo's threads
can abort a process that has finished its work. ``faulthandler`` is on in a launched process: a crash prints every
thread's Python stack.

Distribution is detected from ``WORLD_SIZE`` (set by ``accelerate launch`` and ``torchrun``); a
single-process run never imports ``accelerate``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from medheval.run.outputs import OutputLock, atomic_write_text
from medheval.run.predictions_log import CorruptLogError, LogWriter, jsonl_line, log_key, read_log

T = TypeVar("T")
TIMEOUT_ENV = "MEDHEVAL_DP_TIMEOUT"
DEFAULT_TIMEOUT_S = 4 * 3600


class RankFailed(RuntimeError):
    """Another process of a data-parallel run failed; the message names its rank, step and error."""


def launched_world_size() -> int:
    """Processes in this launch (``WORLD_SIZE`` from accelerate/torchrun); 1 when not launched."""
    try:
        return max(int(os.environ.get("WORLD_SIZE") or 1), 1)
    except ValueError:
        return 1


def launched_rank() -> int:
    """This process's rank in its launch (``RANK`` from accelerate/torchrun), read before any process group
    exists; 0 when not launched (:func:`launched_world_size` 1, whatever ``RANK`` an environment left)."""
    if launched_world_size() == 1:
        return 0
    try:
        return max(int(os.environ.get("RANK") or 0), 0)
    except ValueError:
        return 0


def shard_batches(indices: Sequence[int], batch_size: int, rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s share of ``indices``: whole batches ``b`` (of ``batch_size``) with ``b % world_size == rank``.

    >>> shard_batches(list(range(7)), 2, 1, 2)
    [2, 3, 6]
    """
    if world_size == 1:
        return list(indices)
    step = batch_size * world_size
    starts = range(rank * batch_size, len(indices), step)
    return [index for start in starts for index in indices[start:start + batch_size]]


def part_log_path(log_path: Path, rank: int) -> Path:
    """``predictions.jsonl`` -> ``predictions.rank{rank}.jsonl`` (same folder)."""
    return log_path.with_name(f"{log_path.stem}.rank{rank}{log_path.suffix}")


def merge_parts(log_path: str | Path, order: Sequence[str]) -> int:
    """Merge every ``predictions.rank*.jsonl`` beside ``log_path`` into it; returns how many entries were new.

    The merged log lists entries by the position of their id in ``order`` (the run's splits, record by
    record; stable, so entries of ids outside ``order`` keep their relative order at the end). An entry
    whose (id, model, mitigation, control) is already present with the same content is dropped (with other
    content: refused), so merging twice (a kill between the
    atomic write and the deletion of the part logs) changes nothing. Part logs are deleted only after
    the merged log is written (:func:`medheval.run.outputs.atomic_write_text`)."""
    log_path = Path(log_path)
    parts = sorted(log_path.parent.glob(f"{log_path.stem}.rank*{log_path.suffix}"))
    if not parts:
        return 0
    entries = read_log(log_path)
    seen = {log_key(entry): entry for entry in entries}
    new = 0
    for part in parts:
        for entry in read_log(part):  # a torn last line (a killed process) is dropped and regenerated
            known = seen.get(log_key(entry))
            if known is None:
                seen[log_key(entry)] = entry
                entries.append(entry)
                new += 1
            elif known != entry:  # as in one log (predictions_log.unique_entries): which answer counts is not ours
                raise CorruptLogError(
                    f"{part} and {log_path} hold two different entries for id {entry['id']!r}; one was edited. "
                    f"Remove the wrong line (or delete {part.name} to regenerate its records), or start a new "
                    f"--output folder.")
    position: dict[str, int] = {}
    for index, rid in enumerate(order):
        position.setdefault(rid, index)
    entries.sort(key=lambda entry: position.get(entry["id"], len(position)))
    atomic_write_text(log_path, "".join(jsonl_line(entry) for entry in entries))
    for part in parts:
        part.unlink()
    return new


@dataclass
class Group:
    """The processes of one run: this one's ``rank`` among ``world_size`` (``local_rank`` on its machine).

    ``gather`` exchanges one picklable object per process (``None`` in a single-process run)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    gather: Callable[[Any], list[Any]] | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def together(self, step: str) -> Iterator[None]:
        """Run ``step`` on every process, then meet: if it failed anywhere, every process raises.

        The failing process re-raises its own error; the others raise :class:`RankFailed` naming the
        rank, the step and the error (so no process waits for one that will never come)."""
        if self.world_size == 1:
            yield
            return
        try:
            yield
        except BaseException as error:
            with contextlib.suppress(Exception):  # the others may be gone already: report our own error
                self._exchange(f"{type(error).__name__}: {error}")
            raise
        failures = [(rank, status) for rank, status in enumerate(self._exchange(None)) if status]
        if failures:
            rank, status = failures[0]
            raise RankFailed(f"process {rank} of {self.world_size} failed while {step}: {status}")

    def main_first(self, step: str, work: Callable[[], T]) -> T:
        """``work()`` on the main process, then on the others: they find the data it downloaded and the
        ``datasets`` cache it built (several processes building one Arrow cache at once collide)."""
        result: Any = None
        with self.together(step):
            if self.is_main:
                result = work()
        with self.together(step):
            if not self.is_main:
                result = work()
        return result

    def collect(self, value: T) -> list[T]:
        """Every process's ``value``, in rank order (``[value]`` in a single-process run); every process must
        call it at the same point."""
        if self.world_size == 1:
            return [value]
        assert self.gather is not None
        return self.gather(value)

    def _exchange(self, status: str | None) -> list[Any]:
        assert self.gather is not None
        return self.gather(status)

    @contextlib.contextmanager
    def lock(self, output: str | Path, timeout: float) -> Iterator[None]:
        """The output folder's lock for the whole run, held by the main process only."""
        held: list[OutputLock] = []
        with self.together(f"locking {output}"):
            if self.is_main:
                held.append(OutputLock(output, timeout=timeout).acquire())
        try:
            yield
        finally:
            for lock in held:
                lock.release()

    def generate(self, generate: Callable[[LogWriter, tuple[int, int]], int], log_path: Path,
                 order: Sequence[str], split: str) -> int:
        """One split's generation: ``generate(writer, (rank, world_size))`` on every process, then (several
        processes) the main merges the part logs. Returns how many records were generated for the split
        (all processes) on the main process, this process's count on the others."""
        if self.world_size == 1:
            with LogWriter(log_path) as writer:
                return generate(writer, (0, 1))
        with self.together(f"generating {split}"):
            with LogWriter(part_log_path(log_path, self.rank)) as writer:
                generated = generate(writer, (self.rank, self.world_size))
        with self.together(f"merging the predictions of {split}"):
            if self.is_main:
                generated = merge_parts(log_path, order)
        return generated


SOLO = Group()
_GROUP: Group | None = None


def group(device: str | None = None) -> Group:
    """This process's :class:`Group`: :data:`SOLO` unless launched with ``WORLD_SIZE`` > 1, else one
    built from ``accelerate.PartialState`` (created once; ``device`` picks NCCL/GPU or gloo/CPU for it).
    Sync points use a gloo group of their own with ``MEDHEVAL_DP_TIMEOUT`` seconds."""
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    if launched_world_size() == 1:
        return SOLO
    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    if not faulthandler.is_enabled():  # an abort in one process names where each of its threads was
        with contextlib.suppress(ValueError, OSError, AttributeError):  # a stderr without a file descriptor
            faulthandler.enable()
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S))
    cpu = not torch.cuda.is_available() or not (device or "cuda").startswith("cuda")
    state = PartialState(cpu=cpu, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout)

    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * state.num_processes
        dist.all_gather_object(out, value, group=control)
        return out

    _GROUP = Group(rank=state.process_index, world_size=state.num_processes,
                   local_rank=state.local_process_index, gather=gather)
    atexit.register(_shut_down)
    return _GROUP


def _shut_down() -> None:
    """Destroy the process groups and let go of ours while the interpreter is whole (an exit handler): a gloo
    group torn down by the interpreter's teardown (threads still running) can abort the process ("terminate called
    without an active exception")."""
    global _GROUP
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as error:  # the run's work is done: say so, and end anyway
        print(f"warning: the process group was not shut down cleanly: {type(error).__name__}: {error}",
              file=sys.stderr)
    _GROUP = None  # its gather holds the sync group: free it now, not in the interpreter's teardown
    gc.collect()


def end_process(status: int) -> int:
    """``status`` in a process that is not part of a launch. In a launched process (its group built), the end of the
    process: flush stdout and stderr, run the exit handlers (:func:`_shut_down` among them), flush again, then
    ``os._exit(status)``. Skipping the interpreter's teardown keeps torch's C++ destructors from aborting a process
    whose work is done (the launcher would report the whole run failed). Every file the run writes is closed by
    then (:func:`medheval.run.outputs.atomic_write_text`, the logs' writers); a thread still running (an API judge's
    requests after an error stopped the run) is not waited for."""
    if _GROUP is None:
        return status
    _flush_streams()
    atexit._run_exitfuncs()
    _flush_streams()  # what the exit handlers printed
    os._exit(status)


def run_to_end(main: Callable[[], int]) -> int:
    """``main()``'s status, and in a launched process :func:`end_process` however ``main`` ends: a status, a
    ``SystemExit`` (its code, as the interpreter reads it) or an exception (its traceback through ``sys.excepthook``,
    status 1). Outside a launch an exception propagates as it would without this wrapper."""
    try:
        status = main()
    except SystemExit as stop:
        if _GROUP is None:
            raise
        status = _exit_status(stop.code)
    except BaseException:
        if _GROUP is None:
            raise
        sys.excepthook(*sys.exc_info())
        status = 1
    return end_process(status)


def _exit_status(code: object) -> int:
    """The exit status the interpreter gives ``SystemExit(code)``: ``None`` 0, an int itself, anything else
    printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
            stream.flush()


def device_for(requested: str | None) -> str | None:
    """The model's device in this process: unchanged in a single-process run; with several processes
    ``cuda`` (or nothing, when CUDA is available) becomes ``cuda:{local_rank}``, nothing without CUDA ``cpu``."""
    if launched_world_size() == 1:
        return requested
    import torch

    current = group(requested)
    if requested in (None, "cuda") and torch.cuda.is_available():
        return f"cuda:{current.local_rank}"
    return requested or "cpu"

"""inspect ``.eval`` logs of our tasks as the ``results.json`` shape of ``medheval run``, so that
``medheval publish --results LOG`` writes the ``.eval_results/*.yaml`` a run folder gives
(:func:`medheval.publish.hub.eval_results_entries`).

What is read from a log (``inspect_ai.log.read_eval_log``):

- the task ``medheval/<benchmark>`` and its task arg ``config`` (the benchmark's default config when absent)
  → the split ``<benchmark>:<config>``;
- the split metrics from the log's results: each inspect metric whose name holds one of our metric
  names and a key (``close_ended_accuracy/accuracy``, ``chair_CHAIR_i``, … any of ``/ . _ :`` between,
  any prefix before) → ``metrics[<metric>][<key>]``; other inspect metrics (a plain mean of the
  per-sample values, its stderr) are listed as not published;
- the mitigation from the model arg ``mitigation`` (``-M mitigation=vcd:alpha=1``), written in its
  full form as ``medheval run`` records it; ``random_weights`` when the ``medheval`` provider marked
  an output as coming from a random-weight model, ``fixture`` when our task marked the split as the
  embedded fixture, and inspect's ``--limit`` (such results are refused, as for run folders, unless
  ``publish`` gets the matching ``--allow-*`` flag: :mod:`medheval.run.provenance`).

Only finished logs (status ``success``) of our tasks are read; anything else raises
:class:`InspectLogError` naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

TASK_PREFIX = "medheval/"
INSTALL_HINT = 'reading inspect .eval logs needs inspect_ai: pip install "medheval[interop]"'


class InspectLogError(ValueError):
    """A log that cannot be published: the message names the file and what to do."""


def inspect_log_paths(path: str | Path) -> list[Path]:
    """The inspect logs ``path`` names: itself when it is a ``.eval`` file, the ``.eval`` files in it when it
    is a folder without a ``results.json`` (a run folder wins), else none."""
    path = Path(path)
    if path.is_file():
        return [path] if path.suffix == ".eval" else []
    if path.is_dir() and not (path / "results.json").is_file():
        return sorted(path.glob("*.eval"))
    return []


def _read_log(path: Path) -> Any:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InspectLogError(f"{path}: {INSTALL_HINT}") from None
    try:
        return read_eval_log(str(path))
    except Exception as error:  # noqa: BLE001 - a damaged or foreign file: name it, keep the cause
        raise InspectLogError(f"{path} is not a readable inspect log: {error}") from error


def split_metric_name(name: str, metrics: Iterable[str]) -> tuple[str, str] | None:
    """``"close_ended_accuracy/accuracy"`` → ``("close_ended_accuracy", "accuracy")``: the longest of our
    ``metrics`` names found in ``name`` (at its start or after a separator), followed by a separator and
    the key; ``None`` when no metric name is there."""
    for metric in sorted(metrics, key=len, reverse=True):
        found = re.search(rf"(?:^|[/._:]){re.escape(metric)}[/._:](?P<key>.+)$", name)
        if found:
            return metric, found.group("key")
    return None


def _split(path: Path, log: Any) -> tuple[str, str]:
    """``(benchmark, config)`` of a log of one of our tasks."""
    from medheval.data.benchmarks import _resolve_config
    from medheval.data.registry import list_units

    task = str(log.eval.task)
    benchmark = task.removeprefix(TASK_PREFIX)
    if not task.startswith(TASK_PREFIX) or benchmark not in list_units("datasets"):
        raise InspectLogError(f"{path}: task {task!r} is not a medheval task (expected medheval/<benchmark>, e.g. "
                              "medheval/cxr_vishal); only logs of `inspect eval medheval/...` can be published")
    try:
        return benchmark, _resolve_config(benchmark, (log.eval.task_args or {}).get("config"))
    except ValueError as error:
        raise InspectLogError(f"{path}: {error}") from None


def _mitigation(path: Path, model_args: dict[str, Any]) -> str:
    from medheval.integrations.inspect.model_args import resolve_mitigation

    try:
        method = resolve_mitigation(model_args.get("mitigation"))
    except ValueError as error:
        raise InspectLogError(f"{path}: {error}") from None
    return method.spec() if method is not None else "none"


def results_from_log(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """One log as one run of ``results.json`` (``settings``, ``labels``, ``benchmarks``) and the names of the
    inspect metrics that map to none of ours (module docstring)."""
    from medheval.data.registry import list_units

    path = Path(path)
    log = _read_log(path)
    if log.status != "success" or log.results is None:
        why = f": {log.error.message}" if getattr(log, "error", None) is not None else ""
        raise InspectLogError(f"{path}: the eval did not finish (status {log.status!r}{why}); finish it (inspect "
                              "eval-retry) and publish the log of the completed eval")
    benchmark, config = _split(path, log)
    known = list_units("metrics")
    metrics: dict[str, dict[str, float]] = {}
    unmapped: list[str] = []
    scored = 0
    for score in log.results.scores:
        scored = max(scored, score.scored_samples or 0)
        for name, value in score.metrics.items():
            parsed = split_metric_name(name, known)
            if parsed is None:
                unmapped.append(f"{score.name}/{name}")
                continue
            metric, key = parsed
            if key in metrics.get(metric, {}):
                raise InspectLogError(f"{path}: two inspect metrics give {metric}/{key}; publish a log whose scorer "
                                      "reports each of our metric values once")
            metrics.setdefault(metric, {})[key] = value.value
    if not metrics:
        raise InspectLogError(f"{path}: none of the log's metrics ({', '.join(unmapped) or 'none'}) is one of ours "
                              "(names like close_ended_accuracy/accuracy); score it with the medheval task's scorer")
    random = any((sample.output.metadata or {}).get("random_weights") for sample in log.samples or [])
    fixture = bool((log.eval.metadata or {}).get("fixture")) or any((sample.metadata or {}).get("fixture")
                                                                    for sample in log.samples or [])
    run = {"settings": {"mitigation": _mitigation(path, dict(log.eval.model_args or {})), "model": log.eval.model,
                        "source": f"inspect log {path.name}", "limit": _limit(log)},
           "labels": {"random_weights": True} if random else {},
           "provenance": {"fixture": fixture, "source_model": log.eval.model},
           "benchmarks": {f"{benchmark}:{config}": {"metrics": metrics,
                                                    "n_scored": scored or log.results.completed_samples,
                                                    **_chosen_samples(log), **_empty_predictions(log)}}}
    return run, unmapped


def _empty_predictions(log: Any) -> dict[str, int]:
    """``{"n_empty_predictions": n}``: the samples whose completion is empty or whitespace, as ``medheval run``
    counts them (:func:`medheval.run.runner.count_empty`); nothing for a log read without its samples."""
    from medheval.run.runner import count_empty

    if not log.samples:
        return {}
    return {"n_empty_predictions": count_empty([{"prediction": sample.output.completion if sample.output else ""}
                                                for sample in log.samples])}


def _chosen_samples(log: Any) -> dict[str, int]:
    """``{"n_chosen_samples": n}`` when the eval ran only the samples named by ``sample_id`` (a part of the
    split, refused by ``medheval publish`` like ``--limit``); nothing for a whole split."""
    chosen = getattr(log.eval.config, "sample_id", None)
    if chosen is None:
        return {}
    return {"n_chosen_samples": len(chosen) if isinstance(chosen, (list, tuple)) else 1}


def _limit(log: Any) -> int | None:
    """inspect's ``--limit`` as a record count (it also takes a range ``start,end``), ``None`` without one."""
    limit = getattr(log.eval.config, "limit", None)
    if isinstance(limit, (list, tuple)) and len(limit) == 2:
        return int(limit[1]) - int(limit[0])
    return int(limit) if isinstance(limit, int) else None


def results_from_logs(paths: Iterable[str | Path]) -> tuple[dict[str, Any], list[str]]:
    """Several logs as ``{"runs": [...]}`` plus warnings; two logs of one split and mitigation are refused
    (which one to publish is the user's choice)."""
    runs, warnings, seen = [], [], {}
    for path in paths:
        run, unmapped = results_from_log(path)
        key = (next(iter(run["benchmarks"])), run["settings"]["mitigation"])
        if key in seen:
            raise InspectLogError(f"{seen[key]} and {path} both hold {key[0]} (mitigation {key[1]}); keep one of "
                                  "them in the folder, or pass the log to publish")
        seen[key] = path
        runs.append(run)
        if unmapped:
            warnings.append(f"{Path(path).name}: inspect metrics not published (not ours): {', '.join(unmapped)}")
    return {"runs": runs}, warnings


__all__ = ["INSTALL_HINT", "InspectLogError", "inspect_log_paths", "results_from_log", "results_from_logs",
           "split_metric_name"]

"""Run tasks beyond "a model answers, metrics score the answers" and the small hooks the runner uses.

* :func:`benchmark_default_metrics` — a benchmark unit may name its own default metrics
  (``DEFAULT_METRICS`` in ``datasets/<name>/<name>.py``; Med-HallMark: MediHall Score + text metrics);
* :func:`detector_options` — ``--detector rule|PATH`` as options of the metrics that take a level source;
* :mod:`medheval.tasks.detection` — ``run_eval --task detection``: a hallucination-level source
  (LLM judge, detector checkpoint, rule classifier) scored against Med-HallMark's human levels.
"""

from __future__ import annotations

from typing import Any, Container

TASKS = ("generate", "detection")


def benchmark_default_metrics(name: str) -> tuple[str, ...] | None:
    """The ``DEFAULT_METRICS`` a benchmark unit declares, or ``None`` (the runner's per-answer-type defaults)."""
    from medheval.registry import load_unit_module

    try:
        module = load_unit_module("datasets", name)
    except KeyError:
        return None
    found = getattr(module, "DEFAULT_METRICS", None)
    return tuple(found) if found else None


def benchmark_protocol(name: str) -> str | None:
    """The ``PROTOCOL`` a benchmark unit declares (``"clinhallu"``: :mod:`medheval.tasks.clinhallu`), or
    ``None`` (one generation per item, scored by metrics)."""
    from medheval.registry import load_unit_module

    try:
        module = load_unit_module("datasets", name)
    except KeyError:
        return None
    return getattr(module, "PROTOCOL", None)


def detector_options(detector: str | None, accepted: Container[str]) -> dict[str, Any]:
    """Metric options for ``--detector``: ``"rule"`` -> ``classifier="rule"``; a folder ->
    ``classifier="detector", detector_path=<folder>``; only for metrics whose ``_compute`` takes them."""
    if not detector or "detector_path" not in accepted:
        return {}
    if detector == "rule":
        return {"classifier": "rule"} if "classifier" in accepted else {}
    # explicit, so that a --judge given for other metrics (sh_judge) does not take over the levels
    return {"detector_path": detector, **({"classifier": "detector"} if "classifier" in accepted else {})}

"""``run_eval --task detection``: score a hallucination-level source against human levels.

Med-HallMark's ``conventional`` and ``counterfactual`` files hold, per item, a Med-VLM answer
(``meta.released_response``) and the level humans gave it (``meta.human_level``). Here the
chosen level source classifies those released answers, exactly as it would classify a model's
answers in a MediHall run (the ``medihall_score`` metric does it), and ``medihall_detection``
compares its levels with the human ones: accuracy, macro F1, Cohen's and quadratic-weighted
kappa, per-level figures, the confusion matrix — overall and per subset (with / without ground
truth in the judge prompt). Level sources: ``--judge`` (any LLM judge), ``--detector PATH`` (a
local detector checkpoint) or ``--detector rule`` (the offline rule classifier, the default).

The counterfactual premise rule of the MediHall Score is *off* here: the source's own level is
what is being evaluated. The rule classifier cannot compare an answer without ground truth, so on
that subset it gives the level a wrong answer to the question would get (``rule_without_reference``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from medheval.data.benchmarks import parse_benchmark_spec, prepare_benchmark
from medheval.run.outputs import OutputLock, atomic_write_text
from medheval.run.predictions_log import jsonl_line
from medheval.run.protocol import (RunError, SplitJob, SplitProtocol, load_metric, metric_kwargs, protocol_for,
                                    safe_options, skipped_undecodable)
from medheval.run.runner import decode_records, record_skipped_undecodable

SUBSETS = {"with_ground_truth": True, "without_ground_truth": False}


def level_source(spec: Any) -> dict[str, Any]:
    """``{"kind": "rule"|"judge"|"detector", ...}`` from the run spec (a judge's secrets never included)."""
    if spec.judge and spec.detector:
        raise RunError("give one level source: --judge or --detector (rule or a checkpoint folder), not both")
    if spec.judge:
        return {"kind": "judge", "judge": safe_options(spec)["judge"]}
    if spec.detector and spec.detector != "rule":
        return {"kind": "detector", "path": str(spec.detector)}
    return {"kind": "rule"}


def _source_options(source: dict[str, Any], spec: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"premise_rule": False}
    if source["kind"] == "judge":
        options.update(classifier="judge", judge=spec.judge)
    elif source["kind"] == "detector":
        options.update(classifier="detector", detector_path=spec.detector)
    else:  # answers without ground truth: the level a wrong answer to the question would get
        options.update(classifier="rule", rule_without_reference=True)
    extra = dict(spec.metric_options.get("medihall_score", {}))
    clash = sorted(set(extra) & {"classifier", "judge", "detector_path", "premise_rule"})
    if clash:
        raise ValueError(f"--metric-option medihall_score.{clash[0]} conflicts with the detection task's level "
                         "source: choose it with --judge / --detector")
    options.update(extra)
    return options


def _human_score(levels: list[str]) -> float | None:
    from medheval.families.med_hallmark import WEIGHTS, medihall_score

    return medihall_score([WEIGHTS[level] for level in levels])


def _labelled(loaded: Any, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The split's records with a human level (a released answer to classify); refuses a split with none."""
    rows = loaded.dataset.to_list() if rows is None else rows
    labelled = [row for row in rows if (row["meta"] or {}).get("human_level")]
    if not labelled:
        raise RunError(f"{loaded.name}:{loaded.config} has no human hallucination levels to compare with; the "
                       "detection task runs on med_hallmark:conventional and med_hallmark:counterfactual")
    return labelled


class DetectionProtocol(SplitProtocol):
    """``--task detection`` (declared by ``datasets/med_hallmark``): no model runs; the level source
    classifies the released answers (``medihall_score``'s levels), scored against the human levels
    (``medihall_detection``)."""

    name = "detection"

    def check(self, benchmark: str, backend: Any, spec: Any) -> None:
        level_source(spec)  # one level source: --judge or --detector, not both

    def prepare(self, loaded: Any, backend: Any, spec: Any) -> list[str]:
        _labelled(loaded)
        return ["medihall_score", "medihall_detection"]

    def run_split(self, job: SplitJob) -> None:
        return None  # nothing to generate: the released answers are what is classified

    def score_split(self, job: SplitJob, generated: None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return detect_split(job.loaded, job.spec, level_source(job.spec), job.warnings)


def _decoded(loaded: Any, labelled: list[dict[str, Any]], spec: Any,
             warnings: list[str]) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """(the labelled records whose images decode, their images) for a judge or detector that looks. A record
    whose image does not decode is skipped and counted with ``--on-missing skip``, as generation does
    (``skipped_undecodable_images``); else it is an error naming it, the file and the fix."""
    def with_progress(load: Any, records: list[dict[str, Any]]) -> Any:
        return map(load, tqdm(records, desc=f"images {loaded.name}:{loaded.config}", unit="item"))

    decoded = decode_records(labelled, loaded.resolver.load_record_images, spec.on_missing == "skip", with_progress)
    record_skipped_undecodable(loaded, decoded.skipped, warnings, during="scoring")
    if not decoded.records:
        raise RunError(f"{loaded.name}:{loaded.config}: every record with a human level was skipped because its "
                       f"image did not decode (--on-missing skip); re-download or replace the image files")
    return decoded.records, decoded.images


def detect_split(loaded: Any, spec: Any, source: dict[str, Any],
                 warnings: list[str] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(results entry, per-item rows) for one loaded split; ``warnings`` collects what the run survived."""
    rows = loaded.dataset.to_list()
    labelled = _labelled(loaded, rows)
    options = _source_options(source, spec)
    if loaded.resolver is not None and source["kind"] != "rule":
        labelled, options["images"] = _decoded(loaded, labelled, spec, [] if warnings is None else warnings)
    scorer = load_metric("medihall_score")
    responses = [row["meta"]["released_response"] for row in labelled]
    levels_out = scorer.compute(predictions=responses, references=[row["answer"] for row in labelled],
                                **metric_kwargs(scorer, labelled, options))
    predicted = levels_out["levels"]
    failures = {entry["id"]: entry["reason"] for entry in levels_out["failed"]}
    human = [row["meta"]["human_level"] for row in labelled]
    ids = [row["id"] for row in labelled]
    detector = load_metric("medihall_detection")

    def stats(keep: list[int]) -> dict[str, Any]:
        out = detector.compute(predictions=[predicted[i] or "" for i in keep], references=[human[i] for i in keep],
                               ids=[ids[i] for i in keep])
        for entry in out["failed"]:
            entry["reason"] = failures.get(entry["id"], "the level source gave no readable level")
        scored = [i for i in keep if predicted[i] is not None]
        out["medihall_score_human"] = _human_score([human[i] for i in scored])
        out["medihall_score_predicted"] = _human_score([predicted[i] for i in scored])
        return out

    everything = list(range(len(labelled)))
    by_subset = {}
    for name, with_gt in SUBSETS.items():
        keep = [i for i in everything if bool(labelled[i]["meta"].get("has_ground_truth")) == with_gt]
        if keep:
            by_subset[name] = {key: value for key, value in stats(keep).items() if key != "failed"}
    entry = {
        "n_records": len(loaded.dataset),
        "n_with_human_level": len(labelled),
        "n_without_human_level": len(loaded.dataset) - len(labelled),
        "skipped_missing_images": {"count": len(loaded.skipped_missing_images),
                                   "examples": [rid for rid, _ in loaded.skipped_missing_images[:20]]},
        **skipped_undecodable(loaded),
        "annotation_files": loaded.files,
        "data_quality": loaded.quality,
        "metrics": {"medihall_detection": stats(everything), "by_subset": by_subset,
                    "level_source": {"classifier": levels_out["classifier"], "judge": levels_out["judge"],
                                     "prompt_version": levels_out["prompt_version"], "usage": levels_out["usage"]}},
    }
    items = [{"id": ids[i], "released_response": responses[i], "reference": labelled[i]["answer"],
              "human_level": human[i], "predicted_level": predicted[i], "reason": levels_out["reasons"][i],
              "failed": failures.get(ids[i])} for i in everything]
    return entry, items


def _fmt(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.3f}"


def detection_markdown(results: dict[str, Any]) -> str:
    """``results.md`` of a detection run: one row per split and subset, then confusion matrices and the
    run's warnings (records skipped for an undecodable image, ...)."""
    from medheval.report.tables import warnings_section

    source = results["settings"]["level_source"]
    parts = ["# MediHall detection results", "",
             f"Level source: `{json.dumps(source, sort_keys=True)}` · scored against Med-HallMark's human levels", "",
             "| Split | Subset | n | Failed | Accuracy | Macro-F1 | Cohen κ | Quadratic κ | MediHall (human) | "
             "MediHall (predicted) |", "|" + "---|" * 10]
    for split, entry in results["benchmarks"].items():
        metrics = entry["metrics"]
        for subset, out in [("all", metrics["medihall_detection"]), *metrics["by_subset"].items()]:
            parts.append("| " + " | ".join([split, subset, str(out["n"]), str(out["n_failed"]), _fmt(out["accuracy"]),
                                            _fmt(out["macro_f1"]), _fmt(out["cohen_kappa"]),
                                            _fmt(out["quadratic_kappa"]), _fmt(out["medihall_score_human"]),
                                            _fmt(out["medihall_score_predicted"])]) + " |")
    notes = [f"- `{split}` · {subset}: κ {out['kappa_note']}" for split, entry in results["benchmarks"].items()
             for subset, out in [("all", entry["metrics"]["medihall_detection"]),
                                 *entry["metrics"]["by_subset"].items()] if out.get("kappa_note")]
    parts += ["", *notes] if notes else []
    for split, entry in results["benchmarks"].items():
        confusion = entry["metrics"]["medihall_detection"]["confusion"]
        parts += ["", f"## `{split}`: confusion (rows = human, columns = predicted)", "",
                  "| human \\ predicted | " + " | ".join(confusion["levels"]) + " |",
                  "|" + "---|" * (len(confusion["levels"]) + 1)]
        parts += ["| " + " | ".join([level, *map(str, row)]) + " |"
                  for level, row in zip(confusion["levels"], confusion["rows"])]
    parts += ["", *warnings_section(results.get("warnings", []))] if results.get("warnings") else []
    return "\n".join(parts) + "\n"


def run_detection(spec: Any) -> dict[str, Any]:
    """Run the detection task for every benchmark of ``spec``; writes results.json/results.md/scored.jsonl."""
    from medheval.versions import stack_versions

    source = level_source(spec)
    output = Path(spec.output)
    output.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"settings": {"task": "detection", "level_source": source, "limit": spec.limit,
                                            "benchmarks": list(spec.benchmarks)},
                               "versions": stack_versions(), "benchmarks": {}, "warnings": []}
    scored: list[dict[str, Any]] = []
    with OutputLock(output, timeout=spec.lock_timeout):
        for benchmark_spec in spec.benchmarks:
            name, config = parse_benchmark_spec(benchmark_spec)
            protocol = protocol_for(name, "detection")
            if protocol is None:
                raise RunError(f"benchmark {name} has no detection task: it runs on med_hallmark:conventional and "
                               "med_hallmark:counterfactual (released answers with human hallucination levels)")
            protocol.check(name, None, spec)
            loaded = prepare_benchmark(name, config, data_dir=spec.data_dir,
                                       image_roots=spec.image_roots if source["kind"] != "rule" else None,
                                       on_missing=spec.on_missing, limit=spec.limit)
            job = SplitJob(loaded, None, spec, output, protocol.prepare(loaded, None, spec), {}, results["warnings"])
            entry, items = protocol.score_split(job, protocol.run_split(job))
            results["benchmarks"][job.split] = entry
            scored.extend(items)
        atomic_write_text(output / "scored.jsonl", "".join(jsonl_line(item) for item in scored))
        atomic_write_text(output / "results.json", json.dumps(results, indent=2, sort_keys=True, default=str))
        atomic_write_text(output / "results.md", detection_markdown(results))
    return results

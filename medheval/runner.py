"""benchmark -> backend -> ``predictions.jsonl`` (append-only, resumable) -> metrics -> results.

One output folder holds one run: ``predictions.jsonl`` (all benchmarks, keyed by
(id, model, mitigation)), ``run.json`` (the settings the predictions were made with; a resumed
run must match them), ``scored.jsonl`` (per-item correctness), ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import platform
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from tqdm.auto import tqdm

from medheval import __version__
from medheval.backends.base import Backend, BackendError
from medheval.benchmarks import LoadedBenchmark, parse_benchmark_spec, prepare_benchmark
from medheval.prompts import describe_templates
from medheval.predictions_log import LogWriter, log_key, read_log
from medheval.registry import list_units, metric_path

CLOSE_ENDED_TYPES = frozenset({"yes_no", "multiple_choice"})
# Metrics computed when --metrics is not given: the ones that run offline with no weights to download.
# Model-backed ones (chexbert_similarity, radgraph_f1, ratescore) and judges are opt-in (--metrics, --judge).
DEFAULT_METRICS = {
    "close": ("close_ended_accuracy",),
    "report": ("chair", "text_generation"),
    "open": ("text_generation",),
    "statement": ("stepbench",),  # Med-StepBench statement verification
}
JUDGE_METRIC_FOR = {"open": "sh_judge"}  # added to the defaults when --judge is given


class RunError(RuntimeError):
    """A run cannot proceed; the message says what to change."""


@dataclass
class RunSpec:
    """What to run: benchmark specs (``name`` or ``name:config``) and where inputs come from."""

    benchmarks: Sequence[str]
    output: str | Path
    data_dir: str | Path | None = None
    image_roots: Mapping[str, Any] | None = None
    on_missing: str = "error"
    metrics: Sequence[str] | None = None  # None: the defaults for each split's answer types
    limit: int | None = None
    mitigation: str = "none"
    allow_missing_predictions: bool = False
    upstream_compat: bool = False  # score close-ended items exactly as MedHEval's released scorer
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # {metric: {option: value}}
    judge: str | dict | None = None  # LLM judge spec for the metrics that take one (``backend:model[@base_url]``)
    labels: dict[str, str] = field(default_factory=dict)  # extra labels for the report (e.g. random weights)
    # per-benchmark run options, e.g. {"med_stepbench": {"knowledge": "prior"}} (recorded in results)
    benchmark_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _versions() -> dict[str, str]:
    import datasets
    import evaluate
    import transformers

    versions = {"medheval": __version__, "python": platform.python_version(), "datasets": datasets.__version__,
                "evaluate": evaluate.__version__, "transformers": transformers.__version__}
    try:
        import torch

        versions["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return versions


def _check_run_settings(output: Path, settings: dict[str, Any]) -> None:
    """Refuse to resume into a folder whose predictions were made with other settings."""
    path = output / "run.json"
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != settings:
            changed = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
            raise RunError(
                f"{output} holds predictions made with different settings (changed: {', '.join(changed)}). "
                f"Resume with the same settings, or choose a new --output folder."
            )
    else:
        output.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2, sort_keys=True))


def _metric_names(loaded: LoadedBenchmark, requested: Sequence[str] | None, judge: Any = None) -> list[str]:
    """The requested metrics (checked), or the defaults for the split's answer types."""
    if requested is not None:
        available = list_units("metrics")
        unknown = [name for name in requested if name not in available]
        if unknown:
            raise RunError(f"unknown metric(s) {unknown}; available: {', '.join(available)}")
        return list(requested)
    answer_types = set(loaded.dataset.unique("answer_type"))
    kind = "close" if answer_types <= CLOSE_ENDED_TYPES else "report" if answer_types == {"report"} else "open"
    kind = "statement" if answer_types == {"statement"} else kind
    names = list(DEFAULT_METRICS[kind])
    if judge and kind in JUDGE_METRIC_FOR:
        names.append(JUDGE_METRIC_FOR[kind])
    return names


def _record_batches(loaded: LoadedBenchmark, indices: list[int], batch_size: int,
                    pool: ThreadPoolExecutor) -> Iterator[tuple[list[dict], list[list[Any]]]]:
    """Batches of (records, their images); the next batch's images load while the current one runs."""

    def load(chunk: list[int]) -> tuple[list[dict], list[list[Any]]]:
        batch = loaded.dataset[chunk]
        records = [dict(zip(batch.keys(), values)) for values in zip(*batch.values())]
        if loaded.resolver is None:
            return records, [[] for _ in records]
        return records, list(pool.map(loaded.resolver.load_record_images, records))

    chunks = [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]
    pending = pool.submit(load, chunks[0]) if chunks else None
    for position in range(len(chunks)):
        current = pending.result()
        pending = pool.submit(load, chunks[position + 1]) if position + 1 < len(chunks) else None
        yield current


def generate_predictions(loaded: LoadedBenchmark, backend: Backend, writer: LogWriter,
                         done: set[tuple[str, str, str]], mitigation: str, batch_size: int) -> int:
    """Generate for every record not yet in the log; returns how many were generated now."""
    ids = loaded.dataset["id"]
    todo = [index for index, rid in enumerate(ids) if (rid, backend.name, mitigation) not in done]
    generated = 0
    with tqdm(total=len(ids), initial=len(ids) - len(todo), desc=f"{loaded.name}:{loaded.config}",
              unit="item") as bar, ThreadPoolExecutor(max_workers=8) as pool:
        for records, images in _record_batches(loaded, todo, batch_size, pool):
            began = time.perf_counter()
            outputs = backend.generate(records, images)
            seconds = (time.perf_counter() - began) / max(len(records), 1)
            if len(outputs) != len(records):
                raise BackendError(f"backend {backend.name} returned {len(outputs)} outputs for {len(records)} records")
            for record, prediction in zip(records, outputs):
                writer.write({"id": record["id"], "prediction": prediction, "model": backend.name,
                              "mitigation": mitigation, "seconds": round(seconds, 6)})
            generated += len(records)
            bar.update(len(records))
    return generated


# Record fields a metric receives when its ``_compute`` names them (one value per scored record).
RECORD_INPUTS: dict[str, Callable[[dict], Any]] = {
    "ids": lambda row: row["id"],
    "questions": lambda row: row["question"],
    "answer_types": lambda row: row["answer_type"],
    "choices": lambda row: row["choices"],
    "raw_choices": lambda row: (row["meta"] or {}).get("raw_choices") or "",
    "categories": lambda row: row["category"],
    "sources": lambda row: row["source"],
    "credentialed": lambda row: bool((row["meta"] or {}).get("credentialed")),
    "steps": lambda row: (row["meta"] or {}).get("step"),
    "languages": lambda row: (row["meta"] or {}).get("language"),
}


def metric_kwargs(metric: Any, rows: list[dict], options: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``metric.compute`` beyond predictions/references: the record fields and
    options its ``_compute`` signature names. An option it does not accept is an error."""
    accepted = inspect.signature(metric._compute).parameters
    kwargs = {name: [field(row) for row in rows] for name, field in RECORD_INPUTS.items() if name in accepted}
    for key, value in options.items():
        if key not in accepted:
            raise RunError(f"metric {metric.name!r} takes no option {key!r}; it accepts: "
                           + ", ".join(p for p in accepted if p not in ("self", "predictions", "references")))
        kwargs[key] = value
    return kwargs


def score(loaded: LoadedBenchmark, predictions: Mapping[str, str], metric_names: Sequence[str],
          options: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict, list[dict]]:
    """Run the metrics on the records that have a prediction; returns (results, per-item rows).

    ``options[metric_name]`` holds that metric's options (e.g. ``{"close_ended_accuracy":
    {"upstream_compat": True}}``). List outputs with one entry per record (``correct``, ``scores`` …)
    move from the summary to the per-item rows."""
    rows = [row for row in loaded.dataset.to_list() if row["id"] in predictions]
    results: dict[str, Any] = {}
    per_item = [{"id": row["id"], "prediction": predictions[row["id"]], "reference": row["answer"]} for row in rows]
    if not rows:
        return results, per_item
    for name in metric_names:
        metric = _load_metric(name)
        out = metric.compute(predictions=[predictions[row["id"]] for row in rows],
                             references=[row["answer"] for row in rows],
                             **metric_kwargs(metric, rows, (options or {}).get(name, {})))
        for key in [k for k, v in out.items() if isinstance(v, list) and len(v) == len(rows)]:
            for item, value in zip(per_item, out.pop(key)):
                item[key if key not in item else f"{name}.{key}"] = value
        if name == "close_ended_accuracy":
            out["accuracy_by_source"] = _accuracy_by(rows, per_item, "source")
        results[name] = out
    return results, per_item


@functools.lru_cache(maxsize=None)
def _load_metric(name: str) -> Any:
    """Each metric module is loaded once per process, however many splits use it."""
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    return evaluate.load(metric_path(name))


def _accuracy_by(rows: list[dict], items: list[dict], key: str) -> dict[str, float]:
    totals: dict[str, list[int]] = {}
    for row, item in zip(rows, items):
        if item.get("correct") is None:  # skipped by the upstream-compatible scorer
            continue
        tally = totals.setdefault(row[key], [0, 0])
        tally[0] += bool(item.get("correct"))
        tally[1] += 1
    return {name: hits / n for name, (hits, n) in sorted(totals.items())}


def _options_for(spec: RunSpec, metric_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-metric options: ``--metric-option name.key=value`` plus the run-wide switches."""
    options = {name: dict(spec.metric_options.get(name, {})) for name in metric_names}
    for name in metric_names:
        accepted = inspect.signature(_load_metric(name)._compute).parameters
        if spec.upstream_compat and "upstream_compat" in accepted:
            options[name].setdefault("upstream_compat", True)
        if spec.judge and "judge" in accepted:
            options[name].setdefault("judge", spec.judge)
    unused = sorted(set(spec.metric_options) - set(metric_names))
    if unused:
        raise RunError(f"--metric-option given for metric(s) {unused} that this run does not compute "
                       f"(it computes: {', '.join(metric_names) or 'none'})")
    return options


def _safe_options(spec: RunSpec) -> dict[str, Any]:
    """Metric options as recorded in results: secrets (``api_key`` …) never leave the process."""
    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ("<redacted>" if "key" in k.lower() or "secret" in k.lower() or "password" in k.lower()
                        else clean(v)) for k, v in value.items()}
        if isinstance(value, str):
            return re.sub(r"//[^/@\s]+@", "//", value)  # user:password@ in a URL
        return value

    judge = clean(spec.judge)
    return {"metric_options": clean(spec.metric_options), "judge": judge}


def _predictions_backend_check(loaded: LoadedBenchmark, backend: Any, allow_missing: bool) -> LoadedBenchmark:
    """Compare a predictions file's ids with the split; report mismatches clearly."""
    missing, extra = backend.check_against(loaded.dataset["id"])
    prefix = f"{loaded.name}/{loaded.config}/"
    extra = [rid for rid in extra if rid.startswith(f"{loaded.name}/")]
    if missing and not allow_missing:
        raise RunError(
            f"{len(missing)} record(s) of {loaded.name}:{loaded.config} have no prediction in {backend.path} "
            f"(first: {missing[:10]}). Ids look like {prefix}<qid>. Pass --allow-missing-predictions to score "
            f"only the records present (the others are counted as missing)."
        )
    if missing:
        keep = set(loaded.dataset["id"]) - set(missing)
        loaded.dataset = loaded.dataset.filter(lambda row: row["id"] in keep)
    loaded.quality["missing_predictions"] = len(missing)
    loaded.quality["unknown_prediction_ids"] = extra[:20]
    return loaded


def run(spec: RunSpec, backend: Backend, batch_size: int = 8) -> dict[str, Any]:
    """Run every benchmark of ``spec`` with ``backend``; writes and returns ``results.json``'s content."""
    from medheval.report.tables import write_markdown

    output = Path(spec.output)
    settings = {"model": backend.name, "mitigation": spec.mitigation, "backend": backend.settings(),
                "limit": spec.limit, "benchmarks": list(spec.benchmarks)}
    if spec.benchmark_options:  # prompts depend on them: a resumed run must use the same
        settings["benchmark_options"] = spec.benchmark_options
        unknown = sorted(set(spec.benchmark_options) - {parse_benchmark_spec(b)[0] for b in spec.benchmarks})
        if unknown:
            raise RunError(f"--benchmark-option given for benchmark(s) {unknown} that this run does not include")
    _check_run_settings(output, settings)
    log_path = output / "predictions.jsonl"
    entries = read_log(log_path)
    done = {log_key(entry) for entry in entries}
    results: dict[str, Any] = {"settings": settings, "versions": _versions(), "labels": dict(spec.labels),
                               "prompts": describe_templates(), "scoring": {"upstream_compat": spec.upstream_compat,
                                                                         **_safe_options(spec)},
                               "benchmarks": {}}
    scored: list[dict[str, Any]] = []
    with LogWriter(log_path) as writer:
        for benchmark_spec in spec.benchmarks:
            name, config = parse_benchmark_spec(benchmark_spec)
            loaded = prepare_benchmark(name, config, data_dir=spec.data_dir,
                                       image_roots=spec.image_roots if backend.needs_images else None,
                                       on_missing=spec.on_missing, limit=spec.limit,
                                       run_options=spec.benchmark_options.get(name, {}))
            if backend.needs_images and not spec.image_roots:
                sources = sorted(set(loaded.dataset["source"]))
                raise RunError(f"model {backend.name} needs images; pass --image-root for: "
                               + ", ".join(f"{source}=PATH" for source in sources))
            if hasattr(backend, "check_against"):
                loaded = _predictions_backend_check(loaded, backend, spec.allow_missing_predictions)
            metric_names = _metric_names(loaded, spec.metrics, spec.judge)
            generated = generate_predictions(loaded, backend, writer, done, spec.mitigation, batch_size)
            entries_now = read_log(log_path, repair=False) if generated else entries
            predictions = {entry["id"]: entry["prediction"] for entry in entries_now
                           if entry.get("model") == backend.name and entry.get("mitigation", "none") == spec.mitigation}
            metric_results, per_item = score(loaded, predictions, metric_names, _options_for(spec, metric_names))
            scored.extend({**item, "model": backend.name, "mitigation": spec.mitigation} for item in per_item)
            results["benchmarks"][f"{loaded.name}:{loaded.config}"] = {
                "n_records": len(loaded.dataset),
                "n_scored": len(per_item),
                "generated_this_run": generated,
                "skipped_missing_images": {"count": len(loaded.skipped_missing_images),
                                           "examples": [rid for rid, _ in loaded.skipped_missing_images[:20]]},
                "annotation_files": loaded.files,
                "image_roots": loaded.resolver.describe() if loaded.resolver else {},
                "data_quality": loaded.quality,
                "metrics": metric_results,
                **({"run_options": loaded.run_options} if loaded.run_options else {}),
            }
            entries = entries_now
    with open(output / "scored.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in scored)
    (output / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
    write_markdown(results, output / "results.md")
    return results


def mitigation_slug(spec: str) -> str:
    """A folder name for one mitigation spec (``vcd:alpha=1`` -> ``vcd_alpha-1``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", spec.replace("=", "-")).strip("_") or "none"


def run_grid(spec: RunSpec, backend: Backend, mitigations: Sequence[str], batch_size: int = 8) -> dict[str, Any]:
    """Run ``spec`` once per mitigation (``none`` = plain decoding), side by side like MedHEval's Table 4.

    One mitigation writes straight into ``spec.output``; several write one sub-folder each
    (``<output>/<mitigation>/``, each resumable on its own) plus a combined ``results.md``/``results.json``.
    """
    import copy
    import dataclasses

    from medheval.mitigations import get_mitigation
    from medheval.report.tables import write_grid_markdown

    methods = [(text, get_mitigation(text)) for text in mitigations] or [("none", None)]
    if not backend.needs_images and any(method is not None for _, method in methods):
        raise RunError("--mitigation needs a model (--model): a predictions file was decoded elsewhere")
    runs = []
    for text, method in methods:
        label = method.spec() if method is not None else "none"
        variant = backend
        if method is not None:
            variant = copy.copy(backend)
            variant.generate_kwargs = {**getattr(backend, "generate_kwargs", {}), "custom_generate": method}
        output = spec.output if len(methods) == 1 else Path(spec.output) / mitigation_slug(label)
        runs.append(run(dataclasses.replace(spec, output=output, mitigation=label), variant, batch_size=batch_size))
    if len(methods) > 1:
        combined = {"runs": runs}
        (Path(spec.output) / "results.json").write_text(json.dumps(combined, indent=2, sort_keys=True, default=str))
        write_grid_markdown(runs, Path(spec.output) / "results.md")
    return runs[0] if len(runs) == 1 else {"runs": runs}

"""benchmark -> backend -> ``predictions.jsonl`` (append-only, resumable) -> metrics -> results.

One output folder holds one run: ``predictions.jsonl`` (all benchmarks, keyed by
(id, model, mitigation, image control: :mod:`medheval.run.control`)), ``run.json`` (the settings the predictions were made with, which a resumed
run must match, and under ``"versions"`` the software stack they were first made with, which a resumed
run only warns about), ``scored.jsonl`` (per-item correctness), ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from tqdm.auto import tqdm

from medheval.backends.base import Backend, BackendError
from medheval.data.benchmarks import LoadedBenchmark, parse_benchmark_spec, prepare_benchmark, split_id_prefixes
from medheval.data.images import ImageDecodeError
from medheval.run.control import Control, ControlError, check_control
from medheval.run.distributed import group as process_group
from medheval.run.distributed import launched_rank, shard_batches
# mitigation_slug lives in grid_plan now; it is still imported from here
from medheval.run.grid_plan import PlannedCell, cell_folder, changes, mitigation_slug, record_plan  # noqa: F401
from medheval.run.options import did_you_mean
from medheval.run.generation import GenerationPlan, generate_with, group_by_settings, rendered_prompt, settings_for
from medheval.scoring.metric_options import check_options, compute_parameters, takes
from medheval.run.outputs import atomic_write_text, open_owned
from medheval.run.prompts import describe_templates
from medheval.run.predictions_log import LogWriter, jsonl_line, log_key, read_log
from medheval.run import provenance as run_provenance
from medheval.data.registry import list_units, unit_dir
from medheval.net.secrets import redact, register_urls_in
from medheval.run.protocol import (
    RECORD_INPUTS,
    RunError,
    SplitJob,
    SplitProtocol,
    add_clusters,
    benchmark_default_metrics,
    detector_options,
    load_metric,
    metric_kwargs,
    protocol_for,
    record_credentialed,
    safe_options,
    split_entry,
)
from medheval.versions import changed_output_packages, stack_versions, warn_if_newer_than_tested

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
    # score with MedHEval's released scorers (close-ended rules, text cleaning …); None: the protocol's choice
    # (run_grid: True under the MedHEval paper protocols, False under clean)
    upstream_compat: bool | None = None
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # {metric: {option: value}}
    judge: str | dict | None = None  # LLM judge spec for the metrics that take one (``backend:model[@base_url]``)
    labels: dict[str, str] = field(default_factory=dict)  # extra labels for the report (e.g. random weights)
    allow_remote_credentialed: Sequence[str] = ()  # judge endpoints approved for credentialed data (host/URL)
    lock_timeout: float = 0.0  # seconds to wait for another run holding the output folder (0: refuse at once)
    detector: str | None = None  # MediHall level source: "rule" or a local detector folder (medheval.run.protocol)
    # per-benchmark run options, e.g. {"med_stepbench": {"knowledge": "prior"}} (recorded in results)
    benchmark_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # generation settings per benchmark / answer type (medheval.run.generation); None: the backend's own for all
    generation: GenerationPlan | None = None
    report_cluster: str = "auto"  # report.html's intervals: each split's declared cluster unit, or "none" (items)
    compare_published: bool = False  # report.html's Reproduction table (the papers' published cells beside the run's)
    # image-blind control (medheval.run.control): none, no_image, blank or noise; noise is drawn from control_seed
    control: str = "none"
    control_seed: int = 0
    seed: int | None = None  # the sampling seed of one pass of --seeds (medheval.run.seeds); recorded as settings.seed
    # paper protocol (medheval.run.paper_protocols): what the model receives and how it decodes; "clean" = ours.
    # run_grid (the entry of `medheval run` and of grids) applies it to the backend and the generation plan;
    # run() alone only records it
    protocol: str = "clean"
    # False: the user did not choose --protocol, so a re-score adopts the protocol its answers were made under
    protocol_given: bool = True
    chat_template: str | None = None  # --chat-template: a named conversation template, beats the protocol's

    def __post_init__(self) -> None:
        # a judge spec's ?api-key= or password, and secret-named fields of a dict spec, are redacted from
        # everything the run writes, even when no metric builds the judge
        register_urls_in([self.judge, list(self.allow_remote_credentialed or ())])

    @property
    def image_control(self) -> Control:
        """The :class:`medheval.run.control.Control` of this run."""
        return Control(self.control, self.control_seed)


def _check_run_settings(output: Path, settings: dict[str, Any], versions: Mapping[str, str | None],
                        warnings: list[str]) -> None:
    """Refuse to resume into a folder whose predictions were made with other settings; warn when they were
    made with another transformers or torch (``run.json["versions"]``: a finished prediction stays valid) or at
    another batch size (``--batch-size``: a run that ran out of memory resumes at a smaller one).
    A new folder's run.json gets the settings and ``versions``; an existing one is never rewritten (a
    folder from before versions were recorded keeps none, as its predictions' stack is unknown)."""
    path = output / "run.json"
    if path.exists():
        previous = json.loads(path.read_text())
        recorded_versions = previous.pop("versions", None)
        recorded = previous.get("backend", {}) if isinstance(previous.get("backend"), dict) else {}
        previous.setdefault("protocol", {"name": "clean"})  # folders from before protocols were recorded
        before_name = (previous.get("protocol") or {}).get("name")
        after_name = (settings.get("protocol") or {}).get("name")
        if before_name != after_name:
            raise RunError(f"{output} holds predictions made under protocol {before_name!r}; this run asks for "
                           f"protocol {after_name!r}. Resume with --protocol {before_name}, or choose a new --output "
                           f"folder.")
        if isinstance(recorded.get("device"), str):  # folders of earlier versions hold a data-parallel "cuda:N"
            recorded["device"] = recorded["device"].split(":")[0]
        if run_provenance.is_rescore(recorded) and isinstance(recorded.get("path"), str):
            recorded["path"] = str(Path(recorded["path"]).resolve())  # earlier versions kept the path as typed
        batch_before, batch_after = recorded.get("batch_size"), (settings.get("backend") or {}).get("batch_size")
        resized = "batch_size" in recorded and batch_after is not None and batch_before != batch_after
        if resized:  # how records are grouped, not what they are asked: a run out of memory resumes at a smaller batch
            recorded["batch_size"] = batch_after
        if previous != settings:
            before, after = _flatten(previous), _flatten(settings)
            changed = [f"{key} {json.dumps(before.get(key, '<unset>'))} → {json.dumps(after.get(key, '<unset>'))}"
                       for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
            raise RunError(
                f"{output} holds predictions made with different settings (changed: {'; '.join(changed)}). "
                f"Resume with the same settings, or choose a new --output folder."
            )
        if resized:  # noted: rows decoded in other batches may round differently
            _warn(warnings, f"resuming {output} made at batch size {batch_before}; this run uses {batch_after}: the "
                            f"records generated now are batched differently (in bfloat16/float16 a row's greedy "
                            f"tokens can change where rounding depends on its batch)")
        if isinstance(recorded_versions, Mapping):
            for package, old, new in changed_output_packages(recorded_versions, versions):
                _warn(warnings, f"resuming {output} made with {package} {old}; this process runs {package} {new}: "
                                f"outputs may differ from the earlier predictions")
    else:
        atomic_write_text(path, json.dumps({**settings, "versions": dict(versions)}, indent=2, sort_keys=True))


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"backend": {"max_new_tokens": 8}}`` -> ``{"backend.max_new_tokens": 8}`` (names a changed setting)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _metric_names(loaded: LoadedBenchmark, requested: Sequence[str] | None, judge: Any = None) -> list[str]:
    """The requested metrics (checked), or the defaults for the split's answer types."""
    unit_defaults = benchmark_default_metrics(loaded.name)
    if requested is None and unit_defaults:
        return list(unit_defaults)
    if requested is not None:
        available = list_units("metrics")
        unknown = [name for name in requested if name not in available]
        if unknown:
            hint = did_you_mean(unknown[0], available)
            raise RunError(f"unknown metric(s) {unknown}{hint}; available: {', '.join(available)}")
        return list(requested)
    answer_types = set(loaded.dataset.unique("answer_type"))
    kind = "close" if answer_types <= CLOSE_ENDED_TYPES else "report" if answer_types == {"report"} else "open"
    kind = "statement" if answer_types == {"statement"} else kind
    names = list(DEFAULT_METRICS[kind])
    if judge and kind in JUDGE_METRIC_FOR:
        names.append(JUDGE_METRIC_FOR[kind])
    return names


class SkippedRecord(NamedTuple):
    """A record left out of its batch because one of its images does not decode (``--on-missing skip``)."""

    record_id: str
    ref: str
    reason: str


class RecordBatch(NamedTuple):
    """One batch ready for the model: the records kept, their images, and the records skipped from it."""

    records: list[dict]
    images: list[list[Any]]
    skipped: list[SkippedRecord]


def _decoded_or_error(load_images: Callable[[dict], list[Any]], record: dict) -> list[Any] | ImageDecodeError:
    """The record's images, or the :class:`ImageDecodeError` one of them raised (its batch decides what to do)."""
    try:
        return load_images(record)
    except ImageDecodeError as error:
        return error


def undecodable_error(error: ImageDecodeError, record_id: str) -> ImageDecodeError:
    """``error`` naming the record, the image file and what to do (``--on-missing error``, the default)."""
    named = str(error) if getattr(error, "record_ids", None) else f"record {record_id!r}: {error}"
    if error.location and error.location not in named:
        named += f" File: {error.location}."
    found = ImageDecodeError(
        f"{named} To fix: re-download or replace the file (a download cut short leaves a file whose header is valid "
        f"and whose data is missing), or pass --on-missing skip (Python: on_missing=\"skip\") to leave such records "
        f"out and count them in results.json (skipped_undecodable_images).", error.ref, error.source, error.location)
    found.record_ids = [record_id]
    return found


def decode_records(records: Sequence[dict], load_images: Callable[[dict], list[Any]], skip: bool,
                   map_fn: Callable[..., Iterable[Any]] = map) -> RecordBatch:
    """Decode every record's images (``load_images``, through ``map_fn``: e.g. a thread pool's ``map``): the
    records whose images decode, their images, and, with ``skip`` (``--on-missing skip``), the records whose
    image does not decode in full (a file cut short after a valid header passes the up-front header check);
    without ``skip`` the first such record is an error naming it, the file and what to do
    (:func:`undecodable_error`). Every path that decodes a split's images mid-run goes through here, and
    :func:`record_skipped_undecodable` counts what it skipped."""
    batch = RecordBatch([], [], [])
    decoded = list(map_fn(lambda record: _decoded_or_error(load_images, record), records))
    for record, images in zip(records, decoded):
        if not isinstance(images, ImageDecodeError):
            batch.records.append(record)
            batch.images.append(images)
        elif skip:
            batch.skipped.append(SkippedRecord(str(record["id"]), images.ref or "", str(images)))
        else:
            raise undecodable_error(images, str(record["id"]))
    return batch


def _record_batches(loaded: LoadedBenchmark, indices: list[int], batch_size: int, pool: ThreadPoolExecutor,
                    volumes: bool = False, control: Control = Control(),
                    skip_undecodable: bool = False) -> Iterator[RecordBatch]:
    """Batches of (records, their images, records skipped); the next batch's images load while the current one
    runs. Each image is decoded once, here: a record whose image does not decode (a file cut short after a valid
    header passes the up-front header check) is left out of its batch with ``skip_undecodable``, else it is an
    error naming the record, the file and what to do (:func:`undecodable_error`).
    With ``volumes`` each record also carries ``"volumes"`` ({name: 3D array}) for a 3D-capable backend.
    ``control`` replaces the images and volumes (:mod:`medheval.run.control`; ``no_image`` reads none)."""
    load_images = control.loader(loaded.resolver.load_record_images if loaded.resolver is not None else None)
    read_volumes = control.volume_loader(loaded.volume_reader) if volumes else None

    def load(chunk: list[int]) -> RecordBatch:
        batch = loaded.dataset[chunk]
        records = [dict(zip(batch.keys(), values)) for values in zip(*batch.values())]
        if load_images is None:
            kept = RecordBatch(records, [[] for _ in records], [])
        else:
            kept = decode_records(records, load_images, skip_undecodable, pool.map)
        if read_volumes is not None:
            for record in kept.records:
                record["volumes"] = read_volumes(record)
        return kept

    chunks = [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]
    pending = pool.submit(load, chunks[0]) if chunks else None
    for position in range(len(chunks)):
        current = pending.result()
        pending = pool.submit(load, chunks[position + 1]) if position + 1 < len(chunks) else None
        yield current


def generate_predictions(loaded: LoadedBenchmark, backend: Backend, writer: LogWriter,
                         done: set[tuple[str, str, str, str]], mitigation: str, batch_size: int,
                         generation: GenerationPlan | None = None, shard: tuple[int, int] = (0, 1),
                         control: Control = Control(), provenance: Mapping[str, Any] | None = None,
                         skipped: list[SkippedRecord] | None = None) -> int:
    """Generate for every record not yet in the log; returns how many were generated now. Every secret the
    run holds (API keys, passwords: :func:`medheval.net.secrets.register_secrets`) is redacted from the
    predictions, which a server may have echoed it into. Each log entry records the rendered prompt (when the backend has ``format_prompt``; a re-score: the one its
    answer recorded) and the generation settings.
    ``shard=(rank, world_size)``: only this process's batches (:func:`medheval.run.distributed.shard_batches`).
    ``control``: the images the model gets instead (:mod:`medheval.run.control`); a blind entry records it.
    ``provenance``: written into every entry when it is not a clean full run (:mod:`medheval.run.provenance`).
    ``skipped``: a list that collects the records whose image does not decode (``--on-missing skip``): they are
    left out of their batch, the others answer as they would without them; ``None``: such an image is an error
    naming the record. A skipped record gets no log entry, so a resumed run tries it again."""
    ids = loaded.dataset["id"]
    carried = run_provenance.for_log(provenance or {})
    todo = [index for index, rid in enumerate(ids) if (rid, backend.name, mitigation, control.kind) not in done]
    plan_for = settings_for(generation, loaded.name, loaded.config)
    if generation is not None:  # stable sort: one setting per batch where possible
        answer_types = loaded.dataset["answer_type"]
        todo.sort(key=lambda index: json.dumps(plan_for(answer_types[index]), sort_keys=True))
    todo = shard_batches(todo, batch_size, *shard)
    volumes = bool(getattr(backend, "needs_volumes", False))
    if volumes and loaded.volume_reader is None:
        raise RunError(f"model {backend.name} reads 3D volumes, and {loaded.name} has none (Med-StepBench does)")
    blind = {"control": control.kind} if control.blind else {}
    generated = 0
    with tqdm(total=len(ids), initial=len(ids) - len(todo), desc=f"{loaded.name}:{loaded.config}",
              unit="item") as bar, ThreadPoolExecutor(max_workers=8) as pool:
        for records, images, left_out in _record_batches(loaded, todo, batch_size, pool, volumes, control,
                                                         skip_undecodable=skipped is not None):
            if skipped is not None:
                skipped.extend(left_out)
            for group, group_images, settings in group_by_settings(records, images, plan_for):
                began = time.perf_counter()
                outputs, used = generate_with(backend, group, group_images, settings)
                seconds = (time.perf_counter() - began) / max(len(group), 1)
                if len(outputs) != len(group):
                    raise BackendError(f"backend {backend.name} returned {len(outputs)} outputs for {len(group)} records")
                for record, record_images, prediction in zip(group, group_images, outputs):
                    writer.write({"id": record["id"], "prediction": redact(prediction), "model": backend.name,
                                  "mitigation": mitigation, **blind, "seconds": round(seconds, 6), "generation": used,
                                  **rendered_prompt(backend, record, record_images), **carried})
            generated += len(records)
            bar.update(len(records) + len(left_out))
    return generated


# what re-running the same command does for records skipped during a phase (a phase without: nothing to say)
RESUMED_BY_PHASE = {"generation": ": it answers only the records left out",
                    "judging": ": it judges only the records left out (their answers are kept)"}


def record_skipped_undecodable(loaded: LoadedBenchmark, skipped: Sequence[SkippedRecord], warnings: list[str],
                               during: str = "generation") -> None:
    """Count the records :func:`decode_records` skipped (during ``generation``, ``judging`` for a task that judges
    its generations (ClinHallu), or ``scoring`` for a task that generates nothing) for an image that did not decode with those the up-front check skipped
    (``loaded.skipped_undecodable_images``, once per record), take them out of the split (as an up-front skip
    does: ``n_records`` and the scores leave them out) and say so on the console and in results.
    Nothing is logged for them, so a resumed run tries them again and counts them again only if they
    still fail: each run's count is that run's, never doubled."""
    counted = {rid for rid, _ in loaded.skipped_undecodable_images}
    new = list({record.record_id: record for record in skipped if record.record_id not in counted}.values())
    if not new:
        return
    loaded.skipped_undecodable_images.extend((record.record_id, record.ref) for record in new)
    gone = {record.record_id for record in new}
    loaded.dataset = loaded.dataset.select([index for index, rid in enumerate(loaded.dataset["id"]) if rid not in gone])
    first = new[0]
    resumes = RESUMED_BY_PHASE.get(during, "")
    _warn(warnings, f"{loaded.name}:{loaded.config}: {len(new)} record(s) skipped during {during} because an "
                    f"image did not decode (--on-missing skip; counted in skipped_undecodable_images). First: "
                    f"{first.reason} Re-download or replace the file(s), then re-run the same command{resumes}")


def _images_without_reference(loaded: LoadedBenchmark, rows: list[dict], skip: bool,
                              warnings: list[str]) -> tuple[list[dict], list[list | None]]:
    """(the rows kept, their images) for a metric that takes images (an LLM judge of Med-HallMark's
    reference-free items): a record with no reference answer can only be judged by looking, so its images
    are decoded (:func:`decode_records`: one that does not decode is skipped and counted with ``skip``, else
    an error naming it); every other record gets ``None`` (nothing decoded)."""
    looking = decode_records([row for row in rows if not str(row["answer"] or "").strip()],
                             loaded.resolver.load_record_images, skip)
    record_skipped_undecodable(loaded, looking.skipped, warnings, during="scoring")
    gone = {record.record_id for record in looking.skipped}
    images = {row["id"]: row_images for row, row_images in zip(looking.records, looking.images)}
    kept = [row for row in rows if row["id"] not in gone]
    return kept, [images.get(row["id"]) for row in kept]


def score(loaded: LoadedBenchmark, predictions: Mapping[str, str], metric_names: Sequence[str],
          options: Mapping[str, Mapping[str, Any]] | None = None, skip_undecodable: bool = False,
          warnings: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Run the metrics on the records that have a prediction; returns (results, per-item rows).

    ``options[metric_name]`` holds that metric's options (e.g. ``{"close_ended_accuracy":
    {"upstream_compat": True}}``). List outputs with one entry per record (``correct``, ``scores`` …)
    move from the summary to the per-item rows. A metric that takes images gets those of the records without
    a reference (:func:`_images_without_reference`); with ``skip_undecodable`` (``--on-missing skip``) a record
    whose image does not decode is left out of every metric and counted (``warnings`` says so)."""
    rows = [row for row in loaded.dataset.to_list() if row["id"] in predictions]
    images = None
    if loaded.resolver and rows and any(takes(load_metric(name), "images") for name in metric_names):
        rows, images = _images_without_reference(loaded, rows, skip_undecodable, [] if warnings is None else warnings)
    results: dict[str, Any] = {}
    split = f"{loaded.name}:{loaded.config}"  # what the report groups and filters items by
    per_item = [{"id": row["id"], "prediction": predictions[row["id"]], "reference": row["answer"], "split": split,
                 **{key: row[key] for key in ("category", "source", "answer_type", "images")},
                 "credentialed": record_credentialed(row)} for row in rows]
    if not rows:
        return results, per_item
    computed: dict[str, dict[str, Any]] = {}
    for name in _run_results_last(metric_names):
        metric = load_metric(name)
        kwargs = metric_kwargs(metric, rows, (options or {}).get(name, {}))
        if takes(metric, "images") and "images" not in kwargs and images is not None:
            kwargs["images"] = images
        if takes(metric, "run_results") and "run_results" not in kwargs:
            kwargs["run_results"] = dict(computed)
        out = metric.compute(predictions=[predictions[row["id"]] for row in rows],
                             references=[row["answer"] for row in rows], **kwargs)
        computed[name] = dict(out)
        for key in [k for k, v in out.items() if isinstance(v, list) and len(v) == len(rows)]:
            for item, value in zip(per_item, out.pop(key)):
                item[key if key not in item else f"{name}.{key}"] = value
        if name == "close_ended_accuracy":
            out["accuracy_by_source"] = _accuracy_by(rows, per_item, "source")
        results[name] = out
    return results, per_item


def count_empty(items: Sequence[Mapping[str, Any]]) -> int:
    """How many scored items have an empty or whitespace-only prediction (a model's, an API's or a
    predictions file's). They are scored, not skipped (each metric card says how it reads one), and
    counted in ``results.json`` as the split's ``n_empty_predictions`` so the report can say so."""
    return sum(1 for item in items if not str(item.get("prediction") or "").strip())


def _run_results_last(metric_names: Sequence[str]) -> list[str]:
    """The metrics in order, those whose ``_compute`` takes ``run_results`` (a composite such as RadCliQ-v1,
    built from the other metrics' per-item outputs on the same items) after all others."""
    reads = {name: takes(load_metric(name), "run_results") for name in metric_names}
    return [name for name in metric_names if not reads[name]] + [name for name in metric_names if reads[name]]


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
    """Per-metric options of one split's metrics, checked and typed: ``--metric-option name.key=value``
    plus the run-wide switches (``--upstream-compat``, ``--judge``, ``--allow-remote-credentialed``)."""
    from medheval.run.paper_protocols import get_protocol

    options = {name: dict(spec.metric_options.get(name, {})) for name in metric_names}
    protocol_options = get_protocol(spec.protocol).metric_options
    for name in metric_names:
        metric = load_metric(name)
        accepted = compute_parameters(metric)
        for key, value in protocol_options.get(name, {}).items():  # the paper's scoring, under the user's
            options[name].setdefault(key, value)
        if spec.upstream_compat and "upstream_compat" in accepted:
            options[name].setdefault("upstream_compat", True)
        if spec.judge and "judge" in accepted:
            options[name].setdefault("judge", spec.judge)
        options[name].update(detector_options(spec.detector, accepted))
        if spec.allow_remote_credentialed and "allow_remote_credentialed" in accepted:
            options[name].setdefault("allow_remote_credentialed", list(spec.allow_remote_credentialed))
        options[name] = check_options(name, metric, options[name], set(RECORD_INPUTS))
        if "judge" in options[name]:  # an unknown backend or option fails now, not at scoring after generation
            from medheval.judges.base import JudgeError
            from medheval.judges.spec import check_judge_spec

            try:
                check_judge_spec(options[name]["judge"])
            except JudgeError as error:
                raise RunError(f"metric option {name}.judge: {error}") from None
    return options


def _check_options_used(spec: RunSpec, computed: set[str]) -> None:
    """An option for a metric that no split of the run computes is a mistake (a typo, a missing --metrics)."""
    unused = sorted(set(spec.metric_options) - computed)
    if unused:
        raise RunError(f"--metric-option given for metric(s) {unused} that this run does not compute "
                       f"(it computes: {', '.join(sorted(computed)) or 'none'})")


def _unknown_ids(ids: Iterable[str], splits: Sequence[LoadedBenchmark], own_prefix: bool = False) -> list[str]:
    """The ``ids`` (in order) that name no record of ``splits`` (every record, before ``--limit``); with
    ``own_prefix``, only those that look like the splits' own (:func:`split_id_prefixes`)."""
    known = {rid for loaded in splits for rid in (loaded.all_ids or loaded.dataset["id"])}
    prefixes = tuple(prefix for loaded in splits for prefix in split_id_prefixes(loaded)) if own_prefix else ("",)
    return [rid for rid in ids if rid.startswith(prefixes) and rid not in known]


def _unmatched_ids_note(missing: list[str], extra: list[str]) -> str:
    """What the predictions file's own unmatched ids look like, for the error of a split with records that have no
    prediction: ``""`` when every id of the file matched; named when an id matches a record once the spaces or
    line breaks around it are removed (the id must be exact)."""
    if not extra:
        return ""
    wanted = set(missing)
    padded = [rid for rid in extra if rid.strip() != rid and rid.strip() in wanted]
    note = f"; {len(extra)} id(s) of the file match no record of this split, e.g. {', '.join(repr(i) for i in extra[:2])}"
    if padded:
        note += (f" ({len(padded)} match a record once the spaces around them are removed: ids must be exact, "
                 f"strip them in the file)")
    return note


def _predictions_backend_check(loaded: LoadedBenchmark, backend: Any, allow_missing: bool) -> LoadedBenchmark:
    """Compare a predictions file's ids with the split; report mismatches clearly."""
    missing, extra = backend.check_against(loaded.dataset["id"])
    # ids that look like this split's but name no record of it (typos, another release): counted, not dropped
    unknown = _unknown_ids(extra, [loaded], own_prefix=True)
    if missing and not allow_missing:
        raise RunError(
            f"{len(missing)} record(s) of {loaded.name}:{loaded.config} have no prediction in {backend.path} "
            f"(first: {missing[:10]}). This split's ids look like {', '.join(repr(i) for i in loaded.dataset['id'][:2])}"
            f"{_unmatched_ids_note(missing, extra)}. "
            f"Pass --allow-missing-predictions to score only the records present (the others are counted as missing)."
        )
    if missing:
        keep = set(loaded.dataset["id"]) - set(missing)
        loaded.dataset = loaded.dataset.filter(lambda row: row["id"] in keep)
    loaded.quality["missing_predictions"] = len(missing)
    loaded.quality["missing_prediction_examples"] = missing[:20]
    loaded.quality["n_unknown_prediction_ids"] = len(unknown)
    loaded.quality["unknown_prediction_ids"] = unknown[:20]
    return loaded


def _asked_text(text: str) -> str:
    """``text`` as it is compared with a recorded prompt: without ``<image>`` tokens (protocols drop them from
    the question), whitespace runs as one space."""
    return " ".join(text.replace("<image>", "").split())


def check_rescored_files(loaded: LoadedBenchmark, backend: Any, warnings: list[str]) -> None:
    """A re-score (``backend``: a predictions file) scores ``loaded`` against the annotation files read now.
    When they differ from those the answers were generated from (``provenance.dataset_revision`` of the
    ``results.json`` beside the answers; :func:`medheval.run.provenance.files_changed`), the answers must still
    be to this split's questions, else a :class:`RunError` names the records: every answered id of the split
    must be one of its records, and where a line recorded its ``prompt``, that prompt must hold the record's
    question and choices as the files read now have them. Then the change is a warning naming the split, the
    files and both sha256 prefixes (results.json records both revisions: :func:`medheval.run.provenance.of_run`).
    Answers whose files are unknown get a note. Images cannot be compared: only their references are recorded."""
    split = f"{loaded.name}:{loaded.config}"
    scoring = run_provenance.annotation_revision(loaded.files)
    if scoring is None:
        return
    generated = ((run_provenance.inherited(backend) or {}).get("dataset_revision") or {}).get(split)
    if not isinstance(generated, Mapping):
        _note_once(f"{split}: the annotation files the answers in {backend.path} were generated from are not "
                   f"recorded (no results.json beside them, or one written before medheval recorded them); "
                   f"results.json records the files scored against (sha256 {scoring['sha256'][:12]}) as "
                   f"provenance.scoring_dataset_revision")
        return
    change = run_provenance.files_changed(generated, scoring)
    if change is None:
        return
    gone = _unknown_ids(backend.ids(), [loaded], own_prefix=True)
    asked = {row["id"]: (backend.prompts[row["id"]], [row["question"] or "", *(row["choices"] or [])])
             for row in loaded.dataset.select_columns(["id", "question", "choices"]).to_list()
             if row["id"] in backend.prompts}  # the records to score whose answer recorded its prompt
    other = [rid for rid, (prompt, texts) in asked.items()
             if not all(_asked_text(text) in _asked_text(prompt) for text in texts)]
    if gone or other:
        why = (f"{len(gone)} answered record id(s) are not in them (first: {gone[:5]})" if gone else
               f"{len(other)} record(s) ask another question or choices than the prompt their answer recorded "
               f"(first: {other[:5]})")
        raise RunError(f"{split}: the annotation files differ from those the answers in {backend.path} were "
                       f"generated from ({change}), and {why}: the answers are to other questions, so they cannot "
                       f"be scored against these files. Re-score with the files the answers were generated from "
                       f"(--data-dir), or generate new answers on these files.")
    compared = ("the answered ids and recorded prompts match them" if asked else
                "the answered ids match them; the questions could not be compared (the answers record no prompt)")
    _warn(warnings, f"{split}: scored against other annotation files than the answers were generated from: "
                    f"{change} (answers → now). The references and labels are those of the files read now; "
                    f"{compared}. results.json keeps the answers' files as provenance.dataset_revision and "
                    f"records these as provenance.scoring_dataset_revision", console_once=True)


def _warn(warnings: list[str], text: str, console_once: bool = False) -> None:
    """A problem the run survives: shown on the console now and listed in results.json / results.md.
    ``console_once``: shown once per process (a grid's runs each list it, the console says it once)."""
    warnings.append(text)
    if process_group().is_main and not (console_once and text in _NOTED):  # once per launch, not per process
        if console_once:
            _NOTED.add(text)
        print(f"warning: {text}", file=sys.stderr)


def failed_on_every_item(out: Any) -> bool:
    """A metric output reporting failures (``n_failed`` > 0) and nothing scored (``n`` 0, or 0 per model)."""
    if not isinstance(out, Mapping) or not isinstance(out.get("n_failed"), int) or out["n_failed"] <= 0:
        return False
    counts = list(out["n"].values()) if isinstance(out.get("n"), Mapping) else [out.get("n")]
    return all(count == 0 for count in counts)


def _note_failed_metrics(results: dict[str, Any], split: str, metric_results: Mapping[str, Any],
                         warnings: list[str]) -> None:
    """A metric that failed on every item is listed in ``results["failed_metrics"]`` and as a warning
    (so ``results.md`` says so); the command then exits non-zero (:func:`medheval.cli.cmd_run`)."""
    for name, out in metric_results.items():
        if failed_on_every_item(out):
            _warn(warnings, f"{split}: metric {name} failed on every item ({out['n_failed']} failure(s), reasons "
                            f"in scored.jsonl or results.json): it has no result")
            results.setdefault("failed_metrics", []).append(f"{split} {name}")


FIXTURE_WARNING = ("the annotation files are the embedded fixture (synthetic records in the benchmarks' file "
                   "formats, from `medheval demo` or --data-dir of the fixture): its numbers test the pipeline, "
                   "they are not results")


def _split_warnings(loaded: LoadedBenchmark, warnings: list[str]) -> None:
    split = f"{loaded.name}:{loaded.config}"
    for entry in loaded.files:
        if entry.get("fixture"):  # differs from the pins by design: said once per run, not per file
            if FIXTURE_WARNING not in warnings:
                _warn(warnings, FIXTURE_WARNING, console_once=True)
        elif entry.get("verified") is False:  # None: no pin to check against (user data, Hub snapshots)
            _warn(warnings, f"{split}: annotation file {entry['relpath']} (from --data-dir) has sha256 "
                            f"{entry['sha256']}, not the pinned {entry.get('expected_sha256', '?')}: a modified "
                            f"copy, so results may differ from the released data")
    quality = loaded.quality
    if quality.get("missing_predictions"):
        _warn(warnings, f"{split}: {quality['missing_predictions']} record(s) have no prediction and were not "
                        f"scored (--allow-missing-predictions; first: {quality['missing_prediction_examples'][:5]})")


def _check_spec(spec: RunSpec) -> None:
    """Refuse, before the output folder is made, a run that would compute nothing or names an unknown benchmark."""
    if not spec.benchmarks:
        raise RunError("no benchmark given: pass --benchmark NAME[:CONFIG] (see `medheval list`)")
    try:
        check_control(spec.control)
    except ControlError as error:
        raise RunError(str(error)) from None
    for benchmark_spec in spec.benchmarks:  # a typo fails here, with close matches, leaving no folder behind
        unit_dir("datasets", parse_benchmark_spec(benchmark_spec)[0])
    if spec.metrics is not None and not spec.metrics:
        raise RunError("--metrics names no metric (an empty list computes nothing); leave it out for the "
                       "defaults, or name metrics from `medheval list`")
    for key, root in (spec.image_roots or {}).items():  # a mistyped folder fails now, naming it
        folder = _local_folder(root)
        if folder is not None and not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise RunError(f"--image-root {'' if key == '*' else key + '='}{root}: the folder {folder} {what}")
    if spec.judge is not None:  # a malformed --judge (or an unknown backend or option) fails now, not after generation
        from medheval.judges.spec import check_judge_spec

        check_judge_spec(spec.judge)


def _local_folder(root: Any) -> Path | None:
    """The local folder an image root reads (also under a MIMIC metadata wrapper); ``None`` for remote roots."""
    from medheval.data.images import LocalFolderSource, MimicDicomSource, parse_image_root

    source = parse_image_root(root) if isinstance(root, str) else root
    if isinstance(source, MimicDicomSource):
        source = source.base
    return source.root if isinstance(source, LocalFolderSource) else None


def _refuse_own_log(backend: Backend, output: Path) -> None:
    """A ``--predictions`` file must not be one of the logs this run appends to (``predictions.jsonl`` or a
    data-parallel part log of ``output``): the run would write into the user's input file."""
    given = getattr(backend, "path", None)
    if not isinstance(given, (str, Path)) or not run_provenance.is_rescore(backend):
        return
    source, folder = Path(given).resolve(), output.resolve()
    if source.parent == folder and source.name.startswith("predictions") and source.suffix == ".jsonl":
        raise RunError(f"--predictions {given} is the log this run writes in its --output folder "
                       f"({folder / 'predictions.jsonl'}): the run would append to your input file. Choose "
                       f"another --output folder (or move the predictions file elsewhere).")


def _refuse_grid_folder(output: Path) -> None:
    """A single run must not overwrite the combined results of a mitigation grid in the same folder."""
    path = output / "results.json"
    if path.exists() and not (output / "run.json").exists():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            return
        if isinstance(previous, dict) and "runs" in previous:
            raise RunError(f"{output} holds a mitigation grid (its sub-folders and combined results.json); a single "
                           f"run there would overwrite the grid's results. Re-run the same grid, or choose another "
                           f"--output folder.")


RUN_FILES = ("results.json", "results.md", "scored.jsonl", "predictions.jsonl")


def _refuse_foreign_folder(output: Path) -> None:
    """Without ``run.json`` (every run folder has had one from the start: written before the first prediction),
    results or a predictions log in ``output`` are not this run's: they would be overwritten or mixed in."""
    if (output / "run.json").exists():
        return
    found = [name for name in RUN_FILES if os.path.lexists(output / name)]
    found += sorted(path.name for path in output.glob("predictions.rank*.jsonl"))
    for name in found:  # a planted link, FIFO or hard link: the error that names it (open_owned) comes first
        os.close(open_owned(output / name, os.O_RDONLY))
    if found:
        raise RunError(f"{output} holds {', '.join(found)} but no run.json, so they were not written by a run of "
                       f"medheval into this folder (or its run.json was deleted); a run there would overwrite or mix "
                       f"with them. Choose another --output folder, or move those files away.")


def _check_reused_generation(prepared: list[PreparedSplit], backend: Backend, spec: RunSpec,
                             entries: list[dict[str, Any]], log_path: Path) -> None:
    """A log entry this run reuses must have been generated with the settings this run would use (its
    ``"generation"``; entries from before it was recorded are not checked): mixed settings are refused."""
    from medheval.run.generation import used_settings

    recorded = {entry["id"]: entry["generation"] for entry in entries
                if entry.get("model") == backend.name and entry.get("mitigation", "none") == spec.mitigation
                and entry.get("control", "none") == spec.control and isinstance(entry.get("generation"), dict)}
    for split in prepared:
        if not isinstance(split.protocol, QAProtocol) or not recorded:
            continue
        plan_for = settings_for(spec.generation, split.loaded.name, split.loaded.config)
        by_type: dict[str, dict[str, Any]] = {}  # the settings depend on the answer type only: once per type
        rows = split.loaded.dataset.select_columns(["id", "answer_type"]).to_list()
        for row in rows:
            if row["id"] not in recorded:
                continue
            kind = row["answer_type"]
            if kind not in by_type:
                by_type[kind] = used_settings(backend, plan_for(kind))
            before, now = recorded[row["id"]], by_type[kind]
            changed = changes(before, now, lambda value: "<unset>" if value is None else json.dumps(value))
            if changed:
                raise RunError(f"{log_path}: the prediction for {row['id']!r} was generated with other settings than "
                               f"this run's (changed: {'; '.join(changed)}); reusing it would mix settings in one "
                               f"result. Resume with the same settings, or choose a new --output folder.")


def split_provenance(job: SplitJob) -> dict[str, Any]:
    """The provenance of the answers one split generates (:mod:`medheval.run.provenance`): what the backend
    inherits (a predictions file's), random weights, the split's fixture files, ``--limit``, the protocol."""
    settings = job.backend.settings()
    protocol = job.results.get("protocol") if isinstance(job.results, dict) else None
    return run_provenance.merge(job.state.get("inherited"), {
        "random_weights": bool(job.spec.labels.get("random_weights") or settings.get("random_weights")),
        "fixture": run_provenance.files_are_fixture(job.loaded.files), "limit": job.spec.limit,
        "protocol": protocol.get("name") if isinstance(protocol, dict) else None, "source_model": job.backend.name})


class PreparedSplit(NamedTuple):
    """A loaded and checked split: its protocol, metric names and their typed options."""

    loaded: LoadedBenchmark
    protocol: SplitProtocol
    metric_names: list[str]
    options: dict[str, dict[str, Any]]


class QAProtocol(SplitProtocol):
    """The standard protocol: the model answers every record (data parallel: sharded by batch, resumable
    through ``predictions.jsonl``), metrics score the answers (per answer type, or the unit's
    ``DEFAULT_METRICS``, or ``--metrics``)."""

    name = "qa"

    def prepare(self, loaded: LoadedBenchmark, backend: Backend, spec: RunSpec) -> list[str]:
        if run_provenance.is_rescore(backend):  # a predictions file: its ids against the split's
            _predictions_backend_check(loaded, backend, spec.allow_missing_predictions)
        return _metric_names(loaded, spec.metrics, spec.judge)

    def run_split(self, job: SplitJob) -> int:
        loaded, backend, spec, state = job.loaded, job.backend, job.spec, job.state
        skipped: list[SkippedRecord] | None = [] if spec.on_missing == "skip" else None
        generated = job.group.generate(
            lambda writer, shard: generate_predictions(loaded, backend, writer, state["done"], spec.mitigation,
                                                       job.batch_size, spec.generation, shard, spec.image_control,
                                                       split_provenance(job), skipped),
            state["log_path"], state["order"], job.split)
        if skipped is not None:
            every = [record for part in job.group.collect(skipped) for record in part]  # all processes' skips
            if job.group.is_main:
                record_skipped_undecodable(loaded, every, job.warnings)
        return generated

    def score_split(self, job: SplitJob, generated: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        loaded, backend, spec, state = job.loaded, job.backend, job.spec, job.state
        if generated:
            state["entries"] = read_log(state["log_path"], repair=False)
        predictions = {entry["id"]: entry["prediction"] for entry in state["entries"]
                       if entry.get("model") == backend.name and entry.get("mitigation", "none") == spec.mitigation
                       and entry.get("control", "none") == spec.control}
        metric_results, per_item = score(loaded, predictions, job.metric_names, job.options,
                                         spec.on_missing == "skip", job.warnings)
        _note_failed_metrics(job.results, job.split, metric_results, job.warnings)
        entry = split_entry(loaded, n_scored=len(per_item), n_empty_predictions=count_empty(per_item),
                            generated_this_run=generated, metrics=metric_results)
        blind = {"control": spec.control} if spec.control != "none" else {}
        return entry, [{**item, "model": backend.name, "mitigation": spec.mitigation, **blind} for item in per_item]


def check_distinct_records(benchmarks: Sequence[str], splits: Sequence[LoadedBenchmark]) -> None:
    """Refuse two splits of one run (``benchmarks[i]`` loaded as ``splits[i]``) that hold one record: the same
    ``--benchmark`` twice, a benchmark and its default config (``mm_vishal`` beside ``mm_vishal:all``), or a
    config that gathers others beside a member (``mm_vishal:all``). Its answer would be logged twice into one
    ``predictions.jsonl``, which then reads as edited."""
    first: dict[str, int] = {}
    for position, loaded in enumerate(splits):
        for record_id in loaded.dataset["id"]:
            earlier = first.setdefault(record_id, position)
            if earlier == position:
                continue
            one, other = benchmarks[earlier], benchmarks[position]
            what = (f"--benchmark {one} is given twice" if one == other else
                    f"--benchmark {one} and --benchmark {other} hold the same records (e.g. {record_id!r})")
            raise RunError(f"{what} (benchmarks: {', '.join(benchmarks)}); each record is answered once: name each "
                           f"split once")


class BuiltSplits:
    """The splits one command built, so that it builds each once: :func:`check_before_model` builds them before
    the model loads and hands them to the run (:func:`run_grid`, every cell of it). :meth:`load` builds a split
    the first time it is asked for with given :func:`prepare_benchmark` arguments, and gives every caller its own
    copy (a run filters its split and counts what it skipped)."""

    def __init__(self) -> None:
        self._built: dict[str, LoadedBenchmark] = {}

    def load(self, benchmark_spec: str, spec: RunSpec) -> LoadedBenchmark:
        """Split ``benchmark_spec`` (``name[:config]``) as ``spec`` reads it (its data folder, limit and the
        benchmark's run options), built on the first call."""
        name, config = parse_benchmark_spec(benchmark_spec)
        options = spec.benchmark_options.get(name, {})
        key = json.dumps([name, config, str(spec.data_dir), spec.limit, options], sort_keys=True, default=repr)
        if key not in self._built:
            self._built[key] = prepare_benchmark(name, config, data_dir=spec.data_dir, limit=spec.limit,
                                                 run_options=options)
        built = self._built[key]
        return dataclasses.replace(built, files=copy.deepcopy(built.files), quality=copy.deepcopy(built.quality),
                                   skipped_missing_images=list(built.skipped_missing_images),
                                   skipped_undecodable_images=list(built.skipped_undecodable_images),
                                   run_options=copy.deepcopy(built.run_options))


def _prepare_split(spec: RunSpec, backend: Backend, benchmark_spec: str, warnings: list[str],
                   splits: BuiltSplits | None = None) -> PreparedSplit:
    """Load one split (from ``splits`` when the command built it already) and check everything about it that
    can fail before generation: the protocol's backend and judge, images, the protocol's own checks (a
    predictions file's ids...), the metric names and their (typed) options."""
    name, _ = parse_benchmark_spec(benchmark_spec)
    protocol = protocol_for(name) or QAProtocol()
    protocol.check(name, backend, spec)
    # images are attached once every split is loaded (:func:`_attach_images`: all root problems in one message)
    loaded = (splits or BuiltSplits()).load(benchmark_spec, spec)
    if callable(getattr(backend, "check_records", None)):  # an API model: credentialed records refused up front
        fields = [name for name in ("id", "source", "meta") if name in loaded.dataset.column_names]
        backend.check_records(loaded.dataset.select_columns(fields).to_list())
    if run_provenance.is_rescore(backend):  # scored against the files its answers were made from?
        check_rescored_files(loaded, backend, warnings)
    metric_names = protocol.prepare(loaded, backend, spec)
    options = _options_for(spec, metric_names)
    _split_warnings(loaded, warnings)
    return PreparedSplit(loaded, protocol, metric_names, options)


def _image_sources(loaded: LoadedBenchmark) -> list[str]:
    """The sources of the split's records that reference images (records without images need no root)."""
    rows = loaded.dataset.select_columns(["source", "images"]).to_list()
    return sorted({row["source"] for row in rows if row["images"]})


_NOTED: set[str] = set()  # notes already printed by this process (said once, not once per split or per run of a grid)


def _note_once(text: str) -> None:
    if text not in _NOTED and process_group().is_main:
        _NOTED.add(text)
        print(f"note: {text}", file=sys.stderr)


def _attach_images(spec: RunSpec, backend: Backend, prepared: list[PreparedSplit], note_unused: bool = True) -> None:
    """Check the image roots against every split of the run (:func:`check_image_roots`) and attach them (the
    images themselves are read during generation and scoring): each split's missing image files are reported
    in one error."""
    from medheval.data.benchmarks import attach_images
    from medheval.data.images import ImageError

    reader = backend.name if backend.needs_images and spec.control != "no_image" else None
    if not check_image_roots(spec, [split.loaded for split in prepared], reader, note_unused):
        return
    roots = dict(spec.image_roots or {})
    errors = []
    for split in prepared:
        try:
            attach_images(split.loaded, roots, spec.on_missing)
        except ImageError as error:
            errors.append(f"{split.loaded.name}:{split.loaded.config}: {error}")
    if len(errors) == 1:
        raise ImageError(errors[0])
    if errors:
        raise ImageError(f"{len(errors)} splits have missing images:\n" + "\n".join(errors))


def check_image_roots(spec: RunSpec, splits: Sequence[LoadedBenchmark], reader: str | None,
                      note_unused: bool = True) -> bool:
    """Whether the run attaches image roots to ``splits`` (it does when roots were given, or when model
    ``reader`` reads images; ``None``: none does), after refusing (:class:`RunError`, every problem in one message)
    a root naming a source no split has and each split's sources without a root (with ``--on-missing skip`` a
    source without a root is skipped, unless no root was given at all). Roots no split uses are fine (kept for
    other benchmarks): one note names them all, once per process (``note_unused=False``: none, for a harness
    whose one ``MEDHEVAL_IMAGE_ROOTS`` serves every split, or a check the run repeats)."""
    roots = dict(spec.image_roots or {})
    if not roots and reader is None:  # no image is read
        return False
    needed = {f"{loaded.name}:{loaded.config}": _image_sources(loaded) for loaded in splits}
    every_source = sorted({source for sources in needed.values() for source in sources})
    unused = [f"--image-root {key}=…: no split of this run has images from source {key!r} (this run's image "
              f"sources: {', '.join(every_source) or 'none'})" for key in roots if key != "*" and key not in
              every_source]
    without_root = {split: [s for s in sources if s not in roots and "*" not in roots]
                    for split, sources in needed.items()}
    problems = []
    if spec.on_missing == "error" or not roots:  # with --on-missing skip, a source without a root is skipped
        problems = [f"{split}: no image root for source(s) {', '.join(sources)}"
                    for split, sources in without_root.items() if sources]
    if problems:
        problems += unused  # a mistyped source name explains a missing root
    elif unused and note_unused:  # roots kept for other benchmarks are fine: one line, once, not an error
        keys = [key for key in roots if key != "*" and key not in every_source]
        _note_once(f"--image-root {', '.join(keys)}: no split of this run has images from "
                   f"{'this source' if len(keys) == 1 else 'these sources'} (its image sources: "
                   f"{', '.join(every_source) or 'none'}); not used")
    if problems:
        lacking = sorted({source for sources in without_root.values() for source in sources})
        needs = f" (model {reader} reads images)" if reader else ""
        hint = (" Pass " + " ".join(f"--image-root {source}=PATH_OR_URL" for source in lacking) + "."
                if lacking else "")
        raise RunError(f"image roots{needs}:\n  - " + "\n  - ".join(problems) + "\n" + hint.strip())
    return True


def _warn_unknown_log_ids(entries: list[dict[str, Any]], prepared: list[PreparedSplit], log_path: Path,
                          warnings: list[str]) -> None:
    """Warn about lines of the run's own ``predictions.jsonl`` whose id names none of the records of this run's
    splits (a hand-edited id, or annotation files that no longer hold the record): they are not scored, and were
    left out without a word. Every id is looked at, not only those with a split's prefix: the run's own log holds
    nothing but its splits' records (``run.json`` pins the benchmarks, limit and options of a resume), so an id
    edited in its benchmark/config part is as foreign as one edited at its end."""
    unknown = _unknown_ids(dict.fromkeys(entry["id"] for entry in entries), [split.loaded for split in prepared])
    if unknown:
        _warn(warnings, f"{len(unknown)} line(s) of {log_path} answer no record of the split(s) in this run and are "
                        f"not scored (first ids: {unknown[:5]}): the file was edited, or the annotation files no "
                        f"longer hold those records; remove the lines, or start a new --output folder")


def _predictions_file_summary(backend: Any, prepared: list[PreparedSplit],
                              warnings: list[str]) -> dict[str, Any] | None:
    """How many of a predictions file's ids this run scored, and how many match none of its records."""
    if not run_provenance.is_rescore(backend):
        return None
    in_run = {rid for split in prepared for rid in split.loaded.dataset["id"]}
    ids = backend.ids()
    unused = [rid for rid in ids if rid not in in_run]
    unknown = _unknown_ids(unused, [split.loaded for split in prepared])
    if unknown:
        _warn(warnings, f"{len(unknown)} of {len(ids)} id(s) in the predictions file match no record of the "
                        f"split(s) in this run and were not scored (first: {unknown[:5]})")
    return {"n_predictions": len(ids), "n_used": len(ids) - len(unused), "n_not_used": len(unused),
            "n_unknown": len(unknown), "unknown_examples": unknown[:20]}


def _typed_options(spec: RunSpec, prepared: list[PreparedSplit]) -> dict[str, Any]:
    """The ``--metric-option`` values as the metrics receive them (typed), for the record."""
    typed: dict[str, dict[str, Any]] = {}
    for options in (split.options for split in prepared):
        for metric, given in spec.metric_options.items():
            if metric in options and metric not in typed:
                typed[metric] = {key: options[metric][key] for key in given}
    return typed


RECORDED_APART = frozenset({"judge", "allow_remote_credentialed"})  # results.json "scoring" has their own keys


def _non_default_options(spec: RunSpec, prepared: list[PreparedSplit]) -> dict[str, dict[str, Any]]:
    """Per metric, the options in effect that differ from the metric's defaults (``--metric-option`` and the
    run-wide switches such as ``--upstream-compat``), secrets redacted: ``results.md`` states them."""
    from medheval.scoring.metric_options import non_default_options

    found: dict[str, dict[str, Any]] = {}
    for split in prepared:
        for name, options in split.options.items():
            differing = {key: value if isinstance(value, (str, int, float, bool, list, dict, type(None)))
                         else type(value).__name__  # an object the Python API passed (a labeler, a judge)
                         for key, value in non_default_options(load_metric(name), options).items()
                         if key not in RECORDED_APART}
            if differing and name not in found:
                found[name] = differing
    return safe_options(dataclasses.replace(spec, metric_options=found, judge=None))["metric_options"]


def run(spec: RunSpec, backend: Backend, batch_size: int = 8, splits: BuiltSplits | None = None) -> dict[str, Any]:
    """Run every benchmark of ``spec`` with ``backend``; writes and returns ``results.json``'s content.

    Everything that can be checked is checked before the first generation (splits, images, metric
    names, typed metric options). ``splits``: the splits the command built already (:func:`check_before_model`),
    else each is built here. The output folder is locked for the whole run
    (:class:`medheval.run.outputs.OutputLock`) and every summary file is replaced atomically. Launched
    with several processes (``accelerate launch``), records are sharded across them
    (:mod:`medheval.run.distributed`); the main process merges, scores and writes."""
    from medheval.report.tables import write_markdown

    _check_spec(spec)
    output = Path(spec.output)
    group = process_group()
    log_path = output / "predictions.jsonl"
    versions = stack_versions()
    with group.lock(output, spec.lock_timeout):
        warnings: list[str] = []
        newer = warn_if_newer_than_tested(versions) if group.is_main else None  # printed once per process
        if newer:
            warnings.append(newer)
        prepared, settings, predictions_file = group.main_first(
            "preparing the run", lambda: _prepare_run(spec, backend, output, warnings, group.is_main, versions,
                                                      splits))
        entries = read_log(log_path, repair=group.is_main)
        _check_reused_generation(prepared, backend, spec, entries, log_path)
        _warn_unknown_log_ids(entries, prepared, log_path, warnings)
        order = [rid for split in prepared for rid in split.loaded.dataset["id"]]
        recorded = dataclasses.replace(spec, metric_options=_typed_options(spec, prepared))
        results: dict[str, Any] = {"settings": settings, "versions": versions, "labels": dict(spec.labels),
                                   "protocol": settings["protocol"], "prompts": _describe_prompts(spec),
                                   "scoring": {"upstream_compat": bool(spec.upstream_compat), **safe_options(recorded),
                                               "non_default_options": _non_default_options(spec, prepared)},
                                   "benchmarks": {}, "warnings": warnings, "world_size": group.world_size}
        if predictions_file is not None:
            results["predictions_file"] = predictions_file
        inherited = run_provenance.inherited(backend)  # a re-score carries the provenance of the answers
        if inherited is not None:
            results["provenance"] = inherited
            _note_protocol(spec, inherited, warnings)
        scored: list[dict[str, Any]] = []
        state = {"entries": entries, "done": {log_key(entry) for entry in entries}, "log_path": log_path,
                 "order": order, "inherited": inherited}
        for split in prepared:
            job = SplitJob(split.loaded, backend, spec, output, split.metric_names, split.options, warnings,
                           group=group, results=results, state=state, batch_size=batch_size)
            generated = split.protocol.run_split(job)
            if not group.is_main:
                continue
            entry, per_item = split.protocol.score_split(job, generated)
            add_clusters(split.loaded, entry, per_item)
            if getattr(backend, "auto_batch", False):  # --batch-size auto: the batch this split ran at
                entry["batch_size_chosen"] = backend.take_auto_batch_size()
            results["benchmarks"][job.split] = entry
            scored.extend(per_item)
        with group.together("writing the results"):
            if group.is_main:
                if callable(getattr(backend, "usage", None)):  # an API model: requests, cache hits, tokens
                    results["usage"] = backend.usage()
                atomic_write_text(output / "scored.jsonl", "".join(jsonl_line(item) for item in scored))
                results["report"] = _report_plan()
                results["provenance"] = run_provenance.of_run(results, run_provenance.model_revision_of(backend))
                atomic_write_text(output / "results.json", json.dumps(results, indent=2, sort_keys=True, default=str))
                write_markdown(results, output / "results.md")
                write_report_html(output, results, spec.report_cluster, spec.compare_published)
    return results if group.is_main else json.loads((output / "results.json").read_text())


def _prepare_run(spec: RunSpec, backend: Backend, output: Path, warnings: list[str], main: bool = True,
                 versions: Mapping[str, str | None] | None = None, splits: BuiltSplits | None = None
                 ) -> tuple[list, dict[str, Any], dict[str, Any] | None]:
    """Every split prepared (from ``splits`` when built already) and checked, the run's settings checked against
    ``run.json`` (the main process writes it with ``versions``, the stack, and merges predictions left by the
    processes of a killed data-parallel run)."""
    from medheval.run.distributed import merge_parts

    _refuse_own_log(backend, output)
    _refuse_grid_folder(output)
    _refuse_foreign_folder(output)
    splits = splits or BuiltSplits()
    prepared = [_prepare_split(spec, backend, benchmark_spec, warnings, splits) for benchmark_spec in spec.benchmarks]
    check_distinct_records(spec.benchmarks, [split.loaded for split in prepared])
    _attach_images(spec, backend, prepared)
    _warn_prefix_cache_unused(spec, backend, prepared, warnings)
    _check_options_used(spec, {name for split in prepared for name in split.metric_names})
    predictions_file = _predictions_file_summary(backend, prepared, warnings)
    from medheval.run.paper_protocols import get_protocol

    settings = {"model": backend.name, "mitigation": spec.mitigation, "backend": backend.settings(),
                "limit": spec.limit, "benchmarks": list(spec.benchmarks),
                "protocol": get_protocol(spec.protocol).describe(_seed_used(spec, backend))}
    if spec.benchmark_options:  # prompts depend on them: a resumed run must use the same
        settings["benchmark_options"] = spec.benchmark_options
        unknown = sorted(set(spec.benchmark_options) - {parse_benchmark_spec(b)[0] for b in spec.benchmarks})
        if unknown:
            raise RunError(f"--benchmark-option given for benchmark(s) {unknown} that this run does not include")
    if spec.generation is not None:  # per benchmark / answer type (medheval.run.generation)
        settings["generation"] = spec.generation.describe()
    if spec.image_control.blind:  # absent for with-image runs, as in folders written before controls existed
        settings["control"] = spec.image_control.describe()
    if spec.seed is not None:  # one pass of --seeds (absent otherwise, as in folders written before seeds existed)
        settings["seed"] = spec.seed
    if main:
        _check_run_settings(output, settings, stack_versions() if versions is None else versions, warnings)
        merge_parts(output / "predictions.jsonl", [rid for split in prepared for rid in split.loaded.dataset["id"]])
    return prepared, settings, predictions_file


def _seed_used(spec: RunSpec, backend: Backend) -> int | None:
    """The sampling seed this run's answers were generated with: the pass's, else the backend's."""
    seed = spec.seed if spec.seed is not None else backend.settings().get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def _warn_prefix_cache_unused(spec: RunSpec, backend: Backend, prepared: list, warnings: list[str]) -> None:
    """``--prefix-cache`` serves greedy decoding only (sampled rows need the decoding loop's per-row generators):
    say which splits sample, so their records are generated without it, instead of ignoring the flag silently."""
    if not getattr(backend, "prefix_cache", False):
        return
    sampling = bool(backend.settings().get("do_sample"))
    sampled = []
    for split in prepared:
        loaded = split.loaded
        settings = settings_for(spec.generation, loaded.name, loaded.config)
        types = sorted(answer_type for answer_type in set(loaded.dataset["answer_type"])
                       if settings(answer_type).get("do_sample", sampling))
        if types:
            sampled.append(f"{loaded.name}:{loaded.config} ({', '.join(types)})")
    if sampled:
        _warn(warnings, f"--prefix-cache is not used where records are sampled: {'; '.join(sampled)}. A prefix cache "
                        f"serves greedy decoding only; those records are generated with their whole prompt (the "
                        f"same answers, without its speed-up)")


def _describe_prompts(spec: RunSpec) -> dict[str, Any]:
    """results.json ``"prompts"``: our templates under ``clean``; a paper protocol's prompt version otherwise."""
    from medheval.run.paper_protocols import get_protocol

    protocol = get_protocol(spec.protocol)
    if protocol.instruction is None:
        return describe_templates()
    return {"version": protocol.prompt_version, "protocol": protocol.name, "source": protocol.source,
            "chat_template": spec.chat_template}


def _report_plan() -> dict[str, Any]:
    """What ``report.html`` will hold, recorded before it is written (plots need the ``report`` extra)."""
    from medheval.report.build import plots_unavailable

    note = plots_unavailable()
    if note:
        print(f"note: {note}", file=sys.stderr)
    return {"html": "report.html", "note": note}


def write_report_html(output: Path, results: dict[str, Any], cluster: str = "auto",
                      compare_published: bool = False) -> None:
    """``report.html`` beside ``results.md``, written last (:func:`medheval.report.build.write_run_report`;
    ``cluster``: ``auto`` or ``none``, as ``medheval report --cluster``; ``compare_published``: with the
    Reproduction table, as ``medheval report --compare-published``): the results are on disk already, so
    a problem here is printed, never raised."""
    from medheval.report.build import write_run_report

    problem = write_run_report(output, results, cluster, compare_published=compare_published)
    if problem:
        print(f"note: {problem}", file=sys.stderr)


def _method_name(spec: str) -> str:
    """``"vcd:alpha=1"`` -> ``"vcd"``; the plain decoding's aliases -> ``"none"``."""
    from medheval.mitigations import NO_MITIGATION, parse_spec

    name = parse_spec(spec)[0]
    return "none" if name in NO_MITIGATION else name


def check_before_model(spec: RunSpec, mitigations: Sequence[str] = (), models: Sequence[str] = (),
                       backend: Backend | None = None, controls: Sequence[str] = ()) -> BuiltSplits:
    """What each split's protocol needs whatever the model (:meth:`SplitProtocol.check_inputs`), each split's
    annotation files (built under the paper protocol's options), each of ``mitigations``
    (:func:`resolve_mitigations`), the run's own settings (:func:`_check_spec`), no record in two splits
    (:func:`check_distinct_records`), the upstream conversation template each of ``models`` (``--model`` values)
    renders under the protocol (its type read from its config.json) and, when a model reads images (``models`` given and some of ``controls``, default
    ``[spec.control]``, not ``no_image``), an image root for every source of the splits
    (:func:`check_image_roots`), checked before the model loads: a missing file, root or a mistyped option is
    named before minutes of loading, and before the run writes anything. A re-score's ``backend`` (a
    predictions file) is checked under the protocol its answers were made under, as it runs. Returns the
    splits built, for the run to take (:func:`run_grid`'s ``splits``)."""
    from medheval.backends.conversation import check_template_file
    from medheval.run.options import model_type_before_loading
    from medheval.run.paper_protocols import get_protocol, template_for_model

    if backend is not None and run_provenance.is_rescore(backend):
        spec = _adopt_answers_protocol(spec, backend)
    _check_spec(spec)
    protocol = get_protocol(spec.protocol)
    protocol.check_benchmarks(spec.benchmarks)
    resolve_mitigations(protocol, mitigations)
    for model in models:
        check_template_file(template_for_model(protocol, spec.chat_template, model_type_before_loading(model)))
    spec = _with_protocol_options(spec, protocol)
    for name in dict.fromkeys(parse_benchmark_spec(benchmark)[0] for benchmark in spec.benchmarks):
        (protocol_for(name) or QAProtocol()).check_inputs(name, spec)
    splits = BuiltSplits()
    if launched_rank() != 0:  # a launch's other process: the main one builds first (the run's main_first)
        return splits
    loaded = [splits.load(benchmark, spec) for benchmark in spec.benchmarks]
    check_distinct_records(spec.benchmarks, loaded)
    reader = str(backend.name) if backend is not None and backend.needs_images else None
    reader = reader or (models[0] if backend is None and models else None)
    seeing = any(kind != "no_image" for kind in controls or [spec.control])
    check_image_roots(spec, loaded, reader if seeing else None, note_unused=False)
    return splits


def _with_protocol_options(spec: RunSpec, protocol: Any) -> RunSpec:
    """``spec`` with the protocol's run options of the benchmarks it runs, under the user's (``--benchmark-option``),
    and its scorer (``upstream_compat``) unless the user chose one."""
    if spec.upstream_compat is None:
        spec = dataclasses.replace(spec, upstream_compat=protocol.upstream_compat)
    names = {parse_benchmark_spec(b)[0] for b in spec.benchmarks}
    extra = {name: dict(options) for name, options in protocol.benchmark_options.items() if name in names}
    if not extra:
        return spec
    merged = {name: {**extra.get(name, {}), **spec.benchmark_options.get(name, {})}
              for name in {*extra, *spec.benchmark_options}}
    return dataclasses.replace(spec, benchmark_options=merged)


def _adopt_answers_protocol(spec: RunSpec, backend: Backend) -> RunSpec:
    """``spec`` under the protocol a re-score's answers were made under, when the user gave no ``--protocol``."""
    inherited = run_provenance.inherited(backend)
    protocol = str((inherited or {}).get("protocol") or run_provenance.CLEAN_PROTOCOL)
    if spec.protocol_given or protocol == spec.protocol:
        return spec
    from medheval.run.paper_protocols import list_protocols

    if protocol not in {known.name for known in list_protocols()}:
        raise RunError(f"these answers were made under protocol {protocol!r} (their provenance), which this medheval "
                       f"does not know; pass --protocol NAME to choose the scorer (clean: ours)")
    return dataclasses.replace(spec, protocol=protocol)


def _note_protocol(spec: RunSpec, inherited: Mapping[str, Any], warnings: list[str]) -> None:
    """Say in results.json which protocol scores a re-score whose answers carry a protocol."""
    made = str(inherited.get("protocol") or run_provenance.CLEAN_PROTOCOL)
    if made != spec.protocol:
        _warn(warnings, f"these answers were made under protocol {made!r} and are scored under --protocol "
                        f"{spec.protocol} (its scorer): the numbers differ from the source run's. Drop --protocol to "
                        f"score them as they were made", console_once=True)
    elif made != run_provenance.CLEAN_PROTOCOL and not spec.protocol_given:
        _warn(warnings, f"scored under protocol {made!r}, the one these answers were made under (their provenance); "
                        f"pass --protocol clean to score them with the clean scorer", console_once=True)


def resolve_mitigations(protocol: Any, mitigations: Sequence[str]) -> list[tuple[str, Any]]:
    """``(spec, method)`` of each mitigation under ``protocol`` (its method options added; method ``None``: plain
    decoding), ``[("none", None)]`` for none.

    Raises:
        RunError: the protocol has no settings for a method.
        MitigationError: an unknown method, option or option value (each checked when the method is built).
    """
    from medheval.mitigations import get_mitigation

    specs = [protocol.mitigation_spec(text) for text in mitigations]
    for text in specs or ["none"]:
        protocol.check_mitigation(_method_name(text))
    return [(text, get_mitigation(text)) for text in specs] or [("none", None)]


def check_loaded_model(backend: Backend, methods: Sequence[tuple[str, Any]]) -> None:
    """What only the loaded model tells, checked before a run writes anything (a refused start leaves its
    ``--output`` reusable): the upstream conversation template it renders with (fetched and verified), and what
    each mitigation needs of it (:meth:`~medheval.decoding.loop.DecodingMethod.check_model`: its layer count,
    internals).

    Raises:
        RunError: a mitigation's option does not fit the model, or the model lacks an internal it needs.
    """
    from medheval.backends.conversation import check_template_file
    from medheval.mitigations import MitigationError

    check_template_file(getattr(backend, "conversation", None))
    model = getattr(backend, "model", None)
    for text, method in methods:
        if method is not None and model is not None:
            try:
                method.check_model(model)
            except MitigationError as error:
                raise RunError(f"--mitigation {text} on model {backend.name}: {error}") from None


class ConfiguredRun(NamedTuple):
    """One model's grid as :func:`configure_run` settled it, for :func:`run_configured`."""

    spec: RunSpec  # under its paper protocol, with the protocol's options
    backend: Backend  # rendering under the protocol
    methods: list[tuple[str, Any]]  # (mitigation spec, method or None) under the protocol
    controls: list[str]  # the image controls, each once
    seeds: list[int] | None


def configure_run(spec: RunSpec, backend: Backend, mitigations: Sequence[str], controls: Sequence[str] | None = None,
                  seeds: Sequence[int] | None = None) -> ConfiguredRun:
    """``spec`` under its paper protocol (a re-score's answers' own when none was chosen), ``backend`` rendering
    under it, ``mitigations`` resolved under it and checked against the loaded model (:func:`check_loaded_model`),
    and every cell of mitigation × image control (``controls``; default ``[spec.control]``) × sampling seed
    (``seeds``) checked against the backend: what :func:`run_grid` checks first (once per model), and a config
    grid before it writes its plan.

    Raises:
        RunError: a control or mitigation this backend cannot run (a predictions file, an API model), or seeds
            it cannot sample with.
    """
    from medheval.run.paper_protocols import configure_backend, get_protocol
    from medheval.run.seeds import check_seeds

    spec = _adopt_answers_protocol(spec, backend)
    protocol = get_protocol(spec.protocol)
    protocol.check_benchmarks(spec.benchmarks)
    methods = resolve_mitigations(protocol, mitigations)
    backend = configure_backend(backend, protocol, spec.chat_template)
    check_loaded_model(backend, methods)
    spec = _with_protocol_options(spec, protocol)
    controls = list(dict.fromkeys(controls or [spec.control]))
    try:
        for kind in controls:
            Control(check_control(kind)).check_mitigations([text for text, _ in methods])
    except ControlError as error:
        raise RunError(str(error)) from None
    if not backend.needs_images and any(kind != "none" for kind in controls):
        raise RunError("--control needs a model (--model): a predictions file was decoded elsewhere, with its images")
    if not backend.needs_images and any(method is not None for _, method in methods):
        raise RunError("--mitigation needs a model (--model): a predictions file was decoded elsewhere")
    if not getattr(backend, "supports_mitigations", True) and any(method is not None for _, method in methods):
        raise RunError(f"--mitigation changes a local model's decoding loop; {backend.name} answers over an API. "
                       f"Run mitigations with an HF model (--model <hub id or folder>)")
    if seeds:
        check_seeds(backend, spec.generation, seeds)
    return ConfiguredRun(spec, backend, methods, controls, list(seeds) if seeds else None)


def run_grid(spec: RunSpec, backend: Backend, mitigations: Sequence[str], batch_size: int = 8,
             controls: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
             splits: BuiltSplits | None = None) -> dict[str, Any]:
    """Run ``spec`` once per mitigation (``none`` = plain decoding) × image control (``controls``; default
    ``[spec.control]``, :mod:`medheval.run.control`) × sampling seed (``seeds``, :mod:`medheval.run.seeds`),
    side by side like MedHEval's Table 4: :func:`configure_run`, then :func:`run_configured` (``splits``: those
    :func:`check_before_model` built).

    One cell writes straight into ``spec.output``; several (or any with seeds) write one sub-folder each
    (``<output>/<mitigation>/``, ``<output>/<mitigation>__<control>/`` for a blind cell,
    ``…__seed-<s>/`` per seed, each resumable on its own) plus a combined ``results.md``/``results.json``.
    """
    return run_configured(configure_run(spec, backend, mitigations, controls, seeds), batch_size, splits)


def run_configured(configured: ConfiguredRun, batch_size: int = 8, splits: BuiltSplits | None = None
                   ) -> dict[str, Any]:
    """:func:`run_grid` of a model :func:`configure_run` has configured (each split built once: ``splits``, or
    here). Several cells, or any seed, lock the folder and record the seeds and the plan (the main process, while
    the others wait: a refused plan stops every process of a launch) before the first cell starts."""
    from medheval.run.seeds import record_seeds

    spec, backend, methods, controls, seeds = configured
    cells = [(text, method, kind, seed) for text, method in methods for kind in controls for seed in (seeds or [None])]
    group = process_group()
    several = len(cells) > 1 or bool(seeds)
    lock = group.lock(spec.output, spec.lock_timeout) if several else contextlib.nullcontext()
    with lock:
        if several and (Path(spec.output) / "run.json").exists():
            raise RunError(f"{spec.output} holds a single run (run.json); a grid of {len(cells)} mitigation × "
                           f"control × seed cells there would overwrite its results.md/results.json. Choose another "
                           f"--output folder.")
        with group.together("recording the grid plan"):
            if group.is_main:  # the other processes of a launch write neither file
                record_seeds(Path(spec.output), seeds)
                if several:  # the plan, before the first cell starts (medheval.run.grid_plan)
                    record_plan(Path(spec.output), {"mitigations": [text for text, _ in methods],
                                                    "controls": controls}, _planned(spec, backend, cells))
        return _run_methods(spec, backend, cells, batch_size, seeds, splits or BuiltSplits())


def _cell_identity(backend: Backend, method: Any, control: str) -> tuple[str, str]:
    """The mitigation and image control one cell records: a re-score records those its answers were made with."""
    label = method.spec() if method is not None else getattr(backend, "carried_mitigation", "none")
    return label, getattr(backend, "carried_control", "none") if control == "none" else control


def _planned(spec: RunSpec, backend: Backend, cells: list[tuple[str, Any, str, int | None]]) -> list[PlannedCell]:
    """The plan of :func:`run_grid`'s cells (folders relative to ``spec.output``), named as :func:`_run_methods`
    names them."""
    planned = []
    for _, method, control, seed in cells:
        label, kind = _cell_identity(backend, method, control)
        planned.append(PlannedCell(folder=cell_folder(label, kind, seed), model=str(backend.name), mitigation=label,
                                   control=kind, seed=seed, benchmarks=tuple(spec.benchmarks)))
    return planned


def _run_methods(spec: RunSpec, backend: Backend, cells: list[tuple[str, Any, str, int | None]], batch_size: int,
                 seeds: Sequence[int] | None = None, splits: BuiltSplits | None = None) -> dict[str, Any]:
    """The body of :func:`run_grid` (its folder locked when the grid has several runs; every cell takes its
    splits from ``splits``)."""
    from medheval.report.tables import write_grid_markdown
    from medheval.run.paper_protocols import get_protocol

    protocol = get_protocol(spec.protocol)
    accepted = getattr(backend, "accepted_overrides", None)
    runs = []
    several = len(cells) > 1 or bool(seeds)
    for text, method, control, seed in cells:
        label, control = _cell_identity(backend, method, control)  # a re-score's: those of its answers
        plan = protocol.plan(_method_name(text), spec.generation, accepted)
        variant = backend
        if method is not None:
            variant = copy.copy(backend)
            variant.generate_kwargs = {**getattr(backend, "generate_kwargs", {}), "custom_generate": method}
        if seed is not None:
            variant = copy.copy(variant)
            variant.seed = seed
        output = Path(spec.output) / cell_folder(label, control, seed) if several else spec.output
        runs.append(run(dataclasses.replace(spec, output=output, mitigation=label, control=control, seed=seed,
                                            generation=plan),
                        variant, batch_size=batch_size, splits=splits))
    if several and process_group().is_main:
        combined: dict[str, Any] = {"runs": runs}
        seeded = None
        if seeds:  # the passes' figures: mean and spread over seeds (medheval.report.seeds)
            from medheval.report.paper import to_json
            from medheval.report.seeds import over_seeds_of

            seeded = over_seeds_of(Path(spec.output), spec.report_cluster)
            combined.update(seeds=list(seeds), over_seeds=to_json(seeded) if seeded is not None else None)
        atomic_write_text(Path(spec.output) / "results.json", json.dumps(combined, indent=2, sort_keys=True, default=str))
        write_grid_markdown(runs, Path(spec.output) / "results.md")
        if seeded is not None:
            from medheval.report.paper import to_markdown

            path = Path(spec.output) / "results.md"
            atomic_write_text(path, path.read_text() + "\n" + to_markdown(seeded))
        write_report_html(Path(spec.output), combined, spec.report_cluster, spec.compare_published)
    if seeds:
        return {"runs": runs, "seeds": list(seeds)}
    return runs[0] if len(runs) == 1 else {"runs": runs}

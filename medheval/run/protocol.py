"""The split protocol: the one interface through which the runner runs and scores a benchmark split.

The runner (:mod:`medheval.run.runner`) knows no benchmark. For each split it asks the benchmark's
dataset unit which protocol runs it: ``PROTOCOLS = {task: "module:Class"}`` in
``datasets/<name>/<name>.py``, imported by name when first needed (:func:`protocol_for`); a unit that
declares none for ``generate`` runs the standard one (a model answers each record, metrics score the
answers: :class:`medheval.run.runner.QAProtocol`). A protocol implements, per split:

0. :meth:`SplitProtocol.check_inputs` — before the model loads (:func:`medheval.run.runner.check_before_model`):
   refuse an input it needs whatever the model (a pinned file, a judge setting);
1. :meth:`SplitProtocol.check` — before loading: refuse a backend or judge it cannot work with;
2. :meth:`SplitProtocol.prepare` — after loading: further checks, and the metrics the split is scored with;
3. :meth:`SplitProtocol.run_split` — the generation (data parallel where the protocol allows), or none;
4. :meth:`SplitProtocol.score_split` — on the main process: the split's ``results.json`` entry and its
   per-item rows (``scored.jsonl``);
5. :meth:`SplitProtocol.item_columns` — read a finished run's per-item metric inputs back (the report's
   intervals), for protocols whose items are not in ``scored.jsonl``.

Implemented by the standard QA runner, ClinHallu's stage-replacement protocol
(:mod:`medheval.families.clinhallu.task`) and Med-HallMark's detection task
(:mod:`medheval.families.med_hallmark.detection`, ``--task detection``). The helpers protocols share
(metric loading, metric keyword arguments, options without secrets) live here too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from pathlib import Path
from typing import Any, Callable, ClassVar, Container, Mapping

from medheval.data.schema import CLUSTER_UNITS, cluster_id, record_credentialed

TASKS = ("generate", "detection")


class RunError(RuntimeError):
    """A run cannot proceed; the message says what to change."""


@dataclasses.dataclass
class SplitJob:
    """One split of a run, as a protocol's :meth:`~SplitProtocol.run_split` and
    :meth:`~SplitProtocol.score_split` see it.

    Attributes:
        loaded: the split (``LoadedBenchmark``: dataset, files, image resolver, quality counts).
        backend: the model under test (``None`` where a task runs no model).
        spec: the run's ``RunSpec``.
        output: the run's output folder.
        metric_names: what :meth:`~SplitProtocol.prepare` returned; ``options``: their checked options.
        warnings: the run's warnings (append through the runner to show them too).
        group: the process group (data parallel; one process without ``accelerate``).
        results: the run's ``results.json`` content so far (e.g. ``failed_metrics``).
        state: storage shared by the splits of one run (the predictions log the runner read, ...).
        batch_size: records per generation batch.
    """

    loaded: Any
    backend: Any
    spec: Any
    output: Path
    metric_names: list[str]
    options: dict[str, dict[str, Any]]
    warnings: list[str]
    group: Any = None
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 8

    @property
    def split(self) -> str:
        return f"{self.loaded.name}:{self.loaded.config}"


class SplitProtocol:
    """How one benchmark split is run and scored (the steps in the module docstring)."""

    name: ClassVar[str] = "protocol"

    def check_inputs(self, benchmark: str, spec: Any) -> None:
        """Before the model loads: raise :class:`RunError` for an input the split needs whatever the model
        (a file, a judge setting); ``spec`` holds the run's options with the paper protocol's merged in."""

    def check(self, benchmark: str, backend: Any, spec: Any) -> None:
        """Before the split loads: raise :class:`RunError` for a backend or judge this protocol cannot use."""

    def prepare(self, loaded: Any, backend: Any, spec: Any) -> list[str]:
        """After the split loads: further checks; returns the names of the metrics that score it."""
        raise NotImplementedError

    def run_split(self, job: SplitJob) -> Any:
        """Generate what the split needs (every process calls it); returns what :meth:`score_split` takes."""
        return None

    def score_split(self, job: SplitJob, generated: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """On the main process: the split's results entry and per-item rows."""
        raise NotImplementedError

    def item_columns(self, run_folder: Path, split: str, entry: Mapping[str, Any]
                     ) -> tuple[dict[str, list] | None, str | None]:
        """A finished run's per-item metric inputs for ``split`` (columns plus ``ids``), or ``(None, why not)``."""
        return None, f"{self.name} keeps no per-item columns beyond scored.jsonl"


def _unit(name: str) -> Any | None:
    from medheval.data.registry import load_unit_module

    try:
        return load_unit_module("datasets", name)
    except KeyError:
        return None


def protocol_for(name: str, task: str = "generate") -> SplitProtocol | None:
    """The protocol benchmark ``name`` declares for ``task`` (``PROTOCOLS`` in its dataset unit), or ``None``.

    Raises:
        RunError: the declared ``module:Class`` cannot be imported or is not a :class:`SplitProtocol`.
    """
    if task not in TASKS:
        raise RunError(f"unknown task {task!r}; choose one of {TASKS}")
    unit = _unit(name)
    declared = dict(getattr(unit, "PROTOCOLS", None) or {}).get(task)
    if declared is None:
        return None
    module_name, _, class_name = str(declared).partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise RunError(f"datasets/{name}/{name}.py declares protocol {declared!r} for task {task!r}, which "
                       f"cannot be imported ({error})") from None
    if not (isinstance(found, type) and issubclass(found, SplitProtocol)):
        raise RunError(f"datasets/{name}/{name}.py: protocol {declared!r} is not a SplitProtocol")
    return found()


def benchmark_default_metrics(name: str) -> tuple[str, ...] | None:
    """The ``DEFAULT_METRICS`` a benchmark unit declares, or ``None`` (the runner's per-answer-type defaults)."""
    found = getattr(_unit(name), "DEFAULT_METRICS", None)
    return tuple(found) if found else None


def benchmark_cluster_unit(name: str) -> str:
    """The unit benchmark ``name``'s items are correlated within (``CLUSTER`` in its dataset unit: ``image``,
    ``study``, ``report``; ``item`` when it declares none), which the report's bootstrap resamples."""
    unit = getattr(_unit(name), "CLUSTER", None) or "item"
    if unit not in CLUSTER_UNITS:
        raise RunError(f"datasets/{name}/{name}.py: CLUSTER = {unit!r} is not one of {sorted(CLUSTER_UNITS)}")
    return str(unit)


def add_clusters(loaded: Any, entry: dict[str, Any], per_item: list[dict[str, Any]]) -> None:
    """Record the split's cluster unit in its results entry (``cluster_unit``) and each scored row's cluster
    label (``cluster``, :func:`medheval.data.schema.cluster_id`), for the report's clustered intervals."""
    unit = benchmark_cluster_unit(loaded.name)
    entry["cluster_unit"] = unit
    if not per_item:
        return
    columns = [name for name in ("id", "images", "meta") if name in loaded.dataset.column_names]
    labels = {row["id"]: cluster_id(row, unit) for row in loaded.dataset.select_columns(columns).to_list()}
    for item in per_item:
        if item.get("id") in labels:
            item["cluster"] = labels[item["id"]]


def detector_options(detector: str | None, accepted: Container[str]) -> dict[str, Any]:
    """Metric options for ``--detector``: ``"rule"`` -> ``classifier="rule"``; a folder ->
    ``classifier="detector", detector_path=<folder>``; only for metrics whose ``_compute`` takes them."""
    if not detector or "detector_path" not in accepted:
        return {}
    if detector == "rule":
        return {"classifier": "rule"} if "classifier" in accepted else {}
    # explicit, so that a --judge given for other metrics (sh_judge) does not take over the levels
    return {"detector_path": detector, **({"classifier": "detector"} if "classifier" in accepted else {})}


# The pip extra that brings a metric's optional packages (setup.cfg extras_require; a test checks every metric's
# requirements.txt against it). Every other metric needs only medheval's own dependencies.
METRIC_EXTRAS: dict[str, str] = {"radgraph_f1": "radiology"}


def metric_install_hint(name: str) -> str:
    """The pip command that installs what metric ``name`` imports."""
    extra = METRIC_EXTRAS.get(name)
    return f"pip install 'medheval[{extra}]'" if extra else "pip install medheval (it brings what its metrics import)"


def missing_packages(error: ImportError) -> str | None:
    """The packages an ImportError says are missing: evaluate's list (``... the following dependencies['nltk',
    'rouge_score'] ...``), else the module a ModuleNotFoundError names; None for another ImportError (a name
    missing from an installed module: a version mismatch, not a missing package)."""
    listed = re.search(r"dependencies\s*\[([^\]]*)\]", str(error))
    if listed:
        return ", ".join(name.strip(" '\"") for name in listed.group(1).split(","))
    return error.name if isinstance(error, ModuleNotFoundError) else None


@functools.lru_cache(maxsize=None)
def load_metric(name: str) -> Any:
    """Each metric module is loaded once per process, however many splits use it. A local folder never
    reaches the Hub, so no offline setting is needed (and the runner leaves ``os.environ`` alone). A package
    the metric imports that is not installed is a :class:`RunError` naming the pip command that brings it."""
    import evaluate

    from medheval.data.registry import metric_path

    try:
        return evaluate.load(metric_path(name))
    except ImportError as error:
        missing = missing_packages(error)
        if missing is None:
            raise RunError(f"metric `{name}` cannot load: {error}; an installed package is of a version it does not "
                           f"work with: reinstall it with {metric_install_hint(name)}") from error
        raise RunError(f"metric `{name}` cannot load: it imports {missing}, which is not installed; "
                       f"install it: {metric_install_hint(name)}") from error


# Record fields a metric receives when its ``_compute`` names them (one value per scored record).
RECORD_INPUTS: dict[str, Callable[[dict], Any]] = {
    "ids": lambda row: row["id"],
    "questions": lambda row: row["question"],
    "answer_types": lambda row: row["answer_type"],
    "choices": lambda row: row["choices"],
    "raw_choices": lambda row: (row["meta"] or {}).get("raw_choices") or "",
    "categories": lambda row: row["category"],
    "sources": lambda row: row["source"],
    "credentialed": lambda row: record_credentialed(row),
    "steps": lambda row: (row["meta"] or {}).get("step"),
    "languages": lambda row: (row["meta"] or {}).get("language"),
}


def metric_kwargs(metric: Any, rows: list[dict], options: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``metric.compute`` beyond predictions/references: the record fields and
    options its ``_compute`` signature names. An option it does not accept, or whose value does not
    fit the option's declared type, is an error (:mod:`medheval.scoring.metric_options`)."""
    from medheval.scoring.metric_options import check_options, compute_parameters

    accepted = compute_parameters(metric)
    kwargs = {name: [field(row) for row in rows] for name, field in RECORD_INPUTS.items() if name in accepted}
    kwargs.update(check_options(metric.name, metric, options, set(RECORD_INPUTS)))
    return kwargs


def skipped_undecodable(loaded: Any) -> dict[str, Any]:
    """``{"skipped_undecodable_images": {count, examples}}`` when ``--on-missing skip`` dropped records whose
    image file does not decode (absent otherwise, as in results written before they were counted)."""
    skipped = getattr(loaded, "skipped_undecodable_images", None) or []
    if not skipped:
        return {}
    return {"skipped_undecodable_images": {"count": len(skipped), "examples": [rid for rid, _ in skipped[:20]]}}


def split_entry(loaded: Any, **fields: Any) -> dict[str, Any]:
    """A split's ``results.json`` entry: what every protocol reports about the data (records, skipped images,
    annotation files and their hashes, image roots, label-noise counts, run options) plus ``fields``."""
    return {
        "n_records": len(loaded.dataset),
        "skipped_missing_images": {"count": len(loaded.skipped_missing_images),
                                   "examples": [rid for rid, _ in loaded.skipped_missing_images[:20]]},
        **skipped_undecodable(loaded),
        "annotation_files": loaded.files,
        "image_roots": loaded.resolver.describe() if loaded.resolver else {},
        "data_quality": loaded.quality,
        **fields,
        **({"run_options": loaded.run_options} if loaded.run_options else {}),
    }


def safe_options(spec: Any) -> dict[str, Any]:
    """Metric options as recorded in results: secrets (``api_key`` …) never leave the process."""
    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ("<redacted>" if "key" in k.lower() or "secret" in k.lower() or "password" in k.lower()
                        else clean(v)) for k, v in value.items()}
        if isinstance(value, str):
            return re.sub(r"//[^/@\s]+@", "//", value)  # user:password@ in a URL
        return value

    judge = clean(spec.judge)
    return {"metric_options": clean(spec.metric_options), "judge": judge,
            "allow_remote_credentialed": [clean(str(entry)) for entry in spec.allow_remote_credentialed]}


__all__ = [
    "METRIC_EXTRAS",
    "RECORD_INPUTS",
    "TASKS",
    "RunError",
    "SplitJob",
    "SplitProtocol",
    "add_clusters",
    "benchmark_cluster_unit",
    "benchmark_default_metrics",
    "detector_options",
    "load_metric",
    "metric_install_hint",
    "metric_kwargs",
    "missing_packages",
    "protocol_for",
    "record_credentialed",
    "safe_options",
    "split_entry",
]

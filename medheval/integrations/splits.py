"""The one place both harnesses (lmms-eval, inspect_ai) get a split's items, generation settings and scores.

Everything delegates to the code ``medheval run`` uses: records through
:func:`medheval.data.benchmarks.prepare_benchmark` (via the runner's ``_prepare_split``), images through
the runner's image-root check, prompts through :func:`medheval.run.prompts.build_prompt`, lengths through
:class:`medheval.run.generation.GenerationPlan`, and metrics through the runner's
:func:`medheval.run.runner.score` with the metrics ``medheval run`` picks when ``--metrics`` is not given.
A harness keeps (id, prediction) per sample and calls :func:`score_split` once over all of them, so ratio
metrics (CHAIR_i, BLEU …) are computed over the split, never averaged over items.

Settings come from arguments, else the environment:

- ``MEDHEVAL_DATA_DIR``: the data folder (``--data-dir``); ``MEDHEVAL_DATA_DIR_<BENCHMARK>`` (e.g.
  ``MEDHEVAL_DATA_DIR_MED_STEPBENCH``) wins for that benchmark, since Med-StepBench and Med-HallMark read
  folders of their own.
- ``MEDHEVAL_IMAGE_ROOTS``: ``"source=root,source=root"`` (each item as one ``--image-root``; a bare
  root is the default for every source). One value serves every split: a split uses the roots of its own
  sources, and roots of other sources are not noted (a root name that matches none still shows in the error
  of a split that lacks a root).
- ``MEDHEVAL_ALLOW_CREDENTIALED``: ``1``/``true`` lets a split of credentialed records (MIMIC-CXR, MIMIC-IV)
  load (:func:`load_items`, :func:`record_images`); an explicit argument (inspect's ``-T
  allow_credentialed=true``) wins. Without it such a split is refused: a harness hands the images to whatever
  model it runs, possibly a third-party API, where ``medheval run`` checks the endpoint.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Mapping

from PIL import Image

from medheval.data.benchmarks import benchmark_configs, builder_class
from medheval.scoring.headline import HEADLINE_NUMBERS

HARNESS_BENCHMARKS: tuple[str, ...] = (
    "mm_vishal", "cxr_vishal", "vishal_report", "knowledge", "context", "med_hallmark", "med_stepbench",
)
EXCLUDED: dict[str, str] = {
    "clinhallu": "its protocol regenerates each item once per replaced reasoning stage (several generations "
                 "per item), which a one-generation-per-sample harness task cannot express; use `medheval run`",
}
# Answer types per benchmark, for the split-wide generation length (a harness has one setting per task);
# tests/test_integrations_splits.py checks this table against the loaded fixture splits.
ANSWER_TYPES: dict[str, tuple[str, ...]] = {
    "mm_vishal": ("yes_no", "multiple_choice"), "cxr_vishal": ("yes_no", "multiple_choice"),
    "vishal_report": ("report",), "knowledge:closed": ("yes_no",), "knowledge:open": ("open",),
    "context": ("yes_no",), "med_hallmark": ("yes_no", "open"), "med_hallmark:irg": ("report",),
    "med_stepbench": ("statement",),
}
DATA_DIR_ENV = "MEDHEVAL_DATA_DIR"
IMAGE_ROOTS_ENV = "MEDHEVAL_IMAGE_ROOTS"
ALLOW_CREDENTIALED_ENV = "MEDHEVAL_ALLOW_CREDENTIALED"
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"", "0", "false", "no", "off"})


@dataclass
class HarnessItem:
    """One sample as a harness sees it: canonical id, the prompt ``medheval run`` sends, decoded images,
    the reference answer, and the canonical record itself."""

    id: str
    prompt: str
    images: list[Image.Image]
    target: str
    record: dict


def _check_benchmark(benchmark: str) -> None:
    if benchmark in EXCLUDED:
        raise ValueError(f"benchmark {benchmark!r} has no harness task: {EXCLUDED[benchmark]}")
    if benchmark not in HARNESS_BENCHMARKS:
        raise ValueError(f"unknown harness benchmark {benchmark!r}; choose one of {', '.join(HARNESS_BENCHMARKS)}")


def harness_splits() -> list[tuple[str, str]]:
    """Every (benchmark, config) pair that the harness tasks expose, in a stable order."""
    return [(name, config) for name in HARNESS_BENCHMARKS for config in benchmark_configs(name)]


def default_config(benchmark: str) -> str:
    """The config ``medheval run`` uses when the benchmark is named without one."""
    _check_benchmark(benchmark)
    cls = builder_class(benchmark)
    return cls.DEFAULT_CONFIG_NAME or cls.BUILDER_CONFIGS[0].name


def parse_image_roots(text: str, where: str = IMAGE_ROOTS_ENV) -> dict[str, str]:
    """``"slake=/data/slake,/data/all"`` -> ``{"slake": "/data/slake", "*": "/data/all"}`` (items are
    ``--image-root`` values, parsed by :func:`medheval.data.images.parse_image_root_args`)."""
    from medheval.data.images import parse_image_root_args

    items = [item for item in text.split(",") if item.strip()]
    try:
        return parse_image_root_args(items)
    except ValueError as error:
        raise ValueError(f"{where}={text!r}: {error}. Expected 'source=PATH_OR_URL,source=PATH_OR_URL' "
                         "(a bare PATH_OR_URL is the root for every source)") from None


def harness_settings(data_dir: str | os.PathLike[str] | None = None,
                     image_roots: str | Mapping[str, str] | None = None,
                     benchmark: str | None = None) -> tuple[str | None, dict[str, str] | None]:
    """(data folder, image roots): explicit values win, else ``MEDHEVAL_DATA_DIR_<BENCHMARK>``,
    ``MEDHEVAL_DATA_DIR`` and ``MEDHEVAL_IMAGE_ROOTS`` (module docstring); ``None`` where nothing is set."""
    if data_dir is None:
        specific = os.environ.get(f"{DATA_DIR_ENV}_{benchmark.upper()}") if benchmark else None
        data_dir = specific or os.environ.get(DATA_DIR_ENV) or None
    if isinstance(image_roots, str):
        image_roots = parse_image_roots(image_roots, "image_root")
    elif image_roots is None and os.environ.get(IMAGE_ROOTS_ENV, "").strip():
        image_roots = parse_image_roots(os.environ[IMAGE_ROOTS_ENV])
    return (os.fspath(data_dir) if data_dir is not None else None), (dict(image_roots) if image_roots else None)


def credentialed_allowed(allow: bool | str | None = None) -> bool:
    """Whether credentialed splits may load: ``allow`` when given (a bool, or inspect's ``-T`` text ``true``/
    ``false``), else ``$MEDHEVAL_ALLOW_CREDENTIALED``; anything but a yes/no spelling is an error."""
    where = "allow_credentialed"
    if allow is None:
        allow, where = os.environ.get(ALLOW_CREDENTIALED_ENV, ""), ALLOW_CREDENTIALED_ENV
    if isinstance(allow, bool):
        return allow
    text = str(allow).strip().lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise ValueError(f"{where}={allow!r}: expected true or false (1/0, yes/no)")


def check_credentialed(split: str, records: list[Mapping[str, Any]], allow: bool | str | None = None) -> None:
    """Refuse (:class:`~medheval.judges.endpoints.CredentialedDataError`, naming the split and records) records
    from credentialed sources (``meta.credentialed``, else a MIMIC source) unless :func:`credentialed_allowed`."""
    from medheval.data.schema import record_credentialed
    from medheval.judges.endpoints import CredentialedDataError

    flagged = [str(record.get("id")) for record in records if record_credentialed(dict(record))]
    if not flagged or credentialed_allowed(allow):
        return
    shown = ", ".join(flagged[:3]) + (f" and {len(flagged) - 3} more" if len(flagged) > 3 else "")
    raise CredentialedDataError(
        f"{split}: refusing to load {len(flagged)} credentialed record(s) ({shown}) into a harness task. They "
        "derive from MIMIC-CXR / MIMIC-IV, released on PhysioNet under a credentialed data use agreement that "
        "forbids sharing the data with third parties; the harness sends each record's images to whatever model "
        "it runs (inspect --model / lmms-eval --model, possibly a remote API that medheval cannot check), and "
        "inspect also writes them into its .eval log. Nothing was sent.\n"
        "To proceed with a model you run yourself or a deployment your agreement covers, opt in: inspect "
        "-T allow_credentialed=true (and --no-log-images, which keeps the pixels out of the log); lmms-eval "
        f"{ALLOW_CREDENTIALED_ENV}=1. Or evaluate it with `medheval run`, whose API backend checks the endpoint.")


class _HarnessModel:
    """What the runner's checks need to know of the model: whether it reads images."""

    name = "harness"

    def __init__(self, needs_images: bool) -> None:
        self.needs_images = needs_images


def _prepare(benchmark: str, config: str | None, data_dir: Any, image_roots: Any, limit: int | None,
             needs_images: bool, metric_options: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """The split loaded and checked by the runner's own code (``_prepare_split``, ``_attach_images``)."""
    from medheval.run.runner import RunSpec, _attach_images, _prepare_split

    _check_benchmark(benchmark)
    data_dir, roots = harness_settings(data_dir, image_roots, benchmark)
    spec = RunSpec(benchmarks=[f"{benchmark}:{config or default_config(benchmark)}"], output="", data_dir=data_dir,
                   image_roots=roots, limit=limit,
                   metric_options={name: dict(values) for name, values in (metric_options or {}).items()})
    model = _HarnessModel(needs_images)
    prepared = _prepare_split(spec, model, spec.benchmarks[0], [])
    _attach_images(spec, model, [prepared], note_unused=False)  # one set of roots serves every split
    return prepared


def load_items(benchmark: str, config: str | None = None, data_dir: str | os.PathLike[str] | None = None,
               image_roots: str | Mapping[str, str] | None = None, limit: int | None = None,
               decode_images: bool = True, allow_credentialed: bool | str | None = None) -> list[HarnessItem]:
    """The split's items as ``medheval run`` feeds them to a model: same records (first ``limit``), same
    prompt text, same images (a missing root or file raises the runner's error naming ids and roots).
    ``decode_images=False``: every image is checked but none decoded (``images`` is empty; a harness that
    reads them per sample calls :func:`record_images`). Credentialed records (MIMIC) are refused unless
    ``allow_credentialed`` (else ``$MEDHEVAL_ALLOW_CREDENTIALED``) says yes: :func:`check_credentialed`."""
    from medheval.run.prompts import build_prompt

    loaded = _prepare(benchmark, config, data_dir, image_roots, limit, needs_images=True).loaded
    records = loaded.dataset.to_list()
    check_credentialed(f"{benchmark}:{loaded.config}", records, allow_credentialed)
    items = []
    for record in records:
        images = loaded.resolver.load_record_images(record) if loaded.resolver is not None and decode_images else []
        items.append(HarnessItem(id=record["id"], prompt=build_prompt(record), images=images,
                                 target=str(record["answer"] or ""), record=record))
    return items


@functools.lru_cache(maxsize=8)
def _resolver(roots: tuple[tuple[str, str], ...]) -> Any:
    from medheval.data.images import ImageResolver

    return ImageResolver(dict(roots))


def record_images(record: Mapping[str, Any], image_roots: str | Mapping[str, str] | None = None,
                  allow_credentialed: bool | str | None = None) -> list[Image.Image]:
    """One record's images (keys ``id``, ``source``, ``images``), decoded as ``medheval run`` decodes them,
    through the image roots of :func:`harness_settings`; a credentialed record's as :func:`load_items` allows."""
    if not record.get("images"):
        return []
    check_credentialed(f"{record.get('benchmark', '?')}:{record.get('config', '?')}", [record], allow_credentialed)
    roots = harness_settings(None, image_roots)[1] or {}
    return _resolver(tuple(sorted(roots.items()))).load_record_images(record)


def default_metric_names(benchmark: str, config: str | None = None) -> list[str]:
    """The metrics ``medheval run`` computes for the split without ``--metrics``/``--judge`` (the runner's own
    choice, from the benchmark unit's defaults or the split's answer types in :data:`ANSWER_TYPES`)."""
    from medheval.run.runner import _metric_names

    config = config or default_config(benchmark)
    types = ANSWER_TYPES.get(f"{benchmark}:{config}") or ANSWER_TYPES[benchmark]
    declared = SimpleNamespace(name=benchmark, dataset=SimpleNamespace(unique=lambda column: list(types)))
    return _metric_names(declared, None)  # type: ignore[arg-type]


SPLIT_NUMBERS = HEADLINE_NUMBERS  # the numbers a harness reports per split: medheval.scoring.headline


def split_numbers(benchmark: str, config: str | None = None) -> list[tuple[str, bool]]:
    """``[("metric.key", higher_is_better), ...]``: the split's reported numbers, the headline numbers
    (:data:`medheval.scoring.headline.HEADLINE_NUMBERS`) of the metrics ``medheval run`` computes for it."""
    return [(f"{metric}.{key}", better) for metric in default_metric_names(benchmark, config)
            for key, better, _ in SPLIT_NUMBERS.get(metric, ())]


def number_value(metrics: Mapping[str, Any], number: str) -> float | None:
    """``metrics["chair"]["chair_s"]`` for ``number="chair.chair_s"``; ``None`` when the metric did not give it."""
    metric, _, key = number.partition(".")
    value = (metrics.get(metric) or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def generation_settings(benchmark: str, config: str | None = None) -> dict[str, Any]:
    """What ``medheval run`` generates this split with (no ``--max-new-tokens``): greedy, and the longest
    ``max_new_tokens`` of the split's answer types (:mod:`medheval.run.generation`; a harness task has one
    setting, so a yes/no item of a mixed split may get the multiple-choice length)."""
    from medheval.run.generation import FALLBACK_MAX_NEW_TOKENS, GenerationPlan

    config = config or default_config(benchmark)
    types = ANSWER_TYPES.get(f"{benchmark}:{config}") or ANSWER_TYPES[benchmark]
    plan = GenerationPlan()
    lengths = [plan.for_record(benchmark, config, answer_type).get("max_new_tokens", FALLBACK_MAX_NEW_TOKENS)
               for answer_type in types]
    return {"max_new_tokens": max(lengths), "do_sample": False}


_SCORING_SPLITS: dict[str, Any] = {}  # settings -> the split prepared for scoring, loaded once per process


def _scoring_split(benchmark: str, config: str | None, data_dir: Any, image_roots: Any,
                   metric_options: Mapping[str, Mapping[str, Any]] | None) -> Any:
    """The split as :func:`score_split` scores it, loaded once per (split, data folder, image roots, options):
    inspect's per-sample scorer calls ``score_split`` for every sample, and the split does not change."""
    data_dir, roots = harness_settings(data_dir, image_roots, benchmark)
    key = json.dumps([benchmark, config or default_config(benchmark), data_dir, roots, metric_options],
                     sort_keys=True, default=repr)
    if key not in _SCORING_SPLITS:
        if len(_SCORING_SPLITS) >= 8:
            _SCORING_SPLITS.pop(next(iter(_SCORING_SPLITS)))
        _SCORING_SPLITS[key] = _prepare(benchmark, config, data_dir, roots, None, needs_images=False,
                                        metric_options=metric_options)
    return _SCORING_SPLITS[key]


def split_is_fixture(benchmark: str, config: str | None, data_dir: str | os.PathLike[str] | None = None,
                     image_roots: str | Mapping[str, str] | None = None) -> bool:
    """Whether the split's annotation files are the embedded fixture (synthetic records): a harness task marks
    its log so, and ``publish --results`` refuses it as it refuses such a run (:mod:`medheval.run.provenance`)."""
    from medheval.run.provenance import files_are_fixture

    return files_are_fixture(_scoring_split(benchmark, config, data_dir, image_roots, None).loaded.files)


def score_split(benchmark: str, config: str | None, predictions: Mapping[str, str],
                data_dir: str | os.PathLike[str] | None = None, image_roots: str | Mapping[str, str] | None = None,
                metric_options: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict, list[dict]]:
    """(metrics, per-item rows) for ``predictions`` ({record id: output}), as ``medheval run --predictions``
    computes them (its ``results.json`` split ``metrics`` and ``scored.jsonl`` rows): the runner's
    :func:`~medheval.run.runner.score` with the split's default metrics. Records without a prediction are
    not scored (a harness run with ``--limit``); an id that is no record of the split raises."""
    from medheval.run.runner import score

    prepared = _scoring_split(benchmark, config, data_dir, image_roots, metric_options)
    known = set(prepared.loaded.dataset["id"])
    unknown = [rid for rid in predictions if rid not in known]
    if unknown:
        raise ValueError(f"{len(unknown)} prediction id(s) are no record of {benchmark}:{prepared.loaded.config} "
                         f"(first: {unknown[:5]}); ids look like {prepared.loaded.dataset['id'][:1]}")
    return score(prepared.loaded, predictions, prepared.metric_names, prepared.options)


# Per-item keys, in order of preference: the first one a row has is the value a harness logs per sample.
ITEM_VALUE_KEYS = (
    "item_scores",      # medihall_score: the item's MediHall Score (Med-HallMark)
    "correct",          # close_ended_accuracy, stepbench: 1.0 correct / 0.0 wrong or unparsed
    "scores",           # sh_judge: the judge's per-item score
    "report_chair",     # chair: the report's own CHAIR (hallucinated / generated findings; lower is better)
    "rougeL_per_item",  # text_generation: ROUGE-L F1 of the item
)


def item_value(row: Mapping[str, Any]) -> float | None:
    """The per-item number a harness logs for one scored row: the first of :data:`ITEM_VALUE_KEYS` the
    row has (a bool as 1.0/0.0); ``None`` when it has none, or when that metric failed on the item."""
    for key in ITEM_VALUE_KEYS:
        if key in row:
            value = row[key]
            return float(value) if isinstance(value, (bool, int, float)) else None
    return None


__all__ = ["ALLOW_CREDENTIALED_ENV", "ANSWER_TYPES", "EXCLUDED", "HARNESS_BENCHMARKS", "ITEM_VALUE_KEYS", "SPLIT_NUMBERS", "HarnessItem", "default_config",
           "default_metric_names", "generation_settings", "harness_settings", "harness_splits", "item_value", "load_items",
           "number_value", "parse_image_roots", "check_credentialed", "credentialed_allowed", "record_images", "score_split", "split_is_fixture", "split_numbers"]

"""Find and read run folders for ``medheval report``: single runs, mitigation grids, nested folders.

A *run folder* holds ``results.json`` with ``settings`` and ``benchmarks`` (written by
:func:`medheval.run.runner.run` or the detection task), usually with ``scored.jsonl`` (per-item rows) and
``predictions.jsonl``. A grid folder holds ``results.json`` with ``runs`` plus one run folder per
mitigation; any other folder is searched (a few levels deep) for run folders. A ClinHallu split has no
``scored.jsonl`` rows: its per-item columns come from the protocol logs (:func:`protocol_columns`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Sequence

from medheval.data.schema import is_credentialed, json_kind
from medheval.versions import STACK_PACKAGES

if TYPE_CHECKING:
    from medheval.run.grid_plan import PlannedCell

MAX_DEPTH = 4  # how deep a folder that is not a run is searched for run folders
CLUSTER_MODES = ("auto", "none")  # --cluster: each split's declared unit, or items (no clustering)


class ReportError(ValueError):
    """A path given to ``medheval report`` is not a run folder; the message names it."""


def seed_label(seed: int) -> str:
    """What a seeded pass of ``--seeds`` appends to its Mitigation label (:mod:`medheval.report.seeds`)."""
    return f" · seed {int(seed)}"


def run_has_random_weights(run: "Run") -> bool:
    """Whether a run's answers came from a random-weight model: its labels, its backend's own record or the
    provenance a re-score carries (:func:`medheval.run.provenance.of_run`)."""
    from medheval.run.provenance import of_run

    return bool(of_run(run.results)["random_weights"])


@dataclass
class Run:
    """One run folder: its ``results.json`` and its per-item rows (``[]`` when it has no ``scored.jsonl``)."""

    path: Path
    results: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    # what could not be read, and (the first run's) unfinished runs found beside it: shown in the report
    notes: list[str] = field(default_factory=list)
    cluster: str = "auto"  # intervals resample each split's clusters ("auto") or items ("none")
    _clinhallu: dict[str, tuple[dict[str, list] | None, str | None]] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> str:
        settings = self.results.get("settings", {})
        if settings.get("model"):
            return str(settings["model"])
        source = settings.get("level_source")  # the detection task: no model, a level source
        if isinstance(source, dict):
            return "detector:" + str(source.get("model") or source.get("path") or source.get("kind", "?"))
        return self.path.name

    @property
    def mitigation(self) -> str:
        return str(self.results.get("settings", {}).get("mitigation", "none"))

    @property
    def control(self) -> str:
        """The image-blind control (``none``, ``no_image``, ``blank``, ``noise``; ``none`` for older runs)."""
        from medheval.run.control import control_of

        return control_of(self.results.get("settings"))

    @property
    def seed(self) -> int | None:
        """The sampling seed of one pass of ``--seeds`` (``settings.seed``); ``None`` for a run without seeds."""
        seed = self.results.get("settings", {}).get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def variant(self) -> str:
        """The mitigation, with the control appended for a blind run (``none · no_image``) and the seed for a
        pass of ``--seeds`` (``none · seed 1``, :mod:`medheval.report.seeds`)."""
        text = self.mitigation if self.control == "none" else f"{self.mitigation} · {self.control}"
        return text if self.seed is None else text + seed_label(self.seed)

    @property
    def label(self) -> str:
        return f"{self.model} · {self.variant}"

    @property
    def versions(self) -> dict[str, Any] | None:
        """The software stack ``results.json`` records (``None`` for runs written before it did)."""
        versions = self.results.get("versions")
        return dict(versions) if isinstance(versions, dict) else None

    def not_a_number(self, where: str, value: Any) -> None:
        """Note (once) that the figure at ``where`` is present but not a finite number: the table shows "–"."""
        note = f"{self.path}: {where} is {value!r:.40}, not a number: shown as –"
        if value is not None and note not in self.notes and not isinstance(value, float):
            self.notes.append(note)

    def items_of(self, split: str) -> list[dict[str, Any]]:
        return [item for item in self.items if item["split"] == split]

    def clinhallu_columns(self, split: str) -> tuple[dict[str, list] | None, str | None]:
        """The split's per-item ClinHallu columns (:func:`protocol_columns`, read once), or why there are none."""
        if split not in self._clinhallu:
            entry = self.results["benchmarks"].get(split, {})
            self._clinhallu[split] = protocol_columns(self.path, split, entry)
        return self._clinhallu[split]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ReportError(f"{path}: not readable JSON ({error}); is the run still writing it, or was it "
                          f"truncated? Re-run `medheval run` into that folder to rewrite it.") from error


def _is_run(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("settings"), dict) and isinstance(data.get("benchmarks"), dict)


def split_of(item_id: str, splits: Iterable[str]) -> str:
    """The results key (``name:config``) of an item id ``benchmark/config/qid`` for scored rows that
    predate the ``split`` field: ``name:config`` when that is a split of the run, else the run's only
    split of that benchmark (e.g. ``mm_vishal:all`` holds ``mm_vishal/slake/…``), else ``name:all``."""
    name, _, rest = item_id.partition("/")
    config = rest.partition("/")[0]
    splits = list(splits)
    if f"{name}:{config}" in splits:
        return f"{name}:{config}"
    same = [split for split in splits if split.partition(":")[0] == name]
    if len(same) == 1:
        return same[0]
    return f"{name}:all" if f"{name}:all" in same else f"{name}:{config}"


def read_items(path: Path, results: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    """``scored.jsonl`` rows with ``split`` (joined by id prefix for older rows), ``category``/``source``
    (``None`` when older rows lack them), ``credentialed`` and, when ``predictions.jsonl`` has them, the
    rendered ``prompt`` of each item."""
    scored = path / "scored.jsonl"
    if not scored.exists():
        notes.append(f"{path}: no scored.jsonl, so no per-item intervals or samples for this run")
        return []
    items = []
    # lines end at "\n" only: str.splitlines() would also cut at U+2028, U+0085 ... inside an answer
    for number, line in enumerate(scored.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise ReportError(f"{scored}: line {number} is not JSON ({error}); re-run `medheval run` into "
                              f"{path} to rewrite it") from error
        if not isinstance(item, dict):
            raise ReportError(f"{scored}: line {number} is a JSON {_kind(item)}, expected an object (one scored "
                              f"item); re-run `medheval run` into {path} to rewrite it")
        items.append(item)
    splits = list(results.get("benchmarks", {}))
    prompts = _prompts(path / "predictions.jsonl")
    for item in items:
        item_id = str(item.get("id", ""))
        item["id"] = item_id
        item.setdefault("split", split_of(item_id, splits))
        item.setdefault("category", None)
        item.setdefault("source", None)
        flag = item.get("credentialed")
        item["credentialed"] = flag if isinstance(flag, bool) else is_credentialed(str(item.get("source") or "")) \
            or item["source"] is None and "mimic" in item_id.lower()
        if "prompt" not in item and item_id in prompts:
            item["prompt"] = prompts[item_id]
    return items


def protocol_columns(path: Path, split: str, entry: dict[str, Any]) -> tuple[dict[str, list] | None, str | None]:
    """Per-item columns of a split whose protocol keeps its items outside ``scored.jsonl`` (ClinHallu: its
    judged columns, read back from the protocol logs): the benchmark's protocol
    (:meth:`medheval.run.protocol.SplitProtocol.item_columns`), found through its dataset unit. Returns
    (columns plus ``ids``, ``None``) or (``None``, why not)."""
    from medheval.run.protocol import protocol_for

    name = split.partition(":")[0]
    try:
        protocol = protocol_for(name)
    except Exception as error:  # noqa: BLE001 - a report never fails on one split; it says why
        return None, f"{split}: its protocol could not be loaded ({error})"
    if protocol is None:
        return None, f"{split}: benchmark {name} declares no protocol with per-item columns"
    return protocol.item_columns(path, split, entry)


def _readable_entries(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a log's readable lines, none without the file: the report reads a log as it is and
    skips what does not parse (a torn last line, which the run's own reader repairs when it resumes)."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def _prompts(path: Path) -> dict[str, str]:
    """id -> rendered prompt, for logs whose entries carry one (newer runs; never required)."""
    return {str(entry.get("id")): entry["prompt"] for entry in _readable_entries(path)
            if isinstance(entry.get("prompt"), str)}


def find_runs(paths: Iterable[str | Path], cluster: str = "auto") -> list[Run]:
    """Every run folder under ``paths`` (a run, a grid, or a folder of them), each once: the folders given in their
    order, a folder inside another one given moved after it (:func:`_outermost_first`), each model's ``none`` run
    first (:func:`baseline_first`). A folder given twice, or inside another one given (a grid's own model folder),
    is searched once, as part of the outer one, so its cells and caveats are not counted twice.

    A grid's combined results.json whose sub-folders are gone still yields its runs (without items). A run
    folder started but not finished (:func:`unfinished_run`) and a grid without its combined results.json
    (:func:`unfinished_grid`; :func:`planned_grid` names its cells that never started when its ``grid.json``
    holds a plan) become caveats on the first run; when nothing else was found, the error.
    ``cluster`` (:data:`CLUSTER_MODES`) is how their intervals resample (:attr:`Run.cluster`)."""
    if cluster not in CLUSTER_MODES:
        raise ReportError(f"--cluster {cluster!r}: choose one of {CLUSTER_MODES}")
    given = [Path(path) for path in paths]
    for path in given:
        if path.is_file():  # e.g. the run's results.json instead of its folder
            fix = (f"pass its folder: {path.parent}" if path.name in ("results.json", "results.md", "report.html")
                   else "pass run folders written by `medheval run`")
            raise ReportError(f"{path}: a file, not a run folder; {fix}")
        if not path.is_dir():
            raise ReportError(f"{path}: no such folder; pass run folders written by `medheval run`")
    runs: list[Run] = []
    walked: set[Path] = set()  # every folder searched (resolved): one given twice, or inside another, is not again
    unfinished: list[str] = []  # caveats for runs and grids that were started but never finished
    for path in _outermost_first(given):
        if path.resolve() in walked:  # found with a folder it is in (a grid's own model folder), or given twice
            continue
        before = len(unfinished)
        found = _walk(path, 0, unfinished, walked)
        if not found and len(unfinished) == before:
            raise ReportError(f"{path}: not a run folder (no results.json with 'settings' and 'benchmarks') and "
                              f"no run folder below it (searched {MAX_DEPTH} levels); pass the --output folder "
                              f"of `medheval run`")
        for run in found:
            run.cluster = cluster
            runs.append(run)
    unfinished = list(dict.fromkeys(unfinished))
    if not runs:
        raise ReportError("; ".join(unfinished))
    runs = baseline_first(runs)
    runs[0].notes += unfinished  # shown once among the report's caveats
    return runs


UNFINISHED_MARKS = ("run.json", "predictions.jsonl")  # written when a run starts; results.json when it ends
RESUME = "re-run the same `medheval run` command to resume"


def _count_predictions(path: Path) -> int:
    """How many items ``predictions.jsonl`` answers (distinct ids of its readable lines; 0 without the file)."""
    return len({str(entry["id"]) for entry in _readable_entries(path) if "id" in entry})


def unfinished_run(path: Path) -> str | None:
    """The caveat for a run folder that was started but never scored (``run.json`` or ``predictions.jsonl``,
    no ``results.json``: killed, or still running), or ``None``."""
    if (path / "results.json").exists() or not any((path / name).exists() for name in UNFINISHED_MARKS):
        return None
    count = _count_predictions(path / "predictions.jsonl")
    return (f"{path}: incomplete run ({count} prediction(s) written, no results.json): not scored yet; {RESUME}")


def unfinished_grid(path: Path, found: int) -> str:
    """The caveat for a grid folder (its lock file, run folders below) without its combined ``results.json``
    and without a plan (written before grids recorded theirs): it cannot say which cells never started."""
    return (f"{path}: grid without its combined results.json: it did not finish; the report shows the {found} "
            f"finished run(s) found in it, and cells that never started are not listed; {RESUME}")


@dataclass
class PlanProgress:
    """How far a grid got through its plan (``grid.json``, :mod:`medheval.run.grid_plan`): its cells by state."""

    finished: list["PlannedCell"] = field(default_factory=list)  # results.json written
    unfinished: list["PlannedCell"] = field(default_factory=list)  # started (run.json or predictions.jsonl), not scored
    never_started: list["PlannedCell"] = field(default_factory=list)  # nothing written in its folder

    @property
    def planned(self) -> int:
        return len(self.finished) + len(self.unfinished) + len(self.never_started)


def plan_progress(path: Path, cells: Sequence["PlannedCell"]) -> PlanProgress:
    """Each planned cell of the grid at ``path`` by what its run folder holds: ``results.json`` (finished), a
    start mark (:data:`UNFINISHED_MARKS`: started, not finished) or neither (never started)."""
    progress = PlanProgress()
    for cell in cells:
        folder = path / cell.folder
        if (folder / "results.json").exists():
            progress.finished.append(cell)
        elif any((folder / name).exists() for name in UNFINISHED_MARKS):
            progress.unfinished.append(cell)
        else:
            progress.never_started.append(cell)
    return progress


def cell_names(cells: Sequence["PlannedCell"]) -> str:
    """Planned cells as the report names runs (``model · short mitigation``, a blind cell's control, a seeded
    pass's seed), each with its folder: ``m · vcd (m/vcd_alpha-1), m · none · no_image (m/none__no_image)``."""
    short = mitigation_labels(cell.mitigation for cell in cells)
    names = []
    for cell in cells:
        name = " · ".join([cell.model, short[cell.mitigation], *([cell.control] if cell.control != "none" else [])])
        names.append(f"{name}{seed_label(cell.seed) if cell.seed is not None else ''} ({cell.folder})")
    return ", ".join(names)


def planned_grid(path: Path, cells: Sequence["PlannedCell"], named: Collection[str] = ()) -> str:
    """The caveat for a grid folder with a plan but without its combined ``results.json``: the counts of its
    planned, finished, unfinished and never-started cells, and the last two by name. A started but unfinished
    cell whose own caveat (:func:`unfinished_run`) is among ``named`` is counted, not named again: that
    caveat says more (its folder and how many answers it wrote)."""
    from medheval.run.grid_plan import GRID_FILE

    progress = plan_progress(path, cells)
    unnamed = [cell for cell in progress.unfinished if unfinished_run(path / cell.folder) not in named]
    elsewhere = len(progress.unfinished) - len(unnamed)
    text = (f"{path}: grid without its combined results.json: it did not finish; its plan ({GRID_FILE}) has "
            f"{progress.planned} cell(s): {len(progress.finished)} finished (in the report), "
            f"{len(progress.unfinished)} started but unfinished"
            f"{f' ({elsewhere} named as incomplete run(s))' if elsewhere else ''}, "
            f"{len(progress.never_started)} never started")
    if unnamed:
        text += f"; started but unfinished: {cell_names(unnamed)}"
    if progress.never_started:
        text += f"; never started: {cell_names(progress.never_started)}"
    return f"{text}; {RESUME}"


def _compact(value: Any) -> str:
    """``value`` as JSON on one line, without spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def run_settings(run: Run) -> str:
    """The settings that tell runs apart, in one line (the "Run folders and full settings" section): protocol
    (:func:`medheval.run.provenance.of_run`), decoding (greedy, or sampled with its temperature, top_p and
    seed), max_new_tokens, the generation plan's own layers, ``--limit``, scoring (``upstream_compat``, metric
    options, judge), dtype, batch size and, for a re-score, the answers file; what is not recorded is left out."""
    from medheval.run.provenance import is_rescore, of_run

    results = run.results
    settings = results.get("settings") or {}
    backend = settings.get("backend") if isinstance(settings.get("backend"), dict) else {}
    provenance = of_run(results)
    parts = [f"protocol {provenance['protocol']}"]
    if backend.get("do_sample"):
        seed = run.seed if run.seed is not None else backend.get("seed")
        knobs = [f"{key} {backend[key]}" for key in ("temperature", "top_p") if backend.get(key) is not None]
        parts.append("sampled (" + ", ".join([*knobs, f"seed {seed}"]) + ")")
    elif "do_sample" in backend:
        parts.append("greedy")
    plan = settings.get("generation") if isinstance(settings.get("generation"), dict) else {}
    if backend.get("max_new_tokens") is not None:  # the built-in table (medheval.run.generation) beats it
        parts.append(f"max_new_tokens {'built-in per answer type, else ' if plan.get('builtin') else ''}"
                     f"{backend['max_new_tokens']}")
    layers = {key: plan[key] for key in ("defaults", "answer_types", "benchmarks", "fixed") if plan.get(key)}
    if layers or plan.get("builtin") is False:
        parts.append(f"generation {_compact(layers)}" + ("" if plan.get("builtin", True) else " (no built-in table)"))
    if provenance["limit"] is not None:
        parts.append(f"limit {provenance['limit']}")
    scoring = results.get("scoring") if isinstance(results.get("scoring"), dict) else None
    if scoring is not None:
        parts.append("scoring upstream_compat" if scoring.get("upstream_compat") else "scoring medheval rules")
        if scoring.get("non_default_options"):
            parts.append(f"metric options {_compact(scoring['non_default_options'])}")
        if scoring.get("judge"):
            parts.append(f"judge {scoring['judge'] if isinstance(scoring['judge'], str) else _compact(scoring['judge'])}")
    parts += [f"{name} {backend[key]}" for key, name in (("dtype", "dtype"), ("batch_size", "batch size"))
              if backend.get(key) is not None]
    if is_rescore(backend):
        parts.append(f"re-scored answers from {backend.get('path', '?')}")
    return " · ".join(parts)


def baseline_first(runs: Sequence[Run]) -> list[Run]:
    """``runs`` with each model's runs together and its ``none`` run (the baseline) first; otherwise in the
    given order (models in order of first appearance)."""
    models = list(dict.fromkeys(run.model for run in runs))
    order = {id(run): (models.index(run.model), run.mitigation != "none", index) for index, run in enumerate(runs)}
    return sorted(runs, key=lambda run: order[id(run)])


def _settings_of(spec: str) -> tuple[str, dict[str, str]]:
    """``name:key=value,...`` (the spec of :meth:`medheval.decoding.loop.DecodingMethod.spec`) as
    (name, {key: value})."""
    name, _, rest = spec.partition(":")
    return name, {key: value for key, _, value in (part.partition("=") for part in rest.split(",") if part)}


SHORT_SPEC = 24  # a spec without a preset up to this many characters is shown as it is


def mitigation_labels(specs: Iterable[str]) -> dict[str, str]:
    """A short label per mitigation spec for table rows and figures: the method and its preset
    (``avisc:preset=medheval,alpha=1.0,...`` -> ``avisc (medheval)``); a spec without a preset stays as it is
    when short, else its method. Specs that would share a label get the settings they differ in appended
    (``opera (official, threshold=25)``); any still alike keep their full spec. The full specs go in a legend."""
    parsed = {spec: _settings_of(spec) for spec in dict.fromkeys(specs)}

    def base(spec: str) -> str:
        name, settings = parsed[spec]
        if "preset" in settings:
            return f"{name} ({settings['preset']})"
        return spec if len(spec) <= SHORT_SPEC else name

    labels = {spec: base(spec) for spec in parsed}
    for spec, label in list(labels.items()):
        twins = [other for other in parsed if other != spec and base(other) == label]
        if not twins:
            continue
        name, settings = parsed[spec]
        keys = dict.fromkeys(key for other in [spec, *twins] for key in parsed[other][1] if key != "preset")
        differing = [f"{key}={settings.get(key, '–')}" for key in keys
                     if any(parsed[other][1].get(key) != settings.get(key) for other in twins)]
        shown = ([settings["preset"]] if "preset" in settings else []) + differing
        labels[spec] = f"{name} ({', '.join(shown)})" if shown else spec
    for spec, label in labels.items():
        if sum(other == label for other in labels.values()) > 1:
            labels[spec] = spec
    return labels


def run_labels(runs: Sequence[Run]) -> dict[int, str]:
    """A short, distinct name per run (by ``id``) for headers, legends and caveats, as ``results.md`` names
    them: ``model · short mitigation`` (:func:`mitigation_labels`) with a blind run's control appended
    (``m · none · no_image``); runs still alike get their folder name appended (``m · none (grid-a)``)."""
    short = mitigation_labels(run.mitigation for run in runs)
    base = {id(run): " · ".join([run.model, short[run.mitigation], *([run.control] if run.control != "none" else [])])
            for run in runs}
    labels = dict(base)
    for run in runs:
        twins = [other for other in runs if other is not run and base[id(other)] == base[id(run)]]
        if twins:
            names = {member.path.name for member in [run, *twins]}
            where = run.path.name if len(names) == len(twins) + 1 else str(run.path)
            labels[id(run)] = f"{base[id(run)]} ({where})"
    return labels


def _outermost_first(paths: Sequence[Path]) -> list[Path]:
    """``paths`` in order, those inside another of them (resolved) after the others."""
    resolved = [path.resolve() for path in paths]
    inner = [any(other in folder.parents for other in resolved) for folder in resolved]
    return [path for path, nested in zip(paths, inner) if not nested] + [
        path for path, nested in zip(paths, inner) if nested]


def _walk(path: Path, depth: int, unfinished: list[str], walked: set[Path], in_grid: bool = False) -> list[Run]:
    """The run folders at or below ``path`` not in ``walked`` (resolved folders already searched; ``path``'s are
    added); a started but unfinished run or grid (the outermost one, not each of its levels) adds its caveat to
    ``unfinished``."""
    from medheval.run.grid_plan import read_plan
    from medheval.run.outputs import LOCK_NAME

    if path.resolve() in walked:
        return []
    walked.add(path.resolve())
    results_path = path / "results.json"
    data = _read_json(results_path) if results_path.exists() else None
    if _is_run(data):
        notes = check_results(results_path, data)
        return [Run(path=path, results=data, items=read_items(path, data, notes), notes=notes)]
    incomplete = unfinished_run(path)
    if incomplete:
        unfinished.append(incomplete)
        return []
    # a grid (or run) holds its folder's lock; a grid's plan is in its grid.json (the outermost grid's counts)
    plan = read_plan(path) if data is None and not in_grid else None
    grid = data is None and not in_grid and ((path / LOCK_NAME).is_file() or plan is not None)
    before = len(unfinished)
    runs: list[Run] = []
    if depth < MAX_DEPTH:
        for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            runs += _walk(child, depth + 1, unfinished, walked, in_grid or grid)
    if plan is not None:  # said even when no cell finished: the plan names what never started
        unfinished.insert(before, planned_grid(path, plan, unfinished[before:]))
    elif grid and (runs or len(unfinished) > before):
        unfinished.insert(before, unfinished_grid(path, len(runs)))
    if not runs and isinstance(data, dict) and isinstance(data.get("runs"), list):
        for index, embedded in enumerate(data["runs"]):
            if _is_run(embedded):
                notes = check_results(results_path, embedded, f"runs[{index}].")
                runs.append(Run(path=path / f"runs[{index}]", results=embedded,
                                notes=[f"{path}: grid sub-folder missing; run {index} read from the combined "
                                       f"results.json (no per-item intervals)", *notes]))
    return runs


# fields the report reads as objects or lists, by level (a number or a list there: an edited or damaged file)
TOP_FIELDS = {"settings": dict, "labels": dict, "versions": dict, "usage": dict, "report": dict, "scoring": dict,
              "warnings": list, "failed_metrics": list}
ENTRY_FIELDS = {"metrics": dict, "data_quality": dict, "skipped_missing_images": dict,
                "skipped_undecodable_images": dict, "run_options": dict, "clinhallu_run": dict, "image_roots": dict,
                "annotation_files": list}
EXPECTED = {dict: "an object", list: "a list"}


def _kind(value: Any) -> str:
    """:func:`medheval.data.schema.json_kind`, an array named a list (as the report's messages say)."""
    kind = json_kind(value)
    return "list" if kind == "array" else kind


def _breakdown(key: str) -> bool:
    """Keys of a metric's output that hold a breakdown (an object): ``accuracy_by_category``, ``by_language``..."""
    return key.startswith(("accuracy_by_", "by_")) or "_by_" in key or key == "confusion"


def check_results(path: Path, results: dict[str, Any], prefix: str = "") -> list[str]:
    """Check the shape of a run's ``results.json`` before the report reads it.

    A field of the wrong structure (an object expected: ``benchmarks``, each split's entry, its ``metrics``,
    each metric's output and its ``accuracy_by_*``/``by_*`` breakdowns, ``settings``...; a list expected:
    ``warnings``...) raises :class:`ReportError` naming the file and the field. A value that is NaN or inf is
    shown as "–": returned as a caveat naming it (the tables add one for a figure that is text:
    :meth:`Run.not_a_number`)."""
    notes: list[str] = []

    def refuse(field: str, expected: str, value: Any) -> None:
        raise ReportError(f"{path}: field {prefix}{field} is a {_kind(value)}, expected {expected}; the file was "
                          f"edited or damaged: re-run `medheval run` to rewrite it")

    def check(value: Any, field: str, kind: type) -> None:
        if value is not None and not isinstance(value, kind):
            refuse(field, EXPECTED[kind], value)

    def not_finite(value: Any, field: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                not_finite(inner, f"{field}.{key}")
        elif isinstance(value, list):
            for index, inner in enumerate(value):
                not_finite(inner, f"{field}[{index}]")
        elif isinstance(value, float) and not math.isfinite(value):
            notes.append(f"{path}: {prefix}{field} is {value}, not a number: shown as –")

    def breakdowns(value: Any, field: str) -> None:
        for key, inner in value.items():
            if _breakdown(str(key)):
                check(inner, f"{field}.{key}", dict)
            if isinstance(inner, dict):
                breakdowns(inner, f"{field}.{key}")

    for key, kind in TOP_FIELDS.items():
        check(results.get(key), key, kind)
    if not isinstance(results.get("benchmarks"), dict):
        refuse("benchmarks", "an object (split -> entry)", results.get("benchmarks"))
    for split, entry in results["benchmarks"].items():
        where = f"benchmarks[{split!r}]"
        if not isinstance(entry, dict):
            refuse(where, "an object (one split's results)", entry)
        for key, kind in ENTRY_FIELDS.items():
            check(entry.get(key), f"benchmarks.{split}.{key}", kind)
        for metric, out in (entry.get("metrics") or {}).items():
            check(out, f"benchmarks.{split}.metrics.{metric}", dict)
            if isinstance(out, dict):
                breakdowns(out, f"benchmarks.{split}.metrics.{metric}")
    not_finite(results.get("benchmarks"), "benchmarks")
    return notes


STACK_COLUMNS = ("medheval", "python", *STACK_PACKAGES)


def software_stack(runs: Sequence[Run]) -> list[tuple[str, dict[str, str]]]:
    """``(runs, versions)`` rows of the "Software stack" section: one ``("all runs", …)`` row when every run
    records the same stack, else one row per run folder (``–`` where a version is not recorded); ``[]``
    when no run records its stack (runs written before results.json held ``versions``)."""
    if not any(run.versions for run in runs):
        return []
    stacks = [{name: str((run.versions or {}).get(name) or "–") for name in STACK_COLUMNS} for run in runs]
    if all(run.versions for run in runs) and all(stack == stacks[0] for stack in stacks):
        return [("all runs", stacks[0])]
    return [(f"{run.label} ({run.path})", stack) for run, stack in zip(runs, stacks)]

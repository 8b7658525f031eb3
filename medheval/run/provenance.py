"""Where a run's answers came from, carried through every re-score and checked before publishing.

A run's provenance (``results.json`` key ``provenance``) says what makes its numbers something other than a
model's result on a benchmark:

- ``random_weights``: the answers came from a random-weight model (``--model tiny-random``, ``medheval demo``);
- ``fixture``: some split read the embedded fixture (synthetic records), not the released annotations;
- ``limit``: the run scored only the first ``limit`` records of each split (``--limit``);
- ``protocol``: the evaluation protocol (``results.json`` ``protocol.name``; ``"clean"`` when absent);
- ``source_model``: the model that generated the answers (for a re-score, the one that wrote the file);
- ``made_with`` (a re-score only): how the answers were generated: the first line's ``generation`` settings,
  and from the source run's ``results.json`` (when beside its ``predictions.jsonl``) its ``seed``, software
  ``versions`` and ``inputs`` (:data:`INPUT_SETTINGS`: how the model's inputs were built), so a sampled run
  does not look greedy once re-scored, nor a protocol run's prompt ids tokenized whole.
- ``model_revision`` (when the run knows it): which weights answered (:mod:`medheval.backends.revision`: the
  Hub commit ``from_pretrained`` read, a local folder's name, an API model's reported names);
- ``dataset_revision`` (when the run read annotation files): per split (``BENCHMARK:CONFIG``), the annotation
  files the loader used, each with its sha256 and whether it is the pinned upstream file
  (:func:`annotation_revision`), and one sha256 over them all.

A re-score keeps the original run's ``model_revision`` and ``dataset_revision`` (from the ``results.json``
beside its ``predictions.jsonl``): the revisions of the answers' model and of the questions it was asked.
What it scores against is the annotation files it reads itself; a split whose files differ from the answers'
(:func:`files_changed`), or whose answers' files are unknown (no ``results.json`` beside, or one from before
revisions were recorded), is listed under ``scoring_dataset_revision`` (:func:`of_run`), so the two are never
confused. The runner refuses such a re-score when its answers are to other questions
(:func:`medheval.run.runner.check_rescored_files`) and warns otherwise.

The run writes it into every ``predictions.jsonl`` line it generates (key ``provenance``, only when some flag
is set), so ``medheval run --predictions`` on that file inherits it (from the lines, or from a
``results.json`` beside a ``predictions.jsonl``) and a re-score of a re-score still carries it.
``medheval publish --results`` refuses random-weight, fixture and limited results unless the matching
``--allow-*`` flag is passed (:data:`ALLOW_FLAGS`); the published entries then say so in their notes.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

CLEAN_PROTOCOL = "clean"
RESCORE_BACKEND = "predictions_file"  # the backend settings' name of a predictions file (a re-score)
_INHERITED = "_medheval_inherited_provenance"  # where inherited() keeps its result on the backend
# the per-split annotation revisions: of the questions the answers were generated for, of the files a re-score
# scored against where they are not those (or those are unknown); kept in results.json, never in log lines
REVISION_KEYS = ("dataset_revision", "scoring_dataset_revision")
FIXTURE_MARK = "the embedded fixture"  # in the runner's fixture warning (results written before provenance existed)
# what keeps results off the Hub -> the publish flag that lets them through (written into the published entry)
ALLOW_FLAGS = {"random_weights": "--allow-random-weights", "fixture": "--allow-fixture", "limit": "--allow-limit"}
WHY = {"random_weights": "come from a random-weight model (their numbers mean nothing)",
       "fixture": "were scored on the embedded fixture (synthetic records), not the released data",
       "limit": "scored only the first {limit} record(s) of each split (--limit {limit})"}


def is_rescore(run_or_backend: Any) -> bool:
    """Whether the answers were read from a predictions file (a re-score), not generated: ``run_or_backend`` is
    a run of ``results.json`` (its ``settings``), a ``run.json`` or settings block (its ``backend``), a backend's
    settings (``"backend": "predictions_file"``) or a backend object (a predictions file carries provenance)."""
    if not isinstance(run_or_backend, Mapping):
        return hasattr(run_or_backend, "carried_provenance")
    for key in ("settings", "backend"):
        if isinstance(run_or_backend.get(key), Mapping):
            return is_rescore(run_or_backend[key])
    return run_or_backend.get("backend") == RESCORE_BACKEND


def empty() -> dict[str, Any]:
    """The provenance of a clean run of a real model on the released data, before the model is known."""
    return {"random_weights": False, "fixture": False, "limit": None, "protocol": CLEAN_PROTOCOL, "source_model": None}


def merge(*parts: Mapping[str, Any] | None) -> dict[str, Any]:
    """One provenance from several (this run's and the ones it inherits): any flag set stays set, the
    smallest limit wins, a non-clean protocol wins, the first source model wins."""
    out = empty()
    for part in parts:
        if not part:
            continue
        out["random_weights"] = out["random_weights"] or bool(part.get("random_weights"))
        out["fixture"] = out["fixture"] or bool(part.get("fixture"))
        limit = part.get("limit")
        if isinstance(limit, int) and not isinstance(limit, bool):
            out["limit"] = limit if out["limit"] is None else min(out["limit"], limit)
        protocol = part.get("protocol") or CLEAN_PROTOCOL
        if out["protocol"] == CLEAN_PROTOCOL:
            out["protocol"] = str(protocol)
        out["source_model"] = out["source_model"] or part.get("source_model")
        if part.get("made_with") and not out.get("made_with"):  # the first (the original run's) wins
            out["made_with"] = dict(part["made_with"])
        if isinstance(part.get("model_revision"), Mapping) and not out.get("model_revision"):  # the first wins
            out["model_revision"] = dict(part["model_revision"])
        if isinstance(part.get("dataset_revision"), Mapping) and part["dataset_revision"]:  # per split, first wins
            out["dataset_revision"] = {**part["dataset_revision"], **out.get("dataset_revision", {})}
    return out


def notable(provenance: Mapping[str, Any]) -> bool:
    """Whether anything in ``provenance`` differs from a clean full run (then it is written into log lines)."""
    return bool(provenance.get("random_weights") or provenance.get("fixture") or provenance.get("limit") is not None
                or (provenance.get("protocol") or CLEAN_PROTOCOL) != CLEAN_PROTOCOL)


def for_log(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The ``provenance`` key of a ``predictions.jsonl`` line: ``{}`` for a clean run (nothing added); the
    per-split annotation files stay in ``results.json``."""
    if not notable(provenance):
        return {}
    return {"provenance": {key: value for key, value in provenance.items() if key not in REVISION_KEYS}}


def files_are_fixture(files: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a split's annotation files (``LoadedBenchmark.files``) include the embedded fixture."""
    return any(entry.get("fixture") for entry in files)


def annotation_revision(files: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What identifies a split's annotation source (``LoadedBenchmark.files``): each file's ``relpath`` (its name
    only, when absolute), ``sha256`` (or the datasets ``fingerprint`` of a Hub load), ``pinned`` (its sha256 is
    the one pinned for the upstream release; ``None`` where upstream pins none) and ``fixture``, plus one
    ``sha256`` over all of them; never where the file was read from. ``None`` without files."""
    described = []
    for entry in files:
        relpath = str(entry.get("relpath") or "")
        item: dict[str, Any] = {"relpath": Path(relpath).name if Path(relpath).is_absolute() else relpath,
                                "sha256": entry.get("sha256"), "pinned": entry.get("verified")}
        if entry.get("fingerprint") and not entry.get("sha256"):
            item["fingerprint"] = str(entry["fingerprint"])
        if entry.get("fixture"):
            item["fixture"] = True
        described.append(item)
    if not described:
        return None
    described.sort(key=lambda item: item["relpath"])
    digest = hashlib.sha256("".join(f"{item['relpath']}\0{item['sha256'] or item.get('fingerprint')}\n"
                                    for item in described).encode())
    return {"files": described, "sha256": digest.hexdigest()}


def dataset_revision_of(run: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{split: annotation_revision}`` over the splits of one run of ``results.json`` that name their files."""
    found = {}
    for split, block in (run.get("benchmarks") or {}).items():
        revision = annotation_revision(block.get("annotation_files") or []) if isinstance(block, Mapping) else None
        if revision:
            found[split] = revision
    return found


def files_changed(generated: Mapping[str, Any], scoring: Mapping[str, Any]) -> str | None:
    """How the annotation files a split is scored against (``scoring``) differ from those its answers were
    generated from (``generated``; both :func:`annotation_revision`), one ``"NAME sha256 OLD → NEW"`` per file
    (12-digit prefixes; ``absent`` where a side did not read it); ``None`` when they are the same."""
    if generated.get("sha256") == scoring.get("sha256"):
        return None

    def digests(revision: Mapping[str, Any]) -> dict[str, str]:
        return {str(entry.get("relpath")): str(entry.get("sha256") or entry.get("fingerprint"))
                for entry in revision.get("files") or [] if isinstance(entry, Mapping)}

    before, now = digests(generated), digests(scoring)
    changed = [f"{name} sha256 {before.get(name, 'absent')[:12]} → {now.get(name, 'absent')[:12]}"
               for name in sorted({*before, *now}) if before.get(name) != now.get(name)]
    return "; ".join(changed) or (f"the files' combined sha256 {str(generated.get('sha256'))[:12]} → "
                                  f"{str(scoring.get('sha256'))[:12]}")


def scoring_note(provenance: Mapping[str, Any], split: str) -> str | None:
    """The words a published entry of ``split`` carries when it was scored against other annotation files than
    its answers were generated from, or against files while the answers' are unknown; ``None`` otherwise."""
    scoring = (provenance.get("scoring_dataset_revision") or {}).get(split)
    if not isinstance(scoring, Mapping):
        return None
    generated = (provenance.get("dataset_revision") or {}).get(split)
    answers = (f"sha256={str(generated.get('sha256'))[:12]}" if isinstance(generated, Mapping)
               else "unknown annotation files")
    return (f"rescored against annotation files sha256={str(scoring.get('sha256'))[:12]} "
            f"(answers generated from {answers})")


def model_revision_of(backend: Any) -> dict[str, Any] | None:
    """The backend's model revision (its ``model_revision()``: :mod:`medheval.backends.revision`), or ``None``
    (a predictions file: the answers' own run says, through :func:`inherited`)."""
    method = getattr(backend, "model_revision", None)
    try:
        revision = method() if callable(method) else None
    except Exception:  # noqa: BLE001 - a finished run is written even when its revision cannot be read
        return None
    return dict(revision) if isinstance(revision, Mapping) else None


def of_run(run: Mapping[str, Any], model_revision: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The provenance of one run of ``results.json``: its ``provenance`` key merged with what older files and
    inspect logs say (labels, settings, annotation files, warnings), so nothing recorded is lost;
    ``model_revision``: the running backend's (:func:`model_revision_of`), used when the run holds none.
    The annotation files a run read are its ``dataset_revision``, except in a re-score (a ``predictions_file``
    backend): there they are what it scored against, listed under ``scoring_dataset_revision`` for each split
    where they differ from the answers' ``dataset_revision`` or that has none."""
    settings = run.get("settings") or {}
    backend = settings.get("backend") or {}
    protocol = run.get("protocol")
    fixture = any(files_are_fixture(block.get("annotation_files") or [])
                  for block in (run.get("benchmarks") or {}).values() if isinstance(block, dict))
    fixture = fixture or any(FIXTURE_MARK in str(warning) for warning in run.get("warnings") or [])
    own = {"random_weights": bool((run.get("labels") or {}).get("random_weights") or backend.get("random_weights")),
           "fixture": fixture, "limit": settings.get("limit"),
           "protocol": protocol.get("name") if isinstance(protocol, Mapping) else None,
           "source_model": settings.get("model")}
    if model_revision:
        own["model_revision"] = dict(model_revision)
    read = dataset_revision_of(run)  # the files this run read: of its questions, or for a re-score, of its scoring
    rescore = is_rescore(run)
    if read and not rescore:
        own["dataset_revision"] = read
    found = merge(run.get("provenance"), own)
    generated = found.get("dataset_revision") or {}
    scoring = {split: revision for split, revision in read.items() if rescore and (
        not isinstance(generated.get(split), Mapping) or files_changed(generated[split], revision))}
    if scoring:
        found["scoring_dataset_revision"] = scoring
    return found


def inherited(backend: Any) -> dict[str, Any] | None:
    """What a run inherits from its backend: for a predictions file (``carried_provenance``, ``path``), the
    ``provenance`` of its lines and of the ``results.json`` beside it when it is a run's ``predictions.jsonl``;
    ``None`` when there is nothing to inherit. Worked out once per backend (kept on it): each later call (a
    grid's cells, each split's files check) gets a copy, without reading ``results.json`` again."""
    if not is_rescore(backend):
        return None
    if _INHERITED not in vars(backend):
        setattr(backend, _INHERITED, _inherited(backend))
    return copy.deepcopy(getattr(backend, _INHERITED))


def _inherited(backend: Any) -> dict[str, Any] | None:
    """:func:`inherited`, worked out: the lines' provenance, then each run's beside the answers."""
    found: list[Mapping[str, Any]] = [part for part in backend.carried_provenance if isinstance(part, Mapping)]
    made: dict[str, Any] = {"generation": backend.carried_generation} if getattr(backend, "carried_generation",
                                                                                  None) else {}
    for run in _runs_beside(Path(backend.path)):
        found.append(of_run(run))
        made.update(_made_with(run))
    if made:
        found.append({"made_with": made})  # after the lines' and results' own: an earlier run's wins
    return merge(*found) if found else None


def _runs_beside(path: Path) -> list[Mapping[str, Any]]:
    """The runs of the ``results.json`` beside ``path`` when ``path`` is a run's ``predictions.jsonl`` (one, or a
    grid's ``runs``); none for another file, or one that does not read as JSON."""
    beside = path.parent / "results.json"
    if path.name != "predictions.jsonl" or not beside.is_file():
        return []
    try:
        results = json.loads(beside.read_text())
    except ValueError:
        return []
    runs = (results.get("runs") or [results]) if isinstance(results, dict) else []
    return [run for run in runs if isinstance(run, Mapping)]


# backend settings that decide what the model saw, not how it decoded: the grey canvas of a grayscale image
# (medheval.backends.grey_padding) and the prompt ids built piece by piece (medheval.backends.llava_tokens)
INPUT_SETTINGS = ("grey_padding", "tokenization")


def _made_with(run: Mapping[str, Any]) -> dict[str, Any]:
    """The seed, software versions and input settings (:data:`INPUT_SETTINGS`, key ``inputs``) a run of
    ``results.json`` generated its answers with."""
    settings = run.get("settings") or {}
    backend = settings.get("backend") if isinstance(settings.get("backend"), Mapping) else {}
    if is_rescore(run):  # a re-score generated nothing
        return {}
    seed = settings.get("seed", backend.get("seed"))
    made: dict[str, Any] = {} if seed is None else {"seed": seed}
    if run.get("versions"):
        made["versions"] = dict(run["versions"])
    inputs = {key: backend[key] for key in INPUT_SETTINGS if key in backend}
    if inputs:
        made["inputs"] = inputs
    return made


def input_settings(run: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`INPUT_SETTINGS` behind a run's answers: its own backend's, or, for a re-score, those of the
    run that generated them (``provenance.made_with.inputs``)."""
    settings = run.get("settings") or {}
    backend = settings.get("backend") if isinstance(settings.get("backend"), Mapping) else {}
    if not is_rescore(run):
        return {key: backend[key] for key in INPUT_SETTINGS if key in backend}
    made = (run.get("provenance") or {}).get("made_with") if isinstance(run.get("provenance"), Mapping) else None
    inputs = made.get("inputs") if isinstance(made, Mapping) else None
    return {key: inputs[key] for key in INPUT_SETTINGS if key in inputs} if isinstance(inputs, Mapping) else {}


def blockers(provenance: Mapping[str, Any]) -> list[str]:
    """The provenance keys that keep results off the Hub without an ``--allow-*`` flag."""
    return [key for key in ALLOW_FLAGS if (provenance.get(key) is not None if key == "limit" else provenance.get(key))]


def refusal(provenance: Mapping[str, Any], allowed: Iterable[str] = ()) -> str | None:
    """Why results with ``provenance`` are not published given the ``allowed`` keys, or ``None``."""
    missing = [key for key in blockers(provenance) if key not in set(allowed)]
    if not missing:
        return None
    why = "; ".join(WHY[key].format(limit=provenance.get("limit")) for key in missing)
    flags = " ".join(ALLOW_FLAGS[key] for key in missing)
    return (f"these results {why}. They are not published; pass {flags} to publish them anyway "
            "(the published entries then say so)")


def notes(provenance: Mapping[str, Any], allowed: Iterable[str] = ()) -> list[str]:
    """The words a published entry carries about its provenance: each allowed blocker, a non-clean protocol."""
    out = [{"random_weights": "random-weight model", "fixture": "fixture data",
            "limit": f"limit={provenance.get('limit')}"}[key] + f" (published with {ALLOW_FLAGS[key]})"
           for key in blockers(provenance) if key in set(allowed)]
    if (provenance.get("protocol") or CLEAN_PROTOCOL) != CLEAN_PROTOCOL:
        out.append(f"protocol={provenance['protocol']}")
    return out

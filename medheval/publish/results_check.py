"""Check a ``results.json`` (or what inspect logs gave) before any of it is copied into published files.

:func:`medheval.publish.hub.export_results` writes fields of the results into ``.eval_results/*.yaml`` notes,
file names and ``.eval_results_provenance/*.json``. A results file is data from a folder that may have been
edited, so each field that travels is checked for its type and its shape first (:func:`check_results`); a
field that fails stops the export with a :class:`ResultsError` naming the file and the field:

- counts (``n_scored``, ``n_records``, ``n_chosen_samples``, ``data_quality.n_records``, ``limit``): integers;
- ``protocol``: a protocol this medheval knows (:func:`medheval.run.paper_protocols.list_protocols`);
- ``settings.control``: one of :data:`medheval.run.control.CONTROLS`;
- ``settings.mitigation``: a mitigation spec (letters, digits, ``._:=,/+-``, at most :data:`MAX_SPEC_CHARS`);
- ``model_revision``: what :mod:`medheval.backends.revision` writes (:func:`~medheval.backends.revision.check_revision`);
- ``dataset_revision`` and ``scoring_dataset_revision``: only the keys :func:`medheval.run.provenance.annotation_revision`
  writes: at most :data:`MAX_FILES` files, each a ``relpath`` (at most :data:`MAX_PATH_CHARS` characters),
  hex ``sha256``, a short ``fingerprint`` and ``pinned``/``fixture`` flags;
- ``made_with`` (:func:`publishable_made_with`): only the keys a run writes, typed: ``seed`` an integer,
  ``versions`` at most :data:`MAX_VERSIONS` package names with version strings (:data:`VERSION`),
  ``inputs`` the known input settings (:data:`medheval.run.provenance.INPUT_SETTINGS`: a flag, a short name),
  ``generation`` the known generation settings (:data:`medheval.run.generation.GENERATION_KEYS`: numbers and
  flags). A known key of the wrong type or shape is refused; an unknown key (a predictions file written by
  another tool may carry its own settings) is left out of the published record, and the export says so;
- every other string that reaches the provenance file: at most :data:`MAX_TEXT_CHARS` characters, without
  control or invisible formatting characters (no right-to-left override).

So no field can carry more than a few hundred characters of free text: nothing that travels can hold an image
in any encoding (the push guard, :mod:`medheval.publish.content_scan`, reads every written file as well).

The files written are bounded too (:data:`MAX_FILE_BYTES` each: :func:`check_size`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Iterable, Mapping

from medheval.backends.revision import check_revision
from medheval.backends.revision import shown as _shown
from medheval.run.control import CONTROLS

MAX_TEXT_CHARS = 500  # one string of the provenance record (a version, a generation setting, a file name)
MAX_SPEC_CHARS = 200  # a mitigation spec (vcd:alpha=1,beta=0.1)
MAX_FILE_BYTES = 256 * 1024  # one .eval_results YAML or provenance JSON: a few KB in practice
MAX_DEPTH = 6  # nesting of made_with (generation settings, versions)
MITIGATION_SPEC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=,/+ -]{0,%d}" % (MAX_SPEC_CHARS - 1))
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_VERSIONS = 24  # packages in made_with.versions (a run records 7); 24 x 40 characters cannot hold a 2 KB run
VERSION = re.compile(r"v?[0-9][0-9A-Za-z.+!_-]{0,39}")  # 2.13.0+cpu, 0.1.0.dev3+g1a2b3c4, 3.11.7
PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a distribution name (huggingface_hub, medheval)
SETTING_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")  # an input setting's value (tokenization: upstream_chunked)
MAX_FILES = 64  # annotation files of one split (MedHEval's splits read 1-4)
MAX_PATH_CHARS = 200
FINGERPRINT = re.compile(r"[A-Za-z0-9_-]{1,64}")  # datasets' fingerprint of a Hub load
REVISION_FILE_KEYS = {"relpath", "sha256", "pinned", "fixture", "fingerprint"}
MAX_SEED = 2 ** 64
COUNT_KEYS = ("n_scored", "n_records", "n_chosen_samples")


class ResultsError(ValueError):
    """A results file holds a field of the wrong type or shape (the message names the file and the field)."""


def _fail(where: str, field: str, problem: str) -> ResultsError:
    return ResultsError(f"{where}: {field} {problem}; a results.json edited by hand or not written by "
                        "`medheval run` is not published")


def plain_text(value: str, limit: int = MAX_TEXT_CHARS) -> bool:
    """Whether ``value`` is at most ``limit`` characters without control or formatting characters
    (categories ``Cc``, ``Cf``: newlines, NUL, zero-width and bidirectional overrides)."""
    return len(value) <= limit and not any(unicodedata.category(char) in ("Cc", "Cf") for char in value)


def check_count(value: Any, where: str, field: str) -> None:
    """``value`` is ``None`` or a non-negative integer (not a bool)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise _fail(where, field, f"must be a non-negative integer, got {_shown(value)}")


def check_protocol(name: Any, where: str, field: str) -> None:
    """``name`` is ``None`` or the name of a protocol this medheval knows."""
    from medheval.run.paper_protocols import list_protocols

    known = [protocol.name for protocol in list_protocols()]
    if name is not None and name not in known:
        raise _fail(where, field, f"{_shown(name)} is not a known protocol ({', '.join(known)})")


def check_control_field(control: Any, where: str, field: str) -> None:
    """``control`` is ``None``, one of :data:`CONTROLS`, or a mapping whose ``kind`` is one."""
    kind = control.get("kind", "none") if isinstance(control, Mapping) else control
    if control is not None and kind not in CONTROLS:
        raise _fail(where, field, f"{_shown(kind)} is not an image control ({', '.join(CONTROLS)})")


def check_mitigation(spec: Any, where: str, field: str) -> None:
    """``spec`` is ``None`` or a mitigation spec string (:data:`MITIGATION_SPEC`)."""
    if spec is not None and not (isinstance(spec, str) and MITIGATION_SPEC.fullmatch(spec)):
        raise _fail(where, field, f"{_shown(spec)} is not a mitigation spec (letters, digits, '._:=,/+-'; at most "
                                  f"{MAX_SPEC_CHARS} characters)")


def check_plain(value: Any, where: str, field: str, depth: int = 0) -> None:
    """Every string in ``value`` (keys too) is :func:`plain_text`; nesting is at most :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        raise _fail(where, field, f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if not plain_text(value):
            raise _fail(where, field, f"{_shown(value)} is longer than {MAX_TEXT_CHARS} characters or holds "
                                      "control or formatting characters")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_plain(key, where, f"{field} key", depth + 1)
            check_plain(item, where, f"{field}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain(item, where, f"{field}[{index}]", depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise _fail(where, field, f"holds a {type(value).__name__}, not JSON data")


def check_dataset_revision(revision: Any, where: str, field: str) -> None:
    """A split's annotation revision as :func:`medheval.run.provenance.annotation_revision` writes it:
    ``{"files": [{"relpath", "sha256", "pinned", "fixture", "fingerprint"}], "sha256"}``, nothing else."""
    if revision is None:
        return
    if not isinstance(revision, Mapping) or not isinstance(revision.get("files"), list):
        raise _fail(where, field, f"must be {{'files': [...], 'sha256': ...}}, got {_shown(revision)}")
    extra = sorted(map(str, set(revision) - {"files", "sha256"}))
    if extra:
        raise _fail(where, field, f"has unexpected key(s) {', '.join(map(_shown, extra))}")
    if len(revision["files"]) > MAX_FILES:
        raise _fail(where, f"{field}.files", f"lists {len(revision['files'])} files, more than {MAX_FILES}")
    if revision.get("sha256") is not None and not (isinstance(revision["sha256"], str)
                                                   and SHA256.fullmatch(revision["sha256"])):
        raise _fail(where, f"{field}.sha256", f"is not a sha256 digest: {_shown(revision['sha256'])}")
    for index, entry in enumerate(revision["files"]):
        at = f"{field}.files[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("relpath"), str):
            raise _fail(where, at, f"must be a file entry with a relpath, got {_shown(entry)}")
        digest = entry.get("sha256")
        if digest is not None and not (isinstance(digest, str) and SHA256.fullmatch(digest)):
            raise _fail(where, f"{at}.sha256", f"is not a sha256 digest: {_shown(digest)}")
        for flag in ("pinned", "fixture"):
            if entry.get(flag) is not None and not isinstance(entry[flag], bool):
                raise _fail(where, f"{at}.{flag}", f"must be true, false or null, got {_shown(entry[flag])}")
        extra = sorted(map(str, set(entry) - REVISION_FILE_KEYS))
        if extra:
            raise _fail(where, at, f"has unexpected key(s) {', '.join(map(_shown, extra))}")
        if not plain_text(entry["relpath"], MAX_PATH_CHARS):
            raise _fail(where, f"{at}.relpath", f"{_shown(entry['relpath'])} is longer than {MAX_PATH_CHARS} "
                                                "characters or holds control or formatting characters")
        fingerprint = entry.get("fingerprint")
        if fingerprint is not None and not (isinstance(fingerprint, str) and FINGERPRINT.fullmatch(fingerprint)):
            raise _fail(where, f"{at}.fingerprint", f"is not a datasets fingerprint: {_shown(fingerprint)}")


def _known_type(value: Any, wanted: type | tuple[type, ...]) -> bool:
    """Whether ``value`` is ``None`` or a finite value of ``wanted`` (a bool only where ``wanted`` is bool)."""
    if value is None:
        return True
    if isinstance(value, bool) and wanted is not bool:
        return False
    return isinstance(value, wanted) and not (isinstance(value, float) and not math.isfinite(value))


def _known_keys(value: Any, where: str, at: str, keys: Iterable[str], dropped: list[str]) -> dict[str, Any]:
    """``value`` (a JSON object, else refused) reduced to ``keys``; the names of those left out go to ``dropped``."""
    if not isinstance(value, Mapping):
        raise _fail(where, at, f"must be a JSON object, got {_shown(value)}")
    known = set(keys)
    dropped.extend(f"{at}.{key}" if plain_text(str(key), 64) else f"{at}.{_shown(str(key))}"
                   for key in value if key not in known)
    return {key: item for key, item in value.items() if key in known}


def publishable_made_with(made: Any, where: str, field: str) -> tuple[dict[str, Any] | None, list[str]]:
    """``(made_with as published, unknown keys left out)``; a :class:`ResultsError` for a known key of the
    wrong type or shape (the module docstring lists them). ``None`` stays ``None``."""
    from medheval.run.generation import GENERATION_KEYS
    from medheval.run.provenance import INPUT_SETTINGS

    if made is None:
        return None, []
    dropped: list[str] = []
    kept = _known_keys(made, where, field, ("seed", "versions", "inputs", "generation"), dropped)
    seed = kept.get("seed")
    if not _known_type(seed, int) or (seed is not None and abs(seed) >= MAX_SEED):
        raise _fail(where, f"{field}.seed", f"must be an integer, got {_shown(seed)}")
    if kept.get("versions") is not None:
        versions = kept["versions"]
        if not isinstance(versions, Mapping) or len(versions) > MAX_VERSIONS:
            raise _fail(where, f"{field}.versions", f"must map at most {MAX_VERSIONS} package names to versions, "
                                                    f"got {_shown(versions)}")
        for package, version in versions.items():
            if not (isinstance(package, str) and PACKAGE.fullmatch(package)):
                raise _fail(where, f"{field}.versions key", f"{_shown(package)} is not a package name")
            if version is not None and not (isinstance(version, str) and VERSION.fullmatch(version)):
                raise _fail(where, f"{field}.versions.{package}", f"{_shown(version)} is not a version")
    if kept.get("inputs") is not None:
        inputs = kept["inputs"] = _known_keys(kept["inputs"], where, f"{field}.inputs", INPUT_SETTINGS, dropped)
        for key, value in inputs.items():
            valid = _known_type(value, bool) if key == "grey_padding" else (
                value is None or (isinstance(value, str) and SETTING_NAME.fullmatch(value)))
            if not valid:
                raise _fail(where, f"{field}.inputs.{key}", f"{_shown(value)} is not a valid {key}")
    if kept.get("generation") is not None:
        generation = kept["generation"] = _known_keys(kept["generation"], where, f"{field}.generation",
                                                      GENERATION_KEYS, dropped)
        for key, value in generation.items():
            if not _known_type(value, GENERATION_KEYS[key]):
                raise _fail(where, f"{field}.generation.{key}", f"{_shown(value)} is not a valid {key}")
    return kept, dropped


def _object_or_empty(value: Any, where: str, at: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, ``{}`` when absent; anything else is refused."""
    if value is not None and not isinstance(value, Mapping):
        raise _fail(where, at, "must be a JSON object")
    return value or {}


def check_run(run: Any, where: str, at: str = "") -> None:
    """One run of ``results.json`` (``at``: its place, ``runs[i].`` in a file of several)."""
    from medheval.run import provenance

    if not isinstance(run, Mapping):
        raise _fail(where, at.rstrip(".") or "the file", "must be a JSON object")
    settings = _object_or_empty(run.get("settings"), where, f"{at}settings")
    check_mitigation(settings.get("mitigation"), where, f"{at}settings.mitigation")
    check_control_field(settings.get("control"), where, f"{at}settings.control")
    check_count(settings.get("limit"), where, f"{at}settings.limit")
    if settings.get("model") is not None:
        check_plain(settings["model"], where, f"{at}settings.model")
    protocol = run.get("protocol")
    check_protocol(protocol.get("name") if isinstance(protocol, Mapping) else protocol, where, f"{at}protocol.name")
    carried = _object_or_empty(run.get("provenance"), where, f"{at}provenance")
    check_protocol(carried.get("protocol"), where, f"{at}provenance.protocol")
    check_count(carried.get("limit"), where, f"{at}provenance.limit")
    for flag in ("random_weights", "fixture"):
        if carried.get(flag) is not None and not isinstance(carried[flag], bool):
            raise _fail(where, f"{at}provenance.{flag}", f"must be true or false, got {_shown(carried[flag])}")
    problem = check_revision(carried.get("model_revision"))
    if problem:
        raise _fail(where, f"{at}provenance.{problem[0]}", problem[1])
    if carried.get("source_model") is not None:
        check_plain(carried["source_model"], where, f"{at}provenance.source_model")
    publishable_made_with(carried.get("made_with"), where, f"{at}provenance.made_with")
    benchmarks = run.get("benchmarks")
    if benchmarks is not None and not isinstance(benchmarks, Mapping):
        raise _fail(where, f"{at}benchmarks", "must be a JSON object")
    for split, block in (benchmarks or {}).items():
        field = f"{at}benchmarks[{_shown(split)}]"
        if not isinstance(block, Mapping):
            raise _fail(where, field, "must be a JSON object")
        for key in COUNT_KEYS:
            check_count(block.get(key), where, f"{field}.{key}")
        quality = block.get("data_quality")
        if quality is not None and not isinstance(quality, Mapping):
            raise _fail(where, f"{field}.data_quality", "must be a JSON object")
        check_count((quality or {}).get("n_records"), where, f"{field}.data_quality.n_records")
    found = provenance.of_run(run)
    for key in provenance.REVISION_KEYS:
        for split, revision in (found.get(key) or {}).items():
            check_dataset_revision(revision, where, f"{at}{key}[{_shown(split)}]")


def check_results(results: Any, where: str) -> None:
    """Every run of ``results`` (one run, or ``{"runs": [...]}``) passes :func:`check_run`; ``where`` names the
    file (or logs) in the error."""
    if not isinstance(results, Mapping):
        raise _fail(where, "the file", "must hold a JSON object")
    if "runs" in results:
        if not isinstance(results["runs"], list):
            raise _fail(where, "runs", "must be a list of runs")
        for index, run in enumerate(results["runs"]):
            check_run(run, where, f"runs[{index}].")
    else:
        check_run(results, where)


def check_size(text: str, where: str) -> str:
    """``text`` when its UTF-8 form is at most :data:`MAX_FILE_BYTES`, else a :class:`ResultsError`."""
    size = len(text.encode())
    if size > MAX_FILE_BYTES:
        raise ResultsError(f"{where} would be {size} bytes, over the {MAX_FILE_BYTES} an .eval_results file may "
                           "hold; nothing was written")
    return text


__all__ = ["MAX_FILE_BYTES", "MAX_TEXT_CHARS", "ResultsError", "check_count", "check_control_field",
           "check_dataset_revision", "check_mitigation", "check_plain", "check_protocol", "check_results",
           "check_run", "check_size", "plain_text", "publishable_made_with"]

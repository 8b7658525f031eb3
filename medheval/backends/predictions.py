"""Evaluate predictions made elsewhere: a JSON Lines file of ``{"id", "prediction"}``.

Each non-blank line is one JSON object with the canonical record ``id``
(``benchmark/config/upstream-id``) and the model's output text under ``prediction``.
Other keys (``model``, ``mitigation``, settings, timing: what the runner itself writes)
are allowed and ignored, so a predictions file from an earlier run can be re-scored; ``provenance`` is kept
(:attr:`PredictionsFileBackend.carried_provenance`): the runner makes the re-score inherit it, with
the ``results.json`` beside a run's ``predictions.jsonl`` (:mod:`medheval.run.provenance`). So are the
lines' ``mitigation`` and image-blind ``control`` (:attr:`~PredictionsFileBackend.carried_mitigation`,
:attr:`~PredictionsFileBackend.carried_control`; a file mixing values is refused), the first line's
``generation`` settings (:attr:`~PredictionsFileBackend.carried_generation`) and each line's recorded
``prompt`` (:attr:`~PredictionsFileBackend.prompts`: what a re-score against changed annotation files checks
the questions against, :func:`medheval.run.runner.check_rescored_files`; the re-score writes each into its own
``predictions.jsonl``, so a re-score of it checks them too).

Bounds: a line holds at most :data:`MAX_LINE_BYTES` bytes, a prediction at most
:data:`MAX_PREDICTION_CHARS` characters, an id at most :data:`MAX_ID_CHARS`; past them the line is
refused, naming its number, without being parsed (the file is read line by line, so memory stays small).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medheval.backends.base import BackendError
from medheval.data.schema import json_kind
from medheval.run.control import CONTROLS
from medheval.run.provenance import RESCORE_BACKEND
from medheval.scoring.metric_inputs import surrogate_problem

MAX_LINE_BYTES = 1_000_000  # one line of a predictions file (or of a run's predictions.jsonl)
MAX_PREDICTION_CHARS = 100_000  # one prediction: far above any model's answer or report
MAX_ID_CHARS = 512
EXPECTED_LINE = '{"id": "<benchmark/config/upstream-id>", "prediction": "<model output text>"}'
_MAX_LISTED = 20
_MAX_ERRORS = 50


def _preview(items: list[str], limit: int = _MAX_LISTED) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} id(s): {shown}{more}"


def _json_kind(value: Any) -> str:
    """How a JSON value that is not a string is named in an error, in JSON's words (``null``, not ``NoneType``);
    ``null`` says what to write instead."""
    kind = json_kind(value)
    if kind == "null":
        return ('null: write "" for an empty answer, or leave the line out and pass --allow-missing-predictions '
                'to count the record as missing')
    if kind == "boolean":
        return f"a boolean ({json.dumps(value)})"
    return f"a number ({value!r})" if kind == "number" else f"an {kind}"


_MAX_HINT_BYTES = 256 << 20  # a file parsed whole to confirm it is one JSON document (other_format_hint)


def _whole_file_json(path: Path) -> Any:
    """The file at ``path`` parsed as one JSON document, or ``None`` when it is not one (or too large to check)."""
    try:
        if path.stat().st_size > _MAX_HINT_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None


def other_format_hint(path: Path, first_line: str, objects_seen: bool = False) -> str:
    """A sentence saying the file at ``path`` is in another format than JSON Lines, judged by its first non-blank
    line (a JSON array, a JSON document over several lines, a CSV or TSV table), with a command that converts it;
    ``""`` when the line does not look like one of them. Without it such a file got one "invalid JSON" per line
    and no word of what to do.

    A JSON array or document is named only when the whole file parses as one (a JSON Lines file whose first line
    is broken, e.g. truncated or with an unescaped quote, also starts with ``{``: it is not told to convert itself);
    a table only when the first line is not JSON and no line of the file (``objects_seen``) is a JSON object."""
    text = first_line.strip()
    # never the source itself: "preds.JSONL" -> "preds.jsonl" is the same file on a case-insensitive file system
    # (macOS, Windows), which the shell's ">" would empty before the command reads it
    target = shlex.quote(str(path.with_suffix(".jsonl") if path.suffix.lower() != ".jsonl"
                             else path.with_name(f"{path.stem}-lines.jsonl")))
    source = shlex.quote(str(path))
    if text.startswith(("[", "{")):
        document = _whole_file_json(path)
        opened = 'open(sys.argv[1], encoding="utf-8-sig")'
        if text.startswith("[") and isinstance(document, list):
            what = "one JSON array"
            command = f"python -c 'import json,sys; [print(json.dumps(o)) for o in json.load({opened})]' {source} > {target}"
        elif text.startswith("{") and isinstance(document, dict):
            what = "one JSON document spread over several lines"
            command = f"python -c 'import json,sys; print(json.dumps(json.load({opened})))' {source} > {target}"
        else:
            return ""
    else:
        delimiter = "\t" if "\t" in text else ","
        if delimiter not in text or objects_seen or _parses(text):
            return ""
        header = next(csv.reader([text.removeprefix("\ufeff")], delimiter=delimiter), [])
        columns = [column.strip().lower() for column in header]
        what = f"a {'TSV' if delimiter == chr(9) else 'CSV'} table (columns {header[:6]})"
        rename = ("" if {"id", "prediction"} <= set(columns)
                  else "name the columns holding the record id and the model output 'id' and 'prediction', then ")
        option = ', delimiter="\\t"' if delimiter == "\t" else ""
        # the header's names are matched as the check above matches them (case and spaces aside: "ID, Prediction")
        command = (f"{rename}python -c 'import csv,json,sys; [print(json.dumps({{\"id\": r[\"id\"], \"prediction\": "
                   f"r[\"prediction\"]}})) for r in ({{(k or \"\").strip().lower(): v for k, v in row.items()}} for row "
                   f"in csv.DictReader(open(sys.argv[1], newline=\"\", encoding=\"utf-8-sig\"){option}))]' "
                   f"{source} > {target}")
    return (f"it looks like {what}, not JSON Lines (one JSON object per line, like {EXPECTED_LINE}). "
            f"Convert it: {command}")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class PredictionsFileBackend:
    """A :class:`~medheval.backends.base.Backend` that reads its outputs from a JSONL file.

    The file is read and validated when the backend is created; every problem is
    reported at once, each with its line number.

    Args:
        path: the JSONL file.
        name: the model id to record; defaults to the file's ``model`` field when every
            line carries the same one, else the file name without extension.
    """

    needs_images = False

    def __init__(self, path: str | os.PathLike, *, name: str | None = None):
        self.path = Path(path)
        if self.path.is_dir():  # a run's folder: its answers are in predictions.jsonl
            inside = self.path / "predictions.jsonl"
            hint = (f"pass its answers: --predictions {inside}" if inside.is_file()
                    else "pass a JSON Lines file of {\"id\", \"prediction\"} objects")
            raise BackendError(f"predictions file {str(self.path)!r} is a folder; {hint}")
        if not self.path.is_file():
            raise BackendError(f"predictions file {str(self.path)!r} does not exist or is not a file")
        self._predictions: dict[str, str] = {}
        first_line: dict[str, int] = {}
        duplicates: dict[str, list[int]] = {}
        errors: list[str] = []
        models: set[str] = set()
        carried: list[dict] = []  # the lines' provenance (medheval.run.provenance)
        variants: dict[str, set[str]] = {"mitigation": set(), "control": set()}  # what made the answers
        generation: dict | None = None  # the first line's generation settings
        prompts: dict[str, str] = {}  # the model input each line recorded (a run's predictions.jsonl)

        digest = hashlib.sha256()
        opening: str | None = None  # the first non-blank line: the one that tells the file's format
        opening_refused = False  # it is not a JSON object (other_format_hint then looks at the file's format)
        objects_seen = False  # some line is a JSON object: the file is JSON Lines, not a table
        for lineno, line in self._lines(digest, errors):
            if not line.strip():
                continue
            is_opening = opening is None
            opening = line if is_opening else opening
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                errors.append(f"line {lineno}: invalid JSON ({err.msg} at column {err.colno})")
                opening_refused = opening_refused or is_opening
                continue
            if not isinstance(obj, dict):
                errors.append(f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
                opening_refused = opening_refused or is_opening
                continue
            objects_seen = True
            missing = [key for key in ("id", "prediction") if key not in obj]
            if missing:
                errors.append(
                    f"line {lineno}: missing key(s) {missing} (found {sorted(obj)}); "
                    f"the model output must be under 'prediction'"
                )
                continue
            rid, pred = obj["id"], obj["prediction"]
            if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS:
                shown = repr(rid)[:80] + ("…" if len(repr(rid)) > 80 else "")
                errors.append(f"line {lineno}: 'id' must be a non-empty string of at most {MAX_ID_CHARS} "
                              f"characters, got {shown}")
                continue
            if not isinstance(pred, str):
                errors.append(f"line {lineno} (id {rid!r}): 'prediction' must be a string, got {_json_kind(pred)}")
                continue
            unstorable = surrogate_problem(rid) or surrogate_problem(pred)
            if unstorable:
                errors.append(f"line {lineno} (id {rid!r}): the {'id' if surrogate_problem(rid) else 'prediction'} "
                              f"{unstorable}")
                continue
            if len(pred) > MAX_PREDICTION_CHARS:
                errors.append(f"line {lineno} (id {rid!r}): the prediction has {len(pred)} characters; at most "
                              f"{MAX_PREDICTION_CHARS} are accepted")
                continue
            odd = [key for key in variants if obj.get(key) is not None and not isinstance(obj[key], str)]
            if odd:  # was written into results.json as the text of the Python value ("{'a': 1}")
                example = '"none" or "vcd:alpha=1"' if odd[0] == "mitigation" else '"none" or "no_image"'
                errors.append(f"line {lineno} (id {rid!r}): {odd[0]!r} must be a string, as a run writes it "
                              f"(e.g. {example}), got {_json_kind(obj[odd[0]]).split(':')[0]}")
                continue
            if rid in first_line:
                duplicates.setdefault(rid, [first_line[rid]]).append(lineno)
                continue
            first_line[rid] = lineno
            self._predictions[rid] = pred
            if isinstance(obj.get("model"), str):
                models.add(obj["model"])
            if isinstance(obj.get("provenance"), dict):
                carried.append(obj["provenance"])
            if isinstance(obj.get("prompt"), str):
                prompts[rid] = obj["prompt"]
            for key, seen in variants.items():
                seen.add(str(obj.get(key) or "none"))
            if generation is None and isinstance(obj.get("generation"), dict) and obj["generation"]:
                generation = obj["generation"]

        self._sha256 = digest.hexdigest()
        if duplicates:
            errors.extend(
                f"duplicate id {rid!r} on lines {', '.join(map(str, lines))}" for rid, lines in duplicates.items()
            )
        if errors:
            hint = other_format_hint(self.path, opening, objects_seen) if opening_refused and opening else ""
            shown = errors[:_MAX_ERRORS]
            more = f"\n  ... and {len(errors) - _MAX_ERRORS} more" if len(errors) > _MAX_ERRORS else ""
            raise BackendError(
                f"predictions file {str(self.path)!r} has {len(errors)} problem(s)"
                + (f"; {hint}" if hint else "") + ":\n  "
                + "\n  ".join(shown)
                + more
                + f"\nEach line must be a JSON object like {EXPECTED_LINE}."
            )
        if not self._predictions:
            raise BackendError(
                f"predictions file {str(self.path)!r} is empty: expected one JSON object per line, "
                f"like {EXPECTED_LINE}"
            )

        for key, seen in variants.items():
            if len(seen) > 1:
                raise BackendError(
                    f"predictions file {str(self.path)!r} mixes answers of several {key}s ({', '.join(sorted(seen))}): "
                    f"a re-score records one {key}. Split the file by its {key!r} key and re-score each part "
                    f"into its own --output")

        if name is None:
            name = models.pop() if len(models) == 1 else self.path.stem
        self.name = name
        self.carried_provenance = carried
        self.carried_mitigation: str = variants["mitigation"].pop()  # "none" for lines without the key
        self.carried_control: str = variants["control"].pop()
        if self.carried_control not in CONTROLS:  # it names the re-score's grid folder and published files
            raise BackendError(f"predictions file {str(self.path)!r}: 'control' {self.carried_control[:40]!r} is not "
                               f"an image control medheval writes ({', '.join(CONTROLS)})")
        self.carried_generation: dict | None = generation
        self.prompts: dict[str, str] = prompts  # id -> the model input its line recorded (lines without one: absent)

    def _lines(self, digest: Any, errors: list[str]) -> Iterator[tuple[int, str]]:
        """``(line number, text)`` of each line, read in pieces of at most :data:`MAX_LINE_BYTES`: a longer
        line is skipped unparsed with an error. Lines end at "\\n" only (``str.splitlines()`` would also cut
        at U+2028, U+0085 … inside an answer, which JSON allows raw)."""
        with open(self.path, "rb") as handle:
            lineno = 0
            while True:
                raw = handle.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                digest.update(raw)
                lineno += 1
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    size = len(raw)
                    while not raw.endswith(b"\n"):
                        raw = handle.readline(1 << 20)
                        if not raw:
                            break
                        digest.update(raw)
                        size += len(raw)
                    errors.append(f"line {lineno}: {size} bytes; a line holds at most {MAX_LINE_BYTES} bytes "
                                  f"(a prediction at most {MAX_PREDICTION_CHARS} characters)")
                    continue
                if lineno == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise BackendError(f"predictions file {str(self.path)!r} is not UTF-8 (line {lineno}: "
                                       f"{err})") from None

    # -- inspection -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._predictions)

    def ids(self) -> list[str]:
        """The record ids in the file, in file order."""
        return list(self._predictions)

    def check_against(self, record_ids: list[str]) -> tuple[list[str], list[str]]:
        """``(missing, extra)``: benchmark ids with no prediction, and file ids not in the benchmark.

        Both lists keep their source order (benchmark order, file order).
        """
        wanted = set(record_ids)
        missing = [rid for rid in record_ids if rid not in self._predictions]
        extra = [rid for rid in self._predictions if rid not in wanted]
        return missing, extra

    def recorded_prompt(self, record_id: str) -> str | None:
        """The model input the line of ``record_id`` recorded (``None`` without one): a re-score writes it into
        its own ``predictions.jsonl`` (:func:`medheval.run.generation.rendered_prompt`)."""
        return self.prompts.get(record_id)

    # -- Backend ----------------------------------------------------------------------
    def generate(self, records: list[dict], images: list | None = None) -> list[str]:
        """The stored prediction of each record, in order; ``images`` is ignored."""
        missing = [r["id"] for r in records if r["id"] not in self._predictions]
        if missing:
            raise BackendError(
                f"predictions file {str(self.path)!r} has no prediction for {_preview(missing)}. "
                "Check that the file's ids are the canonical record ids (benchmark/config/upstream-id) "
                "of the benchmark and config being evaluated."
            )
        return [self._predictions[r["id"]] for r in records]

    def settings(self) -> dict:
        return {
            "backend": RESCORE_BACKEND,
            "model": self.name,
            "path": str(self.path.resolve()),  # the same file, given relative or absolute, is the same setting
            "sha256": self._sha256,
            "num_predictions": len(self._predictions),
        }


__all__ = ["MAX_ID_CHARS", "MAX_LINE_BYTES", "MAX_PREDICTION_CHARS", "PredictionsFileBackend"]

"""Med-HallMark's released files (Chen et al. 2024, arXiv 2406.10185) and their mapping to the
canonical record (:mod:`medheval.data.schema`), for the ``datasets/med_hallmark`` builder.

The files are pinned to ``ydk122024/Med-HallMark`` at commit ``1eb83d85`` with their sha256
(two names really end in ``..json``). Four formats:

* ``Conventional..json`` / ``Counterfactual..json``: LLaVA-style ``conversations`` whose human
  turn is a whole hallucination-judge prompt around one item and whose gpt turn is the human
  level (also ``classification_label``, 0 = catastrophic … 5 = correct). :func:`split_judge_prompt`
  cuts the question, the released Med-VLM answer and the ground truth (when the prompt variant has
  one) out of the prompt by its field markers (``question:``, ``Med-VLM answer:``,
  ``ground-truth:``, then a blank line before the closing instruction);
* ``Confidence_weakening.json``: a confidence-weakening prefix, a colon, the question; the gpt
  turn is the reference answer (no id, no level);
* ``Irg.json``: report generation: ``question``, ``Med-VLM answer``, ``ground-truth``, ``image``
  (a MIMIC-CXR dicom id) and ``prompt`` (the report judge prompt); no level is released.

The same readers give the exact upstream judge prompts as templates (:func:`upstream_vqa_template`,
:func:`upstream_irg_template`): the text is read from the pinned, sha256-verified file at run
time, never stored in this project.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medheval.data.fetch import PinnedFile, fetch
from medheval.data.builders import check_text_length, id_field, read_json_records, text_field
from medheval.scoring.parsing import parse_yes_no
from medheval.data.schema import is_credentialed, make_id
from medheval.data.images import DICOM_ID_PATTERN

BENCHMARK = "med_hallmark"
COMMIT = "1eb83d8503e9a81b18bb6cf116316fe2c19a81a9"
BASE_URL = f"https://raw.githubusercontent.com/ydk122024/Med-HallMark/{COMMIT}"
HOMEPAGE = "https://github.com/ydk122024/Med-HallMark"
CITATION = """@article{chen2024medhallmark,
  title={Detecting and Evaluating Medical Hallucinations in Large Vision Language Models},
  author={Chen, Jiawei and Yang, Dingkang and others},
  journal={arXiv preprint arXiv:2406.10185},
  year={2024}
}"""


def _pin(relpath: str, sha256: str) -> PinnedFile:
    return PinnedFile(relpath=relpath, url=f"{BASE_URL}/{relpath}", sha256=sha256)


FILES: dict[str, PinnedFile] = {
    "conventional": _pin("Conventional..json", "064b6fec3e67fc794943be9aeeb6bc743f3a6bcc7f2d90ad97ff691547d7c985"),
    "counterfactual": _pin("Counterfactual..json", "8be17919935e4b2af49b6b131c1ef885af516063f42bf0e0bea3cfd2add4ed5b"),
    "confidence_weakening": _pin("Confidence_weakening.json",
                                 "325b16fa9357df7766eeeb1b111fd23e6f0e04ec8f13aeefd03c6ea5f26b9b95"),
    "irg": _pin("Irg.json", "5e44151f875b0e2700a8dd29483a152f6dc9bf05d9eca7f48fc026e89dc9e31b"),
}
COUNTS = {"conventional": 499, "counterfactual": 111, "confidence_weakening": 140, "irg": 359}

# classification_label -> level key (medheval.families.med_hallmark.LEVELS order; kept literal so the reader
# needs nothing from the scoring code)
_LABEL_LEVELS = ("catastrophic", "critical", "attribute", "prompt_induced", "minor", "correct")

_FIELD_BLOCK = re.compile(
    r"question: (?P<question>.*?)\nMed-VLM answer: (?P<response>.*?)(?:\nground-truth: (?P<reference>.*))?", re.S
)
_DICOM = re.compile(rf"{DICOM_ID_PATTERN}\.jpg")


# --------------------------------------------------------------------------- prompt records


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt as literal pieces around named fields: ``pieces[0] + f0 + pieces[1] + f1 + … + pieces[-1]``.

    Kept as pieces (not a ``str.format`` string) so braces in the upstream text need no escaping.
    """

    pieces: tuple[str, ...]
    fields: tuple[str, ...]

    def render(self, **values: Any) -> str:
        missing = [name for name in self.fields if name not in values]
        if missing:
            raise KeyError(f"prompt template needs {missing}")
        out = [self.pieces[0]]
        for name, piece in zip(self.fields, self.pieces[1:]):
            out += ["" if values[name] is None else str(values[name]), piece]
        return "".join(out)


@dataclass(frozen=True)
class JudgePromptItem:
    """What one judge-prompt record holds: the item and the prompt's template around it."""

    question: str
    response: str
    reference: str | None
    template: PromptTemplate


def split_judge_prompt(text: str) -> JudgePromptItem:
    """Cut ``question``, Med-VLM ``response`` and ``reference`` (``None`` in the variant without
    ground truth) out of one conventional/counterfactual human turn; ``ValueError`` when the
    field markers are not there.

    The fields sit in the last blank-line-separated block that starts with ``question: ``; the
    closing instruction is the paragraph after them. Values are kept verbatim (not stripped), so
    ``template.render(...)`` with them gives ``text`` back byte for byte.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected the prompt text, got {type(text).__name__}")
    body, sep, _closing = text.rpartition("\n\n")
    start = body.rfind("\n\nquestion: ")
    if not sep or start < 0:
        raise ValueError("no 'question: … / Med-VLM answer: …' block followed by a closing paragraph")
    start += 2
    m = _FIELD_BLOCK.fullmatch(body, start)
    if m is None:
        raise ValueError("the field block lacks 'Med-VLM answer: '")
    names = ["question", "response"] + (["reference"] if m["reference"] is not None else [])
    spans = [m.span(name) for name in names]
    pieces = [text[:spans[0][0]]] + [text[a[1]:b[0]] for a, b in zip(spans, spans[1:])] + [text[spans[-1][1]:]]
    return JudgePromptItem(m["question"], m["response"], m["reference"],
                           PromptTemplate(tuple(pieces), tuple(names)))


def irg_prompt_template(record: dict) -> PromptTemplate | None:
    """The template of an ``Irg.json`` record's ``prompt``: the text around its ground truth and its
    Med-VLM answer (fields ``reference``, ``response``); ``None`` when either is empty or not found
    exactly once in that order."""
    prompt, reference, response = record.get("prompt"), record.get("ground-truth"), record.get("Med-VLM answer")
    if not (isinstance(prompt, str) and reference and response) or prompt.count(reference) != 1:
        return None
    i = prompt.index(reference)
    j = prompt.find(response, i + len(reference))
    if j < 0 or prompt.count(response) != 1:
        return None
    return PromptTemplate((prompt[:i], prompt[i + len(reference):j], prompt[j + len(response):]),
                          ("reference", "response"))


# --------------------------------------------------------------------------- images


def image_reference(image: Any) -> tuple[str, str]:
    """``(source, reference relative to that source's image root)`` for a released ``image`` value.

    ``rad/synpic*.jpg`` and ``synpic*.jpg`` -> VQA-RAD; ``slake/xmlab*/source.jpg`` -> SLAKE
    (``xmlab*/source.jpg``, relative to SLAKE's ``imgs/``); a bare MIMIC-CXR dicom id
    ``<dicom_id>.jpg`` -> ``mimic_cxr`` (mapped to its folder by a metadata CSV at load time, see
    :class:`medheval.data.images.MimicDicomSource`). ``ValueError`` for anything else.
    """
    if image is not None and not isinstance(image, str):
        raise ValueError(f"image {image!r} is {type(image).__name__}, not a reference string: every Med-HallMark "
                         f"record has one image (a VQA-RAD synpic, SLAKE xmlab or MIMIC-CXR dicom reference)")
    if image is None or not image.strip():
        raise ValueError(f"image {'null' if image is None else repr(image)} is empty: every Med-HallMark record "
                         f"has one image (a VQA-RAD synpic, SLAKE xmlab or MIMIC-CXR dicom reference)")
    ref = image
    if re.fullmatch(r"(?:rad/)?synpic\d+\.jpg", ref):
        return "vqa_rad", ref.removeprefix("rad/")
    if re.fullmatch(r"(?:slake/)?xmlab\d+/source\.jpg", ref):
        return "slake", ref.removeprefix("slake/")
    if _DICOM.fullmatch(ref):
        return "mimic_cxr", ref
    raise ValueError(f"image {ref!r} is not a VQA-RAD synpic, SLAKE xmlab or MIMIC-CXR dicom reference")


# --------------------------------------------------------------------------- canonical records


def _answer_type(answer: str) -> str:
    """``yes_no`` when the reference starts with a yes/no word and reads as one, else ``open``."""
    first = re.match(r"\W*(\w+)", answer or "")
    if first and first.group(1).lower() in ("yes", "no") and parse_yes_no(answer) is not None:
        return "yes_no"
    return "open"


def _record(config: str, upstream_id: Any, raw: dict, question: str, answer: str, answer_type: str,
            meta: dict, flags: list[str], path: str, index: int) -> dict:
    try:
        source, ref = image_reference(raw.get("image"))
    except ValueError as error:
        raise ValueError(f"{path}: record #{index} (id={upstream_id!r}): field 'image': {error}") from None
    where = f"{path}: record #{index} (id={upstream_id!r})"
    for key, text in (("question", question), ("answer", answer), ("released_response", meta.get("released_response"))):
        if isinstance(text, str):
            check_text_length(text, key, where)
    if not question.strip():  # the model would get the image and the answer-format suffix only
        flags = [*flags, "empty_question"]
    meta.update(upstream_id=upstream_id, upstream_image=raw.get("image"), quality_flags=flags,
                credentialed=is_credentialed(source))
    return {
        "id": make_id(BENCHMARK, config, upstream_id),
        "benchmark": BENCHMARK,
        "config": config,
        "images": [ref],
        "question": question,
        "answer": answer,
        "answer_type": answer_type,
        "choices": [],
        "category": config,
        "source": source,
        "meta": meta,
    }


def _turns(raw: Any, path: str, index: int) -> tuple[str, str]:
    turns = raw.get("conversations") if isinstance(raw, dict) else None
    if (not isinstance(turns, list) or len(turns) != 2
            or not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns)):
        raise ValueError(f"{path}: record #{index}: expected 'conversations' with a human and a gpt turn "
                         "(Med-HallMark's LLaVA format)")
    return turns[0]["value"], turns[1]["value"]


def judged_records(path: str | Path, config: str) -> Iterator[dict]:
    """Canonical records of ``Conventional..json`` / ``Counterfactual..json``.

    ``answer`` is the ground truth cut out of the judge prompt ("" in the no-ground-truth
    variant, flagged ``no_ground_truth``); ``meta.released_response`` is the Med-VLM answer the
    humans labelled, ``meta.human_level`` their level, ``meta.human_label`` the released integer.
    """
    path = str(path)
    for index, raw in enumerate(read_json_records(path, "a Med-HallMark file")):
        human, gpt = _turns(raw, path, index)
        upstream_id = id_field(raw, "id", f"{path}: record #{index}") if "id" in raw else index + 1
        try:
            item = split_judge_prompt(human)
        except ValueError as error:
            raise ValueError(f"{path}: record #{index} (id={upstream_id!r}): field 'conversations' (human turn): "
                             f"{error}") from None
        label = raw.get("classification_label")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(_LABEL_LEVELS):
            raise ValueError(f"{path}: record #{index} (id={upstream_id!r}): classification_label {label!r} "
                             "is not an integer 0-5 (0 = catastrophic ... 5 = correct); fix the record")
        reference = item.reference
        flags = [] if reference is not None else ["no_ground_truth"]
        if not gpt.lower().startswith(_LABEL_LEVELS[label].split("_")[0]):
            flags.append("label_text_mismatch")
        meta = {"released_response": item.response, "human_level": _LABEL_LEVELS[label], "human_label": label,
                "human_label_text": gpt, "has_ground_truth": reference is not None}
        answer = reference if reference is not None else ""
        yield _record(config, upstream_id, raw, item.question, answer,
                      _answer_type(answer) if reference is not None else "open", meta, flags, path, index)


def confidence_weakening_records(path: str | Path, config: str = "confidence_weakening") -> Iterator[dict]:
    """Canonical records of ``Confidence_weakening.json``: ``question`` as released (prefix included),
    ``meta.plain_question`` without the prefix, ``meta.prefix`` the prefix (up to its colon); ids are
    the 1-based record positions (the file has none)."""
    path = str(path)
    for index, raw in enumerate(read_json_records(path, "a Med-HallMark file")):
        human, gpt = _turns(raw, path, index)
        prefix, colon, plain = human.partition(":")
        flags = [] if colon and plain.strip() else ["no_prefix_found"]
        meta = {"plain_question": plain.strip() if colon else human, "prefix": (prefix + colon) if colon else ""}
        yield _record(config, index + 1, raw, human, gpt, _answer_type(gpt), meta, flags, path, index)


_IRG_KEYS = ("question", "Med-VLM answer", "ground-truth", "image")


def irg_records(path: str | Path, config: str = "irg") -> Iterator[dict]:
    """Canonical records of ``Irg.json`` (MIMIC-CXR, credentialed): ``answer`` = the ground-truth
    report, ``meta.released_response`` = the released Med-VLM report; no level is released
    (``Hallucination-type`` is empty in every record). Ids are 1-based positions (``qid`` is empty)."""
    path = str(path)
    for index, raw in enumerate(read_json_records(path, "a Med-HallMark file")):
        missing = [key for key in _IRG_KEYS if not isinstance(raw, dict) or key not in raw]
        if missing:
            raise ValueError(f"{path}: record #{index} lacks field(s) {missing}; expected the Irg.json format")
        upstream_id = raw.get("qid") or index + 1
        where = f"{path}: record #{index} (id={upstream_id!r})"
        question, response, reference = (text_field(raw, key, where) for key in ("question", "Med-VLM answer",
                                                                                    "ground-truth"))
        released_type = raw.get("Hallucination-type") or None
        meta = {"released_response": response, "released_hallucination_type": released_type}
        flags = [] if reference.strip() else ["no_ground_truth"]
        yield _record(config, upstream_id, raw, question, reference, "report", meta, flags, path, index)


READERS = {
    "conventional": judged_records,
    "counterfactual": judged_records,
    "confidence_weakening": confidence_weakening_records,
    "irg": irg_records,
}


# --------------------------------------------------------------------------- upstream prompts


def _verified(key: str, data_dir: str | Path | None) -> Path:
    got = fetch(FILES[key], data_dir=data_dir)
    if not got.verified:
        raise ValueError(
            f"{got.path} has sha256 {got.sha256}, not the pinned {FILES[key].sha256}: the exact upstream prompt "
            f"is read only from the released file ({FILES[key].url})"
        )
    return got.path


@functools.lru_cache(maxsize=None)
def upstream_vqa_template(with_reference: bool, data_dir: str | None = None) -> PromptTemplate:
    """Med-HallMark's VQA judge prompt as a template (fields ``question``, ``response`` and, with
    ``with_reference``, ``reference``), read from the human turn of the first record of the pinned
    ``Conventional..json`` that uses that variant."""
    path = _verified("conventional", data_dir)
    for index, raw in enumerate(read_json_records(path, "a Med-HallMark file")):
        item = split_judge_prompt(_turns(raw, str(path), index)[0])
        if (item.reference is not None) == with_reference:
            return item.template
    raise ValueError(f"{path}: no record uses the prompt variant {'with' if with_reference else 'without'} ground truth")


@functools.lru_cache(maxsize=None)
def upstream_irg_template(data_dir: str | None = None) -> PromptTemplate:
    """Med-HallMark's report judge prompt as a template (fields ``reference``, ``response``), read from
    the ``prompt`` field of the pinned ``Irg.json``."""
    path = _verified("irg", data_dir)
    for raw in read_json_records(path, "a Med-HallMark file"):
        template = irg_prompt_template(raw)
        if template is not None:
            return template
    raise ValueError(f"{path}: no record's prompt holds its ground truth and answer once each")

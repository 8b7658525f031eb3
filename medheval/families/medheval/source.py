"""MedHEval's released annotation files (Chang et al. 2025, arXiv 2503.02157) and their
mapping to the canonical record (:mod:`medheval.data.schema`).

The files are pinned to upstream commit ``7f7d980e`` with their sha256; one earlier revision is pinned too
(:data:`REPORT_BA4586E`: the report-generation file as it stood before upstream commit ``42e36fc``). Three file
formats exist; each has one mapping function here, shared by the builders in
``datasets/``:

* visual close-ended, fine-grained (``*_pairs.json`` per source): ``question_type``
  binary | multi-choice, ``choices`` as one string, ``hallucination_type`` type_1..4;
* report generation (visual open-ended): ``answer`` + ``structured_answer``;
* knowledge / context: ``ground_truth_type`` (close) or ``question_type`` (open).

Upstream label noise is kept as released and listed in ``meta["quality_flags"]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medheval.data.builders import PinnedFilesBuilder, check_text_length, id_field, image_field, read_json_records, text_field
from medheval.data.fetch import PinnedFile
from medheval.scoring.parsing import normalize_reference, split_choices
from medheval.data.schema import HALLUCINATION_TYPE_TO_CATEGORY, is_credentialed, make_id

COMMIT = "7f7d980e676890ed99513f4629fd4d5af19bc8b9"
BASE_URL = f"https://raw.githubusercontent.com/Aofei-Chang/MedHEval/{COMMIT}/benchmark_data"
HOMEPAGE = "https://github.com/Aofei-Chang/MedHEval"
CITATION = """@article{chang2025medheval,
  title={MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author={Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal={arXiv preprint arXiv:2503.02157},
  year={2025}
}"""


def _pin(relpath: str, sha256: str, commit: str = COMMIT) -> PinnedFile:
    base = BASE_URL if commit == COMMIT else f"https://raw.githubusercontent.com/Aofei-Chang/MedHEval/{commit}/benchmark_data"
    return PinnedFile(relpath=relpath, url=f"{base}/{relpath}", sha256=sha256)


_VISUAL_CLOSE = "Visual_Misinterpretation_Hallucination/close-ended/fine-grained"
FILES: dict[str, PinnedFile] = {
    "slake": _pin(f"{_VISUAL_CLOSE}/slake_qa_pairs.json",
                  "4aed33132547d326f848e05b93e34ec509fe8d624cb3a38cd763d360c2680499"),
    "vqa_rad": _pin(f"{_VISUAL_CLOSE}/rad_vqa_pairs.json",
                    "3b8e5ea2be1598bbcafca311225d3d244f0ed020903cbf5709c9ff31c9e15697"),
    "iu_xray": _pin(f"{_VISUAL_CLOSE}/xray_closed_pairs.json",
                    "904fff4bd83ea3f27926d82b7c6f963bf52ab54fc26712e5e9cfec78bdf009eb"),
    "mimic_cxr": _pin(f"{_VISUAL_CLOSE}/mimic_cxr_closed_pairs.json",
                      "68bdb156ee6117742280fa9e4db4452d243560615b9b49b3a2a601f3e07e4875"),
    "report": _pin("Visual_Misinterpretation_Hallucination/open-ended/MIMIC-CXR_pairs.json",
                   "9b933043b68054ecce25a5ad5525c7364486dfa34115dfd4b00c734f6d5cb4ac"),
    "knowledge_closed": _pin("Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json",
                             "77fd16b713643ec0acac54255ef7b9229d92457f8ab0a27e8774f0bf154d9514"),
    "knowledge_open": _pin("Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json",
                           "303b748ec9baf91392751700cf6f05b7c263ab21876d205d09ff579fe42e371d"),
    "context": _pin("Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json",
                    "05d979d6f37c3abd988004401318332657807450958429d75398249e77a8e02c"),
}
# The report-generation file before upstream commit 42e36fc (2025-04-23) rewrote it: at ba4586e (2025-02-28) it
# held 500 items (qids 0-499) under an earlier instruction, and 60 of the 490 references kept later differ (the
# earlier ones more often compare with prior studies). Same schema and relative path; loaded by the
# ``vishal_report:ba4586e`` config.
REPORT_BA4586E_COMMIT = "ba4586e84dbd947003f954b10f95fa8ed8b05b68"
REPORT_BA4586E = _pin("Visual_Misinterpretation_Hallucination/open-ended/MIMIC-CXR_pairs.json",
                      "121c6d6e17a6ecd8394cf92d260ca0c099f682241d0d6b01c6f504435886991f", commit=REPORT_BA4586E_COMMIT)
FILES["report_ba4586e"] = REPORT_BA4586E

_REQUIRED_KEYS = {
    "visual_close": ("img_name", "question", "answer", "question_type", "choices", "qid", "hallucination_type"),
    "report": ("img_name", "question", "answer", "qid"),
    "text_close": ("img_name", "question", "answer", "qid"),
    "text_open": ("img_name", "question", "answer", "qid"),
}
_BARE_LETTERS = {chr(code) for code in range(ord("A"), ord("Z") + 1)}


def read_records(path: str | Path) -> list[dict]:
    """Read one upstream JSON array; the error names the file when it is not one."""
    return read_json_records(path, "a MedHEval benchmark_data file")


def _check_keys(raw: dict, fmt: str, path: str, index: int) -> None:
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: record #{index} is a {type(raw).__name__}, expected an object")
    missing = [key for key in _REQUIRED_KEYS[fmt] if key not in raw]
    if missing:
        raise ValueError(
            f"{path}: record #{index} (qid={raw.get('qid')!r}) lacks field(s) {missing}; "
            f"expected the MedHEval '{fmt}' format"
        )
    where = f"{path}: record #{index} (qid={raw.get('qid')!r})"
    id_field(raw, "qid", where)
    for key in ("question", "answer"):
        text_field(raw, key, where)
    if isinstance(raw.get("choices"), str):  # a choices string is parsed for its options
        check_text_length(raw["choices"], "choices", where)
    image_field(raw, "img_name", where)  # every released MedHEval file has an image per record (none is text-only)


def _is_yes_no(answer: str) -> bool:
    return answer.strip().rstrip(".").lower() in {"yes", "no"}


def _close_ended_fields(answer: str, declared: str | None, raw_choices: Any) -> tuple[str, list[str], list[str]]:
    """Derive (answer_type, choices, quality_flags) from the data, not from the label alone."""
    flags: list[str] = []
    choices = split_choices(raw_choices)
    if declared == "multi-choice" or (declared is None and len(choices) >= 2):
        answer_type = "multiple_choice"
        if not choices and _is_yes_no(answer):
            answer_type, flags = "yes_no", ["multi_choice_without_choices"]
        elif len(choices) < 2:
            flags.append("fewer_than_two_choices")
        if choices and all(option in _BARE_LETTERS for option in choices):
            flags.append("choices_are_bare_letters")
    elif declared in ("binary", None):
        answer_type = "yes_no"
        if declared is None:
            flags.append("answer_type_missing")
        if choices:
            flags.append("binary_with_choices")
    else:
        answer_type = "open"
        flags.append(f"unknown_question_type:{declared}")
    usable_choices = choices if answer_type == "multiple_choice" else []
    usable = answer_type == "open" or normalize_reference(answer, answer_type, usable_choices) is not None
    if answer_type == "yes_no" and not _is_yes_no(answer):
        # "Abnormal", "Unclear" -> unusable; "The image does not show X" -> usable, but not a yes/no word
        flags.append("binary_answer_is_sentence" if usable else "binary_answer_not_yes_no")
    elif not usable:
        flags.append("answer_not_in_choices")
    return answer_type, usable_choices, flags


def visual_close_records(path: str | Path, benchmark: str, config: str, source: str) -> Iterator[dict]:
    """Canonical records of one fine-grained visual close-ended file (MM-/CXR-VisHal)."""
    for index, raw in enumerate(read_records(path)):
        _check_keys(raw, "visual_close", str(path), index)
        answer = str(raw["answer"])
        answer_type, choices, flags = _close_ended_fields(answer, raw["question_type"], raw["choices"])
        htype = raw["hallucination_type"]
        category = HALLUCINATION_TYPE_TO_CATEGORY.get(htype, "")
        if not category:
            flags.append(f"unknown_hallucination_type:{htype}")
        meta = {
            "upstream_qid": raw["qid"],
            "hallucination_type": htype,
            "question_type": raw["question_type"],
            "raw_choices": raw["choices"],
            "omission_type": raw.get("omission_type"),
            "img_id": raw.get("img_id"),
            "location": raw.get("location"),
            "modality": raw.get("modality"),
        }
        yield _record(benchmark, config, source, raw, answer, answer_type, choices, category, meta, flags)


def report_records(path: str | Path, benchmark: str, config: str) -> Iterator[dict]:
    """Canonical records of the visual open-ended (report generation) file."""
    for index, raw in enumerate(read_records(path)):
        _check_keys(raw, "report", str(path), index)
        meta = {
            "upstream_qid": raw["qid"],
            "img_id": raw.get("img_id"),
            "structured_answer": raw.get("structured_answer"),
        }
        yield _record(benchmark, config, "mimic_cxr", raw, str(raw["answer"]), "report", [], "report", meta, [])


def text_records(path: str | Path, benchmark: str, config: str, category: str) -> Iterator[dict]:
    """Canonical records of the knowledge (close/open) and context files (MIMIC-CXR images)."""
    for index, raw in enumerate(read_records(path)):
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: record #{index} is a {type(raw).__name__}, expected an object")
        declared = raw.get("ground_truth_type") or raw.get("question_type")
        fmt = "text_open" if declared == "type4_Knowledge" else "text_close"
        _check_keys(raw, fmt, str(path), index)
        answer = str(raw["answer"])
        if fmt == "text_open":
            answer_type, choices, flags = "open", [], []
        else:
            answer_type, choices, flags = _close_ended_fields(answer, declared, raw.get("choices"))
        meta = {
            "upstream_qid": raw["qid"],
            "question_type": declared,
            "raw_choices": raw.get("choices"),
            "img_id": raw.get("img_id"),
            "structured_answer": raw.get("structured_answer"),
        }
        yield _record(benchmark, config, "mimic_cxr", raw, answer, answer_type, choices, category, meta, flags)


def _record(benchmark: str, config: str, source: str, raw: dict, answer: str, answer_type: str,
            choices: list[str], category: str, meta: dict, flags: list[str]) -> dict:
    if not str(raw["question"]).strip():  # the model would get the image and the answer-format suffix only
        flags = [*flags, "empty_question"]
    meta["quality_flags"] = flags
    meta["credentialed"] = is_credentialed(source)
    return {
        "id": make_id(benchmark, config, raw["qid"]),
        "benchmark": benchmark,
        "config": config,
        "images": [str(raw["img_name"])],
        "question": str(raw["question"]),
        "answer": answer,
        "answer_type": answer_type,
        "choices": choices,
        "category": category,
        "source": source,
        "meta": meta,
    }


class MedHEvalBuilder(PinnedFilesBuilder):
    """Base builder for the MedHEval splits: a unit declares ``BUILDER_CONFIGS`` and ``config_files``
    (keys of :data:`FILES`)."""

    PINNED: dict[str, PinnedFile] = FILES
    HOMEPAGE = HOMEPAGE
    CITATION = CITATION

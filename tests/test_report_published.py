"""The published numbers (issue 22, points 11-12): the transcription against the papers' text, the alias
table, the Reproduction section of ``medheval report --compare-published`` and ``medheval published``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import SHARED_UPSTREAM
from medheval.cli import main
from medheval.report.collect import Run
from medheval.report.paper import Cell, Column, Table
from medheval.report.published import (ALIASES, COLUMNS, SPLITS, Published, load_published, paper_models,
                                       reproduction)

PAPERS_DIR = SHARED_UPSTREAM.parent.parent / "papers"  # ../shared/papers beside ../shared/data/upstream
PAPER_FILES = {"medheval": "medheval.txt", "med_hallmark": "med_hallmark.txt", "clinhallu": "clinhallu.txt",
               "med_stepbench": "med_stepbench.txt"}
requires_papers = pytest.mark.skipif(not PAPERS_DIR.is_dir(), reason="../shared/papers is absent")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")  # a printed number, not part of a name (7b, 1.5-7b, 3D)

# Cells read by hand from the papers' tables: (paper, table, model, setting, split, metric, printed). Those marked
# "text" are also quoted in the paper's prose (e.g. MedHEval: "CheXagent ... (Acc = 0.739)").
SAMPLE = [
    ("medheval", "3", "GPT-4o", "Original", "MM-VisHal", "Acc-A", "0.775"),
    ("medheval", "3", "CheXagent", "Original", "CXR-VisHal", "Acc", "0.739"),  # text
    ("medheval", "3", "MiniGPT-4", "Original", "CXR-VisHal", "Acc-M", "0.301"),
    ("medheval", "3", "LLM-CXR", "Original", "CXR-VisHal", "Acc-R", "0.403"),
    ("medheval", "3", "Med-Flamingo", "Original", "MM-VisHal", "Acc-R", "0.327"),
    ("medheval", "4", "LLaVA-Med", "OPERA", "CXR-VisHal", "Acc", "0.732"),
    ("medheval", "4", "LLaVA-Med-1.5", "PAI", "MM-VisHal", "Acc-A", "0.640"),
    ("medheval", "4", "LLaVA-Med-1.5", "DAMRO", "CXR-VisHal", "Acc-S", "0.605"),
    ("medheval", "4", "LLaVA-Med", "AVISC", "CXR-VisHal", "Acc-R", "0.835"),
    ("medheval", "9", "LLaVA-NeXT 13B", "PAI", "CXR-VisHal", "Acc-R", "0.645"),
    ("medheval", "9", "LLaVA-NeXT 7B", "AVISC", "MM-VisHal", "Acc-M", "0.512"),
    ("medheval", "9", "LLaVA-NeXT 13B", "DoLa", "MM-VisHal", "Acc", "0.453"),
    ("medheval", "5", "CheXagent", "Original", "Report generation", "CHAIR", "6.88"),
    ("medheval", "5", "XrayGPT", "Original", "Report generation", "RadGraph", "12.88"),
    ("medheval", "5", "GPT-4o", "Original", "Report generation", "RaTEScore", "45.39"),
    ("medheval", "6", "LLaVA-Med", "PAI", "Report generation", "CHAIR", "27.31"),
    ("medheval", "6", "LLaVA-Med-1.5", "DoLa", "Report generation", "Recall", "6.29"),
    ("medheval", "6", "LLaVA-Med", "OPERA", "Report generation", "CheXbert", "23.59"),
    ("medheval", "10", "LLaVA-NeXT 7B", "PAI", "Report generation", "Recall", "3.83"),
    ("medheval", "10", "LLaVA-NeXT 13B", "DoLa", "Report generation", "CHAIR", "13.90"),
    ("medheval", "7", "GPT-4o", "Original", "Knowledge open-ended", "S_h", "0.77 ± 0.81"),  # text
    ("medheval", "7", "XrayGPT", "Original", "Knowledge open-ended", "BLEU", "1.91"),
    ("medheval", "7", "Med-Flamingo", "Original", "Knowledge open-ended", "ROUGE-2", "10.17"),
    ("medheval", "8", "LLaVA-Med-1.5", "M3ID", "Knowledge open-ended", "ROUGE-1", "40.21"),
    ("medheval", "8", "LLaVA-Med", "OPERA", "Knowledge open-ended", "METEOR", "34.02"),
    ("medheval", "11", "LLaVA-NeXT 7B", "PAI", "Knowledge open-ended", "S_h", "2.09 ± 1.24"),
    ("medheval", "11", "LLaVA-NeXT 13B", "M3ID", "Knowledge open-ended", "BERTScore", "88.92"),
    ("med_hallmark", "1", "mPLUG-Owl2", "", "Med-VQA", "METEOR", "29.39"),  # text
    ("med_hallmark", "1", "mPLUG-Owl2", "", "IRG", "BERTScore", "64.49"),  # text
    ("med_hallmark", "1", "XrayGPT", "", "IRG", "BERTScore", "62.62"),  # text
    ("med_hallmark", "1", "MiniGPT4", "", "IRG", "MediHall Score", "0.88"),  # text
    ("med_hallmark", "1", "InstructBLIP-7b", "", "Med-VQA", "ROUGE-2", "0.59"),  # text
    ("med_hallmark", "1", "InstructBLIP-13b", "", "Med-VQA", "ROUGE-2", "0.58"),  # text
    ("med_hallmark", "1", "LLaVA-Med(SF)", "", "Med-VQA", "MediHall Score", "0.61"),  # text
    ("med_hallmark", "1", "XrayGPT", "", "Med-VQA", "Acc", "0.02"),
    ("med_hallmark", "1", "RadFM", "", "IRG", "BLEU", "0.05"),
    ("med_hallmark", "2", "LLaVA1.5-13b", "", "Confidence-weakening", "BLEU", "7.19"),
    ("med_hallmark", "2", "LLaVA-Med (SF)", "", "Conventional (true')", "MediHall Score", "0.72"),
    ("med_hallmark", "2", "XrayGPT", "", "Confidence-weakening", "METEOR", "18.8"),
    ("med_stepbench", "3", "MedM-VL 2D", "w/o", "EN", "Step 3 F1", "0.40"),  # text
    ("med_stepbench", "3", "MedM-VL 2D", "w/o", "EN", "Step 4 F1", "0.61"),  # text
    ("med_stepbench", "3", "MedM-VL 3D", "w/o", "EN", "Step 3 F1", "0.51"),  # text
    ("med_stepbench", "3", "M3D", "w/o", "EN", "Step 3 F1", "0.38"),  # text
    ("med_stepbench", "3", "Gemini 2.5 flash", "w/o", "EN", "Step 4 F1", "0.61"),  # text
    ("med_stepbench", "3", "Qwen3-VL-4B", "w/o", "EN", "Step 4 F1", "0.63"),  # text
    ("med_stepbench", "3", "LLaVA-Med", "w/o", "EN", "Step 4 F1", "0.42"),  # text
    ("med_stepbench", "3", "Med-Flamingo", "w/o", "EN", "Step 4 F1", "0.59"),  # text
    ("med_stepbench", "3", "GPT 4o", "w", "VI", "Step 4 R", "0.83"),
    ("med_stepbench", "3", "Qwen3-VL-8B", "w", "VI", "Step 2 R", "0.92"),
    ("med_stepbench", "3", "MedM-VL 3D", "w/o", "VI", "Step 4 F1", "0.39"),
    ("clinhallu", "4", "model average", "", "VQA-RAD", "Delta^V", "15.5"),  # text
    ("clinhallu", "4", "model average", "", "MedXpertQA", "Delta^K", "33.4"),  # text
    ("med_hallmark", "3", "ID 2", "", "Figure 2(b) examples", "BERTScore", "46.11"),  # text
    ("med_hallmark", "4", "ours", "", "human-annotated test set", "Correct Statements Recall", "65.96"),
    ("med_hallmark", "5", "mPLUG-Owl2", "", "Med-VQA", "METEOR", "29.39"),
    ("med_hallmark", "6", "RadFM", "", "Counterfactual", "ROUGE-L", "13.31"),
    ("med_hallmark", "6", "LLaVA-Med (SF)", "", "Counterfactual", "ROUGE-1 recall", "38.52"),
    ("med_hallmark", "7", "XrayGPT", "", "IRG", "BERTScore recall", "65.32"),
    ("med_stepbench", "4", "Gemini 2.5 Flash", "Clinician's rationale", "", "F1", "0.57"),  # text
    ("med_stepbench", "4", "Gemini 2.5 Flash", "LLM rationale", "", "R", "0.98"),  # text
    ("med_stepbench", "4", "MedM-VL 3D", "Clinician's rationale", "", "F1", "0.53"),  # text
    ("med_stepbench", "5", "Qwen3 VL-4B", "none", "", "Step 2 F1", "0.65"),
    ("med_stepbench", "5", "Gemini 2.5 Flash", "both", "", "Step 4 F1", "0.65"),
    ("med_stepbench", "6", "Gemini 2.5 Flash", "PET + CT", "VI", "Step 1 F1", "0.79"),  # text
    ("med_stepbench", "6", "Gemini 2.5 Flash", "PET/CT", "VI", "Step 1 F1", "0.98"),  # text
    ("med_stepbench", "6", "Qwen3 VL-4B", "PET + CT", "EN", "Step 3 F1", "0.20"),  # text
    ("med_stepbench", "6", "Med Flamingo", "PET/CT", "EN", "Step 4 F1", "0.59"),
]


def _paper_text(paper: str) -> str:
    return (PAPERS_DIR / PAPER_FILES[paper]).read_text(encoding="utf-8")


def _contains_run(tokens: list[str], run: list[str]) -> bool:
    return any(tokens[i:i + len(run)] == run for i in range(len(tokens) - len(run) + 1))


def _row_numbers(records: list[Published]) -> list[str]:
    out: list[str] = []
    for record in records:
        out += [f"{record.value:.{record.decimals}f}"] + ([] if record.std is None
                                                           else [f"{record.std:.{record.decimals}f}"])
    return out


def test_sample_is_big_enough_and_spans_every_paper() -> None:
    assert len(SAMPLE) >= 30
    assert {row[0] for row in SAMPLE} == set(PAPER_FILES)


@requires_papers
@pytest.mark.parametrize("paper, table, model, setting, split, metric, printed", SAMPLE)
def test_sampled_cell_matches_the_paper(paper: str, table: str, model: str, setting: str, split: str, metric: str,
                                        printed: str) -> None:
    """Each hand-read cell (SAMPLE: paper, table, row, column as printed) is stored with exactly the printed
    value, and the paper's table line of that row shows it (ClinHallu Table 4: the sentence of the text that
    quotes it, with "%", as the table body is absent from the text copy)."""
    found = [r for r in load_published() if (r.paper, r.table, r.model, r.setting, r.split, r.metric)
             == (paper, table, model, setting, split, metric)]
    assert len(found) == 1, f"{paper} Table {table} {model} {setting} {split} {metric}: {len(found)} records"
    assert found[0].printed == printed
    text = _paper_text(paper)
    if paper == "clinhallu":
        assert f"{printed}%" in text
        return
    first = printed.split(" ± ")[0]
    # the row's line names the model, or (a mitigation row) its setting, or (Med-HallMark Table 2) its question type
    names = [model.split(" ")[0], *([setting] if setting else []),
             *({"Confidence-weakening": ["spadesuit"], "Conventional (true')": ["clubsuit"]}.get(split, []))]
    assert any(any(name in line for name in names) for line in text.splitlines() if first in NUMBER.findall(line))


@requires_papers
def test_every_stored_row_is_a_row_of_the_paper() -> None:
    """Every stored row (one model × setting × table, its cells in the file's column order, S_h with its std;
    Med-HallMark Table 2: per question type) appears in the paper's text as consecutive printed numbers of one
    line: the transcription neither drops, adds nor reorders a value. MedHEval Table 3 (GPT-4o) e.g. is the
    line "GPT-4o 0.775 0.697 ... 0.794"."""
    rows: dict[tuple[str, ...], list[Published]] = {}
    for record in load_published():
        if record.paper != "clinhallu":  # Med-HallMark Table 2 prints each question type on its own line
            split = record.split if (record.paper, record.table) == ("med_hallmark", "2") else ""
            rows.setdefault((record.paper, record.table, record.model, record.setting, split), []).append(record)
    assert len(rows) > 100
    lines = {paper: [NUMBER.findall(line) for line in _paper_text(paper).splitlines()] for paper in PAPER_FILES}
    missing = [key for key, records in rows.items()
               if not any(_contains_run(tokens, _row_numbers(records)) for tokens in lines[key[0]])]
    assert not missing, f"rows not found in the paper text: {missing[:5]}"


def test_shape_of_the_transcription() -> None:
    """Counts per table follow from the papers' tables: MedHEval Table 3 has 9 models × 2 splits × 5 columns
    = 90 cells; Table 4, 16 rows (2 models × 8 settings) × 10 = 160; Table 9, 13 rows × 10 = 130; Table 5,
    11 × 5 = 55; Table 6, 16 × 5 = 80; Table 10, 13 × 5 = 65; Table 7, 11 × 7 = 77; Table 8, 16 × 7 = 112;
    Table 11, 13 × 7 = 91. Med-HallMark Table 1: 12 models × 15 columns, less the 5 empty IRG MediHall cells
    = 175; Table 2: 4 models × 2 question types × 7 = 56. Med-StepBench Table 3: 7 models with both languages
    (16 cells without knowledge), 5 of them with knowledge (12: no Step 1), 4 English-only models (8), 3 of
    them with knowledge (6): 112 + 60 + 32 + 18 = 222. Issue 30, point 11: Med-HallMark Table 3, 4 examples × 8
    = 32; Table 4, 7 methods × 6 levels × (ACC, recall) = 84; Tables 5 and 6, 12 models × 13 (recall, precision,
    F1 of BERTScore and ROUGE-1/2/L, METEOR) = 156 each; Table 7, 7 × 13 = 91; its text quotes 3 more numbers in
    §6.1 and 2 in §6.3. Med-StepBench Table 4, 3 rationales × 5 models × (P, R, F1) = 45; Table 5, 3 models × 4
    knowledge rows × 3 steps × 3 = 108; Table 6, Med-Flamingo 2 inputs × 4 steps (English only) = 8 plus 2 models
    × 2 inputs × 4 steps × 2 languages = 32, 40 in all. ClinHallu, numbers quoted in its text: Table 2, 3
    averages; Table 6, 4 figures and the ends of 2 ranges = 8; Figure 4, 6 Fix/Break rates."""
    counts: dict[tuple[str, str], int] = {}
    for record in load_published():
        counts[(record.paper, record.table)] = counts.get((record.paper, record.table), 0) + 1
    assert counts == {("medheval", "3"): 90, ("medheval", "4"): 160, ("medheval", "9"): 130, ("medheval", "5"): 55,
                      ("medheval", "6"): 80, ("medheval", "10"): 65, ("medheval", "7"): 77, ("medheval", "8"): 112,
                      ("medheval", "11"): 91, ("med_hallmark", "1"): 175, ("med_hallmark", "2"): 56,
                      ("med_stepbench", "3"): 222, ("clinhallu", "4"): 4,
                      ("med_hallmark", "3"): 32, ("med_hallmark", "4"): 84, ("med_hallmark", "5"): 156,
                      ("med_hallmark", "6"): 156, ("med_hallmark", "7"): 91, ("med_hallmark", "text §6.1"): 3,
                      ("med_hallmark", "text §6.3"): 2, ("med_stepbench", "4"): 45, ("med_stepbench", "5"): 108,
                      ("med_stepbench", "6"): 40, ("clinhallu", "2"): 3, ("clinhallu", "6"): 8,
                      ("clinhallu", "Figure 4"): 6}


@requires_papers
def test_clinhallu_text_numbers_are_quoted_in_the_text() -> None:
    """ClinHallu's table bodies are absent from the text copy: each stored number is one its text quotes, in its
    printed form (a % rate, or a kappa), and says so in its note."""
    text = _paper_text("clinhallu")
    printed = set(NUMBER.findall(text))
    records = [r for r in load_published() if r.paper == "clinhallu"]
    assert len(records) == 21
    for record in records:
        assert record.printed in printed, record.where()
        if record.unit == "0-100":  # a rate is printed with its % sign, or ends a range that has it (89.7–91.7%)
            assert re.search(re.escape(record.printed) + r"(%|–\d+(\.\d+)?%)", text), record.where()
        assert "text" in (record.note or ""), record.where()
    assert {r.location for r in records} == {"Table 2", "Table 4", "Table 6", "Figure 4"}


def test_table6_counterfactual_matches_the_per_type_row() -> None:
    """Med-HallMark Table 6 (counterfactual) prints LLaVA1.5-7b's BERTScore F1 as 55.86: the report's per-type
    row of med_hallmark:counterfactual matches it (BS column), under the med-hallmark protocol."""
    model = "llava-hf/llava-1.5-7b-hf"
    per_type = Table("med_hallmark", "t", ["Model", "Mitigation", "Split"], [Column("BS"), Column("R-L")])
    per_type.rows.append(([model, "none", "med_hallmark:counterfactual"], [Cell(value=50.0), Cell(value=20.0)]))
    _, records = reproduction([per_type], runs=[_run(model, splits=("med_hallmark:counterfactual",),
                                                     protocol="med-hallmark")])
    assert [(r["table"], r["metric"], r["value"], r["comparable"]) for r in records] == [
        ("6", "BERTScore", 55.86, True), ("6", "ROUGE-L", 21.8, True)]


def test_alias_table_points_at_stored_models_splits_and_columns() -> None:
    """Every alias names a model the file holds for that paper; every split and report column mapping names a
    split and metric the file holds (a typo there would silently match nothing)."""
    records = load_published()
    for paper, name in ALIASES:
        assert any(r.paper == paper and r.model == name for r in records), (paper, name)
    for paper, split in SPLITS:
        assert any(r.paper == paper and r.split == split for r in records), (paper, split)
    for paper, tables, columns in COLUMNS.values():
        for metric, _ in columns.values():
            assert any(r.paper == paper and r.table in tables and r.metric == metric for r in records), metric


def test_alias_matching() -> None:
    """A Hub id matches case-insensitively; an API spec without its prefix and endpoint; a local folder by its
    last path part; a Hub id of another organisation does not; a model only in another paper does not."""
    assert paper_models("llava-hf/llava-1.5-7b-hf", "med_hallmark") == ["LLaVA1.5-7b"]
    assert paper_models("LLAVA-HF/llava-1.5-7B-hf", "med_hallmark") == ["LLaVA1.5-7b"]
    assert paper_models("/models/llava-1.5-7b-hf/", "med_hallmark") == ["LLaVA1.5-7b"]
    assert paper_models("someone/llava-1.5-7b-hf", "med_hallmark") == []
    assert paper_models("llava-hf/llava-1.5-7b-hf", "medheval") == []
    assert paper_models("openai:gpt-4o@http://127.0.0.1:8000/v1", "medheval") == ["GPT-4o"]
    assert paper_models("openai:gpt-4o@http://127.0.0.1:8000/v1", "med_stepbench") == ["GPT 4o"]
    assert paper_models("llava-hf/llava-v1.6-vicuna-7b-hf", "medheval") == ["LLaVA-NeXT 7B"]
    assert paper_models("CheXagent", "medheval") == ["CheXagent"]  # the printed name itself


def _close_ended(model: str, mitigation: str, acc_a: Cell, acc: Cell) -> Table:
    table = Table("medheval_close_ended", "t", ["Model", "Mitigation", "Split"],
                  [Column("Acc-A"), Column("Acc"), Column("n", ranked=False)])
    table.rows.append(([model, mitigation, "mm_vishal:all"], [acc_a, acc, Cell(text="10")]))
    return table


def _run(model: str, mitigation: str = "none", splits: tuple[str, ...] = ("mm_vishal:all",),
         protocol: str | None = None, folder: str = "run", options: dict | None = None, **top: object) -> Run:
    """A hand-made run (results.json only) for the comparability checks: ``protocol`` as h-proto records it
    (``{"protocol": {"name": ...}}``; absent = clean), ``top``: other top-level keys (``seeds``, ``labels``),
    ``options``: every split's run options."""
    results: dict = {"settings": {"model": model, "mitigation": mitigation}, "labels": {}, "warnings": [],
                     "benchmarks": {s: {"metrics": {}, **({"run_options": options} if options else {})}
                                    for s in splits}, **top}
    if protocol is not None:
        results["protocol"] = {"name": protocol}
        from medheval.run.paper_protocols import get_protocol

        results.setdefault("scoring", {"upstream_compat": get_protocol(protocol).upstream_compat})  # as run_grid records
        if protocol.startswith("medheval-"):  # as a LLaVA-family run under the MedHEval protocols records
            results["settings"]["backend"] = {"tokenization": "upstream_chunked", "grey_padding": True}
            for split in (s for s in splits if s.startswith("vishal_report")):  # chair as the protocols score it,
                results["benchmarks"][split]["metrics"]["chair"] = dict(PROTOCOL_CHAIR)  # with CheXbert's weights
    return Run(path=Path(folder), results=results)


# the chair output's scalars of a MedHEval protocol run given CheXbert (--metric-option chair.labeler=chexbert)
PROTOCOL_CHAIR = {"chair": 0.2, "recall": 0.5, "labeler": "chexbert", "variant": "medheval_code",
                  "upstream_compat": True}


def test_reproduction_known_difference_and_flag() -> None:
    """MedHEval Tables 3 and 9 print LLaVA-NeXT 7B (llava-hf/llava-v1.6-vicuna-7b-hf, Original) on MM-VisHal
    as Acc-A 0.576 and Acc 0.494, i.e. 57.6 and 49.4 in the report's %. A run under the medheval-baseline
    protocol with Acc 52.0 [48.0, 56.0]: Δ = 52.0 − 49.4 = +2.6, and 49.4 lies inside the interval (not
    flagged). Acc-A 50.0 [45.0, 55.0]: Δ = 50.0 − 57.6 = −7.6, and 57.6 lies above 55.0 (flagged). Each cell
    matches two published cells: Table 3 (baseline, comparable) and Table 9's Original row, produced by the
    mitigation script (protocol medheval-mitigation): listed, not comparable, no Δ. A PAI run under
    medheval-mitigation matches only Table 9's PAI row: Acc 0.499 → Δ = 52.0 − 49.9 = +2.1."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    table = _close_ended(model, "none", Cell(value=50.0, low=45.0, high=55.0), Cell(value=52.0, low=48.0, high=56.0))
    reproduced, records = reproduction([table], runs=[_run(model, protocol="medheval-baseline")])
    got = {(r["table"], r["metric"]): (round(r["paper_value"], 6), r["difference"] and round(r["difference"], 6),
                                       r["outside_interval"], r["comparable"]) for r in records}
    assert got == {("3", "Acc-A"): (57.6, -7.6, True, True), ("9", "Acc-A"): (57.6, None, None, False),
                   ("3", "Acc"): (49.4, 2.6, False, True), ("9", "Acc"): (49.4, None, None, False)}
    assert [cells[3].text for _, cells in reproduced.rows] == ["⚠ yes", "–", "no", "–"]
    assert [cells[4].text for _, cells in reproduced.rows][:2] == [
        "yes", "no: protocol differs (run: medheval-baseline, paper: medheval-mitigation)"]
    assert reproduced.rows[1][1][2].value is None  # no Δ beside a cell of another protocol
    assert any("Outside the run's 95% item-resampling interval (1)" in line for line in reproduced.footer)
    assert any("Not comparable (2 of 4)" in line for line in reproduced.footer)
    # an informal scale, said so, with how many flags chance alone gives: 5% of the 2 cells checked
    assert reproduced.columns[3].label == "Paper outside run's 95% item-resampling CI (informal)"
    assert "not a test of the reproduction" in reproduced.footer[0]
    assert [line for line in reproduced.footer if line.startswith("By chance")] == [
        "By chance: 1 of the 2 comparable cell(s) with an interval are flagged; about 5% of them (≈ 0.1) would be "
        "even if every run matched its paper up to item-sampling noise, so read a flag as a pointer to look, not "
        "a finding."]
    pai = _close_ended(model, "pai", Cell(value=50.0), Cell(value=52.0))
    unchecked, records = reproduction([pai], runs=[_run(model, "pai", protocol="medheval-mitigation")])
    assert not any(line.startswith("By chance") for line in unchecked.footer)  # no interval: nothing checked
    assert [(r["table"], r["setting"], r["metric"]) for r in records] == [("9", "PAI", "Acc-A"), ("9", "PAI", "Acc")]
    assert records[1]["difference"] == pytest.approx(2.1) and records[1]["comparable"]
    assert records[1]["outside_interval"] is None  # no interval: said, not flagged


@pytest.mark.parametrize("top, settings, split_extra, reasons", [
    ({}, {}, {}, ["protocol differs (run: clean, paper: medheval-baseline)"]),  # no protocol recorded: clean
    ({"protocol": {"name": "medheval-baseline"}, "labels": {"random_weights": "demo"}}, {}, {}, ["random weights"]),
    ({"protocol": {"name": "medheval-baseline"}}, {"backend": {"random_weights": True}}, {}, ["random weights"]),
    ({"protocol": {"name": "medheval-baseline"}}, {}, {"annotation_files": [{"relpath": "a.json", "fixture": True}]},
     ["fixture data"]),
    ({"protocol": {"name": "medheval-baseline"}}, {"limit": 20}, {}, ["--limit 20"]),
    ({"protocol": {"name": "medheval-baseline"}, "seeds": [0, 1, 2]}, {}, {}, ["3 seeds (paper: 1)"]),
    ({"protocol": {"name": "medheval-baseline"}, "seeds": [0]}, {"limit": None}, {}, []),
    ({"protocol": {"name": "clinhallu"}, "seeds": [0, 1], "labels": {"random_weights": "x"}}, {"limit": 5},
     {"annotation_files": [{"fixture": True}]},
     ["protocol differs (run: clinhallu, paper: medheval-baseline)", "random weights", "fixture data", "--limit 5",
      "2 seeds (paper: 1)"]),
    # MedHEval's cells were scored by its released scorer: a run scored by ours is not comparable
    ({"protocol": {"name": "medheval-baseline"}, "scoring": {"upstream_compat": False}}, {}, {},
     ["scored with this project's rules (paper: its released scorer; --upstream-compat)"]),
    ({"protocol": {"name": "medheval-baseline"}, "scoring": {}}, {}, {},
     ["scored with this project's rules (paper: its released scorer; --upstream-compat)"]),
])
def test_every_row_says_why_it_is_or_is_not_comparable(top: dict, settings: dict, split_extra: dict,
                                                       reasons: list[str]) -> None:
    """Each condition of a hand-made results.json (the keys `medheval run` writes: ``protocol.name``,
    ``labels.random_weights`` or ``settings.backend.random_weights``, ``fixture`` on an annotation file,
    ``settings.limit``, ``seeds``; the protocol's ``settings.backend.tokenization`` is there) is one reason, against MedHEval Table 3 (medheval-baseline, one pass); with
    none the row is comparable and has its Δ: 52.0 − 49.4 = +2.6."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    backend = {"tokenization": "upstream_chunked", **settings.get("backend", {})}  # as a protocol run records
    run = Run(path=Path("r"), results={"settings": {"model": model, "mitigation": "none", **settings,
                                                    "backend": backend},
                                       "benchmarks": {"mm_vishal:all": {"metrics": {}, **split_extra}},
                                       "scoring": {"upstream_compat": True}, **top})
    table = _close_ended(model, "none", Cell(), Cell(value=52.0))
    reproduced, records = reproduction([table], runs=[run])
    table3 = [(r, row) for r, row in zip(records, reproduced.rows) if r["table"] == "3"]
    assert len(table3) == 1
    record, (_, cells) = table3[0]
    assert record["reasons"] == reasons and record["comparable"] is (not reasons)
    assert cells[4].text == ("yes" if not reasons else "no: " + "; ".join(reasons))
    assert (record["difference"], cells[2].value) == ((None, None) if reasons else (pytest.approx(2.6),) * 2)


def test_a_clinhallu_run_needs_clinhallus_scorer() -> None:
    """ClinHallu's numbers were scored by its released scripts (Acc over valid traces): a run under its protocol
    scored with this project's denominators (--no-upstream-compat) is not comparable."""
    from medheval.report.published import Published, RunConditions

    from medheval.families.clinhallu.prompts import UPSTREAM_VERSION
    from medheval.families.clinhallu.protocol import PROCEDURE

    cell = Published("clinhallu", "4", "model average", "", "VQA-RAD", "Delta^V", 15.5, 1, "%")
    run = {"procedure": PROCEDURE, "prompts": {"version": UPSTREAM_VERSION}}
    scored = {"protocol": {"name": "clinhallu"}, "settings": {"model": "m"},
              "benchmarks": {"clinhallu:vqa_rad": {"clinhallu_run": run}}}
    split = ["clinhallu:vqa_rad"]
    assert RunConditions.of({**scored, "scoring": {"upstream_compat": True}}, split).reasons(cell) == []
    assert RunConditions.of({**scored, "scoring": {"upstream_compat": False}}, split).reasons(cell) == [
        "scored with this project's rules (paper: its released scorer; --upstream-compat)"]


@pytest.mark.parametrize("run, reasons", [
    ({"prompts": {"version": "clinhallu-upstream-0123abcd-v1"}},  # procedure 1 wrote no procedure
     ["ClinHallu procedure 1 (the run predates procedure 2: every setting regenerated up to max_attempts, H^V "
      "judged on the Rep-K trace)",
      "ClinHallu prompts clinhallu-upstream-0123abcd-v1 (paper: {upstream}, --benchmark-option "
      "clinhallu.prompts=upstream; an earlier version: the run predates it)"]),
    ({"procedure": 2, "prompts": {"version": "clinhallu-own-v1"}},
     ["ClinHallu prompts clinhallu-own-v1 (paper: {upstream}, --benchmark-option clinhallu.prompts=upstream; an "
      "earlier version: the run predates it)"]),
    (None, ["the run records no ClinHallu procedure or prompts (no clinhallu_run in results.json for the split)"]),
], ids=["procedure_1", "own_prompts", "unrecorded"])
def test_a_clinhallu_cell_needs_the_current_procedure_and_clinhallus_prompts(run, reasons) -> None:
    """An old procedure-1 run under --protocol clinhallu --upstream-compat judged H^V on the ORG trace with
    the v1 prompts: its ClinHallu cells are not comparable, and the reason says the run predates the change."""
    from medheval.families.clinhallu.prompts import UPSTREAM_VERSION
    from medheval.report.published import Published, RunConditions

    cell = Published("clinhallu", "2", "m", "", "VQA-RAD", "H^V", 10.0, 1, "%")
    results = {"protocol": {"name": "clinhallu"}, "settings": {"model": "m"}, "scoring": {"upstream_compat": True},
               "benchmarks": {"clinhallu:vqa_rad": {} if run is None else {"clinhallu_run": run}}}
    assert RunConditions.of(results, ["clinhallu:vqa_rad"]).reasons(cell) == [
        reason.format(upstream=UPSTREAM_VERSION) for reason in reasons]


@pytest.mark.parametrize("model, printed, reason", [
    ("openai:gpt-4o@http://127.0.0.1:8000/v1", "GPT-4o",
     "no inference code released for GPT-4o (the protocol's text for it is inferred)"),
    ("StanfordAIMI/CheXagent-8b", "CheXagent",
     "the paper ran CheXagent through its own released script (its own prompt format and decoding), which "
     "medheval-baseline does not reproduce"),
])
def test_a_published_model_whose_inference_the_protocol_does_not_reproduce_is_never_comparable(
        model: str, printed: str, reason: str) -> None:
    """The protocols reproduce MedHEval's scripts for LLaVA-Med-1.5 and LLaVA-NeXT only. GPT-4o's Table 3 cells
    came from code not in the repository; CheXagent's from its own script there (Med-LVLMs/CheXagent: another
    template and decoding), which the protocol does not follow: a run under medheval-baseline, real weights,
    full data, upstream scoring, is listed beside them without a Δ, each with its own reason."""
    run = _run(model, protocol="medheval-baseline")
    _, records = reproduction([_close_ended(model, "none", Cell(value=70.0), Cell(value=60.0))], runs=[run])
    table3 = [r for r in records if r["table"] == "3"]
    assert table3 and all(r["model"] == printed for r in table3)
    assert all(r["reasons"] == [reason] and r["difference"] is None for r in table3)


def test_reproduction_prints_the_papers_precision() -> None:
    """Med-HallMark Table 1 prints LLaVA1.5-13b's Med-VQA ACC as 0.23 (two decimals, 0–1). A run's ACC of 0.278
    shows as 0.28 | 0.23 | +0.05 (not 0.3 | 0.2 | +0.0); MedHEval's Acc 0.494 (three decimals, 0–1) shows in
    the report's % with one: 49.4; Med-HallMark's BERTScore 62.89 (0–100) keeps two."""
    from medheval.report.paper import format_cell

    model = "llava-hf/llava-1.5-13b-hf"
    table1 = Table("med_hallmark_table1", "t", ["Model", "Mitigation", "Task", "Question types"], [Column("ACC")])
    table1.rows.append(([model, "none", "Med-VQA", "conventional + confidence_weakening"], [Cell(value=0.278)]))
    run = _run(model, splits=("med_hallmark:conventional", "med_hallmark:confidence_weakening"),
               protocol="med-hallmark")
    reproduced, _ = reproduction([table1], runs=[run])
    assert [format_cell(c) for c in reproduced.rows[0][1][:3]] == ["0.28", "0.23", "+0.05"]
    close = _close_ended("llava-hf/llava-v1.6-vicuna-7b-hf", "none", Cell(), Cell(value=52.04))
    reproduced, _ = reproduction([close], runs=[_run("llava-hf/llava-v1.6-vicuna-7b-hf",
                                                     protocol="medheval-baseline")])
    assert [format_cell(c) for c in reproduced.rows[0][1][:3]] == ["52.0", "49.4", "+2.6"]
    per_type = Table("med_hallmark", "t", ["Model", "Mitigation", "Split"], [Column("BS")])
    per_type.rows.append(([model, "none", "med_hallmark:confidence_weakening"], [Cell(value=60.0)]))
    run = _run(model, splits=("med_hallmark:confidence_weakening",), protocol="med-hallmark",
               options={"question": "plain"})
    reproduced, _ = reproduction([per_type], runs=[run])
    assert [format_cell(c) for c in reproduced.rows[0][1][:3]] == ["60.00", "62.89", "-2.89"]
    steps = Table("med_stepbench", "t", ["Model", "Mitigation", "Knowledge"], [Column("EN S2 F1")])
    steps.rows.append((["Qwen/Qwen3-VL-8B-Instruct", "none", "none"], [Cell(value=70.4)]))
    reproduced, _ = reproduction([steps])  # Med-StepBench prints 0.69 (two decimals, 0–1): 69 in the report's %
    assert [format_cell(c) for c in reproduced.rows[0][1][:2]] == ["70", "69"]


def test_irg_once_and_table2_true_subset() -> None:
    """Med-HallMark: a run's IRG figures appear in the report's Table 1 (IRG row) and per-type table
    (med_hallmark:irg); the paper prints them once (Table 1), so they are listed once. Table 2's ♣ column is
    Q_Conv^true' — the confidence-weakening questions without their prefix (run option question=plain) — not
    the conventional split: a conventional run matches neither Table 2 column; confidence_weakening as
    released matches ♠ (BERTScore 59.05 for LLaVA1.5-13b), asked plain ♣ (62.89)."""
    model = "llava-hf/llava-1.5-13b-hf"
    table1 = Table("med_hallmark_table1", "t", ["Model", "Mitigation", "Task", "Question types"], [Column("BS")])
    table1.rows.append(([model, "none", "IRG", "irg"], [Cell(value=40.0)]))
    per_type = Table("med_hallmark", "t", ["Model", "Mitigation", "Split"], [Column("BS")])
    for split in ("med_hallmark:irg", "med_hallmark:conventional", "med_hallmark:confidence_weakening"):
        per_type.rows.append(([model, "none", split], [Cell(value=40.0)]))
    splits = ("med_hallmark:irg", "med_hallmark:conventional", "med_hallmark:confidence_weakening")
    _, records = reproduction([table1, per_type], runs=[_run(model, splits=splits, protocol="med-hallmark")])
    assert [(r["table"], r["split"], r["value"], r["run_split"]) for r in records] == [
        ("1", "IRG", 47.96, "IRG"), ("2", "Confidence-weakening", 59.05, "med_hallmark:confidence_weakening")]
    plain = _run(model, splits=splits, protocol="med-hallmark", options={"question": "plain"})
    _, records = reproduction([per_type], runs=[plain])
    assert [(r["table"], r["split"], r["value"]) for r in records] == [("2", "Conventional (true')", 62.89)]


def test_stepbench_llava_7b_alias() -> None:
    """Med-StepBench's "LLaVA-7B" is the shipped config's llava-hf/llava-1.5-7b-hf (version assumed), so its
    Table 3 cells line up: EN Step 1 R 0.53 without knowledge."""
    assert paper_models("llava-hf/llava-1.5-7b-hf", "med_stepbench") == ["LLaVA-7B"]
    table = Table("med_stepbench", "t", ["Model", "Mitigation", "Knowledge"], [Column("EN S1 R")])
    table.rows.append((["llava-hf/llava-1.5-7b-hf", "none", "none"], [Cell(value=50.0)]))
    _, records = reproduction([table])
    assert [(r["model"], r["metric"], r["value"]) for r in records] == [("LLaVA-7B", "Step 1 R", 0.53)]
    assert records[0]["reasons"] == ["protocol differs (run: clean, paper: med-stepbench)"]


def test_reproduction_stepbench_knowledge_and_no_match() -> None:
    """Med-StepBench Table 3, Qwen3-VL-8B (Qwen/Qwen3-VL-8B-Instruct), EN Step 2 F1: 0.69 without knowledge,
    0.73 with ('w', matched to knowledge=both). Two runs under the med-stepbench protocol, one per knowledge
    setting, with cells of 70.0 [60.0, 80.0]: Δ = +1.0 and −3.0, both inside. An unknown model matches
    nothing, and the table says so."""
    table = Table("med_stepbench", "t", ["Model", "Mitigation", "Knowledge"], [Column("EN S2 F1")])
    runs = []
    for knowledge in ("none", "both"):
        table.rows.append((["Qwen/Qwen3-VL-8B-Instruct", "none", knowledge], [Cell(value=70.0, low=60.0, high=80.0)]))
        run = _run("Qwen/Qwen3-VL-8B-Instruct", splits=("med_stepbench:all",), protocol="med-stepbench",
                   folder=knowledge, options={"knowledge": knowledge})
        run.results["benchmarks"]["med_stepbench:all"]["metrics"] = {"stepbench": {}}
        runs.append(run)
    _, records = reproduction([table], runs=runs)
    assert [(r["setting"], round(r["difference"], 6), r["outside_interval"]) for r in records] == [
        ("w/o", 1.0, False), ("w", -3.0, False)]
    other = _close_ended("my/model", "none", Cell(value=1.0), Cell(value=2.0))
    empty, records = reproduction([other])
    assert records == [] and not empty.rows and any("No run matched" in line for line in empty.footer)


def test_report_compare_published_end_to_end(tmp_path: Path) -> None:
    """``medheval report RUN --compare-published``: a run of llava-hf/llava-v1.6-vicuna-7b-hf on mm_vishal:all
    with 24 items, 12 right (Acc 50.0%), the anatomy items (0, 4, …, 20) all wrong (Acc-A 0.0%; 0 of 6: the
    Clopper–Pearson interval [0, 1 − 0.025^(1/6)] = [0, 45.9]).
    Under the medheval-baseline protocol, against MedHEval Table 3: Acc 49.4 → Δ = +0.6, inside the interval;
    Acc-A 57.6 → Δ = −57.6, outside (flagged, listed in the footer). report.md has the Reproduction heading;
    report.json the records. The same run without a protocol (clean) is listed without Δ, saying why."""
    from report_runs import write_run

    correct = [False, True, True, True, False, True, False, True, False, True, False, False] * 2
    clean = write_run(tmp_path / "clean", "none", correct, model="llava-hf/llava-v1.6-vicuna-7b-hf")
    out = tmp_path / "clean-report"
    assert main(["report", str(clean), "--output", str(out), "--no-plots", "--no-html", "--compare-published"]) == 0
    records = json.loads((out / "report.json").read_text())["reproduction"]
    assert records and all(r["difference"] is None and not r["comparable"] for r in records)
    assert "| no: protocol differs (run: clean, paper: medheval-baseline) |" in (out / "report.md").read_text()
    run = write_run(tmp_path / "run", "none", correct, model="llava-hf/llava-v1.6-vicuna-7b-hf")
    results = json.loads((run / "results.json").read_text())
    settings = {**results["settings"], "backend": {**results["settings"].get("backend", {}),
                                                   "tokenization": "upstream_chunked"}}
    (run / "results.json").write_text(json.dumps({**results, "protocol": {"name": "medheval-baseline"},
                                                  "settings": settings,
                                                  "scoring": {**results.get("scoring", {}), "upstream_compat": True}}))
    out = tmp_path / "report"
    assert main(["report", str(run), "--output", str(out), "--no-plots", "--compare-published"]) == 0
    markdown = (out / "report.md").read_text()
    assert "## Reproduction" in markdown
    assert "MedHEval Table 3: LLaVA-NeXT 7B · Original · MM-VisHal · Acc (0.494)" in markdown
    records = json.loads((out / "report.json").read_text())["reproduction"]
    table3 = {r["metric"]: r for r in records if r["table"] == "3"}
    assert table3["Acc"]["difference"] == pytest.approx(0.6)
    assert table3["Acc"]["outside_interval"] is False
    assert table3["Acc-A"]["difference"] == pytest.approx(-57.6)
    assert table3["Acc-A"]["outside_interval"] is True
    assert "Outside the run's 95% item-resampling interval" in markdown and "Reproduction" in (out / "report.html").read_text()
    plain = tmp_path / "plain"
    assert main(["report", str(run), "--output", str(plain), "--no-plots", "--no-html"]) == 0
    assert "Reproduction" not in (plain / "report.md").read_text()
    assert "reproduction" not in json.loads((plain / "report.json").read_text())


def test_the_report_a_run_writes_can_hold_the_reproduction_table(tmp_path: Path, fixture_benchmark) -> None:
    """``medheval run --compare-published`` (and a grid's ``compare_published: true``): the report.html the run
    writes holds the Reproduction table, as ``medheval report --compare-published`` would. A matched model's row
    (MedHEval Table 3, LLaVA-NeXT 7B, Acc 0.494) shows; the tiny model matches no published cell, which the table
    says; without the flag report.html has no Reproduction table."""
    from report_runs import write_run

    from medheval.report.build import write_run_report

    run = write_run(tmp_path / "run", "none", [True, False] * 5, model="llava-hf/llava-v1.6-vicuna-7b-hf")
    results = json.loads((run / "results.json").read_text())
    assert write_run_report(run, results, compare_published=True) is None
    page = (run / "report.html").read_text()
    assert "Reproduction" in page and "LLaVA-NeXT 7B" in page and "0.494" in page
    assert write_run_report(run, results) is None
    assert "Reproduction" not in (run / "report.html").read_text()

    args = ["run", "--benchmark", "mm_vishal", "--model", "tiny-random-llava", "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "2", "--max-new-tokens", "2"]
    args += [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    assert main([*args, "--output", str(tmp_path / "tiny"), "--compare-published"]) == 0
    page = (tmp_path / "tiny" / "report.html").read_text()
    assert "Reproduction" in page and "No run matched" in page
    assert main([*args, "--output", str(tmp_path / "plain")]) == 0
    assert "Reproduction" not in (tmp_path / "plain" / "report.html").read_text()


def test_published_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``medheval published``: MedHEval Table 3's CheXagent row as printed (CXR-VisHal Acc 0.739); --json gives
    its 10 cells; a model by Hub id (StanfordAIMI/CheXagent-8b) finds the same; no match exits 2 and says so."""
    assert main(["published", "--paper", "medheval", "--table", "3", "--model", "CheXagent"]) == 0
    text = capsys.readouterr().out
    assert "MedHEval (arXiv 2503.02157), Table 3 — CXR-VisHal" in text
    assert re.search(r"CheXagent\s+Original\s+0\.782\s+0\.576\s+0\.739\s+0\.851\s+0\.739", text)
    assert main(["published", "--paper", "medheval", "--table", "3", "--model", "StanfordAIMI/CheXagent-8b",
                 "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == 10 and {c["model"] for c in cells} == {"CheXagent"}
    assert main(["published", "--model", "no-such-model"]) == 2
    assert "no published value matches --model no-such-model" in capsys.readouterr().err


@pytest.mark.parametrize("line, says", [
    ('{"paper": "x", "table": "1", "model": "m", "split": "s", "metric": "a", "setting": "", "value": 1, '
     '"decimals": 0, "unit": "0-1"}', "unknown paper 'x'"),
    ('{"paper": "medheval", "table": "1", "model": "m", "split": "s", "metric": "a", "setting": "", "value": "1", '
     '"decimals": 0, "unit": "0-1"}', "field 'value' must be a number"),
    ('{"paper": "medheval", "table": "1", "model": "m", "split": "s", "metric": "a", "setting": "", "value": 1, '
     '"decimals": 0, "unit": "%"}', "unit '%' is not one of"),
    ('{"paper": "medheval", "table": 3}', "field 'table' must be a string"),
    ("not json", "not JSON"),
])
def test_bad_published_file_names_line_and_field(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "published.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(says)):
        load_published(path)


def test_med_hallmark_table1_rows_match_the_papers_tasks():
    """Med-HallMark Table 1 (arXiv 2406.10185): the report's Table 1 rows name the paper's task. The Med-VQA
    row (conventional + confidence-weakening pooled) matches the published Med-VQA cells, ACC included; the
    IRG row matches the IRG cells and has no ACC (the paper prints none for IRG)."""
    from medheval.report.paper import Column, Table
    from medheval.report.published import load_published, matches

    table = Table("med_hallmark_table1", "Table 1", ["Model", "Mitigation", "Task", "Pooled"],
                  [Column("BS"), Column("ACC"), Column("MediHall Score")])
    records = load_published()
    vqa = ["llava-hf/llava-1.5-7b-hf", "none", "Med-VQA", "conventional + confidence_weakening"]
    irg = ["llava-hf/llava-1.5-7b-hf", "none", "IRG", "irg"]
    for labels, column, metric in ((vqa, "BS", "BERTScore"), (vqa, "ACC", "Acc"), (vqa, "MediHall Score",
                                   "MediHall Score"), (irg, "BS", "BERTScore"), (irg, "MediHall Score",
                                                                                 "MediHall Score")):
        found = matches(table, labels, column, records)
        assert [(r.model, r.split, r.metric) for r, _ in found] == [("LLaVA1.5-7b", labels[2], metric)], column
        assert found[0][1] == found[0][0].value  # shown in the paper's units (0-100 text metrics, 0-1 scores)
    assert matches(table, irg, "ACC", records) == []
    assert matches(table, [*vqa[:1], "vcd", *vqa[2:]], "BS", records) == []  # Med-HallMark rows are unmitigated


@pytest.mark.parametrize("backend, reasons", [
    ({"grey_padding": True, "tokenization": "upstream_chunked"}, []),
    ({"tokenization": "upstream_chunked"},
     ["images not padded as the released code pads them (a grayscale image on a grey square: the run predates "
      "it, or its processor does not pad to a square)"]),
    ({"grey_padding": True}, ["prompt tokenized whole, not piece by piece around the image as the released code "
                              "does (the run predates it)"]),
])
def test_llava_med_cells_need_the_released_codes_image_canvas(backend: dict, reasons: list[str]) -> None:
    """LLaVA-Med-1.5's released process_images puts a grayscale image on a grey-114 square
    (medheval.backends.grey_padding), which its run records as ``settings.backend.grey_padding``: a run under
    medheval-baseline that records it stands beside MedHEval Table 3's LLaVA-Med-1.5 cells with a Δ; one without it
    (made before the canvas, or through a processor that crops instead of padding) is listed without one.
    LLaVA-NeXT's tiles have no such canvas, so its cells never ask for it (the tests above)."""
    model = "microsoft/llava-med-v1.5-mistral-7b"
    run = _run(model, protocol="medheval-baseline")
    run.results["settings"]["backend"] = backend
    _, records = reproduction([_close_ended(model, "none", Cell(value=70.0), Cell(value=60.0))], runs=[run])
    table3 = [r for r in records if r["table"] == "3"]
    assert table3 and all(r["model"] == "LLaVA-Med-1.5" for r in table3)
    assert all(r["reasons"] == reasons and (r["difference"] is None) == bool(reasons) for r in table3)


def _report_table(model: str, split: str) -> Table:
    table = Table("medheval_report", "t", ["Model", "Mitigation", "Split"], [Column("CHAIR ↓"), Column("n", ranked=False)])
    table.rows.append(([model, "none", split], [Cell(value=20.0), Cell(text="10")]))
    return table


FORMULA = ("CHAIR formula differs (run: chair.variant={}; paper: its released code, Σ(FP + FN) / #(labelled 0 or 1), "
           "chair.variant=medheval_code)")
RULES = ("CHAIR and Recall labelled by chexpert_rules (paper: CheXbert; --metric-option chair.labeler=chexbert)")
UNCLEANED = ("report predictions not cleaned before labelling as the released scorer cleans them ('Assistant:' "
             "character strip, reports under 10 characters replaced; the run predates it, or "
             "chair.upstream_compat=false)")


@pytest.mark.parametrize("chair, chair_reasons, recall_reasons", [
    ({}, [], []),  # as the protocol scores it, with CheXbert: comparable
    ({"variant": "paper", "uncertain_as_positive": False}, [FORMULA.format("paper")], []),
    ({"variant": "paper", "uncertain_as_positive": True}, [FORMULA.format("paper")],
     ["Recall counts uncertain labels as positive (chair.uncertain_as_positive; paper: its released code drops a "
      "reference's uncertain cells)"]),
    ({"labeler": "chexpert_rules"}, [RULES], [RULES]),
    ({"upstream_compat": False}, [UNCLEANED], [UNCLEANED]),
    # a protocol run scored before the protocols set chair's variant and cleaning (rule labeler, the default)
    ({"labeler": "chexpert_rules", "variant": "paper", "upstream_compat": None},
     [RULES, FORMULA.format("paper"), UNCLEANED], [RULES, UNCLEANED]),
])
def test_chair_cells_are_comparable_only_when_scored_as_the_released_chair_code(chair, chair_reasons, recall_reasons):
    """MedHEval Table 5's LLaVA-NeXT 7B CHAIR and Recall came from run_chair.py: CheXbert labels of cleaned
    predictions, CHAIR = Σ(FP + FN) / #(labelled 0 or 1). A medheval-baseline run's cells are comparable only when
    its chair output (results.json) records that labeler, variant and cleaning; the paper variant's CHAIR is another
    formula (its Recall is the same unless uncertain labels count as positive)."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    run = _run(model, splits=("vishal_report:default",), protocol="medheval-baseline")
    out = run.results["benchmarks"]["vishal_report:default"]["metrics"]["chair"]
    out.update(chair)
    for key in [key for key, value in chair.items() if value is None]:
        del out[key]  # not recorded
    table = Table("medheval_report", "t", ["Model", "Mitigation", "Split"], [Column("Recall"), Column("CHAIR ↓")])
    table.rows.append(([model, "none", "vishal_report:default"], [Cell(value=50.0), Cell(value=20.0)]))
    _, records = reproduction([table], runs=[run])
    got = {r["metric"]: r["reasons"] for r in records if r["table"] == "5"}
    assert got == {"CHAIR": chair_reasons, "Recall": recall_reasons}
    assert all(r["comparable"] is (not r["reasons"]) and (r["difference"] is None) == bool(r["reasons"])
               for r in records if r["table"] == "5")


@pytest.mark.parametrize("split, extra", [
    ("vishal_report:default", []),
    ("vishal_report:ba4586e", ["annotation revision differs (run: upstream ba4586e, 500 items, earlier instruction; "
                               "paper: the released 490-item file, vishal_report:default)"]),
])
def test_report_rows_on_the_earlier_report_file_are_matched_and_flagged(split: str, extra: list[str]) -> None:
    """MedHEval Table 5 prints LLaVA-NeXT 7B's report CHAIR (baseline). A run of vishal_report:default under
    medheval-baseline is comparable; the same run on vishal_report:ba4586e (the 500-item file before upstream
    42e36fc) is listed beside the same published cell, with the revision as its reason and no Δ."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    run = _run(model, splits=(split,), protocol="medheval-baseline")
    _, records = reproduction([_report_table(model, split)], runs=[run])
    table5 = [r for r in records if r["table"] == "5"]
    assert len(table5) == 1 and table5[0]["metric"] == "CHAIR" and table5[0]["run_split"] == split
    assert table5[0]["reasons"] == extra and table5[0]["comparable"] is (not extra)


def test_the_flag_allows_for_the_papers_rounding() -> None:
    """Table 3 prints LLaVA-NeXT 7B's MM-VisHal Acc as 0.494 (3 decimals): 49.4 in the report's %, i.e. any value
    in [49.35, 49.45]. A run interval [49.42, 56.0] holds 49.44, which prints as 0.494, so the paper is not
    shown to lie outside it (it was flagged: 49.4 < 49.42); [49.46, 56.0] holds none of them: flagged. Acc-A
    (0.576 → [57.55, 57.65]) against [45.0, 57.56]: not flagged; against [45.0, 57.54]: flagged."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    run = _run(model, protocol="medheval-baseline")
    for acc_a_high, acc_low, expected in ((57.56, 49.42, (False, False)), (57.54, 49.46, (True, True))):
        table = _close_ended(model, "none", Cell(value=50.0, low=45.0, high=acc_a_high),
                             Cell(value=52.0, low=acc_low, high=56.0))
        _, records = reproduction([table], runs=[run])
        got = {r["metric"]: r["outside_interval"] for r in records if r["table"] == "3"}
        assert (got["Acc-A"], got["Acc"]) == expected

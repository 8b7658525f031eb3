"""Paired comparisons across seeds and with items left out: a pass of ``--seeds`` is its own row (tables,
records, heatmap), a blind pass is paired with the with-image pass of its seed, and items a pairing drops are
counted in the record and named in the footer (medheval.report.paper.comparisons / image_deltas)."""

import json
import math

import pytest

from medheval.report.collect import find_runs
from medheval.report.paper import UNPAIRED_KEYS, build_tables, comparisons, image_deltas, to_markdown
from medheval.report.plots import delta_rows, deltas_figure, text_boxes
from report_runs import write_clinhallu_run, write_run
from clinhallu_fixture import HAND_TABLE

BASE = [True, False] * 10  # 10 of 20 right


def _seeded(folder, mitigation, correct, seed, control="none"):
    """``write_run`` with ``settings.seed`` (a pass of ``--seeds``) and, for a blind pass, ``settings.control``."""
    run = write_run(folder, mitigation, correct)
    results = json.loads((run / "results.json").read_text())
    results["settings"].update(seed=seed, **({"control": control} if control != "none" else {}))
    (run / "results.json").write_text(json.dumps(results))
    return run


def _fix(k):
    """BASE with its first k wrong items made right: k fixes, no breaks (Δ = 5k points over 20 items)."""
    return [ok or (i % 2 == 1 and i // 2 < k) for i, ok in enumerate(BASE)]


def _break(k):
    """BASE with its first k right items made wrong (Δ = −5k points)."""
    return [ok and not (i % 2 == 0 and i // 2 < k) for i, ok in enumerate(BASE)]


@pytest.fixture
def two_seeds(tmp_path):
    """One folder holding both passes (as `--seeds 1,2` writes them): seed 1's vcd fixes 5 items (+25.0),
    seed 2's breaks 2 (−10.0)."""
    grid = tmp_path / "grid"
    for seed, vcd in ((1, _fix(5)), (2, _break(2))):
        _seeded(grid / f"none__seed-{seed}", "none", BASE, seed)
        _seeded(grid / f"vcd__seed-{seed}", "vcd", vcd, seed)
    return find_runs([grid])


def test_two_seeds_are_two_rows_with_their_own_delta(two_seeds):
    table, records = comparisons(two_seeds)
    assert [labels[:2] for labels, _ in table.rows] == [["m", "vcd · seed 1"], ["m", "vcd · seed 2"]]
    assert [(r["mitigation"], r["seed"], r["diff"]) for r in records] == [("vcd", 1, pytest.approx(25.0)),
                                                                          ("vcd", 2, pytest.approx(-10.0))]
    assert [r["baseline"] for r in records] == [50.0, 50.0]  # each against the none pass of its seed
    assert all(r["run"].endswith(f"vcd__seed-{r['seed']}") for r in records)


def test_the_heatmap_has_a_row_per_seed(two_seeds):
    _, records = comparisons(two_seeds)
    rows, labels = delta_rows(records)
    assert labels == ["vcd · seed 1", "vcd · seed 2"] and len(rows) == 2
    texts = [text for text, _ in text_boxes(deltas_figure(records))]
    assert {"vcd · seed 1", "vcd · seed 2"} <= set(texts)
    cells = sorted(text.split("\n")[0].rstrip("*") for text in texts if text.startswith(("+", "-")))
    assert cells == ["+25.0", "-10.0"]  # both seeds drawn: none overwrote the other


def test_heatmap_rows_still_alike_get_their_folder():
    record = {"model": "m", "mitigation": "vcd", "split": "s", "metric": "Acc", "diff": 1.0, "low": None,
              "high": None, "p_value": 0.5}
    _, labels = delta_rows([{**record, "run": "/x/grid-a/vcd"}, {**record, "run": "/x/grid-b/vcd"}])
    assert labels == ["vcd (/x/grid-a/vcd)", "vcd (/x/grid-b/vcd)"]  # folder names alike: their paths
    _, labels = delta_rows([{**record, "run": "/x/a"}, {**record, "run": "/x/b"}])
    assert labels == ["vcd (a)", "vcd (b)"]
    _, labels = delta_rows([record])  # a record without seed or run (written by hand, or before them)
    assert labels == ["vcd"]


def test_a_blind_pass_is_paired_with_the_with_image_pass_of_its_seed(tmp_path):
    """Seed 1 with image: 15 of 20 right, seed 2: 8; blind seed 1: 10, blind seed 2: 10. Δ image is 15 − 10 =
    +25 points for seed 1 and 8 − 10 = −10 for seed 2; pairing both blind passes with seed 1 would give +25
    twice."""
    out = tmp_path / "out"
    for seed, sighted in ((1, _fix(5)), (2, _break(2))):
        _seeded(out / f"none__seed-{seed}", "none", sighted, seed)
        _seeded(out / f"none__no_image__seed-{seed}", "none", BASE, seed, control="no_image")
    table, records = image_deltas(find_runs([out]))
    got = sorted((r["seed"], r["blind_seed"], r["with_image"], r["blind"], r["diff"]) for r in records)
    assert got == [(1, 1, 75.0, 50.0, pytest.approx(25.0)), (2, 2, 40.0, 50.0, pytest.approx(-10.0))]
    assert sorted(labels[1:3] for labels, _ in table.rows) == [["none · seed 1", "no_image"],
                                                               ["none · seed 2", "no_image"]]
    # a blind pass of a seed no with-image pass has: paired with another seed, and the row says which
    _seeded(out / "none__no_image__seed-3", "none", BASE, 3, control="no_image")
    table, records = image_deltas(find_runs([out]))
    (odd,) = [r for r in records if r["blind_seed"] == 3]
    assert odd["seed"] in (1, 2)
    assert [labels[2] for labels, _ in table.rows if labels[2] != "no_image"] == ["no_image · seed 3"]


def test_unpaired_items_are_counted_and_named(tmp_path):
    """none scored items 0–39; vcd scored 0–24 and 40–44, with item 0 unscored (None), item 1 NaN and item 2
    without its per-item value: 15 only in none (25–39), 5 only in vcd (40–44), 3 unscored, 22 paired. pai
    scored the same 40 items as none: nothing left out, no footer line."""
    grid = tmp_path / "grid"
    write_run(grid / "none", "none", BASE * 2)
    write_run(grid / "pai", "pai", _fix(3) * 2)
    vcd = write_run(grid / "vcd", "vcd", (_fix(5) * 3)[:45])
    rows = [json.loads(line) for line in (vcd / "scored.jsonl").read_text().splitlines()]
    rows = [row for row in rows if not 25 <= int(row["id"].rsplit("/", 1)[1]) <= 39]
    rows[0]["correct"], rows[1]["correct"] = None, math.nan
    del rows[2]["correct"]
    (vcd / "scored.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    table, records = comparisons(find_runs([grid]))
    counts = {r["mitigation"]: (r["n"], *(r[key] for key in UNPAIRED_KEYS)) for r in records}
    assert counts == {"vcd": (22, 15, 5, 3), "pai": (40, 0, 0, 0)}
    unpaired = [line for line in table.footer if line.startswith("Unpaired")]
    assert unpaired == ["Unpaired, m · vcd · mm_vishal:all · Acc: n = 22 paired; left out 15 only in none, 5 only "
                        "in the mitigation run, 3 in both but unscored in one or both (no per-item value)."]
    tables = {t.key: t for t in build_tables(find_runs([grid]))}
    assert unpaired[0] in to_markdown(tables["mitigation_vs_none"])


def test_unpaired_blind_items_say_which_run(tmp_path):
    out = tmp_path / "out"
    write_run(out / "none", "none", BASE)
    blind = write_run(out / "none__no_image", "none", BASE[:14])
    results = json.loads((blind / "results.json").read_text())
    results["settings"]["control"] = "no_image"
    (blind / "results.json").write_text(json.dumps(results))
    table, (record,) = image_deltas(find_runs([out]))
    assert (record["n"], record["n_only_blind"], record["n_only_with_image"], record["n_unscored"]) == (14, 0, 6, 0)
    assert "n_only_baseline" not in record
    assert [line for line in table.footer if line.startswith("Unpaired")] == [
        "Unpaired, m · none · no_image · mm_vishal:all · Acc: n = 14 paired; left out 6 only in the run with its "
        "image."]


def test_clinhallu_org_pairing_counts_what_it_leaves_out(tmp_path):
    """none: the six hand-worked items (ORG 1, 0, None, 1, 0, 0); vcd (upstream_compat: valid answers only)
    answered the first five. Item 5 is only in none; item 2 is unscored in none (no valid ORG answer): 4 paired."""
    write_clinhallu_run(tmp_path / "grid" / "none", HAND_TABLE)
    write_clinhallu_run(tmp_path / "grid" / "vcd", [(row[0], 1, *row[2:]) for row in HAND_TABLE[:5]],
                        mitigation="vcd", upstream_compat=True)
    table, (record,) = comparisons(find_runs([tmp_path / "grid"]))
    assert (record["metric"], record["n"], *(record[key] for key in UNPAIRED_KEYS)) == ("Acc (ORG)", 4, 1, 0, 1)
    assert record["baseline"] == pytest.approx(50.0) and record["value"] == 100.0  # none's 1, 0, 1, 0 of items 0, 1, 3, 4
    assert any(line.startswith("Unpaired, m · vcd · clinhallu:all · Acc (ORG): n = 4 paired; left out 1 only in "
                               "none, 1 in both but unscored") for line in table.footer)


def _rewrite(run, change):
    """``run``'s scored.jsonl with ``change`` applied to each row."""
    rows = [json.loads(line) for line in (run / "scored.jsonl").read_text().splitlines()]
    for row in rows:
        change(row)
    (run / "scored.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_comparison_that_pairs_no_item_is_said_not_dropped(tmp_path):
    """none scored items 0–19; vcd scored 20 other ids (e.g. a resume limited to other items): no id in both,
    so no Δ can be computed, and the comparison used to vanish with no row, record or footer line. It is now a
    footer line counting what was left out (20 only in none, 20 only in vcd); pai's values are all None: 20 in
    both but unscored."""
    grid = tmp_path / "grid"
    write_run(grid / "none", "none", BASE)
    _rewrite(write_run(grid / "vcd", "vcd", _fix(3)), lambda row: row.update(id=row["id"] + "-other"))
    table, records = comparisons(find_runs([grid]))
    assert records == [] and table is not None and table.rows == []
    assert [line for line in table.footer if line.startswith("Not compared")] == [
        "Not compared, m · vcd · mm_vishal:all · Acc: no item paired (n = 0); 20 only in none, 20 only in the "
        "mitigation run, 0 in both but unscored in one or both (no per-item value)."]
    _rewrite(write_run(grid / "pai", "pai", _fix(3)), lambda row: row.update(correct=None))
    table, records = comparisons(find_runs([grid]))
    assert any(line.startswith("Not compared, m · pai · mm_vishal:all · Acc: no item paired (n = 0); 0 only in none, "
                               "0 only in the mitigation run, 20 in both but unscored") for line in table.footer)
    tables = {t.key: t for t in build_tables(find_runs([grid]))}
    assert "Not compared, m · vcd" in to_markdown(tables["mitigation_vs_none"])


def test_a_blind_run_that_pairs_no_item_is_said_not_dropped(tmp_path):
    out = tmp_path / "out"
    write_run(out / "none", "none", BASE)
    blind = write_run(out / "none__no_image", "none", BASE)
    results = json.loads((blind / "results.json").read_text())
    results["settings"]["control"] = "no_image"
    (blind / "results.json").write_text(json.dumps(results))
    _rewrite(blind, lambda row: row.update(id=row["id"] + "-other"))
    table, records = image_deltas(find_runs([out]))
    assert records == [] and table is not None
    assert [line for line in table.footer if line.startswith("Not compared")] == [
        "Not compared, m · none · no_image · mm_vishal:all · Acc: no item paired (n = 0); 20 only in the blind run, "
        "20 only in the run with its image, 0 in both but unscored in one or both (no per-item value)."]

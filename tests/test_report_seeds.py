"""The over-seeds table (medheval.report.seeds) on hand-made figures and hand-made run results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from medheval.report.collect import Run
from medheval.report.paper import Cell, Column, Table, build_tables, to_markdown
from medheval.report.seeds import over_seeds
from medheval.report.tables import variant


def _table(rows):
    table = Table("medheval_close_ended", "Close-ended (%)", ["Model", "Mitigation", "Split"], [Column("Acc"), Column("n")])
    table.rows = [(labels, cells) for labels, cells in rows]
    return table


def test_mean_sd_range_and_item_half_width_by_hand():
    rows = [
        (["m", "none · seed 0", "s"], [Cell(70.0, 65.0, 75.0), Cell(text="10")]),
        (["m", "none · seed 1", "s"], [Cell(72.0, 66.0, 78.0), Cell(text="10")]),
        (["m", "none · seed 2", "s"], [Cell(77.0, 70.0, 84.0), Cell(text="10")]),
        (["m", "vcd · seed 0", "s"], [Cell(50.0, 40.0, 60.0), Cell(text="10")]),  # one seed only: no spread
        (["m", "pai", "s"], [Cell(60.0, 50.0, 70.0), Cell(text="10")]),  # unseeded: not in the table
    ]
    table = over_seeds([_table(rows)])
    assert table is not None and len(table.rows) == 1  # the text column "n" has no figure to average
    labels, (seeds, mean, spread, items) = table.rows[0]
    assert labels == ["Close-ended (%)", "m · none · s", "Acc"]
    assert seeds.text == "3 (0, 1, 2)" and seeds.n == 3
    assert mean.value == pytest.approx(73.0)  # (70 + 72 + 77) / 3
    assert mean.std == pytest.approx(math.sqrt((9 + 1 + 16) / 2))  # sample SD: sqrt(13) = 3.61
    assert (spread.low, spread.high, spread.text) == (70.0, 77.0, "70.0–77.0")
    assert items.value == pytest.approx(6.0) and items.text == "± 6.0"  # half-widths 5, 6, 7
    text = to_markdown(table)
    assert "| 73.00 ± 3.61 | 70.0–77.0 | ± 6.0 |" in text and "sample, n − 1" in text


def test_missing_intervals_and_no_seeded_rows():
    rows = [(["m", "none · seed 3", "s"], [Cell(10.0), Cell(text="4")]),
            (["m", "none · seed 4", "s"], [Cell(20.0), Cell(text="4")])]
    (labels, cells), = over_seeds([_table(rows)]).rows
    assert cells[0].text == "2 (3, 4)" and cells[1].value == 15.0 and cells[3].text == "–"
    assert over_seeds([_table([(["m", "none", "s"], [Cell(1.0), Cell(text="1")])])]) is None


def _results(seed, accuracy):
    settings = {"model": "m", "mitigation": "none", "seed": seed} if seed is not None else {"model": "m",
                                                                                        "mitigation": "none"}
    return {"settings": settings, "benchmarks": {"context:default": {"metrics": {
        "close_ended_accuracy": {"accuracy": accuracy, "n": 4}}}}}


def test_seeded_runs_are_rows_of_their_own_and_averaged(tmp_path):
    runs = [Run(path=Path(tmp_path / f"none__seed-{s}"), results=_results(s, a)) for s, a in ((0, 0.5), (1, 0.75))]
    assert [run.variant for run in runs] == ["none · seed 0", "none · seed 1"]
    assert variant(runs[1].results["settings"]) == "none · seed 1"
    assert Run(path=tmp_path, results=_results(None, 0.5)).variant == "none"  # without seeds: unchanged
    tables = build_tables(runs)
    close = next(t for t in tables if t.key == "medheval_close_ended")
    assert [labels[1] for labels, _ in close.rows] == ["none · seed 0", "none · seed 1"]  # no folder suffix
    (labels, cells), = over_seeds(tables).rows
    assert labels[1] == "m · none · context:default"
    assert cells[1].value == pytest.approx(62.5) and cells[1].std == pytest.approx(math.sqrt(2) * 12.5)


def test_a_seeded_mitigation_pass_is_compared_with_the_baseline_of_its_seed(tmp_path):
    from medheval.report.paper import _baseline

    def run(mitigation, seed):
        results = _results(seed, 0.5)
        results["settings"]["mitigation"] = mitigation
        return Run(path=tmp_path / f"{mitigation}__seed-{seed}", results=results)

    baselines = [run("none", 0), run("none", 1)]
    assert _baseline(run("vcd", 1), baselines) is baselines[1]
    assert _baseline(run("vcd", 0), baselines) is baselines[0]
    assert _baseline(run("vcd", 7), baselines) is baselines[0]  # no pass of that seed: the grid's first


def test_the_note_names_each_interval_the_half_width_comes_from(tmp_path):
    """A seeded grid's over-seeds table holds the mitigation − none Δ rows too (their interval: the sign-flip
    test inverted, not a bootstrap), and its note says which interval each kind of row uses."""
    import json

    from medheval.report.collect import find_runs
    from medheval.report.seeds import NOTE
    from report_runs import write_run

    for seed in (1, 2):
        for mitigation, correct in (("none", [True, False] * 10), ("vcd", [True] * 12 + [False] * 8)):
            run = write_run(tmp_path / "grid" / f"{mitigation}__seed-{seed}", mitigation, correct)
            results = json.loads((run / "results.json").read_text())
            results["settings"]["seed"] = seed
            (run / "results.json").write_text(json.dumps(results))
    table = over_seeds(build_tables(find_runs([tmp_path / "grid"])))
    delta = [cells for labels, cells in table.rows if labels[0].startswith("Mitigation − none") and labels[2] == "Δ"]
    assert len(delta) == 1 and delta[0][1].value == pytest.approx(10.0)  # 60% − 50% in both seeds
    assert "bootstrap interval over items, averaged" not in NOTE  # the old wording, true of figures only
    assert "for a paired Δ (mitigation − none, with image − blind) the sign-flip test inverted" in NOTE
    assert "for a figure its bootstrap interval (for a 0/1 figure widened" in NOTE and "Tango" in NOTE and NOTE in table.footer


def test_the_seeds_named_are_those_with_a_figure():
    """Seeds 1, 2, 3 ran; seed 2 has no F1 (a "–" cell): the F1 row is over 2 seeds, and names 1 and 3, not
    "2 (1, 2, 3)". Its mean is (1.234 + 1.266)/2 = 1.25 and its SD sqrt(2·0.016²/1) = 0.0226."""
    rows = [(["m", "vcd · seed 1", "s"], [Cell(50.0), Cell(1.234)]),
            (["m", "vcd · seed 2", "s"], [Cell(54.0), Cell()]),
            (["m", "vcd · seed 3", "s"], [Cell(52.0), Cell(1.266)])]
    source = Table("medheval_report", "Report (%)", ["Model", "Mitigation", "Split"], [Column("Acc"), Column("F1")])
    source.rows = rows
    table = over_seeds([source])
    by_column = {labels[2]: cells for labels, cells in table.rows}
    assert by_column["Acc"][0].text == "3 (1, 2, 3)"
    assert by_column["F1"][0].text == "2 (1, 3)" and by_column["F1"][0].n == 2
    assert by_column["F1"][1].value == pytest.approx(1.25) and by_column["F1"][1].std == pytest.approx(0.016 * 2 ** 0.5)


def test_a_raw_scale_figure_keeps_its_decimals_over_seeds():
    """A RadCliQ-like figure shown with two decimals (digits=2): min–max and the item half-width keep two, the mean
    beside its SD three (the SD keeps the tables' two). With one decimal, "1.2–1.3" hid the spread of 1.25 ± 0.02."""
    rows = [(["m", "vcd · seed 1", "s"], [Cell(1.234, 1.134, 1.334, digits=2)]),
            (["m", "vcd · seed 2", "s"], [Cell(1.266, 1.186, 1.346, digits=2)])]
    source = Table("medheval_report", "Report", ["Model", "Mitigation", "Split"], [Column("RadCliQ")])
    source.rows = rows
    (_, (seeds, mean, spread, items)), = over_seeds([source]).rows
    assert spread.text == "1.23–1.27" and items.text == "± 0.09"  # half-widths 0.10 and 0.08
    assert mean.digits == 3 and "| 1.250 ± 0.02 | 1.23–1.27 | ± 0.09 |" in to_markdown(over_seeds([source]))

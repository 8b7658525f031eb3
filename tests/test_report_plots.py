"""Report figures: valid PNG files, at least the minimum size and growing with their rows, one per kind of
data present."""

import json
import struct

import pytest

from medheval.report.collect import find_runs
from medheval.report.plots import DPI, SIZE, agreement_plot, write_plots
from report_runs import write_grid

WIDTH, HEIGHT = int(SIZE[0] * DPI), int(SIZE[1] * DPI)


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    assert data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def runs(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": [True, False] * 10, "vcd": [True, True, False, True] * 5})
    results = json.loads((grid / "none" / "results.json").read_text())
    results["benchmarks"]["med_hallmark:conventional"] = {"metrics": {
        "medihall_score": {"medihall_score": 0.6, "level_distribution": {"catastrophic": 2, "minor": 1, "correct": 5}},
        "medihall_detection": {"confusion": {"levels": ["correct", "minor"], "rows": [[4, 1], [2, 3]]}}}}
    results["benchmarks"]["clinhallu:test"] = {"metrics": {"clinhallu": {
        "acc": 0.6, "h_v": 0.3, "h_k": 0.1, "h_r": 0.05, "counts": {"n": 20},
        "fix_rate": {"rep_v": 0.5, "rep_k": 0.2, "rep_vk": 0.6}, "break_rate": {"rep_v": 0.1, "rep_k": 0.0, "rep_vk": 0.2}}}}
    (grid / "none" / "results.json").write_text(json.dumps(results))
    return find_runs([grid])


def test_every_figure_is_a_png_of_at_least_the_minimum_size(runs, tmp_path):
    """Saved with their tight bounding box: the minimum SIZE less its empty margins (a confusion matrix, square,
    loses them at the sides), so the height stays; the deltas heatmap is sized by its cells instead
    (tests/test_report_figures.py)."""
    made = write_plots(runs, tmp_path / "plots")
    assert set(made) == {"category_accuracy", "mitigation_deltas", "medihall_levels", "clinhallu", "agreement_4"}
    for name, path in made.items():
        width, height = png_size(path)
        if name == "mitigation_deltas":
            continue
        assert height >= 0.9 * HEIGHT and width >= (0.6 if name.startswith("agreement") else 0.9) * WIDTH


def test_a_figure_with_more_rows_is_taller(runs, tmp_path):
    """MediHall levels: one bar row per run · split; 20 rows need more than the minimum height
    (ROW_INCHES each), one row does not."""
    from medheval.report.plots import ROW_INCHES, medihall_levels

    one = png_size(medihall_levels(runs, tmp_path / "one.png"))
    many = runs * 20
    tall = png_size(medihall_levels(many, tmp_path / "tall.png"))
    assert one[1] < 1.1 * HEIGHT and tall[1] >= 20 * ROW_INCHES * DPI > one[1]


def test_no_data_no_figure(tmp_path):
    grid = write_grid(tmp_path / "g", {"none": [True, False]}, new_fields=False)
    made = write_plots(find_runs([grid]), tmp_path / "plots")
    assert "mitigation_deltas" not in made and "medihall_levels" not in made and "clinhallu" not in made


def test_agreement_scatter_of_numeric_ratings(tmp_path):
    path = agreement_plot(tmp_path / "a.png", judge=[1, 2, 3, 4, 5], human=[1, 2, 3, 5, 4])
    assert png_size(path)[0] >= 0.9 * WIDTH
    with pytest.raises(ValueError, match="confusion matrix, or judge and human"):
        agreement_plot(tmp_path / "b.png")


def _category_runs(tmp_path):
    """none: 28 items (7 per type, every type with an interval), its Acc-S dropped from results.json (no
    figure); vcd: 20 items (5 per type, each type with right and wrong answers: too few for an interval)."""
    from report_runs import write_run

    none = write_run(tmp_path / "grid" / "none", "none", [i % 3 != 0 for i in range(28)])
    results = json.loads((none / "results.json").read_text())
    del results["benchmarks"]["mm_vishal:all"]["metrics"]["close_ended_accuracy"]["accuracy_by_category"]["symptom"]
    (none / "results.json").write_text(json.dumps(results))
    write_run(tmp_path / "grid" / "vcd", "vcd", [i % 3 != 0 for i in range(20)])
    return find_runs([tmp_path / "grid"])


def test_category_bars_skip_missing_figures_and_mark_no_interval(tmp_path):
    from medheval.report.plots import NO_INTERVAL, bar_note, category_series

    (split, series), = category_series(_category_runs(tmp_path))
    assert split == "mm_vishal:all" and [label for label, _ in series] == ["m · none", "m · vcd"]
    none, vcd = (bars for _, bars in series)
    assert none.x == [0, 1, 3] and none.missing == [2]  # Acc-S: no bar, not a 0
    assert none.no_interval == [] and all(b is not None and b >= 0 for b in none.below + none.above)
    assert vcd.x == pytest.approx([0.4, 1.4, 2.4, 3.4]) and vcd.missing == []
    assert vcd.no_interval == vcd.x and vcd.below == [None] * 4  # no error bar of length 0
    # vcd: items 0, 3, 6, ... wrong (i % 3 == 0), over the types in turn (i % 4): 2, 1, 2 and 2 of each 5 wrong
    assert vcd.heights == pytest.approx([60.0, 80.0, 60.0, 60.0])
    assert bar_note([none, vcd]) == f"{NO_INTERVAL}: no interval (4 bar(s); the table's † says why); no figure, no bar: 1"
    assert bar_note([none]) == "no figure, no bar: 1" and bar_note([]) == ""


def test_category_figure_draws_what_the_series_say(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer, ErrorbarContainer
    from medheval.report.plots import NO_INTERVAL, category_figure

    fig = category_figure(_category_runs(tmp_path))
    ax = fig.axes[0]
    drawn = [len(c) for c in ax.containers if isinstance(c, BarContainer)]
    assert drawn == [3, 4]  # none's Acc-S is not drawn
    (errors,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]  # none's three bars only
    assert len(errors.lines[2][0].get_segments()) == 3
    assert sorted(t.get_text() for t in ax.texts) == ["n/i"] * 4 + ["–"]  # "–": none's Acc-S, at its place
    (dash,) = [t for t in ax.texts if t.get_text() == "–"]
    assert dash.get_position()[0] == 2 and NO_INTERVAL == "n/i"
    assert ax.get_xlabel().replace("\n", " ").startswith(f"{NO_INTERVAL}: no interval (4 bar(s)")
    plt.close(fig)


def test_clinhallu_figure_leaves_missing_rates_out(tmp_path):
    import matplotlib.pyplot as plt
    from medheval.report.plots import clinhallu_figure

    grid = write_grid(tmp_path / "grid", {"none": [True, False] * 10})
    results = json.loads((grid / "none" / "results.json").read_text())
    results["benchmarks"]["clinhallu:test"] = {"metrics": {"clinhallu": {
        "acc": 0.6, "h_v": 0.3, "h_k": None, "h_r": 0.05, "counts": {"n": 20},
        "fix_rate": {"rep_v": 0.5, "rep_k": 0.2, "rep_vk": 0.6}, "break_rate": {"rep_v": 0.1, "rep_vk": 0.2}}}}
    (grid / "none" / "results.json").write_text(json.dumps(results))
    fig = clinhallu_figure(find_runs([grid]))
    left, right = fig.axes
    assert sorted(round(p.get_height(), 6) for p in left.patches) == [5.0, 30.0, 60.0]  # H^K: no bar
    assert sorted(round(p.get_height(), 6) for p in right.patches) == [-20.0, -10.0, 20.0, 50.0, 60.0]
    assert left.get_xlabel().endswith("no figure, no bar: 2")
    plt.close(fig)

"""Report figures: valid PNG files of the fixed pixel size, one per kind of data present."""

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


def test_every_figure_is_a_png_of_the_expected_size(runs, tmp_path):
    made = write_plots(runs, tmp_path / "plots")
    assert set(made) == {"category_accuracy", "mitigation_deltas", "medihall_levels", "clinhallu", "agreement_4"}
    for path in made.values():
        assert png_size(path) == (WIDTH, HEIGHT)


def test_no_data_no_figure(tmp_path):
    grid = write_grid(tmp_path / "g", {"none": [True, False]}, new_fields=False)
    made = write_plots(find_runs([grid]), tmp_path / "plots")
    assert "mitigation_deltas" not in made and "medihall_levels" not in made and "clinhallu" not in made


def test_agreement_scatter_of_numeric_ratings(tmp_path):
    path = agreement_plot(tmp_path / "a.png", judge=[1, 2, 3, 4, 5], human=[1, 2, 3, 5, 4])
    assert png_size(path) == (WIDTH, HEIGHT)
    with pytest.raises(ValueError, match="confusion matrix, or judge and human"):
        agreement_plot(tmp_path / "b.png")

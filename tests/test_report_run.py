"""A run writes its own report.html; results.md lists every caveat a reader needs."""

from __future__ import annotations

import json
import sys

from medheval.data.benchmarks import load_benchmark
from medheval.cli import main
from medheval.report.tables import caveats, write_markdown


def _score_half(fixture_benchmark, tmp_path, *extra):
    """Score a predictions file answering half of mm_vishal ("Yes." everywhere), the rest missing."""
    rows = load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"]).to_list()
    kept = rows[: len(rows) // 2]
    path = tmp_path / "half.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "prediction": "Yes."}) + "\n" for r in kept))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(path), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--allow-missing-predictions", *extra]) == 0
    return out, rows, kept


def test_a_run_writes_report_html_and_per_item_fields(fixture_benchmark, tmp_path):
    out, rows, kept = _score_half(fixture_benchmark, tmp_path)
    results = json.loads((out / "results.json").read_text())
    assert results["report"] == {"html": "report.html", "note": None}
    page = (out / "report.html").read_text()
    assert 'data-table="medheval_close_ended"' in page and "data:image/png;base64," in page
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    assert [(s["split"], s["category"], s["source"]) for s in scored] == [
        ("mm_vishal:all", by_id[s["id"]]["category"], by_id[s["id"]]["source"]) for s in scored]
    assert len(scored) == len(kept)
    md = (out / "results.md").read_text()
    assert f"{len(rows) - len(kept)} record(s) have no prediction" in md  # the warning, from the runner


def test_a_run_without_matplotlib_still_succeeds_and_says_so(fixture_benchmark, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "medheval.report.plots", None)  # import fails as with matplotlib missing
    out, _, _ = _score_half(fixture_benchmark, tmp_path)
    results = json.loads((out / "results.json").read_text())
    assert results["report"]["html"] == "report.html" and "plots left out" in results["report"]["note"]
    assert "report: plots left out" in (out / "results.md").read_text()
    assert "plots left out" in capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert "data:image/png" not in page and "plots left out" in page and 'data-table="medheval_close_ended"' in page


def test_a_report_that_cannot_be_written_does_not_fail_the_run(fixture_benchmark, tmp_path, monkeypatch, capsys):
    from medheval.report import html

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(html, "write_html", broken)
    out, _, _ = _score_half(fixture_benchmark, tmp_path)
    assert (out / "results.md").exists() and not (out / "report.html").exists()
    assert "report.html not written (OSError" in capsys.readouterr().err


def test_results_md_states_the_caveats(tmp_path):
    run = {"settings": {"model": "m", "mitigation": "none", "backend": {"random_weights": True}}, "labels": {},
           "warnings": [], "benchmarks": {"knowledge:open": {
               "n_records": 10, "n_scored": 7, "skipped_missing_images": {"count": 2, "examples": []},
               "data_quality": {}, "annotation_files": [{"relpath": "a.json", "verified": None},
                                                        {"relpath": "b.json", "verified": True}],
               "metrics": {"sh_judge": {"sh": 1.5, "n_failed": 3},
                           "text_generation": {"bleu": 1.0, "n_empty_predictions": 1}}}}}
    lines = caveats(run)
    assert lines == [
        "the model has random weights: its numbers mean nothing",
        "`knowledge:open`: 3 of 10 record(s) have no prediction and are not scored",
        "`knowledge:open`: 2 record(s) skipped for a missing image (--on-missing skip)",
        "`knowledge:open` · sh_judge: 3 item(s) could not be scored and are left out of its figures",
        "`knowledge:open` · text_generation: 1 empty prediction(s), scored 0",
        "`knowledge:open`: annotation file(s) not checked against a pinned checksum (user data or a Hub snapshot): "
        "a.json"]
    write_markdown(run, tmp_path / "results.md")
    md = (tmp_path / "results.md").read_text()
    assert "## Caveats" in md and all(line in md for line in lines)
    run["benchmarks"]["knowledge:open"].update(n_scored=10, skipped_missing_images={"count": 0})
    run["benchmarks"]["knowledge:open"]["metrics"] = {}
    run["benchmarks"]["knowledge:open"]["annotation_files"] = []
    run["settings"]["backend"] = {}
    assert caveats(run) == []


def test_a_run_and_its_report_show_the_software_stack(fixture_benchmark, tmp_path):
    from medheval.report.build import write_report
    from medheval.versions import stack_versions

    out, _, _ = _score_half(fixture_benchmark, tmp_path)
    now = stack_versions()
    shown = [f"{package} {now[package]}" for package in
             ("medheval", "transformers", "torch", "datasets", "evaluate", "huggingface_hub")]
    written = write_report([out], tmp_path / "report", plots=False)
    markdown = written["markdown"].read_text()
    assert "## Software stack" in markdown
    line = next(line for line in markdown.splitlines() if line.startswith("All runs: "))
    assert all(entry in line for entry in shown), line
    summary = json.loads(written["json"].read_text())
    assert summary["software_stack"] == [{"runs": "all runs", "versions": {k: str(v) for k, v in now.items()}}]
    assert summary["runs"][0]["versions"] == now
    for page in (written["html"].read_text(), (out / "report.html").read_text()):  # medheval report; the run's own
        stack = page.split("<h2>Software stack</h2>")[1].split("</table>")[0]
        assert all(f"<td>{now[package]}</td>" in stack for package in now), stack


# -- issue 23, point 8: `medheval report` on bad input --------------------------------------------------------
def _edited(tmp_path, edit):
    from report_runs import write_run

    run = write_run(tmp_path / "run", "none", [True, False, True, True])
    results = json.loads((run / "results.json").read_text())
    edit(results)
    (run / "results.json").write_text(json.dumps(results))
    return run


def _wrong_category(results):
    results["benchmarks"]["mm_vishal:all"]["metrics"]["close_ended_accuracy"]["accuracy_by_category"] = 0.5


def _split_as_list(results):
    results["benchmarks"]["mm_vishal:all"] = [1, 2]


def _metrics_as_list(results):
    results["benchmarks"]["mm_vishal:all"]["metrics"] = ["close_ended_accuracy"]


def _warnings_as_text(results):
    results["warnings"] = "one warning"


import pytest  # noqa: E402


@pytest.mark.parametrize("edit, field", [
    (_wrong_category, "benchmarks.mm_vishal:all.metrics.close_ended_accuracy.accuracy_by_category is a number"),
    (_split_as_list, "benchmarks['mm_vishal:all'] is a list"),
    (_metrics_as_list, "benchmarks.mm_vishal:all.metrics is a list"),
    (_warnings_as_text, "warnings is a string, expected a list"),
])
def test_a_results_field_of_the_wrong_structure_is_one_line_naming_file_and_field(tmp_path, capsys, edit, field):
    run = _edited(tmp_path, edit)
    assert main(["report", str(run), "--output", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert str(run / "results.json") in err and field in err


def test_a_scored_line_that_is_a_list_and_a_raw_line_separator(tmp_path, capsys):
    from report_runs import write_run

    run = write_run(tmp_path / "run", "none", [True, False])
    lines = (run / "scored.jsonl").read_text().splitlines()
    item = json.loads(lines[0])
    item["prediction"] = "yes\u2028really"  # a raw U+2028 (json.dumps escapes it; a hand-written file may not)
    lines[0] = json.dumps(item, ensure_ascii=False).replace("\\u2028", "\u2028")
    (run / "scored.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "\u2028" in (run / "scored.jsonl").read_text(encoding="utf-8")
    assert main(["report", str(run), "--output", str(tmp_path / "ok"), "--no-plots"]) == 0
    (run / "scored.jsonl").write_text("\n".join([*lines, "[1, 2]"]) + "\n", encoding="utf-8")
    assert main(["report", str(run), "--output", str(tmp_path / "bad"), "--no-plots"]) == 2
    assert "scored.jsonl: line 3 is a JSON list, expected an object" in capsys.readouterr().err


def test_not_a_number_shows_as_a_dash_with_a_caveat(tmp_path):
    def edit(results):
        metric = results["benchmarks"]["mm_vishal:all"]["metrics"]["close_ended_accuracy"]
        metric["accuracy"] = "seventy"
        metric["accuracy_by_category"]["anatomy"] = float("nan")

    run = _edited(tmp_path, edit)
    assert main(["report", str(run), "--output", str(tmp_path / "report"), "--no-plots"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "seventy" not in md.split("## Caveats")[1].split("\n## ", 1)[1]  # never a table cell
    assert "metrics.close_ended_accuracy.accuracy is 'seventy', not a number: shown as –" in md
    assert "accuracy_by_category.anatomy is nan, not a number: shown as –" in md
    assert "| nan" not in md.lower()


def test_html_in_names_is_text_in_markdown_cells_and_dollars_are_not_mathtext(fixture_benchmark, tmp_path):
    pytest.importorskip("matplotlib")
    from report_runs import write_grid

    grid = write_grid(tmp_path / "grid", {"none": [True, False, True, False], "vcd": [True, True, True, False]},
                      model="<img src=x onerror=alert(1)>$x_{1}$|m")
    report = tmp_path / "report"
    (report / "plots").mkdir(parents=True)
    (report / "plots" / "stale_from_last_time.png").write_bytes(b"\x89PNG")
    assert main(["report", str(grid), "--output", str(report)]) == 0
    md = (report / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "onerror" in line]
    assert rows and all("&lt;img src=x onerror=alert(1)&gt;$x_{1}$\\|m" in row for row in rows)
    assert "<img src=x" not in md.replace("`<img src=x onerror=alert(1)>$x_{1}$|m", "")
    plots = sorted(p.name for p in (report / "plots").iterdir())
    assert "stale_from_last_time.png" not in plots and "category_accuracy.png" in plots

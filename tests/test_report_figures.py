"""Figures and tables read at a glance (issue 25, part 4): a 9-mitigation grid report, its deltas heatmap,
short mitigation labels with their legend, ``none`` first, shared notes once per section, folded caveats,
the Med-StepBench per-step figure, and the page in headless Chromium at 1,400 px."""

import json
import os
import shutil
import warnings

import pytest

from medheval.report.build import write_report
from medheval.report.collect import find_runs, mitigation_labels
from medheval.report.html import FOLD_CAVEATS
from medheval.report.paper import MARK_NOTE, build_tables, comparisons, sections
from medheval.report.plots import (CELL, DPI, PANEL_COLUMNS, delta_panels, deltas_figure, overlapping, text_boxes,
                                   write_plots)
from medheval.report.stats import METHOD_NOTE
from medheval.run.runner import mitigation_slug
from report_runs import write_run
from test_report_plots import png_size

# The nine mitigations of MedHEval Table 4 as `medheval run` records them (DecodingMethod.spec()), OPERA twice.
SPECS = ["none",
         "vcd:preset=medheval,alpha=1.0,beta=0.1,noise_step=500,noise_seed=0",
         "m3id:preset=medheval,lam=0.02,beta=0.1",
         "pai:preset=medheval,alpha=0.2,gamma=1.1,start_layer=none,end_layer=none,beta=0.1,use_cfg=true",
         "dola:preset=medheval,layers=medheval,relative_top=0.1,final_norm=false",
         "avisc:preset=medheval,alpha=1.0,beta=0.1,layer_gamma=0.5,top_k=10,lamb=1.0,masking_scheme=zeros",
         "damro:preset=medheval,alpha=0.5,beta=0.1,top_k=none,vision_layer=-1,cls_heads=mean,masking_scheme=zeros",
         "opera:preset=medheval,num_beams=5,scale_factor=50.0,threshold=15,num_attn_candidates=5,"
         "penalty_weights=1.0,window_size=512",
         "opera:preset=official,num_beams=5,scale_factor=50.0,threshold=25,num_attn_candidates=5,"
         "penalty_weights=1.0,window_size=512"]
BASE = [True, False] * 10  # none: 10 of 20 right
SHARED_WARNING = "annotation file mm_vishal.json differs from the pinned checksum"


def write_nine_grid(folder, with_caveats=False):
    """none + 8 mitigations in slug-named sub-folders (as `medheval run --mitigation ...` names them); the
    k-th mitigation (k = 1..8) also gets wrong items 1..k right. With ``with_caveats`` every run carries
    one shared warning and one of its own."""
    for k, spec in enumerate(SPECS):
        correct = [ok or (i % 2 == 1 and i // 2 < k) for i, ok in enumerate(BASE)]
        run = write_run(folder / mitigation_slug(spec), spec, correct, bleu=[10.0, 20.0 + k])
        if with_caveats:
            results = json.loads((run / "results.json").read_text())
            results["warnings"] = [SHARED_WARNING, f"{k} prediction id(s) match no record"]
            (run / "results.json").write_text(json.dumps(results))
    return folder


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return write_nine_grid(tmp_path_factory.mktemp("nine") / "grid", with_caveats=True)


def test_short_labels_are_method_and_preset_and_stay_distinct():
    labels = mitigation_labels(SPECS + ["vcd:alpha=1", "opera:preset=official,threshold=30,num_beams=5",
                                        "dola:layers=medheval,relative_top=0.1,final_norm=false"])
    assert labels[SPECS[0]] == "none" and labels[SPECS[1]] == "vcd (medheval)"
    assert labels[SPECS[7]] == "opera (medheval)"
    # two official OPERA runs: the settings they differ in are appended, its own first (–: not set)
    assert labels[SPECS[8]] == "opera (official, scale_factor=50.0, threshold=25, num_attn_candidates=5, " \
                               "penalty_weights=1.0, window_size=512)"
    assert labels["opera:preset=official,threshold=30,num_beams=5"] == (
        "opera (official, threshold=30, scale_factor=–, num_attn_candidates=–, penalty_weights=–, window_size=–)")
    assert labels["vcd:alpha=1"] == "vcd:alpha=1"  # short, no preset: as it is
    assert labels["dola:layers=medheval,relative_top=0.1,final_norm=false"] == "dola"
    assert len(set(labels.values())) == len(labels)


def test_tables_put_none_first_show_short_labels_and_a_legend_of_full_settings(grid):
    runs = find_runs([grid])
    assert runs[0].mitigation == "none"  # folders sort avisc, damro, ... none ...: the baseline moves first
    tables = {table.key: table for table in build_tables(runs)}
    close = tables["medheval_close_ended"]
    shown = [close.shown(labels[1]) for labels, _ in close.rows]
    assert shown[0] == "none" and "opera (official)" in shown and "vcd (medheval)" in shown
    assert all(len(label) <= 20 for label in shown)
    assert close.labels[SPECS[5]] == "avisc (medheval)" and len(close.labels) == 8  # none needs no legend
    # the data keep the full settings (CSV, JSON); the Markdown and HTML show the label and the legend
    assert [labels[1] for labels, _ in close.rows][1:] == [run.mitigation for run in runs[1:]]
    out = grid.parent / "report"
    written = write_report([grid], out, plots=False)
    markdown = written["markdown"].read_text()
    table_md = markdown.split("## MedHEval Tables 3–4")[1].split("\n## ")[0]
    assert "| m | none | mm_vishal:all |" in table_md.splitlines()[4]
    assert "| m | avisc (medheval) | mm_vishal:all |" in table_md
    assert f"- avisc (medheval) = {SPECS[5]}" in table_md  # the legend, under the table
    page = written["html"].read_text()
    section = page.split('data-table="medheval_close_ended"')[1].split('data-table="medheval_generation"')[0]
    assert f"<td>{SPECS[5]}</td>" not in section.split("</table>")[0]  # not a row label
    assert "<td>avisc (medheval)</td>" in section and f"<td>{SPECS[5]}</td>" in section  # label; legend entry
    summary = json.loads(written["json"].read_text())
    assert summary["tables"][0]["short_labels"][SPECS[1]] == "vcd (medheval)"


def test_shared_notes_are_said_once_per_section(grid):
    tables = build_tables(find_runs([grid]))
    found = {section.title: section for section in sections(tables)}
    medheval = found["MedHEval"]
    assert [table.key for table, _ in medheval.tables] == ["medheval_close_ended", "medheval_generation"]
    assert MARK_NOTE in medheval.notes and any(METHOD_NOTE in line for line in medheval.notes)
    assert all(MARK_NOTE not in footer for _, footer in medheval.tables)
    # the full footers stay on the tables (report.json), the page says each shared line once per section
    assert all(MARK_NOTE in table.footer for table, _ in medheval.tables)
    written = write_report([grid], grid.parent / "report-notes", plots=False)
    page = written["html"].read_text()
    assert page.count(MARK_NOTE) == 1  # the comparison section has no ranked column
    assert page.count("Notes for the tables above") == 1
    assert written["markdown"].read_text().count(MARK_NOTE) == 1
    # a section of one table keeps its footer under it
    (comparison, footer), = found["Mitigations against none"].tables
    assert footer == comparison.footer and found["Mitigations against none"].notes == []


def test_a_line_shared_by_some_tables_of_a_section_names_them():
    from medheval.report.paper import Column, Table

    a, b, c = (Table(f"medheval_{x}", f"MedHEval {x.upper()}: t", ["Model"], [Column("Acc")], footer=[*f])
               for x, f in (("a", ["shared", "own a"]), ("b", ["shared"]), ("c", ["other"])))
    (section,) = sections([a, b, c])
    assert section.notes == ["MedHEval A; MedHEval B: shared"]
    assert [footer for _, footer in section.tables] == [["own a"], [], ["other"]]


def test_caveats_are_grouped_across_runs_and_long_lists_fold(grid):
    written = write_report([grid], grid.parent / "report-caveats", plots=False)
    notes = json.loads(written["json"].read_text())["caveats"]
    assert notes.count(f"{SHARED_WARNING} (all runs)") == 1  # said once for the nine runs
    assert sum(SHARED_WARNING in line for line in notes) == 1
    assert len(notes) == len(set(notes)) == 1 + 9 + 1  # shared, one per run, credentialed items
    page = written["html"].read_text()
    caveats = page.split("<h2>Caveats (11)</h2>")[1].split("<h2>")[0]
    open_part, folded = caveats.split("<details class='more-caveats'>")
    assert open_part.count("<li>") == FOLD_CAVEATS
    assert f"<summary>{11 - FOLD_CAVEATS} more caveats</summary>" in folded
    assert folded.count("<li>") == 11 - FOLD_CAVEATS


def test_deltas_heatmap_known_cells_and_labels_that_never_overlap(grid):
    """Mitigation k gets k of none's 10 wrong items right and breaks none: Δ = 5k points, McNemar
    p = 2 · 0.5^k (b = 0, c = k; the sign-flip test over 20 items estimates it), so unadjusted k = 5 is not
    significant (p = 0.0625) and k = 6 is (p = 0.031). Holm over the 16 comparisons multiplies the smallest,
    k = 8's 0.0078, by 16: 0.125, so no cell keeps its star."""
    runs = find_runs([grid])
    _, holm = comparisons(runs)
    assert len(holm) == 16  # 8 mitigations × (Acc on mm_vishal:all, BLEU on knowledge:open)
    assert not any(r["significant"] for r in holm) and {r["family_size"] for r in holm} == {16}
    acc = {r["mitigation"]: r for r in holm if r["metric"] == "Acc"}
    assert acc[SPECS[8]]["p_adjusted"] == pytest.approx(16 * acc[SPECS[8]]["p_value"])
    assert acc[SPECS[8]]["p_adjusted"] > 0.05
    cells = [text for text, _ in text_boxes(deltas_figure(holm)) if text.startswith(("+", "-"))]
    assert len(cells) == 16 and not any("*" in text for text in cells)
    _, records = comparisons(runs, "none")
    acc = {r["mitigation"]: r for r in records if r["metric"] == "Acc"}
    assert acc[SPECS[5]]["diff"] == pytest.approx(25.0) and acc[SPECS[5]]["p_value"] == pytest.approx(0.0625)
    assert acc[SPECS[6]]["significant"] and not acc[SPECS[5]]["significant"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "tight layout not applied", nor any other warning
        fig = deltas_figure(records)
        boxes = text_boxes(fig)
    texts = [text for text, _ in boxes]
    assert "+25.0\n[" in "\n".join(texts) and "+25.0*" not in texts and any(t.startswith("+30.0*\n") for t in texts)
    assert {"vcd (medheval)", "opera (official)", "mm_vishal:all\nAcc", "knowledge:open\nBLEU"} <= set(texts)
    assert "none" not in texts  # the baseline is what each row is compared with, not a row
    assert overlapping(boxes) == []
    rows = [text for text in texts if text.endswith(")") and " (" in text]
    assert len(rows) == 8
    # size follows content: 8 rows of CELL[1] inches, and a figure of 2 rows is smaller
    width, height = fig.get_size_inches()
    assert height >= 8 * CELL[1]
    small = deltas_figure([r for r in records if r["mitigation"] in SPECS[1:3]])
    assert small.get_size_inches()[1] < height


def test_the_old_layout_would_have_failed_the_overlap_check():
    """The check has teeth: 60 labels on a 4.5-inch axis (the old fixed-size deltas plot) overlap."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=DPI)
    ax.set_yticks(range(60), [f"avisc:preset=medheval · split{i} · Acc" for i in range(60)], fontsize=7)
    assert overlapping(text_boxes(fig)) != []
    plt.close(fig)


def test_wide_comparisons_wrap_into_panels():
    records = [{"model": "m", "mitigation": "vcd", "split": f"s{s}", "metric": f"M{m}", "diff": 1.0, "low": 0.0,
                "high": 2.0, "p_value": 0.5} for s in range(3) for m in range(5)]
    panels = delta_panels(records)
    assert [len(p) for p in panels] == [5, 5, 5]  # a split is not cut when it fits a panel of its own
    assert all(len(p) <= PANEL_COLUMNS for p in delta_panels(records * 1 + [
        {**records[0], "split": "wide", "metric": f"W{i}"} for i in range(11)]))
    fig = deltas_figure(records)
    assert overlapping(text_boxes(fig)) == []


def test_grid_figures_write_without_warnings_and_are_sized_by_content(grid, tmp_path):
    runs = find_runs([grid])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = write_plots(runs, tmp_path / "plots")
    assert set(made) == {"category_accuracy", "mitigation_deltas"}
    width, height = png_size(made["mitigation_deltas"])
    assert height >= 8 * CELL[1] * DPI and width < 800  # two columns of cells: narrow and tall
    small = write_plots(find_runs([write_nine_grid(tmp_path / "two")]), tmp_path / "plots-two")
    assert png_size(small["mitigation_deltas"])[1] == height  # same rows, same height (deterministic)


def _stepbench_run(folder, knowledge, mitigation="none"):
    """One Med-StepBench run: EN and VI, steps 1–4, four hallucinated and four true statements per step."""
    from medheval.data.registry import load_unit_module

    steps = load_unit_module("datasets", "med_stepbench").STEPS
    folder.mkdir(parents=True)
    items, per_language = [], {}
    for language in ("en", "vi"):
        per_step = {}
        for step in (1, 2, 3, 4):
            right = [i < step for i in range(4)] + [True] * 4  # step s: s of 4 hallucinations caught
            items += [{"id": f"med_stepbench/{language}/s{step}-{i}", "prediction": "x", "correct": ok,
                       "reference": "hallucination" if i < 4 else "ground_truth", "split": "med_stepbench:all",
                       "category": steps[step], "source": "med_stepbench"} for i, ok in enumerate(right)]
            tp, fn = step, 4 - step
            per_step[str(step)] = {"recall": tp / 4, "f1": 2 * tp / (2 * tp + fn)}
        per_language[language] = {"per_step": per_step}
    (folder / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / "results.json").write_text(json.dumps({"settings": {"model": "m", "mitigation": mitigation},
                                                     "benchmarks": {"med_stepbench:all": {
        "n_records": len(items), "n_scored": len(items), "run_options": {"knowledge": knowledge},
        "metrics": {"stepbench": {"accuracy": sum(i["correct"] for i in items) / len(items), "n_unparsed": 0,
                                  "by_language": per_language}}}}}))
    return folder


def test_stepbench_per_step_figure_en_vi_with_and_without_knowledge(tmp_path):
    runs = find_runs([_stepbench_run(tmp_path / "plain", "none"), _stepbench_run(tmp_path / "prior", "prior")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = write_plots(runs, tmp_path / "plots")
    assert "stepbench_steps" in made and png_size(made["stepbench_steps"])[0] >= 800
    import matplotlib.pyplot as plt
    from medheval.report.plots import stepbench_figure

    fig = stepbench_figure(runs)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["EN: recall (%)", "VI: recall (%)", "EN: F1 (%)", "VI: F1 (%)"]
    en_recall = fig.axes[0]
    # bars of series 0 (knowledge none): recall s/4 per step = 25, 50, 75, 100; series 1 has no Step-1 bar
    heights = [round(patch.get_height(), 6) for patch in en_recall.patches]
    assert heights == [25.0, 50.0, 75.0, 100.0, 50.0, 75.0, 100.0]
    assert overlapping(text_boxes(fig)) == []
    plt.close(fig)


def test_report_at_1400_px_in_headless_chromium(grid, tmp_path):
    """The headline Acc column is inside a 1,400 px viewport, the caveats are deduplicated and folded, the
    deltas figure is shown; screenshots go to tmp_path and, when set, $MEDHEVAL_ARTIFACTS."""
    from cdp_browser import Browser, require_browser

    executable = require_browser()
    written = write_report([grid], tmp_path / "report")
    browser = Browser(executable)
    try:
        browser.call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1,
                     mobile=False)
        browser.open(written["html"].resolve().as_uri())
        assert browser.errors() == []
        assert browser.evaluate("window.innerWidth") == 1400
        edge = browser.evaluate(
            "(() => { const t = document.querySelector('table[data-table=medheval_close_ended]');"
            " const th = Array.from(t.querySelectorAll('th')).find(h => h.textContent === 'Acc');"
            " return th.getBoundingClientRect().right; })()")
        assert 0 < edge <= 1400
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1400  # no horizontal scrolling
        first = browser.evaluate("document.querySelector('table[data-table=medheval_close_ended] tbody "
                                 "td:nth-child(2)').textContent")
        assert first == "none"
        caveats = browser.evaluate("Array.from(document.querySelectorAll('ul.caveats li')).map(li => li.textContent)")
        assert len(caveats) == len(set(caveats)) == 11
        assert sum(SHARED_WARNING in text for text in caveats) == 1
        visible = "Array.from(document.querySelectorAll('ul.caveats li')).filter(li => li.checkVisibility()).length"
        assert browser.evaluate(visible) == FOLD_CAVEATS
        plot = browser.evaluate("(() => { const i = document.querySelector('img.plot[alt=mitigation_deltas]');"
                                " const r = i.getBoundingClientRect();"
                                " return [r.right, r.height, i.naturalWidth]; })()")
        assert 0 < plot[0] <= 1400 and plot[1] > 0 and plot[2] > 0
        shots = [browser.screenshot(tmp_path / "report_1400.png")]
        browser.evaluate("document.querySelector('details.more-caveats').open = true;"
                         "document.querySelectorAll('details.legend').forEach(d => d.open = true)")
        assert browser.evaluate(visible) == 11
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1400  # the legend wraps too
        shots.append(browser.screenshot(tmp_path / "report_1400_open.png"))
        assert all(shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for shot in shots)
        if os.environ.get("MEDHEVAL_ARTIFACTS"):
            os.makedirs(os.environ["MEDHEVAL_ARTIFACTS"], exist_ok=True)
            for shot in shots:
                shutil.copy(shot, os.path.join(os.environ["MEDHEVAL_ARTIFACTS"], shot.name))
        assert browser.errors() == []
    finally:
        browser.close()


def test_grid_results_md_uses_short_labels_and_lists_the_full_settings(grid, tmp_path):
    from medheval.report.tables import write_grid_markdown

    runs = [json.loads((grid / mitigation_slug(spec) / "results.json").read_text()) for spec in SPECS]
    write_grid_markdown(runs, tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    table = text.split("## Close-ended accuracy (%)")[1].split("\n## ")[0]
    assert "| m | none |" in table and "| m | avisc (medheval) |" in table and SPECS[5] not in table
    legend = text.split("## Mitigation settings")[1].split("\n\n")[1].splitlines()
    assert legend[0] == f"- `vcd (medheval)`: `{SPECS[1]}`" and len(legend) == 8
    assert f"`m` · `opera (official)`: {SHARED_WARNING}" in text  # caveats and warnings name runs short too

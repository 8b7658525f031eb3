"""Clustered intervals (issue 25, part 1): each benchmark declares the unit its items correlate within, runs
record each item's cluster, and ``medheval report`` resamples clusters (``--cluster none``: items)."""

from __future__ import annotations

import json
import types

import pytest
from conftest import UPSTREAM_MEDHEVAL, requires_upstream

from medheval.cli import main
from medheval.data.benchmarks import load_benchmark
from medheval.data.schema import CLUSTER_UNITS, cluster_id
from medheval.report.build import write_report
from medheval.report.collect import ReportError, find_runs
from medheval.report.paper import build_tables, comparisons
from medheval.report.tables import md_text
from medheval.report.stats import (CLUSTER_NOTE, FEW_CLUSTERS, LEVEL, METHOD_NOTE, bootstrap_ci, compare_accuracy,
                                   expanded_level)
from medheval.run import protocol
from medheval.run.protocol import RunError, benchmark_cluster_unit
from report_runs import write_grid, write_run

BASE = [True] * 6 + [False] * 10 + [True] * 4  # 10/20 right
BETTER = [True] * 6 + [True] * 5 + [False] * 5 + [True] * 4  # 15/20: items 6–10 fixed
IMAGES = [f"img{i // 2}.png" for i in range(20)]  # 10 images, 2 questions each
LABELS = [f"image:{name}" for name in IMAGES]
FOUR = [f"img{i // 5}.png" for i in range(20)]  # 4 images, 5 questions each: below MIN_CLUSTERS


def _item_interval(values):
    """The item bootstrap's expanded percentile interval (n items), in percent."""
    return tuple(100 * b for b in bootstrap_ci(values, level=expanded_level(LEVEL, len(values))))


def _close_ended(runs):
    return {table.key: table for table in build_tables(runs)}["medheval_close_ended"]


def test_report_resamples_the_images_and_names_them(tmp_path):
    """Acc of the ``none`` run is 10/20 over 10 images; its interval is the cluster bootstrap's (``LABELS``, its
    level expanded for G = 10) joined with the item bootstrap's (expanded for n = 20), the footer names the unit and G = 10, and the paired comparison tests over the
    same images (and over items: the larger p)."""
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER}, images=IMAGES)
    table = _close_ended(find_runs([grid]))
    acc = table.rows[0][1][4]
    values = [float(x) for x in BASE]
    low, high = bootstrap_ci(values, clusters=LABELS, level=expanded_level(LEVEL, 10))
    item_low, item_high = _item_interval(values)
    assert (acc.value, acc.low, acc.high) == (50.0, min(100 * low, item_low), max(100 * high, item_high))
    assert (acc.unit, acc.n_clusters, acc.n) == ("mm_vishal:all by image", 10, 20)
    assert CLUSTER_NOTE in table.footer and METHOD_NOTE not in table.footer
    assert any(line.startswith("Resampled: mm_vishal:all by image (10 clusters)") for line in table.footer)
    _, (record,) = comparisons(find_runs([grid]))
    expected = compare_accuracy(BASE, BETTER, clusters=LABELS)
    assert record["test"] == "sign-flip over clusters (exact) and items (exact)"
    assert record["p_value"] == expected.p_value >= compare_accuracy(BASE, BETTER).p_value
    # items 6–10 fixed lie in images 3, 4, 5: cluster totals 2, 2, 1 (the rest 0); |±2 ±2 ±1| = 5 for 2 of the
    # 8 sign patterns of those three, so p = 2/8 = 0.25 over the 10 images
    assert expected.p_value == pytest.approx(0.25)
    assert (record["resampled"], record["n_clusters"], record["n"]) == ("mm_vishal:all by image", 10, 20)
    assert record["low"] == pytest.approx(100 * expected.low) and record["high"] == pytest.approx(100 * expected.high)
    assert record["low"] <= 0 <= record["high"]


def test_few_images_give_no_interval_and_say_why(tmp_path):
    """4 images: the figure and the comparison keep their estimates but have no interval (and no star), and the
    footer says why; with --cluster none the items give both."""
    grid = write_grid(tmp_path / "grid", {"none": BASE, "vcd": BETTER}, images=FOUR)
    tables = {table.key: table for table in build_tables(find_runs([grid]))}
    acc = tables["medheval_close_ended"].rows[0][1][4]
    assert (acc.value, acc.low, acc.note) == (50.0, None, FEW_CLUSTERS)
    assert f"No interval (†): {FEW_CLUSTERS}." in tables["medheval_close_ended"].footer
    delta = tables["mitigation_vs_none"].rows[0][1][2]
    assert (delta.value, delta.low, delta.star, delta.note) == (25.0, None, False, FEW_CLUSTERS)
    _, (record,) = comparisons(find_runs([grid]))
    assert record["low"] is None and record["n_clusters"] == 4 and not record["significant"]
    assert record["p_value"] >= 2 / 2 ** 4  # the smallest a 4-cluster sign-flip test can give
    assert _close_ended(find_runs([grid], cluster="none")).rows[0][1][4].low is not None


def test_cluster_none_gives_the_item_bootstrap_and_todays_footer(tmp_path):
    """``--cluster none`` ignores the cluster ids: the same cells as a run written without them, item intervals,
    the sign-flip test over items for accuracy (b = 0, c = 5: McNemar's 0.0625, exactly), and the item method
    note alone."""
    clustered = write_grid(tmp_path / "clustered", {"none": BASE, "vcd": BETTER}, images=IMAGES)
    plain = write_grid(tmp_path / "plain", {"none": BASE, "vcd": BETTER})
    table = _close_ended(find_runs([clustered], cluster="none"))
    acc = table.rows[0][1][4]
    assert (acc.low, acc.high) == _item_interval([float(x) for x in BASE])
    assert (acc.unit, acc.n_clusters) == (None, None)
    assert METHOD_NOTE in table.footer and not any(line.startswith("Resampled") for line in table.footer)
    _, (record,) = comparisons(find_runs([clustered], cluster="none"))
    assert record["test"] == "exact sign-flip over items" and record["p_value"] == pytest.approx(0.0625)
    write_report([clustered], tmp_path / "a", plots=False, html=False, cluster="none")
    write_report([plain], tmp_path / "b", plots=False, html=False, cluster="none")
    for name in ("tables.csv", "report.md"):
        a = (tmp_path / "a" / name).read_text().replace(str(clustered), "RUNS")
        b = (tmp_path / "b" / name).read_text().replace(str(plain), "RUNS")
        assert a == b


def test_runs_without_cluster_ids_fall_back_to_items_and_say_so(tmp_path):
    run = write_run(tmp_path / "old", "none", BASE)  # scored.jsonl as written before clustered intervals
    table = _close_ended(find_runs([run]))
    acc = table.rows[0][1][4]
    assert (acc.low, acc.high) == _item_interval([float(x) for x in BASE])
    footer = "\n".join(table.footer)
    assert "mm_vishal:all by item, not by image" in footer and "no cluster ids" in footer
    assert METHOD_NOTE in table.footer  # what was done: items resampled


def test_cli_cluster_option(tmp_path, capsys):
    run = write_run(tmp_path / "run", "none", BASE, images=IMAGES)
    assert main(["report", str(run), "--output", str(tmp_path / "auto"), "--no-plots", "--no-html"]) == 0
    assert "mm_vishal:all by image (10 clusters)" in (tmp_path / "auto" / "report.md").read_text()
    assert main(["report", str(run), "--output", str(tmp_path / "none"), "--no-plots", "--no-html",
                 "--cluster", "none"]) == 0
    markdown = (tmp_path / "none" / "report.md").read_text()
    assert md_text(METHOD_NOTE) in markdown and "Resampled:" not in markdown  # notes are escaped in Markdown
    with pytest.raises(SystemExit):
        main(["report", str(run), "--output", str(tmp_path / "x"), "--cluster", "image"])
    assert "invalid choice: 'image'" in capsys.readouterr().err
    with pytest.raises(ReportError, match="--cluster 'study': choose one of"):
        find_runs([run], cluster="study")


def test_a_run_records_each_items_image_and_its_report_resamples_them(fixture_benchmark, tmp_path):
    rows = load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"]).to_list()
    predictions = tmp_path / "mine.jsonl"
    predictions.write_text("".join(json.dumps({"id": r["id"], "prediction": "Yes."}) + "\n" for r in rows))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(predictions), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    entry = json.loads((out / "results.json").read_text())["benchmarks"]["mm_vishal:all"]
    assert entry["cluster_unit"] == "image"
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row for row in rows}
    assert [item["cluster"] for item in scored] == [
        "image:" + "+".join(sorted(by_id[item["id"]]["images"])) for item in scored]
    images = len({item["cluster"] for item in scored})
    assert 1 < images < len(scored)  # the fixture asks several questions about some images
    assert f"mm_vishal:all by image ({images} clusters)" in (out / "report.html").read_text()
    other = tmp_path / "none"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(predictions), "--output", str(other),
                 "--data-dir", fixture_benchmark["data_dir"], "--cluster", "none"]) == 0
    assert "by image" not in (other / "report.html").read_text()


def test_each_benchmark_declares_its_unit(monkeypatch):
    declared = {name: benchmark_cluster_unit(name) for name in (
        "mm_vishal", "cxr_vishal", "knowledge", "context", "med_hallmark", "vishal_report", "med_stepbench",
        "clinhallu")}
    assert declared == {"mm_vishal": "image", "cxr_vishal": "image", "knowledge": "image", "context": "image",
                        "med_hallmark": "image", "vishal_report": "report", "med_stepbench": "study",
                        "clinhallu": "image"}
    monkeypatch.setattr(protocol, "_unit", lambda name: types.SimpleNamespace(CLUSTER="pixel"))
    with pytest.raises(RunError, match=r"datasets/x/x.py: CLUSTER = 'pixel' is not one of"):
        benchmark_cluster_unit("x")
    monkeypatch.setattr(protocol, "_unit", lambda name: None)  # a unit that declares nothing: items
    assert benchmark_cluster_unit("x") == "item"


def test_cluster_ids_of_records():
    record = {"id": "b/c/1", "images": ["b.png", "a.png"], "meta": {"study_id": "S7"}}
    assert cluster_id(record, "image") == "image:a.png+b.png"  # an image set, in any order
    assert cluster_id({**record, "images": ["a.png", "b.png"]}, "image") == cluster_id(record, "image")
    assert cluster_id({**record, "images": []}, "image") == "item:b/c/1"  # no image: its own cluster
    assert cluster_id(record, "study") == "study:S7"
    assert cluster_id(record, "report") == "report:b/c/1" and cluster_id(record, "item") == "item:b/c/1"
    with pytest.raises(ValueError, match=r"record 'b/c/1': clustered by study but meta.study_id is missing"):
        cluster_id({**record, "meta": {}}, "study")
    with pytest.raises(ValueError, match="unknown cluster unit 'pixel'"):
        cluster_id(record, "pixel")
    assert set(CLUSTER_UNITS) == {"image", "study", "report", "item"}


def test_stepbench_statements_cluster_by_study(tmp_path, dataset_cache):
    from medheval.families.stepbench.fixtures import write_stepbench_fixture

    fixture = write_stepbench_fixture(tmp_path / "sb", studies=3, per_study=8)
    rows = load_benchmark("med_stepbench:all", data_dir=fixture["data_dir"], cache_dir=dataset_cache).to_list()
    labels = [cluster_id(row, benchmark_cluster_unit("med_stepbench")) for row in rows]
    assert len(set(labels)) == 3 and len(labels) > 3
    assert all(label == f"study:{row['meta']['study_id']}" for label, row in zip(labels, rows))


@requires_upstream
def test_real_slake_split_has_many_questions_per_image():
    """The released SLAKE close-ended file: 1,536 questions about 180 images (up to 15 each), so resampling
    items would treat 1,536 correlated answers as independent."""
    from medheval.families.medheval.source import visual_close_records

    path = UPSTREAM_MEDHEVAL / "Visual_Misinterpretation_Hallucination/close-ended/fine-grained/slake_qa_pairs.json"
    records = list(visual_close_records(path, benchmark="mm_vishal", config="slake", source="slake"))
    labels = [cluster_id(record, "image") for record in records]
    assert (len(labels), len(set(labels))) == (1536, 180)


def test_stepbench_table_resamples_studies(tmp_path):
    """8 statements of 2 studies: A = s0, s1 (hallucinations, both caught), s4, s5 (true, kept); B = s2, s3
    (hallucinations, both missed), s6 (true, kept), s7 (true, flagged). Recall 2/4; F1 = Σ2tp / Σ(2tp + fp + fn)
    = 4/7, per study 4/4 (A) and 0/3 (B). Resampling the 2 studies gives AA, AB or BB: recall 1, ½, 0 and F1
    8/8, 4/7, 0/6, intervals spanning [0, 100] from 2 observations: 2 < 6 clusters, so the report shows the
    figures without an interval and says why. Resampling the 8 statements does no better for F1: the true,
    kept s4, s5, s6 are 0 of 0 in it (no tp, fp or fn), so only 5 statements hold F1, below the minimum too."""
    run = tmp_path / "sb"
    run.mkdir()
    labels = ["hallucination"] * 4 + ["ground_truth"] * 4
    correct = [True, True, False, False, True, True, True, False]
    studies = ["A", "A", "B", "B", "A", "A", "B", "B"]
    items = [{"id": f"med_stepbench/en/s{i}", "prediction": "x", "reference": label, "correct": ok,
              "split": "med_stepbench:all", "category": "anatomical_mapping", "source": "med_stepbench",
              "cluster": f"study:{study}"} for i, (label, ok, study) in enumerate(zip(labels, correct, studies))]
    (run / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    per_step = {"1": {"recall": 0.5, "f1": 4 / 7}}
    (run / "results.json").write_text(json.dumps({"settings": {"model": "m", "mitigation": "none"}, "benchmarks": {
        "med_stepbench:all": {"n_records": 8, "n_scored": 8, "cluster_unit": "study", "metrics": {"stepbench": {
            "accuracy": 5 / 8, "n_unparsed": 0, "by_language": {"en": {"per_step": per_step}}}}}}}))
    (table,) = [t for t in build_tables(find_runs([run])) if t.key == "med_stepbench"]
    names = [c.label for c in table.columns]
    recall, f1, acc = (table.rows[0][1][names.index(name)] for name in ("EN S1 R", "EN S1 F1", "Acc"))
    assert (recall.low, recall.high, recall.n_clusters, recall.note) == (None, None, 2, FEW_CLUSTERS)
    assert (f1.value, f1.low, f1.n, f1.n_clusters) == (pytest.approx(400 / 7), None, 8, 2)
    assert acc.unit == "med_stepbench:all by study" and acc.n_clusters == 2 and acc.low is None
    assert f"No interval (†): {FEW_CLUSTERS}." in table.footer
    (plain,) = [t for t in build_tables(find_runs([run], cluster="none")) if t.key == "med_stepbench"]
    item_f1 = plain.rows[0][1][names.index("EN S1 F1")]  # s4, s5, s6 (true, kept) are 0 of 0: 5 units hold F1
    assert (item_f1.n, item_f1.low, item_f1.note) == (8, None, FEW_CLUSTERS)
    assert (1 - expanded_level(LEVEL, 8)) / 2 < (5 / 8) ** 8 < (1 - LEVEL) / 2


def test_grid_config_cluster_key(tmp_path):
    from medheval.run.grids import GridConfigError, load_grid_config, run_spec

    path = tmp_path / "grid.yaml"
    path.write_text("output: o\nmodels: [m/x]\nbenchmarks: [context]\ncluster: image\n")
    with pytest.raises(GridConfigError, match=rf"{path}: cluster: expected auto or none, got 'image'"):
        load_grid_config(path)
    path.write_text("output: o\nmodels: [m/x]\nbenchmarks: [context]\ncluster: none\n")
    assert run_spec(load_grid_config(path), "m/x", {}).report_cluster == "none"
    path.write_text("output: o\nmodels: [m/x]\nbenchmarks: [context]\n")
    assert run_spec(load_grid_config(path), "m/x", {}).report_cluster == "auto"


def _clinhallu_pair(folder, images, none_org, vcd_org):
    from report_runs import write_clinhallu_run

    table = lambda org: [("vqa_rad", right, right, right, right, 0, 0, 0) for right in org]  # noqa: E731
    write_clinhallu_run(folder / "none", table(none_org), images=images)
    write_clinhallu_run(folder / "vcd", table(vcd_org), mitigation="vcd", images=images)
    return find_runs([folder])


def test_clinhallu_clusters_by_image(tmp_path):
    """ClinHallu's VQA-RAD and PathVQA items ask several questions per image, so it resamples images.
    Six images of two items; none is right on one item of each (6/12), VCD on both (12/12): every image adds +1,
    so over the 6 images only the identity and the all-flipped sign vector reach |T| = 6: p = 2/64 = 0.03125,
    as McNemar over the 12 items (b = 0, c = 6). Two images of six items, VCD fixing all six of image A: over
    items p = 2/64 still, but over the 2 images p = 1 (|±6 ±0| = 6 always), so no interval and no star."""
    images = [f"img{i // 2}.jpg" for i in range(12)]
    runs = _clinhallu_pair(tmp_path / "six", images, [False, True] * 6, [True] * 12)
    _, (record,) = comparisons(runs)
    assert (record["resampled"], record["n_clusters"], record["n"]) == ("clinhallu:all by image", 6, 12)
    assert record["p_value"] == pytest.approx(0.03125) and record["low"] > 0 and record["significant"]
    stage = {t.key: t for t in build_tables(runs)}["clinhallu_stages"]
    acc = stage.rows[0][1][0]
    assert (acc.value, acc.unit, acc.n_clusters) == (50.0, "clinhallu:all by image", 6) and acc.low is not None
    assert any("clinhallu:all by image (6 clusters)" in line for line in stage.footer)

    images = [f"img{i // 6}.jpg" for i in range(12)]
    runs = _clinhallu_pair(tmp_path / "two", images, [False] * 6 + [True] * 6, [True] * 12)
    _, (record,) = comparisons(runs)
    assert record["n_clusters"] == 2 and record["p_value"] == 1.0 and record["low"] is None
    assert not record["significant"] and record["note"] == FEW_CLUSTERS
    _, (by_item,) = comparisons(find_runs([tmp_path / "two"], cluster="none"))
    assert by_item["p_value"] == pytest.approx(0.03125) and by_item["low"] > 0
    acc = {t.key: t for t in build_tables(runs)}["clinhallu_stages"].rows[0][1][0]
    assert (acc.value, acc.low, acc.note) == (50.0, None, FEW_CLUSTERS)


def test_clinhallu_run_without_cluster_ids_says_so(tmp_path):
    from report_runs import write_clinhallu_run

    table = [("vqa_rad", 1, 1, 1, 1, 0, 0, 0)] * 3 + [("vqa_rad", 0, 0, 0, 0, 0, 0, 0)] * 3
    run = write_clinhallu_run(tmp_path / "old", table)
    stage = {t.key: t for t in build_tables(find_runs([run]))}["clinhallu_stages"]
    assert stage.rows[0][1][0].low is not None  # items resampled
    assert any("clinhallu:all by item, not by image: this run's protocol logs have no cluster ids" in line
               for line in stage.footer)


def test_clinhallu_logs_outside_the_run_folder_are_never_read(tmp_path):
    """A results.json naming another folder's ClinHallu logs (``logs``: an absolute path), or a split name that
    leads out of the run folder, makes the report read nothing there; it says why, naming the folder."""
    import shutil

    from report_runs import write_clinhallu_run
    from medheval.report.collect import protocol_columns

    table = [("vqa_rad", 1, 1, 1, 1, 0, 0, 0)] * 3 + [("vqa_rad", 0, 0, 0, 0, 0, 0, 0)] * 3
    run = write_clinhallu_run(tmp_path / "run", table)
    entry = json.loads((run / "results.json").read_text())["benchmarks"]["clinhallu:all"]
    columns, why = protocol_columns(run, "clinhallu:all", entry)
    assert why is None and len(columns["ids"]) == 6  # the run's own logs
    elsewhere = tmp_path / "victim" / "logs"
    shutil.move(str(run / "clinhallu" / "all"), str(elsewhere))
    columns, why = protocol_columns(run, "clinhallu:all", {**entry, "logs": str(elsewhere)})
    assert columns is None and f"named for clinhallu:all ({elsewhere}) are outside the run folder" in why
    columns, why = protocol_columns(run, "clinhallu:../../victim/logs", entry)
    assert columns is None and "outside the run folder" in why
    inside = run / "clinhallu" / "moved"  # a folder inside the run is still read
    shutil.move(str(elsewhere), str(inside))
    columns, why = protocol_columns(run, "clinhallu:all", {**entry, "logs": str(inside)})
    assert why is None and len(columns["ids"]) == 6

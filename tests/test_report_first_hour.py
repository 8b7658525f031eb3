"""The report as a new reader meets it: random weights as a banner (not one caveat among many), the accuracy
columns spelled out, no heading promising an S_h column that is not there, a BERTScore that could not be
computed named with its reason, the caveat fold's count in the singular when it folds one, and Markdown's
backticks shown as code in the HTML, not as literal backticks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from report_runs import write_run
from medheval.report.build import write_report
from medheval.report.collect import find_runs
from medheval.report.html import FOLD_CAVEATS, _caveats_html, _text_html, random_weight_banner


def _random(folder: Path) -> Path:
    results = json.loads((folder / "results.json").read_text())
    results["settings"]["backend"] = {"random_weights": True}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_random_weights_open_the_report_as_a_banner(tmp_path):
    real = write_run(tmp_path / "real", "none", [True, False, True, True], model="real-model")
    fake = _random(write_run(tmp_path / "fake", "none", [True, True, False, False], model="tiny-random"))
    written = write_report([real, fake], tmp_path / "report", plots=False)
    page = Path(written["html"]).read_text()
    banner = re.search(r'<div class="banner" role="alert">(.*?)</div>', page)
    assert banner and "tiny-random" in banner.group(1) and "real-model" not in banner.group(1)
    assert page.index('class="banner"') < page.index("<h2>Caveats")  # above everything else
    markdown = Path(written["markdown"]).read_text().splitlines()
    assert markdown[2].startswith("> **⚠ Random weights: tiny-random")
    assert random_weight_banner(find_runs([real])) is None  # a real run alone: no banner


def test_accuracy_columns_spelled_out_and_no_s_h_promised_without_its_column(tmp_path):
    run = write_run(tmp_path / "run", "none", [True, False, True, True, False, True, True, True],
                    bleu=[10.0, 20.0])
    results = json.loads((run / "results.json").read_text())
    results["benchmarks"]["knowledge:open"]["metrics"]["text_generation"].update(
        bertscore=None, bertscore_unavailable_reason="no BERTScore weights offline (roberta-large)")
    (run / "results.json").write_text(json.dumps(results))
    report = json.loads(Path(write_report([run], tmp_path / "report", plots=False)["json"]).read_text())
    tables = {table["key"]: table for table in report["tables"]}
    close = tables["medheval_close_ended"]
    assert any(line.startswith("Accuracy by hallucination category: Acc-A anatomy, Acc-M measurement, "
                               "Acc-S symptom, Acc-R radiology") for line in close["footer"])
    generation = tables["medheval_generation"]
    assert "S_h" not in generation["title"]
    assert any("S_h" in line and "--judge" in line for line in generation["footer"])
    assert "BERTScore not computed on knowledge:open: no BERTScore weights offline (roberta-large)" in generation["footer"]


def test_caveat_fold_counts_in_the_singular_and_backticks_become_code():
    notes = [f"note {i}" for i in range(FOLD_CAVEATS)] + ["use `--judge` for S_h"]
    page = _caveats_html(notes)
    assert "1 more caveat<" in page and "1 more caveats" not in page
    assert "use <code>--judge</code> for S_h" in page and "`" not in page
    assert "2 more caveats" in _caveats_html(notes + ["another"])
    assert _text_html("a `<b>` b") == "a <code>&lt;b&gt;</code> b"  # escaped inside code too
    assert _text_html("an odd ` backtick") == "an odd ` backtick"

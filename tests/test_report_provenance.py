"""A re-score (``medheval run --predictions``) keeps what the answers it read were: the report reads random
weights, fixture data and ``--limit`` through the run's provenance (:func:`medheval.run.provenance.of_run`),
so a re-score of a random-weight, limited run opens with the same banner, lists the same caveats and is not
comparable beside the paper."""

from __future__ import annotations

import json
import re
from pathlib import Path

from report_runs import write_run
from medheval.report.build import write_report
from medheval.report.collect import Run
from medheval.report.paper import Cell
from medheval.report.published import RunConditions, reproduction
from test_report_published import _close_ended

CARRIED = {"random_weights": True, "fixture": True, "limit": 8, "protocol": "clean", "source_model": "tiny-random"}


def _rescore(folder: Path) -> Path:
    """The run as ``medheval run --predictions`` writes it: a predictions-file backend, no labels, no limit of
    its own, and the provenance carried from the answers' lines."""
    results = json.loads((folder / "results.json").read_text())
    results["settings"].update(backend={"backend": "predictions_file", "model": "tiny-random"}, limit=None)
    results["provenance"] = CARRIED
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_rescore_of_random_limited_fixture_answers_keeps_banner_and_caveats(tmp_path: Path) -> None:
    run = _rescore(write_run(tmp_path / "rescore", "none", [True, False, True, True], model="tiny-random"))
    written = write_report([run], tmp_path / "report", plots=False)
    markdown = Path(written["markdown"]).read_text()
    assert markdown.splitlines()[2].startswith("> **⚠ Random weights: tiny-random · none has random weights.")
    caveats = markdown.split("## Caveats")[1].split("\n## ")[0]
    assert "- the model has random weights: its numbers mean nothing" in caveats
    assert ("- only the first 8 record(s) of each split were answered (--limit 8): not a whole-split result"
            in caveats)
    assert "- the answers were made on the embedded fixture (synthetic records), not the released data" in caveats
    page = Path(written["html"]).read_text()
    banner = re.search(r'<div class="banner" role="alert">(.*?)</div>', page)
    assert banner and "tiny-random · none has random weights" in banner.group(1)
    assert "(--limit 8): not a whole-split result" in page
    assert json.loads(Path(written["json"]).read_text())["caveats"][:3] == [
        "the model has random weights: its numbers mean nothing (tiny-random · none)",
        "the answers were made on the embedded fixture (synthetic records), not the released data: its numbers "
        "test the pipeline, they are not results (tiny-random · none)",
        "only the first 8 record(s) of each split were answered (--limit 8): not a whole-split result "
        "(tiny-random · none)"]


def test_a_rescore_is_not_comparable_beside_the_paper() -> None:
    """The re-score's own settings are clean (no labels, no limit); its carried provenance is not; the carried
    non-clean protocol wins over the re-score's clean one."""
    model = "llava-hf/llava-v1.6-vicuna-7b-hf"
    results = {"settings": {"model": model, "mitigation": "none", "limit": None,
                            "backend": {"backend": "predictions_file"}},
               "benchmarks": {"mm_vishal:all": {"metrics": {}}}, "labels": {}, "protocol": {"name": "clean"},
               "scoring": {"upstream_compat": True},
               "provenance": {**CARRIED, "protocol": "medheval-baseline", "source_model": model,
                              "made_with": {"inputs": {"tokenization": "upstream_chunked"}}}}
    table = _close_ended(model, "none", Cell(), Cell(value=52.0))
    _, records = reproduction([table], runs=[Run(path=Path("r"), results=results)])
    record = next(r for r in records if r["table"] == "3")
    assert record["reasons"] == ["random weights", "fixture data", "--limit 8"]
    assert not record["comparable"] and record["difference"] is None
    conditions = RunConditions.of(results, ["mm_vishal:all"])
    assert (conditions.protocol, conditions.random_weights, conditions.limit) == ("medheval-baseline", True, 8)

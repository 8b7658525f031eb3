"""The "Run folders and full settings" section shows what tells runs apart: protocol, decoding (greedy, or
sampled with temperature and seed), max_new_tokens and the generation plan's layers, scoring
(``upstream_compat``), dtype and batch size; escaped in report.html."""

from __future__ import annotations

import html
import json
from pathlib import Path

from report_runs import write_run
from medheval.report.build import write_report
from medheval.report.tables import md_text


def _settings(folder: Path, backend: dict, **top: object) -> Path:
    results = json.loads((folder / "results.json").read_text())
    results["settings"]["backend"] = backend
    results["settings"]["generation"] = top.pop("generation", {"builtin": True})
    results.update(top)
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_runs_of_one_model_show_the_settings_they_differ_in(tmp_path: Path) -> None:
    clean = _settings(write_run(tmp_path / "clean", "none", [True, False, True]),
                      {"do_sample": False, "max_new_tokens": 64, "dtype": "float32", "batch_size": 8},
                      protocol={"name": "clean"}, scoring={"upstream_compat": False})
    paper = _settings(write_run(tmp_path / "paper", "none", [True, True, False]),
                      {"do_sample": True, "temperature": 0.7, "top_p": None, "seed": 3, "max_new_tokens": 64,
                       "dtype": "bfloat16", "batch_size": 4},
                      generation={"builtin": False, "fixed": {"max_new_tokens": 512}},
                      protocol={"name": "medheval-baseline"},
                      scoring={"upstream_compat": True, "judge": "<b>judge</b>"})
    written = write_report([clean, paper], tmp_path / "report", plots=False)
    markdown = Path(written["markdown"]).read_text()
    assert (f"- `m · none (clean)`: `m · none` ({clean}): protocol clean · greedy · max_new_tokens built-in per "
            f"answer type, else 64 · scoring medheval rules · dtype float32 · batch size 8") in markdown
    shown = (f"protocol medheval-baseline · sampled (temperature 0.7, seed 3) · max_new_tokens 64 · generation "
             f'{{"fixed":{{"max_new_tokens":512}}}} (no built-in table) · scoring upstream_compat · judge '
             f"<b>judge</b> · dtype bfloat16 · batch size 4")
    assert f"- `m · none (paper)`: `m · none` ({paper}): {md_text(shown)}" in markdown  # escaped: no raw <b>
    page = Path(written["html"]).read_text()
    assert f"<li>m · none (paper): m · none ({paper}): {html.escape(shown)}</li>" in page
    assert "<b>judge</b>" not in page

"""The single-file HTML report: escaping, no credentialed images, and a real headless Chromium run."""

import json
import os
import shutil

import pytest
from PIL import Image

from medheval.report.build import write_report
from medheval.report.html import _json_for_script
from report_runs import write_grid

PAYLOAD = "</script><script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\">"


@pytest.fixture
def report(tmp_path):
    """A grid (none/vcd, 20 close-ended + 2 credentialed open items each) with hostile predictions and images."""
    grid = write_grid(tmp_path / "grid", {"none": [True, False] * 10, "vcd": [True, True, False, True] * 5},
                      bleu=[10.0, 30.0], prompt=True)
    scored = grid / "vcd" / "scored.jsonl"
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    rows[0]["prediction"] = PAYLOAD
    scored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    images = tmp_path / "images"
    images.mkdir()
    for i in range(20):
        Image.new("RGB", (300, 200), (i * 10, 80, 120)).save(images / f"img{i}.png")
        Image.new("RGB", (300, 200), (200, 0, 0)).save(images / f"p{i}.jpg")
    out = tmp_path / "report"
    written = write_report([grid], out, thumbnails=True,
                           image_roots={"slake": str(images), "mimic_cxr": str(images)})
    return written, json.loads((out / "report.json").read_text())


def test_script_json_cannot_close_its_element():
    text = _json_for_script({"x": "</script><!--&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"x": "</script><!--&"}


def test_text_is_escaped_and_credentialed_images_never_embedded(report):
    written, _ = report
    page = written["html"].read_text()
    assert PAYLOAD not in page and "<b onmouseover" not in page
    assert "Content-Security-Policy" in page and "http://" not in page and "https://" not in page
    data = json.loads(page.split('id="sample-data">')[1].split("</script>")[0])
    thumbs = {row["id"]: "thumbnail" in row for row in data}
    assert thumbs["mm_vishal/slake/0"] and not thumbs["knowledge/open/0"]  # mimic_cxr: never embedded
    assert all(row["prompt"].startswith("Question ") for row in data)


def test_a_cell_without_an_interval_keeps_its_dagger_in_html(tmp_path):
    """BLEU over 2 items (10 and 30: 20.0) has no interval (fewer than 6 units): Markdown and HTML both show
    "20.0 †" beside the footer's "No interval (†)"; a cell with an interval shows none."""
    import re

    grid = write_grid(tmp_path / "grid", {"none": [True, False] * 10}, bleu=[10.0, 30.0])
    written = write_report([grid], tmp_path / "out", plots=False)
    page, markdown = written["html"].read_text(), written["markdown"].read_text()
    assert "| 20.0 † |" in markdown
    cells = re.findall(r'<td class="[a-z]*" title="[^"]*">([^<]*)</td>', page)
    assert "20.0 †" in cells and "No interval (†)" in page
    assert any(text.startswith("50.0 [") and "†" not in text for text in re.findall(r"<td[^>]*>([^<]*)</td>", page))


def test_a_mimic_shaped_image_of_a_non_credentialed_item_is_never_embedded(tmp_path):
    """A hostile run folder's SLAKE item naming a MIMIC-CXR file under the SLAKE root gets no thumbnail."""
    from medheval.report.html import _thumbnail

    name = "p19/p19999901/s59999901/f1c00001-00000000-00000000-00000000-00000001.jpg"
    (tmp_path / name).parent.mkdir(parents=True)
    Image.new("RGB", (30, 20), (200, 0, 0)).save(tmp_path / name)
    Image.new("RGB", (30, 20), (0, 200, 0)).save(tmp_path / "img0.png")
    item = {"id": "mm_vishal/slake/0", "source": "slake", "credentialed": False}
    assert _thumbnail({**item, "images": ["img0.png"]}, {"slake": str(tmp_path)}).startswith("data:image/png")
    assert _thumbnail({**item, "images": [name]}, {"slake": str(tmp_path)}) is None


def test_no_thumbnails_unless_asked(tmp_path):
    grid = write_grid(tmp_path / "grid", {"none": [True, False]})
    written = write_report([grid], tmp_path / "out", plots=False, image_roots={"slake": str(tmp_path)})
    assert "data:image/png" not in written["html"].read_text()


def test_report_in_headless_chromium(report, tmp_path):
    from cdp_browser import Browser, require_browser

    executable = require_browser()
    written, summary = report
    browser = Browser(executable)
    try:
        browser.open(written["html"].resolve().as_uri())
        assert browser.errors() == []
        keys = browser.evaluate("Array.from(document.querySelectorAll('table.paper')).map(t => t.dataset.table)")
        assert keys == [table["key"] for table in summary["tables"]]
        assert browser.evaluate("document.querySelectorAll('img.plot').length") == len(summary["plots"]) > 0
        rows = "document.querySelectorAll('#samples tr.sample').length"
        assert browser.evaluate(rows) == 44 and browser.evaluate("document.getElementById('shown').textContent") == "44"
        assert browser.evaluate("window.pwned === undefined")
        assert browser.evaluate("document.querySelectorAll('#samples img').length") == 40  # the slake thumbnails of both runs
        browser.evaluate("var s = document.getElementById('f-mitigation'); s.value = 'vcd';"
                         "s.dispatchEvent(new Event('change'))")
        assert browser.evaluate(rows) == 22
        browser.evaluate("var s = document.getElementById('f-correct'); s.value = 'wrong';"
                         "s.dispatchEvent(new Event('change'))")
        assert browser.evaluate(rows) == 5  # vcd: 15/20 right
        shot = browser.screenshot(tmp_path / "report.png")  # the artifact: tables, plots, a filtered list
        browser.evaluate("var s = document.getElementById('f-benchmark'); s.value = 'knowledge:open';"
                         "s.dispatchEvent(new Event('change'))")
        assert browser.evaluate(rows) == 0
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("MEDHEVAL_ARTIFACTS"):
            os.makedirs(os.environ["MEDHEVAL_ARTIFACTS"], exist_ok=True)
            shutil.copy(shot, os.path.join(os.environ["MEDHEVAL_ARTIFACTS"], "report_html.png"))
        assert browser.errors() == []
    finally:
        browser.close()

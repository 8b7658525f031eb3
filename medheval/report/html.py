"""One self-contained ``report.html``: tables, embedded PNG plots and a per-sample browser.

Nothing is fetched when it opens (a Content-Security-Policy forbids any network source; plots and
thumbnails are ``data:`` URIs; the script is inline vanilla JS). Every text is escaped: table cells
with :func:`html.escape`, the samples travel as JSON inside ``<script type="application/json">`` with
``<``, ``>`` and ``&`` written as ``\\u003c``… and are put on the page with ``textContent`` only, so a
prediction cannot inject markup. Images of credentialed items (MIMIC; ``is_credentialed`` or the
record's ``meta.credentialed``) are never embedded; other thumbnails only when asked for and the
source's image root is a local folder.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from medheval.run.outputs import atomic_write_text
from medheval.report.collect import (STACK_COLUMNS, Run, run_has_random_weights, run_labels, run_settings,
                                     software_stack)
from medheval.report.paper import Table, format_cell, sections
from medheval.report.tables import neutralise_bidi
from medheval.data.schema import is_credentialed

MAX_SAMPLES = 5000  # per report; the browser says when items were left out
FOLD_CAVEATS = 8  # caveats shown open; the rest fold into a <details> that says how many it holds
THUMBNAIL_PX = 128

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
p{overflow-wrap:anywhere}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #bbb;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee}.best{font-weight:bold;background:#e3f1e9}.worst{background:#fbe9e2}
.foot{font-size:12px;color:#555;margin:0 0 1.5em}.caveats li{color:#8a3b00;overflow-wrap:anywhere}.runs li{overflow-wrap:anywhere}
.legend{font-size:12px;color:#333;margin:0 0 .3em}.legend td{border:none;padding:0 .6em 0 0}
.legend td:last-child{font-family:monospace;word-break:break-all}.section-notes{border-top:1px solid #ccc}
#samples td{max-width:420px;white-space:pre-wrap;word-break:break-word}
img.plot{max-width:100%;border:1px solid #ddd;margin:.5em 0}
.filters label{margin-right:1em}
.banner{background:#fde8e8;border:2px solid #b42318;color:#7a1a12;padding:.6em 1em;font-weight:bold;margin:.5em 0 1em}
"""

_SCRIPT = r"""
(function () {
  var data = JSON.parse(document.getElementById('sample-data').textContent);
  var body = document.querySelector('#samples tbody');
  var shown = document.getElementById('shown');
  var filters = {benchmark: 'split', category: 'category', mitigation: 'mitigation', correct: 'correct'};
  function fill(name, key) {
    var select = document.getElementById('f-' + name), seen = {};
    data.forEach(function (s) {
      var v = String(s[key]);
      if (!seen[v]) { seen[v] = true; var o = document.createElement('option'); o.value = v; o.textContent = v; select.appendChild(o); }
    });
    select.addEventListener('change', render);
  }
  function cell(row, text) { var td = document.createElement('td'); td.textContent = text == null ? '' : String(text); row.appendChild(td); return td; }
  function render() {
    var query = document.getElementById('f-text').value.toLowerCase();
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var n = 0;
    data.forEach(function (s) {
      for (var name in filters) {
        var value = document.getElementById('f-' + name).value;
        if (value !== '*' && String(s[filters[name]]) !== value) { return; }
      }
      if (query && (s.prediction + ' ' + s.reference + ' ' + s.prompt + ' ' + s.id).toLowerCase().indexOf(query) < 0) { return; }
      n += 1;
      var row = document.createElement('tr');
      row.className = 'sample';
      ['id', 'split', 'category', 'model', 'mitigation', 'correct', 'prompt', 'prediction', 'reference'].forEach(function (k) { cell(row, s[k]); });
      var td = cell(row, '');
      if (s.thumbnail) { var img = document.createElement('img'); img.src = s.thumbnail; img.alt = s.id; td.appendChild(img); }
      body.appendChild(row);
    });
    shown.textContent = String(n);
  }
  Object.keys(filters).forEach(function (name) { fill(name, filters[name]); });
  document.getElementById('f-text').addEventListener('input', render);
  render();
})();
"""




def _json_for_script(value: Any) -> str:
    """JSON that cannot close its ``<script>`` element or open a comment."""
    return json.dumps(value, ensure_ascii=False).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _table_html(table: Table, footer: list[str] | None = None) -> str:
    """A table with short row labels, the legend of their full settings under it, then ``footer`` (the
    table's own lines; its whole footer when ``None``)."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in [*table.row_header, *(c.label for c in table.columns)])
    rows = []
    for labels, cells in table.rows:
        tds = "".join(f"<td>{e(table.shown(label))}</td>" for label in labels)
        tds += "".join(f'<td class="{cell.mark}"' + (f' title="{e(cell.note)}"' if cell.note else "")
                       + f">{e(format_cell(cell, markdown=False))}</td>" for cell in cells)
        rows.append(f"<tr>{tds}</tr>")
    foot = "".join(f"<div>{_text_html(line)}</div>" for line in (table.footer if footer is None else footer))
    legend = ""
    if table.labels:
        entries = "".join(f"<tr><td>{e(short)}</td><td>{e(spec)}</td></tr>" for spec, short in table.labels.items())
        legend = (f'<details class="legend" data-legend="{e(table.key)}"><summary>Mitigation settings '
                  f'({len(table.labels)} short labels)</summary><table>{entries}</table></details>')
    return (f'<h4>{e(table.title)}</h4><table class="paper" data-table="{e(table.key)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{legend}<div class="foot">{foot}</div>')


def _tables_html(tables: list[Table]) -> str:
    """The tables section by section (:func:`medheval.report.paper.sections`): the notes that tables of a
    section share are said once, under its last table."""
    e = html.escape
    parts = []
    for section in sections(tables):
        body = "".join(_table_html(table, footer) for table, footer in section.tables)
        notes = "".join(f"<div>{_text_html(line)}</div>" for line in section.notes)
        notes = f'<div class="foot section-notes"><b>Notes for the tables above</b>{notes}</div>' if notes else ""
        parts.append(f'<section class="tables"><h3>{e(section.title)}</h3>{body}{notes}</section>')
    return "".join(parts)


def _runs_html(runs: list[Run]) -> str:
    """The runs by short label (model · short mitigation · control, :func:`medheval.report.collect.run_labels`);
    their folders and full settings folded below."""
    e = html.escape
    labels = run_labels(runs)
    names = ", ".join(labels[id(run)] for run in runs)
    folders = "".join(f"<li>{e(labels[id(run)])}: {e(run.label)} ({e(str(run.path))}): {e(run_settings(run))}</li>"
                      for run in runs)
    return (f"<p>Runs ({len(runs)}): {e(names)}</p><details class='runs'><summary>Run folders and full "
            f"settings</summary><ul>{folders}</ul></details>")


def _text_html(text: str) -> str:
    """Escaped text with Markdown's inline code (`x`) shown as ``<code>`` (the notes are written for
    ``report.md`` too, so they carry backticks)."""
    parts = html.escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: shown as it is
        return html.escape(text)
    return "".join(f"<code>{part}</code>" if index % 2 else part for index, part in enumerate(parts))


def random_weight_banner(runs: list[Run]) -> str | None:
    """The warning a report of random-weight runs opens with (plain text; ``None`` when every run is real)."""
    labels = run_labels(runs)
    names = [labels[id(run)] for run in runs if run_has_random_weights(run)]
    if not names:
        return None
    return (f"Random weights: {', '.join(names)} {'has' if len(names) == 1 else 'have'} random weights. Their "
            "numbers test the pipeline and say nothing about any real model; do not compare or publish them.")


def _caveats_html(notes: list[str]) -> str:
    """The caveats as a list; beyond :data:`FOLD_CAVEATS` the rest fold into one ``<details>``."""
    if not notes:
        return ""
    e = html.escape
    shown = "".join(f"<li>{_text_html(n)}</li>" for n in notes[:FOLD_CAVEATS])
    rest = notes[FOLD_CAVEATS:]
    more = f"{len(rest)} more caveat{'' if len(rest) == 1 else 's'}"
    folded = (f"<details class='more-caveats'><summary>{more}</summary><ul class='caveats'>"
              + "".join(f"<li>{_text_html(n)}</li>" for n in rest) + "</ul></details>") if rest else ""
    return f"<h2>Caveats ({len(notes)})</h2><ul class='caveats'>{shown}</ul>{folded}"


def _banner_html(runs: list[Run]) -> str:
    banner = random_weight_banner(runs)
    return f'<div class="banner" role="alert">{html.escape(banner)}</div>' if banner else ""


def _credentialed(item: dict[str, Any]) -> bool:
    return bool(item.get("credentialed")) or is_credentialed(str(item.get("source") or ""))


def _thumbnail(item: dict[str, Any], image_roots: dict[str, str]) -> str | None:
    """A ``data:`` PNG of the item's first image when it is not credentialed, its name is not MIMIC-shaped
    (:func:`~medheval.data.images.looks_credentialed`: a SLAKE item of a hostile run folder naming a MIMIC-CXR
    file embeds nothing), and its source's root is a local folder holding it (a path escaping the root is
    refused)."""
    from medheval.data.images import looks_credentialed

    images, source = item.get("images") or [], str(item.get("source") or "")
    root = image_roots.get(source)
    if _credentialed(item) or not images or not root or "://" in root or not Path(root).is_dir():
        return None
    if looks_credentialed(str(images[0])):
        return None
    base = Path(root).resolve()
    path = (base / str(images[0])).resolve()
    if base not in path.parents or not path.is_file():
        return None
    from medheval.data.images import ImageDecodeError, check_pixels, open_image

    try:
        with open_image(path, f"image {path.name}") as image:
            check_pixels(image, f"image {path.name}")
            image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="PNG")
    except (OSError, ImageDecodeError):
        return None
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def samples(runs: list[Run], thumbnails: bool = False, image_roots: dict[str, str] | None = None) -> list[dict]:
    """The browser's rows: id, split, category, model, mitigation, correct, prompt, prediction, reference."""
    rows = []
    for run in runs:
        for item in run.items:
            correct = item.get("correct")
            rows.append({"id": item["id"], "split": item["split"], "category": item.get("category") or "–",
                         "model": run.model, "mitigation": run.variant,
                         "correct": "correct" if correct is True else "wrong" if correct is False else "not scored",
                         "prompt": item.get("prompt") or "(not logged)", "prediction": str(item.get("prediction", "")),
                         "reference": str(item.get("reference") or ""),
                         **({"thumbnail": thumb} if thumbnails and (thumb := _thumbnail(item, image_roots or {}))
                            else {})})
    return rows


def _stack_html(runs: list[Run]) -> str:
    """The "Software stack" section (:func:`medheval.report.collect.software_stack`); empty when no run records it."""
    e = html.escape
    rows = software_stack(runs)
    if not rows:
        return ""
    head = "".join(f"<th>{e(name)}</th>" for name in ("Runs", *STACK_COLUMNS))
    body = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in (label, *(stack[n] for n in STACK_COLUMNS)))
                   + "</tr>" for label, stack in rows)
    return f'<h2>Software stack</h2><table class="stack"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def write_html(runs: list[Run], tables: list[Table], figures: dict[str, Path], notes: list[str], path: str | Path,
               thumbnails: bool = False, image_roots: dict[str, str] | None = None) -> Path:
    """Write the single-file report; returns its path."""
    e = html.escape
    rows = samples(runs, thumbnails, image_roots)
    left_out = max(0, len(rows) - MAX_SAMPLES)
    rows = rows[:MAX_SAMPLES]
    plots = "".join(f'<figure><img class="plot" alt="{e(name)}" src="data:image/png;base64,'
                    f'{base64.b64encode(Path(file).read_bytes()).decode("ascii")}"><figcaption>{e(name)}</figcaption>'
                    f"</figure>" for name, file in figures.items())
    selects = "".join(f'<label>{label} <select id="f-{name}"><option value="*">all</option></select></label>'
                      for name, label in (("benchmark", "benchmark"), ("category", "category"),
                                          ("correct", "correctness"), ("mitigation", "mitigation")))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>MedHEval-HF report</title><style>{_STYLE}</style></head><body>
<h1>MedHEval-HF report</h1>
{_banner_html(runs)}
{_runs_html(runs)}
{_caveats_html(notes)}
{_stack_html(runs)}
<h2>Tables</h2>{_tables_html(tables) or "<p>No table: the runs hold no scored metric.</p>"}
<h2>Plots</h2>{plots or "<p>No plots (see the caveats).</p>"}
<h2>Samples</h2>
<div class="filters">{selects}<label>text <input id="f-text" type="search"></label>
<span><span id="shown">0</span> of {len(rows)} shown{f"; {left_out} more not included" if left_out else ""}</span></div>
<table id="samples"><thead><tr><th>id</th><th>benchmark</th><th>category</th><th>model</th><th>mitigation</th>
<th>correct</th><th>prompt</th><th>prediction</th><th>reference</th><th>image</th></tr></thead><tbody></tbody></table>
<script type="application/json" id="sample-data">{_json_for_script(rows)}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    atomic_write_text(path, neutralise_bidi(page))
    return Path(path)

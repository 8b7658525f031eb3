"""Markdown tables shaped like MedHEval's Table 3 (close-ended accuracy by hallucination category)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from medheval.run.control import control_of
from medheval.run.outputs import atomic_write_text
from medheval.data.schema import VISUAL_CATEGORIES

CATEGORY_COLUMNS = {"anatomy": "Acc-A", "measurement": "Acc-M", "symptom": "Acc-S", "radiology": "Acc-R"}


# bidirectional controls (embeddings, overrides, isolates, marks): a reply holding U+202E could show its text
# reversed, so the page shows each as a visible "[U+202E]" instead
_BIDI = {code: f"[U+{code:04X}]" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}


def neutralise_bidi(text: str) -> str:
    """``text`` with every bidirectional control character written as a visible ``[U+XXXX]``; applied to
    every file a reader opens (report.html whole, report.md, tables.csv, results.md), so every text the
    report shows (tables, legends, caveats, samples) is covered."""
    return text.translate(_BIDI)


def md_cell(text: Any) -> str:
    """Text safe in a Markdown table cell: HTML as entities (a model named ``<img onerror=...>`` shows as
    text), ``|`` escaped, newlines as spaces."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("\r", " ").replace("\n", " "))


def md_text(text: Any) -> str:
    """Text safe as a Markdown line or note (a caveat, footer, title), never a table cell: HTML as entities,
    newlines as spaces, ``[`` and ``]`` escaped (no link or image a run folder's text could plant,
    ``![x](https://...)``); backticks, emphasis and ``|`` are kept (an escaped ``\\|`` shows as such in a code
    span such as ``--p-adjust holm|bh|none``)."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", " ")
            .replace("\n", " ").replace("[", "\\[").replace("]", "\\]"))


def md_code(text: Any, cell: bool = False) -> str:
    """``text`` as one inline code span, whatever backticks it holds (the fence is longer than any run of
    them), newlines as spaces, and ``&``, ``<``, ``>`` as entities (shown as such: a code span is literal in
    Markdown, but a file with no raw tag is safe in any viewer); ``cell``: ``|`` escaped for a table cell."""
    body = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", " ").replace("\n", " ")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    span = f"{fence}{pad}{body}{pad}{fence}"
    return span.replace("|", "\\|") if cell else span


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.IGNORECASE)


def csv_cell(value: Any) -> Any:
    """A ``tables.csv`` cell a spreadsheet cannot run: text starting with ``= + - @``, tab or carriage return
    (a formula such as ``=HYPERLINK(...)`` from a model name) gets a leading ``'``; numbers, and text that is
    a number (``-0.05``, ``+1.2``), are kept."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def _row(cells: Iterable[Any]) -> str:
    """A table row; each cell as :func:`md_text` with ``|`` escaped (no raw HTML, link or image from a model or
    split name, no extra column)."""
    return "| " + " | ".join(md_text(cell).replace("|", "\\|") for cell in cells) + " |"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def close_ended_table(runs: Iterable[dict[str, Any]]) -> str:
    """One row per run (model + mitigation); per benchmark split: Acc-A/M/S/R (visual splits) and overall."""
    runs = list(runs)
    splits: list[str] = []
    for run in runs:
        for split, entry in run["benchmarks"].items():
            if "close_ended_accuracy" in entry["metrics"] and split not in splits:
                splits.append(split)
    if not splits:
        return ""
    header = ["Model", "Mitigation"]
    for split in splits:
        header += [f"{split} {CATEGORY_COLUMNS[c]}" for c in VISUAL_CATEGORIES if _has_category(runs, split, c)]
        header.append(f"{split} Acc")
    lines = [_row(header), "|" + "---|" * len(header)]
    for run in runs:
        row = [run["settings"]["model"], variant(run["settings"])]
        for split in splits:
            metric = run["benchmarks"].get(split, {}).get("metrics", {}).get("close_ended_accuracy")
            by_category = (metric or {}).get("accuracy_by_category", {})
            row += [_pct(by_category.get(c)) for c in VISUAL_CATEGORIES if _has_category(runs, split, c)]
            row.append(_pct(metric["accuracy"]) if metric else "–")
        lines.append(_row(row))
    return "\n".join(lines)


def _has_category(runs: list[dict[str, Any]], split: str, category: str) -> bool:
    return any(
        category in run["benchmarks"].get(split, {}).get("metrics", {}).get("close_ended_accuracy", {}).get(
            "accuracy_by_category", {})
        for run in runs
    )


# Open-ended columns, in the order of MedHEval's Table 5 (report metrics) then Table 7 (generation
# metrics), then the LLM-judge scores: (metric module, output key, column label, multiplier).
OPEN_ENDED_COLUMNS: tuple[tuple[str, str, str, float], ...] = (
    ("chexbert_similarity", "chexbert_similarity", "CheXbert", 100.0),
    ("radgraph_f1", "radgraph_f1", "RadGraph", 100.0),
    ("ratescore", "ratescore", "RaTEScore", 100.0),
    ("chair", "recall", "Recall", 100.0),
    ("chair", "chair", "CHAIR ↓", 100.0),
    ("text_generation", "bertscore", "BERTScore", 1.0),
    ("text_generation", "bleu", "BLEU", 1.0),
    ("text_generation", "meteor", "METEOR", 1.0),
    ("text_generation", "rouge1", "ROUGE-1", 1.0),
    ("text_generation", "rouge2", "ROUGE-2", 1.0),
    ("text_generation", "rougeL", "ROUGE-L", 1.0),
    ("sh_judge", "sh", "S_h ↓", 1.0),
    ("medihall_score", "medihall_score", "MediHall", 1.0),
    ("medihall_score", "accuracy", "ACC", 1.0),  # Med-HallMark's ACC (Table 1; 0–1, Med-VQA only, None for IRG)
    ("radcliq", "radcliq", "RadCliQ-v1 ↓", 1.0),  # an estimated error count, not a percentage
    ("green", "green", "GREEN", 100.0),
)
# Columns shown as "mean ± std" (the paper reports S_h so): (metric, key) -> the std key.
STD_OF: dict[tuple[str, str], str] = {("sh_judge", "sh"): "sh_std", ("radcliq", "radcliq"): "radcliq_std"}


def open_ended_table(runs: Iterable[dict[str, Any]]) -> str:
    """One row per (run, open-ended split); the columns any of them computed (scores in %, S_h on 0–5)."""
    runs = list(runs)
    present = [column for column in OPEN_ENDED_COLUMNS if any(
        isinstance(entry["metrics"].get(column[0], {}).get(column[1]), (int, float))
        for run in runs for entry in run["benchmarks"].values())]
    if not present:
        return ""
    header = ["Model", "Mitigation", "Split", *(label for _, _, label, _ in present)]
    lines = [_row(header), "|" + "---|" * len(header)]
    for run in runs:
        for split, entry in run["benchmarks"].items():
            if not any(metric in entry["metrics"] for metric, _, _, _ in present):
                continue
            cells = []
            for metric, key, _, scale in present:
                value = entry["metrics"].get(metric, {}).get(key)
                std = entry["metrics"].get(metric, {}).get(STD_OF.get((metric, key), ""))
                cell = f"{scale * value:.2f}" if isinstance(value, (int, float)) else "–"
                cells.append(f"{cell} ± {scale * std:.2f}" if isinstance(value, (int, float))
                             and isinstance(std, (int, float)) else cell)
            lines.append(_row([run["settings"]["model"], variant(run["settings"]), split, *cells]))
    return "\n".join(lines)


def counts_table(run: dict[str, Any]) -> str:
    """Per split: records, scored, empty predictions, unparsed predictions, unusable references, skipped
    images, flagged items."""
    header = ["Split", "Records", "With prediction", "Empty prediction", "Unparsed", "Bad reference",
              "Skipped (missing image)", "Flagged upstream"]
    lines = [_row(header), "|" + "---|" * len(header)]
    for split, entry in run["benchmarks"].items():
        metric = entry["metrics"].get("close_ended_accuracy", {})
        lines.append(_row([split, entry["n_records"], entry["n_scored"], entry.get("n_empty_predictions", "–"),
                           metric.get("n_unparsed", "–"),
                           metric.get("n_bad_reference", "–"), entry["skipped_missing_images"]["count"],
                           entry["data_quality"].get("n_flagged", 0)]))
    return "\n".join(lines)


def write_markdown(run: dict[str, Any], path: str | Path) -> None:
    """``results.md``: labels, the Table-3-shaped accuracy table, counts, data-quality flags. Every text from
    ``run`` (names, warnings, caveats, notes) is escaped (:func:`md_text`, :func:`md_code`): a hostile
    results.json plants no raw HTML, link or image."""
    parts = ["# MedHEval-HF results", ""]
    for label in run.get("labels", {}).values():
        parts += [f"> **{md_text(label)}**", ""]
    settings = run["settings"]
    parts += [f"Model: {md_code(settings['model'])} · mitigation: {md_code(settings['mitigation'])}"
              + (f" · image control: {md_code(control_of(settings))}" if control_of(settings) != "none" else ""), ""]
    parts += warnings_section(run.get("warnings", []))
    found = caveats(run)
    parts += ["## Caveats", "", *(f"- {md_text(line)}" for line in found), ""] if found else []
    parts += ["## How items were scored", "", *(f"- {line}" for line in scoring_lines(run)), ""]
    table = close_ended_table([run])
    if table:
        parts += ["## Close-ended accuracy (%)", "", table, ""]
    table = open_ended_table([run])
    if table:
        parts += ["## Open-ended metrics (CheXbert/RadGraph/RaTEScore/Recall/CHAIR in %, text metrics 0–100, "
                  "S_h 0–5, MediHall and ACC 0–1)", "", table, ""]
    table = stepbench_table([run])
    if table:
        parts += ["## Med-StepBench: recall and F1 (%) per step, hallucination = positive class", "", table, ""]
    table = clinhallu_stage_table([run])
    if table:
        parts += ["## ClinHallu: accuracy and stage hallucination rates (%) (its Table 2)", "", table, "",
                  *(md_text(line) for line in clinhallu_stage_notes(_clinhallu_results([run]))), ""]
        parts += ["## ClinHallu: gold-stage replacement, Δ (points) and Fix/Break (%) (its Table 3)", "",
                  clinhallu_replacement_table([run]), ""]
    notes = [f"- {md_code(split)} · {md_text(metric)}: {md_text(value)}" for split, entry in run["benchmarks"].items()
             for metric, out in entry["metrics"].items() if isinstance(out, dict)
             for key, value in sorted(out.items()) if value and key.endswith(("_unavailable_reason", "_note"))]
    if notes:
        parts += ["## Notes", "", *notes, ""]
    parts += ["## Counts", "", counts_table(run), ""]
    flags = {split: entry["data_quality"].get("flags", {}) for split, entry in run["benchmarks"].items()}
    if any(flags.values()):
        parts += ["## Upstream data-quality flags (kept as released, not re-labelled)", ""]
        for split, counts in flags.items():
            if counts:
                parts.append(f"- {md_code(split)}: " + ", ".join(f"{md_text(name)} × {md_text(n)}"
                                                                 for name, n in sorted(counts.items())))
        parts.append("")
    atomic_write_text(path, neutralise_bidi("\n".join(parts)))


def caveats(run: dict[str, Any]) -> list[str]:
    """What a reader of one run's numbers must know beyond its warnings: random weights, records scored
    without a prediction or an image, items a metric could not score, annotation files not checked
    against a pinned checksum (``medheval report`` lists the same lines)."""
    lines = []
    if (run.get("report") or {}).get("note"):
        lines.append(f"report: {run['report']['note']}")
    lines += provenance_caveats(run)
    upstream = bool((run.get("scoring") or {}).get("upstream_compat"))
    for split, entry in run.get("benchmarks", {}).items():
        missing = int(entry.get("n_records", 0)) - int(entry.get("n_scored", entry.get("n_records", 0)))
        if missing > 0:
            lines.append(f"`{split}`: {missing} of {entry['n_records']} record(s) have no prediction and are not scored")
        empty = entry.get("n_empty_predictions")
        if isinstance(empty, int) and empty:
            lines.append(empty_predictions_line(split, empty, entry.get("n_scored", entry.get("n_records")),
                                                upstream))
        skipped = (entry.get("skipped_missing_images") or {}).get("count", 0)
        if skipped:
            lines.append(f"`{split}`: {skipped} record(s) skipped for a missing image (--on-missing skip)")
        undecodable = (entry.get("skipped_undecodable_images") or {}).get("count", 0)
        if undecodable:
            lines.append(f"`{split}`: {undecodable} record(s) skipped for an undecodable image (corrupt, truncated or "
                         f"not an image; --on-missing skip)")
        for metric, out in entry.get("metrics", {}).items():
            failed = (out or {}).get("n_failed") if isinstance(out, dict) else None
            if isinstance(failed, int) and failed:
                lines.append(f"`{split}` · {metric}: {failed} item(s) could not be scored and are left out of "
                             f"its figures")
            for key, what in (("n_unparsed", "unparsed answer(s), counted wrong"),
                              ("n_bad_reference", "unusable reference(s)"),
                              ("n_empty_predictions", "empty prediction(s), scored 0")):
                if key == "n_empty_predictions" and isinstance(empty, int):
                    continue  # said once for the split above (results.json before it had the split's count)
                if isinstance(out, dict) and isinstance(out.get(key), int) and out[key]:
                    lines.append(f"`{split}` · {metric}: {out[key]} {what}")
            if metric == "text_generation" and isinstance(out, dict) and out.get("n_empty_references"):
                lines.append(f"`{split}` · {metric}: {out['n_empty_references']} item(s) without a reference, left "
                             f"out of every column (n = {out.get('n')})")
        unchecked = [f["relpath"] for f in entry.get("annotation_files", []) if f.get("verified") is None]
        if unchecked:
            lines.append(f"`{split}`: annotation file(s) not checked against a pinned checksum (user data or a Hub "
                         f"snapshot): {', '.join(unchecked[:3])}{' …' if len(unchecked) > 3 else ''}")
    return lines


def provenance_caveats(run: dict[str, Any]) -> list[str]:
    """The flags of the run's provenance (:func:`medheval.run.provenance.of_run`: its own settings and what a
    re-score carries from the answers it read) that its labels and warnings do not already state: random
    weights, fixture data, ``--limit``."""
    from medheval.run.provenance import FIXTURE_MARK, of_run

    found = of_run(run)
    lines = []
    if found["random_weights"] and not (run.get("labels") or {}).get("random_weights"):
        lines.append("the model has random weights: its numbers mean nothing")
    if found["fixture"] and not any(FIXTURE_MARK in str(warning) for warning in run.get("warnings") or []):
        lines.append("the answers were made on the embedded fixture (synthetic records), not the released data: "
                     "its numbers test the pipeline, they are not results")
    if found["limit"] is not None:
        lines.append(f"only the first {found['limit']} record(s) of each split were answered (--limit "
                     f"{found['limit']}): not a whole-split result")
    return lines


def empty_predictions_line(split: str, empty: int, scored: Any, upstream_compat: bool = False) -> str:
    """The caveat for a split's empty (or whitespace-only) predictions: they are scored, not skipped."""
    how = ("scored as the released scorers read them (MedHEval's yes/no scorer reads a blank answer as yes)"
           if upstream_compat else "scored as wrong/0, not skipped (close-ended: unparsed; text overlap: 0; each "
                                   "metric's card says how it reads a blank answer)")
    return f"`{split}`: {empty} of {scored} prediction(s) are empty; {how}"


# Keys of a metric's output that say how its items were scored (reported in results.md, with their values).
SCORING_MODE_KEYS = ("labeler", "variant", "prompt_style", "prompt_version", "mode", "stage_denominator",
                     "comparable")
LABELER_NOTE = {"chexpert_rules": "the offline rule labeler; the MedHEval paper labelled reports with CheXbert"}


def scoring_lines(run: dict[str, Any]) -> list[str]:
    """How one run's items were scored: ``upstream_compat``, the modes its metrics report (CHAIR's labeler and
    variant, the S_h prompt style, …), the judge, and every metric option that differs from its default; as
    Markdown lines, every value escaped (:func:`md_code`)."""
    scoring = run.get("scoring") or {}
    compat = bool(scoring.get("upstream_compat"))
    lines = [f"`upstream_compat={str(compat).lower()}`: "
             + ("the benchmarks' released scoring code where it differs from the papers" if compat
                else "the papers' definitions")]
    modes: dict[str, dict[str, list[str]]] = {}  # metric -> key -> distinct values over splits
    for entry in (run.get("benchmarks") or {}).values():
        for metric, out in (entry.get("metrics") or {}).items():
            for key in SCORING_MODE_KEYS:
                if isinstance(out, dict) and isinstance(out.get(key), (str, int, float, bool)):
                    values = modes.setdefault(metric, {}).setdefault(key, [])
                    if str(out[key]) not in values:
                        values.append(str(out[key]))
    for metric, keys in modes.items():
        described = []
        for key, values in keys.items():
            notes = [LABELER_NOTE[value] for value in values if key == "labeler" and value in LABELER_NOTE]
            described.append(f"{md_text(key)} {md_code(' / '.join(values))}"
                             + (f" ({md_text('; '.join(notes))})" if notes else ""))
        lines.append(f"{md_code(metric)}: " + ", ".join(described))
    judge = scoring.get("judge")
    if judge:
        lines.append(f"judge: {md_code(judge if isinstance(judge, str) else json.dumps(judge, sort_keys=True))}")
    options = scoring.get("non_default_options")
    if options is None:  # a run written before this was recorded: the options that were given
        options = scoring.get("metric_options") or {}
        label = "metric options given"
    else:
        label = "metric options that differ from the defaults"
    given = [md_code(f"{metric}.{key}={json.dumps(value)}") for metric, values in sorted(options.items())
             for key, value in sorted(values.items())]
    lines.append(f"{label}: " + (", ".join(given) if given else "none"))
    return lines


def warnings_section(warnings: Iterable[str]) -> list[str]:
    """``## Warnings``: what the run survived but a reader must know (modified annotation files,
    records without a prediction, prediction ids matching no record), each escaped (:func:`md_text`);
    nothing when there is none."""
    return _section("Warnings", [md_text(text) for text in warnings])


def _section(title: str, lines: Iterable[str]) -> list[str]:
    """``## title`` and one bullet per line (lines already Markdown-safe); nothing when there is none."""
    lines = list(lines)
    return [f"## {title}", "", *(f"- {line}" for line in lines), ""] if lines else []


def grouped(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """``(run, text)`` pairs as one line per distinct text, naming the runs it applies to (a warning that
    every mitigation of a grid shares is said once)."""
    runs: dict[str, list[str]] = {}
    for run, text in pairs:
        runs.setdefault(text, [])
        if run not in runs[text]:
            runs[text].append(run)
    return [f"{', '.join(names)}: {text}" for text, names in runs.items()]


def variant(settings: dict[str, Any]) -> str:
    """The Mitigation column: the mitigation, with a blind run's control appended (``none · no_image``,
    :mod:`medheval.run.control`) and a seeded pass's seed (``none · seed 1``, :mod:`medheval.run.seeds`)."""
    control = control_of(settings)
    text = str(settings["mitigation"]) if control == "none" else f"{settings['mitigation']} · {control}"
    return text if settings.get("seed") is None else f"{text} · seed {settings['seed']}"  # a pass of --seeds


def _cell(settings: dict[str, Any]) -> str:
    """A grid cell as warnings and caveats name it: the mitigation, and a blind run's control
    (```none` · `no_image```)."""
    control = control_of(settings)
    seed = "" if settings.get("seed") is None else f" · seed {md_text(settings['seed'])}"
    return md_code(settings["mitigation"]) + ("" if control == "none" else f" · {md_code(control)}") + seed


def write_grid_markdown(runs: list[dict[str, Any]], path: str | Path, heading: str = "mitigations") -> None:
    """The combined ``results.md`` of several runs (mitigations, or models × mitigations of a grid
    config): one row per run, same columns; mitigations by short label (method and preset,
    :func:`medheval.report.collect.mitigation_labels`), their full settings listed under "Mitigation settings"."""
    from medheval.report.collect import mitigation_labels

    short = mitigation_labels(str(run["settings"]["mitigation"]) for run in runs)
    legend = [f"- {md_code(label)}: {md_code(spec)}" for spec, label in short.items() if label != spec]
    runs = [{**run, "settings": {**run["settings"], "mitigation": short[str(run["settings"]["mitigation"])]}}
            for run in runs]
    parts = [f"# MedHEval-HF results: {heading} side by side", ""]
    labels = {label for run in runs for label in run.get("labels", {}).values()}
    parts += [line for label in sorted(labels) for line in (f"> **{md_text(label)}**", "")]
    parts += _section("Warnings", grouped((f"{md_code(run['settings']['model'])} · {_cell(run['settings'])}",
                                           md_text(text)) for run in runs for text in run.get("warnings", [])))
    parts += _section("Caveats", grouped((_cell(run["settings"]), md_text(line)) for run in runs
                                         for line in caveats(run)))
    scoring = grouped((f"{md_code(run['settings']['model'])} · {_cell(run['settings'])}", line)
                      for run in runs for line in scoring_lines(run))
    parts += ["## How items were scored", "", *(f"- {line}" for line in scoring), ""]
    notes = {"ClinHallu: Acc and stage hallucination rates (%)": clinhallu_stage_notes(_clinhallu_results(runs))}
    for title, table in (("Close-ended accuracy (%)", close_ended_table(runs)),
                         ("Open-ended metrics", open_ended_table(runs)),
                         ("Med-StepBench: recall and F1 (%) per step", stepbench_table(runs)),
                         ("ClinHallu: Acc and stage hallucination rates (%)", clinhallu_stage_table(runs)),
                         ("ClinHallu: Δ (points) and Fix/Break (%)", clinhallu_replacement_table(runs)),
                         ("ClinHallu: Δ (points) averaged over models, Eq. 14 (its Table 4)",
                          clinhallu_average_table(runs))):
        if table:
            parts += [f"## {title}", "", table, ""]
            parts += [*(md_text(line) for line in notes[title]), ""] if notes.get(title) else []
    parts += ["## Mitigation settings", "", *legend, ""] if legend else []
    parts += ["Per-mitigation details (counts, notes, data quality): the `results.md` in each sub-folder.", ""]
    atomic_write_text(path, neutralise_bidi("\n".join(parts)))


# Med-StepBench, shaped like its Table 3: recall and F1 (hallucination = positive class) per step,
# English and Vietnamese side by side, one row per model × knowledge setting.
STEPBENCH_STEPS = (1, 2, 3, 4)
STEPBENCH_LANGUAGES = ("en", "vi")


def stepbench_rows(runs: Iterable[dict[str, Any]]) -> list[tuple[str, str, str, dict[str, dict]]]:
    """(model, mitigation, knowledge, {language: per_step, "n_unparsed": int}) for runs with ``stepbench`` results."""
    rows: list[tuple[str, str, str, dict[str, dict]]] = []
    for run in runs:
        for entry in run["benchmarks"].values():
            metric = entry.get("metrics", {}).get("stepbench")
            if not metric:
                continue
            knowledge = str(entry.get("run_options", {}).get("knowledge", "none"))
            key = (run["settings"]["model"], variant(run["settings"]), knowledge)
            found = next((row for row in rows if row[:3] == key), None)
            if found is None:
                found = (*key, {})
                rows.append(found)
            for language, summary in (metric.get("by_language") or {}).items():
                found[3][language] = summary.get("per_step", {})
            found[3]["n_unparsed"] = found[3].get("n_unparsed", 0) + int(metric.get("n_unparsed", 0))
    return rows


def stepbench_shows(knowledge: str, step: int) -> bool:
    """Whether a Table 3 cell of ``step`` is shown in a row of this ``knowledge`` setting: Step 1 has no
    with-knowledge variant (its prompts take no knowledge, ``KNOWLEDGE_STEPS``), so the paper prints "–"."""
    return knowledge == "none" or step != 1


STEPBENCH_STEP1_NOTE = ("Step 1 takes no prior or external knowledge (knowledge goes to steps 2–4 only), so its "
                        "cells in rows with knowledge are –, as in Med-StepBench Table 3.")


def stepbench_table(runs: Iterable[dict[str, Any]]) -> str:
    """R and F1 (%) per step S1–S4 × EN/VI, one row per model × knowledge setting ("–": not run, or Step 1 in
    a row with knowledge, :func:`stepbench_shows`)."""
    rows = stepbench_rows(runs)
    if not rows:
        return ""
    header = ["Model", "Mitigation", "Knowledge"] + [
        f"{language.upper()} S{step} {what}" for language in STEPBENCH_LANGUAGES
        for step in STEPBENCH_STEPS for what in ("R", "F1")] + ["Unparsed"]
    lines = [_row(header), "|" + "---|" * len(header)]
    for model, mitigation, knowledge, by_language in rows:
        cells = []
        for language in STEPBENCH_LANGUAGES:
            per_step = by_language.get(language, {})
            for step in STEPBENCH_STEPS:
                scores = (per_step.get(step) or per_step.get(str(step))) if stepbench_shows(knowledge, step) else None
                cells += [_pct(scores["recall"]) if scores else "–", _pct(scores["f1"]) if scores else "–"]
        cells.append(str(by_language.get("n_unparsed", 0)))
        lines.append(_row([model, mitigation, knowledge, *cells]))
    if any(knowledge != "none" for _, _, knowledge, _ in rows):
        lines += ["", STEPBENCH_STEP1_NOTE]
    return "\n".join(lines)


# ClinHallu, shaped like its Table 2 (accuracy and stage hallucination rates) and Table 3 (accuracy
# and the change Δ when gold stages replace the model's), plus Fix/Break per replacement setting;
# one row per model × split × source ("all" = the split's items together).
CLINHALLU_REPLACEMENTS = (("rep_v", "Rep-V"), ("rep_k", "Rep-K"), ("rep_vk", "Rep-VK"))


# how each stage_denominator of metrics/clinhallu reads H^V/H^K/H^R (said under the tables that show them)
CLINHALLU_STAGE_NOTES = {
    "all_items": "H^V, H^K, H^R as the paper's Eq. 13: over all items, a stage that is empty, invalid or unjudged "
                 "counted as hallucinated (stage_denominator=all_items)",
    "judged": "H^V, H^K, H^R over the judged stages only, an empty, invalid or unjudged stage left out "
              "(stage_denominator=judged; the paper's Eq. 13 divides by all items)",
}


def clinhallu_stage_denominator(metric: dict[str, Any]) -> str:
    """The stage denominator a ``metrics/clinhallu`` result used: its ``stage_denominator``; results written
    before that key existed divided by the judged stages, or by all items under ``upstream_compat``."""
    recorded = metric.get("stage_denominator")
    if recorded in CLINHALLU_STAGE_NOTES:
        return str(recorded)
    return "all_items" if metric.get("denominator") == "valid_only" else "judged"


def clinhallu_stage_notes(results: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per stage denominator that ClinHallu ``results`` ((label, metric) pairs) used, naming the
    labels of each when they differ; for under the H^V/H^K/H^R table."""
    used: dict[str, list[str]] = {}
    for label, metric in results:
        used.setdefault(clinhallu_stage_denominator(metric), []).append(label)
    if not used:
        return []
    if len(used) == 1:
        return [CLINHALLU_STAGE_NOTES[next(iter(used))] + "."]
    return [f"{CLINHALLU_STAGE_NOTES[mode]}: {', '.join(names)}." for mode, names in used.items()]


def _clinhallu_results(runs: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{model} · {split}", metric) for model, split, source, metric in clinhallu_rows(runs) if source == "all"]


def _signed_pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:+.1f}"


def clinhallu_rows(runs: Iterable[dict[str, Any]]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(model, split, source, metrics) for runs with ``clinhallu`` results: the whole split first, then per source."""
    rows: list[tuple[str, str, str, dict[str, Any]]] = []
    for run in runs:
        for split, entry in run["benchmarks"].items():
            metric = entry.get("metrics", {}).get("clinhallu")
            if not metric:
                continue
            model = run["settings"]["model"]
            rows.append((model, split, "all", metric))
            rows += [(model, split, source, sub) for source, sub in sorted((metric.get("per_source") or {}).items())]
    return rows


def _clinhallu_table(runs: Iterable[dict[str, Any]], columns: list[tuple[str, Any]]) -> str:
    rows = clinhallu_rows(runs)
    if not rows:
        return ""
    header = ["Model", "Split", "Source", "n"] + [title for title, _ in columns]
    lines = [_row(header), "|" + "---|" * len(header)]
    for model, split, source, metric in rows:
        cells = [cell(metric) for _, cell in columns]
        lines.append(_row([model, split, source, str((metric.get("counts") or {}).get("n", "–")), *cells]))
    return "\n".join(lines)


def clinhallu_stage_table(runs: Iterable[dict[str, Any]]) -> str:
    """ClinHallu Table 2: ORG accuracy and H^V (VR in Rep-K), H^K (KR in Rep-V), H^R (reasoning in Rep-VK), %."""
    return _clinhallu_table(runs, [("Acc", lambda m: _pct(m.get("acc"))), ("H^V", lambda m: _pct(m.get("h_v"))),
                                   ("H^K", lambda m: _pct(m.get("h_k"))), ("H^R", lambda m: _pct(m.get("h_r")))])


def clinhallu_replacement_table(runs: Iterable[dict[str, Any]]) -> str:
    """ClinHallu Table 3: ORG accuracy and Δ^V, Δ^K, Δ^VK (setting minus ORG, points), then Fix/Break (%)
    per replacement setting (Fix = ORG wrong → right, over ORG wrong; Break = ORG right → wrong, over ORG right)."""
    columns: list[tuple[str, Any]] = [("Acc", lambda m: _pct(m.get("acc")))]
    columns += [(f"Δ^{label[4:]}", lambda m, key=key: _signed_pct(m.get(f"delta_{key[4:]}")))
                for key, label in CLINHALLU_REPLACEMENTS]
    for key, label in CLINHALLU_REPLACEMENTS:
        columns += [(f"{label} Fix", lambda m, key=key: _pct((m.get("fix_rate") or {}).get(key))),
                    (f"{label} Break", lambda m, key=key: _pct((m.get("break_rate") or {}).get(key)))]
    return _clinhallu_table(runs, columns)


# ClinHallu Table 4: the Δ of Table 3 averaged over models (Eq. 14), per mitigation × split × source.
CLINHALLU_DELTAS = tuple(f"delta_{key[4:]}" for key, _ in CLINHALLU_REPLACEMENTS)


def clinhallu_model_average(runs: Iterable[dict[str, Any]]
                            ) -> list[tuple[str, str, str, list[str], dict[str, tuple[float | None, int]]]]:
    """(mitigation, split, source, models, {delta_v/delta_k/delta_vk: (mean, k)}) where at least two models
    ran the split: ClinHallu Eq. 14, Δ^s = (1/|M|) Σ_m (Acc_m^s − Acc_m^ORG), the mean of each model's
    ``delta_*`` over the k models that have it (a model that did not run setting s has none). Sources are
    listed for a split with more than one ("all" = the split's items together)."""
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for run in runs:
        for split, entry in run["benchmarks"].items():
            metric = entry.get("metrics", {}).get("clinhallu")
            if not metric:
                continue
            mitigation = str(run["settings"].get("mitigation", "none"))
            per_source = sorted((metric.get("per_source") or {}).items())
            parts = [("all", metric)] + (per_source if len(per_source) > 1 else [])
            for source, part in parts:
                groups.setdefault((mitigation, split, source), {}).setdefault(str(run["settings"]["model"]), part)
    rows = []
    for (mitigation, split, source), by_model in groups.items():
        if len(by_model) < 2:
            continue
        means: dict[str, tuple[float | None, int]] = {}
        for key in CLINHALLU_DELTAS:
            values = [float(m[key]) for m in by_model.values() if isinstance(m.get(key), (int, float))
                      and not isinstance(m.get(key), bool) and math.isfinite(m[key])]
            # rounded to 12 places (+ 0.0 turns -0.0 into 0.0): float noise must not print as "-0.0"
            means[key] = (round(math.fsum(values) / len(values), 12) + 0.0 if values else None, len(values))
        rows.append((mitigation, split, source, sorted(by_model), means))
    return rows


def clinhallu_average_table(runs: Iterable[dict[str, Any]]) -> str:
    """ClinHallu Table 4: model-averaged Δ^V, Δ^K, Δ^VK (points, Eq. 14), one row per mitigation × split ×
    source where two or more models ran; "" when none."""
    rows = clinhallu_model_average(runs)
    if not rows:
        return ""
    header = ["Mitigation", "Split", "Source", "Models"] + [f"Δ^{label[4:]}" for _, label in CLINHALLU_REPLACEMENTS]
    lines = [_row(header), "|" + "---|" * len(header)]
    for mitigation, split, source, models, means in rows:
        cells = [_signed_pct(mean) + ("" if k == len(models) or mean is None else f" ({k} of {len(models)})")
                 for mean, k in (means[key] for key in CLINHALLU_DELTAS)]
        lines.append(_row([mitigation, split, source, f"{len(models)}: {', '.join(models)}", *cells]))
    return "\n".join(lines)


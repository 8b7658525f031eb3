"""``medheval report RUN_DIR... --output DIR``: tables (Markdown, CSV, JSON), plots and one HTML file.

Writes ``report.md``, ``tables.csv`` (one tidy row per cell), ``report.json`` (tables, comparisons,
notes), ``plots/*.png`` and ``report.html`` (self-contained); ``--compare-published`` adds the Reproduction
table (:mod:`medheval.report.published`). Plots need matplotlib (the ``report``
extra); without it the report is written without them and says so.

The output folder is replaced as a whole (:func:`write_report`): everything is built in a staging folder
beside it, then put in its place in one rename, under the folder's lock (``.medheval.lock``, as a run
holds). A kill leaves the old report or the new one, never new tables beside an old ``report.html``; a
second report into the same folder refuses at once, or waits ``--lock-timeout`` seconds. A folder that
holds anything but a report's files is refused, untouched.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import quote

if TYPE_CHECKING:  # imported when a report is written, so `medheval --help` stays fast
    from medheval.report.collect import Run


def caveats(runs: list["Run"]) -> list[str]:
    """What a reader must know about the runs: labels (random weights), warnings, unread parts; each line
    names the runs it applies to by their short labels (:func:`medheval.report.collect.run_labels`)."""
    from medheval.report.collect import run_labels
    from medheval.report.tables import caveats as run_caveats

    names = run_labels(runs)
    lines: list[str] = []
    per_run: dict[str, list[int]] = {}  # a warning or caveat -> the runs it applies to (said once)
    for index, run in enumerate(runs):
        for label in run.results.get("labels", {}).values():
            if f"{label}" not in lines:
                lines.append(str(label))
        for text in [*run.results.get("warnings", []), *run_caveats(run.results)]:
            if index not in per_run.setdefault(str(text), []):
                per_run[str(text)].append(index)
        lines += run.notes
    for text, indices in per_run.items():
        scope = ("all runs" if len(runs) > 1 and len(indices) == len(runs)
                 else ", ".join(dict.fromkeys(names[id(runs[i])] for i in indices)))
        lines.append(f"{text} ({scope})")
    if any(item.get("credentialed") for run in runs for item in run.items):
        lines.append("Some items derive from credentialed data (MIMIC, PhysioNet agreement): keep this report "
                     "under the same terms; images of those items are never embedded.")
    return lines


def with_seeds(tables: list[Any]) -> list[Any]:
    """``tables`` and, where runs were sampled with several seeds, the over-seeds table
    (:func:`medheval.report.seeds.over_seeds`: mean and spread over seeds beside the interval over items)."""
    from medheval.report.seeds import over_seeds

    table = over_seeds(tables)
    return tables + [table] if table is not None else tables


def plots_unavailable() -> str | None:
    """Why there can be no plots (matplotlib, an optional extra, is missing), or ``None``."""
    try:
        importlib.import_module("medheval.report.plots")
    except ImportError as error:
        return f"plots left out: {error} (pip install 'medheval[report]')"
    return None


def _plots(runs: list["Run"], folder: Path, p_adjust: str = "holm") -> tuple[dict[str, Path], str | None]:
    """The figures, or none and why (the tables never depend on matplotlib)."""
    note = plots_unavailable()
    if note:
        return {}, note
    from medheval.report.plots import write_plots

    return write_plots(runs, folder, p_adjust), None


def write_run_report(output: str | Path, results: dict[str, Any], cluster: str = "auto",
                     p_adjust: str = "holm", compare_published: bool = False) -> str | None:
    """``report.html`` for the run (or grid) just written into ``output``; ``results`` is its results.json
    content (``{"runs": [...]}`` for a grid); ``cluster``, ``p_adjust`` and ``compare_published`` (the
    Reproduction table) as in :func:`write_report`. Never
    raises: the run's results are already on disk, so a problem is returned as a one-line note (``None`` when
    all went well)."""
    import tempfile

    from medheval.report.collect import Run, find_runs, read_items
    from medheval.report.html import write_html
    from medheval.report.paper import build_tables

    output = Path(output)
    try:
        if "runs" in results:
            runs = find_runs([output], cluster=cluster)
        else:
            notes: list[str] = []
            runs = [Run(path=output, results=results, items=read_items(output, results, notes), notes=notes,
                        cluster=cluster)]
        with tempfile.TemporaryDirectory(prefix="medheval-plots-") as folder:
            figures, note = _plots(runs, Path(folder), p_adjust)
            notes = caveats(runs)
            notes += [note] if note and not any(note in line for line in notes) else []
            tables = with_seeds(build_tables(runs, p_adjust))
            if compare_published:
                _reproduction(tables, runs)
            write_html(runs, tables, figures, notes, output / "report.html")
        return None
    except Exception as error:  # noqa: BLE001 - the run succeeded; its report must not undo that
        return (f"report.html not written ({type(error).__name__}: {error}); "
                f"try `medheval report {output} --output DIR`")


REPORT_FILES = frozenset({"report.md", "tables.csv", "report.json", "report.html", "plots", ".medheval.lock"})


def write_report(paths: Sequence[str | Path], output: str | Path, plots: bool = True, html: bool = True,
                 thumbnails: bool = False, image_roots: dict[str, str] | None = None,
                 runs: "list[Run] | None" = None, cluster: str = "auto",
                 compare_published: bool = False, p_adjust: str = "holm", lock_timeout: float = 0.0) -> dict[str, Any]:
    """Read the run folders under ``paths`` and write the report into ``output``, replacing it whole (module
    docstring); returns what was written. Arguments as in :func:`build_report`; ``lock_timeout``: seconds to
    wait for another report into ``output``."""
    from medheval.run.outputs import OutputLock, is_orphan, remove_stale_staging, replace_folder, staging_folder

    output = Path(output)
    if output.is_symlink():
        raise ValueError(f"--output {output} is a symbolic link; the report replaces its folder whole: give the "
                         "real folder")
    foreign = sorted(path.name for path in output.iterdir()
                     if path.name not in REPORT_FILES and not is_orphan(path)) if output.is_dir() else []
    if foreign:
        raise ValueError(f"--output {output} holds files that are not a report's ({', '.join(foreign[:5])}"
                         f"{' ...' if len(foreign) > 5 else ''}); the report replaces its folder whole: give an "
                         "empty or report-only folder")
    if runs is None:  # read first: a wrong run path fails before the output folder (and its lock) is created
        from medheval.report.collect import find_runs

        runs = find_runs(paths, cluster=cluster)
    with OutputLock(output, timeout=lock_timeout, purpose="report"):
        remove_stale_staging(output.parent, output.name)  # what a killed report left beside it
        stage = staging_folder(output)
        try:
            written = build_report(paths, stage, plots=plots, html=html, thumbnails=thumbnails,
                                   image_roots=image_roots, runs=runs, cluster=cluster,
                                   compare_published=compare_published, p_adjust=p_adjust,
                                   final_output=output)
            # the new folder's lock file, held across the swap: a report waiting on the old one locks it next
            with OutputLock(stage, purpose="report"):
                replace_folder(stage, output)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return {kind: _moved(value, stage, output) for kind, value in written.items()}


def _moved(value: Any, stage: Path, output: Path) -> Any:
    """A path (or ``{name: path}``) under ``stage`` as the same path under ``output``."""
    if isinstance(value, Path) and value.is_relative_to(stage):
        return output / value.relative_to(stage)
    if isinstance(value, dict):
        return {key: _moved(item, stage, output) for key, item in value.items()}
    return value


def build_report(paths: Sequence[str | Path], output: str | Path, plots: bool = True, html: bool = True,
                 thumbnails: bool = False, image_roots: dict[str, str] | None = None,
                 runs: "list[Run] | None" = None, cluster: str = "auto",
                 compare_published: bool = False, p_adjust: str = "holm",
                 final_output: str | Path | None = None) -> dict[str, Any]:
    """Read the run folders under ``paths`` and write the report into ``output``; returns what was written.
    ``final_output``: where ``output`` will be moved (:func:`write_report`), for the paths ``report.json`` gives.

    ``cluster``: ``auto`` resamples each split's clusters (the unit its benchmark declares), ``none`` items
    (the intervals of reports before clustering); it applies to ``runs`` read here, not to ``runs`` given.
    ``compare_published``: add the "Reproduction" table (:func:`medheval.report.published.reproduction`).
    ``p_adjust``: how each comparison table's p-values are adjusted as one family: ``holm`` (default), ``bh``
    or ``none`` (:func:`medheval.report.stats.adjust_p`)."""
    from medheval.run.outputs import atomic_write_text
    from medheval.report.tables import md_code, md_text, neutralise_bidi
    from medheval.report.collect import find_runs, run_labels, run_settings, software_stack
    from medheval.report.paper import build_tables, comparisons, image_deltas, sections_markdown, to_csv, to_json

    runs = find_runs(paths, cluster=cluster) if runs is None else runs
    output = Path(output)
    tables = with_seeds(build_tables(runs, p_adjust))
    reproduced = _reproduction(tables, runs) if compare_published else None
    _, compared = comparisons(runs, p_adjust)
    _, blind = image_deltas(runs, p_adjust)
    notes = caveats(runs)
    figures, plot_note = _plots(runs, output / "plots", p_adjust) if plots else ({}, None)
    if plot_note:
        notes.append(plot_note)
    names = run_labels(runs)
    from medheval.report.html import random_weight_banner

    banner = random_weight_banner(runs)
    # every text from a run folder (names, paths, settings, warnings) is escaped where it is written
    header = ["# MedHEval-HF report", "", *([f"> **⚠ {md_text(banner)}**", ""] if banner else []),
              "Runs: " + ", ".join(md_code(names[id(run)]) for run in runs), ""]
    header += ["Run folders and full settings:", "", *(f"- {md_code(names[id(run)])}: {md_code(run.label)} "
                                                       f"({md_text(run.path)}): {md_text(run_settings(run))}"
                                                       for run in runs), ""]
    header += ["## Caveats", "", *(f"- {md_text(line)}" for line in notes), ""] if notes else []
    header += usage_section(runs)
    header += stack_section(runs)
    markdown = "\n".join(header) + "\n" + sections_markdown(tables)
    markdown += "".join(f"\n![{md_text(name)}](plots/{quote(path.name)})\n" for name, path in figures.items())
    atomic_write_text(output / "report.md", neutralise_bidi(markdown))
    atomic_write_text(output / "tables.csv", neutralise_bidi(to_csv(tables)))
    summary = {"runs": [{"path": str(run.path), "model": run.model, "mitigation": run.mitigation,
                         **({"control": run.control} if run.control != "none" else {}),
                         **({"usage": run.results["usage"]} if run.results.get("usage") else {}),
                         **({"versions": run.versions} if run.versions else {})} for run in runs],
               "software_stack": [{"runs": label, "versions": versions} for label, versions in software_stack(runs)],
               "caveats": notes, "tables": [to_json(table) for table in tables], "comparisons": compared,
               **({"image_deltas": blind} if blind else {}),
               "plots": {name: str(_moved(path, output, Path(final_output or output))) for name, path in figures.items()},
               **({"reproduction": reproduced} if reproduced is not None else {})}
    atomic_write_text(output / "report.json", json.dumps(summary, indent=2, default=str))
    written = {"markdown": output / "report.md", "csv": output / "tables.csv", "json": output / "report.json",
               "plots": figures, "plot_note": plot_note}
    if html:
        from medheval.report.html import write_html

        written["html"] = write_html(runs, tables, figures, notes, output / "report.html",
                                     thumbnails=thumbnails, image_roots=image_roots or {})
    return written


def _reproduction(tables: list[Any], runs: list["Run"]) -> list[dict[str, Any]]:
    """Append the "Reproduction" table to ``tables`` (each row's comparability read from its run); its rows
    as JSON records (``report.json``)."""
    from medheval.report.published import reproduction

    table, records = reproduction(tables, runs=runs)
    tables.append(table)
    return records


USAGE_COLUMNS = ("requests", "cached", "failures", "retries", "input_tokens", "output_tokens")


def usage_section(runs: Sequence["Run"]) -> list[str]:
    """``## API usage``: requests, cache hits, failures, retries and tokens of runs whose model answered over
    an API (``results.json["usage"]``); nothing when no run did."""
    from medheval.report.tables import md_cell, md_code

    rows = [(run, run.results["usage"]) for run in runs if isinstance(run.results.get("usage"), dict)]
    if not rows:
        return []
    lines = ["## API usage (model under test)", "", "| Run | " + " | ".join(USAGE_COLUMNS) + " |",
             "|" + "---|" * (len(USAGE_COLUMNS) + 1)]
    lines += [f"| {md_code(run.label, cell=True)} | " + " | ".join(md_cell(usage.get(key, "–"))
                                                                  for key in USAGE_COLUMNS) + " |" for run, usage in rows]
    return lines + [""]


def stack_section(runs: Sequence["Run"]) -> list[str]:
    """``## Software stack``: one line when all runs share one stack, else a table with a row per run."""
    from medheval.report.collect import STACK_COLUMNS, software_stack
    from medheval.report.tables import md_cell, md_code, md_text

    rows = software_stack(runs)
    if not rows:
        return []
    if len(rows) == 1 and rows[0][0] == "all runs":
        return ["## Software stack", "", "All runs: " + " · ".join(md_text(f"{name} {version}")
                                                                  for name, version in rows[0][1].items()), ""]
    lines = ["## Software stack", "", "| Run | " + " | ".join(STACK_COLUMNS) + " |",
             "|" + "---|" * (len(STACK_COLUMNS) + 1)]
    lines += [f"| {md_code(label, cell=True)} | " + " | ".join(md_cell(stack[name]) for name in STACK_COLUMNS)
              + " |" for label, stack in rows]
    return lines + [""]


def add_report_command(commands: argparse._SubParsersAction) -> None:
    """``medheval report RUN_DIR... --output DIR``."""
    from medheval.run.options import seconds_argument

    parser = commands.add_parser("report", help="tables with intervals, plots and one HTML file from run folders")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, mitigation grids, or folders of them")
    parser.add_argument("--output", required=True, help="folder for report.md/.json/.html, tables.csv, plots/")
    parser.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    parser.add_argument("--lock-timeout", type=seconds_argument, default=0.0, metavar="SECONDS",
                        help="another report into --output holds it: wait up to SECONDS (default 0: refuse at "
                             "once). The folder is built aside and replaced in one rename")
    parser.add_argument("--no-html", action="store_true", help="no report.html")
    parser.add_argument("--thumbnails", action="store_true",
                        help="embed thumbnails of non-credentialed images found under a local --image-root "
                             "(never MIMIC/credentialed ones)")
    parser.add_argument("--image-root", action="append", default=[], metavar="SOURCE=FOLDER",
                        help="local image folder per source, for --thumbnails (repeatable)")
    parser.add_argument("--cluster", choices=("auto", "none"), default="auto",
                        help="what intervals and paired comparisons resample: auto (default) each split's "
                             "declared unit (image, study, report or item), none items one by one")
    parser.add_argument("--p-adjust", choices=("holm", "bh", "none"), default="holm",
                        help="adjust the p-values of each comparison table as one family: holm (default; Holm "
                             "1979, family-wise error), bh (Benjamini-Hochberg 1995, false discovery rate) or none; "
                             "stars mark adjusted p < 0.05")
    parser.add_argument("--compare-published", action="store_true",
                        help="a Reproduction section: each cell whose model matches a published one (Hub id or "
                             "alias), beside the paper's value; where the run is comparable (the paper's protocol, "
                             "real weights and data, no --limit, one pass) with the difference, flagged when the "
                             "paper's value is outside the run's 95%% interval, else saying why not (`medheval "
                             "published` lists the stored tables)")
    parser.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from medheval.run.outputs import check_output_folder

    check_output_folder(args.output)  # a file or an unwritable folder: one line, before any run is read
    roots = {}
    for item in args.image_root:
        source, sep, root = item.partition("=")
        if not sep or not source or not root:
            raise ValueError(f"--image-root {item!r}: expected SOURCE=FOLDER, e.g. slake=/data/slake/imgs")
        roots[source] = root
    written = write_report(args.runs, args.output, plots=not args.no_plots, html=not args.no_html,
                           thumbnails=args.thumbnails, image_roots=roots, cluster=args.cluster,
                           compare_published=args.compare_published, p_adjust=args.p_adjust,
                           lock_timeout=args.lock_timeout)
    for kind, path in written.items():
        if isinstance(path, Path):
            print(f"{kind}: {path}")
    if written.get("plot_note"):
        print(f"note: {written['plot_note']}")
    return 0

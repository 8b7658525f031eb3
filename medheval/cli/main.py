"""``medheval`` command line (``run_eval.py`` is the same as ``medheval run``)."""

from __future__ import annotations

HELP_DESCRIPTION = ("Measure and mitigate hallucinations of medical vision-language models. Start with "
                    "'medheval demo --output runs/demo' (the whole pipeline on embedded fixtures, a few minutes "
                    "on a CPU). run_eval.py is the same as 'medheval run'.")

import argparse
import dataclasses
import errno
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from medheval.run.options import (
    add_run_arguments,
    build_backend,
    check_sampling_flags,
    parse_benchmark_options,
    parse_metric_options,
    seconds_argument,
    split_list,
)

if TYPE_CHECKING:
    from medheval.run.runner import BuiltSplits, RunSpec


def cmd_run(args: argparse.Namespace) -> int:
    from medheval.data.images import parse_image_root_args
    from medheval.run.grids import given_options
    from medheval.run.runner import RunError, RunSpec, run_grid

    if getattr(args, "config", None):
        return cmd_grid(args)
    if args.task == "detection":
        return cmd_detect(args)
    if not args.output:
        raise RunError("give --output FOLDER (or --config GRID.yaml)")
    if not (args.model or args.predictions):
        raise RunError("give --model (a model answers) or --predictions (a file of answers), "
                       "or --task detection to score a level source on Med-HallMark's released answers")
    check_sampling_flags(args)
    from medheval.run.outputs import check_output_folder

    args.output_folder = check_output_folder(args.output)  # before the model loads
    spec = RunSpec(
        benchmarks=split_list(args.benchmark) or [],
        output=args.output,
        data_dir=args.data_dir,
        image_roots=parse_image_root_args(args.image_root) or None,
        on_missing=args.on_missing,
        metrics=split_list(args.metrics),
        limit=args.limit,
        allow_missing_predictions=args.allow_missing_predictions,
        upstream_compat=args.upstream_compat,
        metric_options=parse_metric_options(args.metric_option),
        judge=args.judge,
        allow_remote_credentialed=tuple(args.allow_remote_credentialed),
        lock_timeout=args.lock_timeout,
        detector=args.detector,
        benchmark_options=parse_benchmark_options(getattr(args, "benchmark_option", [])),
        generation=_generation_plan(args),
        report_cluster=args.cluster,
        compare_published=args.compare_published,
        control_seed=args.seed,
        protocol=args.protocol,
        protocol_given="protocol" in given_options(list(getattr(args, "argv", None) or [])[1:]),
        chat_template=args.chat_template,
    )
    backend, labels, splits = _backend_after_checks(args, spec)
    spec = dataclasses.replace(spec, labels=labels)
    from medheval.run.seeds import parse_seeds

    fallback = args.batch_size if isinstance(args.batch_size, int) else 8  # 'auto' is the HF backend's
    results = run_grid(spec, backend, args.mitigation or ["none"], batch_size=getattr(backend, "batch_size", fallback),
                       controls=getattr(args, "control", None) or ["none"], seeds=parse_seeds(getattr(args, "seeds", None)),
                       splits=splits)
    return _finish(results, Path(args.output))


def _backend_after_checks(args: argparse.Namespace, spec: "RunSpec") -> tuple[Any, dict[str, str], "BuiltSplits"]:
    """:func:`medheval.run.options.build_backend`, after :func:`medheval.run.runner.check_before_model` (files,
    image roots, mitigation options, the model's conversation template) where it loads a model's weights; an API
    model or a predictions file loads none, so its own argument checks come first (before any data is fetched).
    Returns the backend, its labels and the splits the checks built (for the run: each is built once)."""
    from medheval.backends.api import is_api_model
    from medheval.run.runner import BuiltSplits, check_before_model

    def check(backend: Any = None) -> BuiltSplits:
        return check_before_model(spec, args.mitigation or [], [args.model] if args.model else [], backend,
                                  getattr(args, "control", None) or ["none"])

    if args.predictions or is_api_model(args.model):
        backend, labels = build_backend(args)
        return backend, labels, check(backend)
    splits = check()
    return (*build_backend(args), splits)


def _finish(results: dict, output: Path) -> int:
    """Print the run's (or grid's) results.md once per launch; the exit code: 1 when a metric failed on
    every item (every process exits 1; the main one says why) or nothing was scored, else 0."""
    from medheval.run.distributed import group as process_group

    if process_group().is_main:  # one report per launch, not one per process
        print((output / "results.md").read_text())
        print(f"results: {output / 'results.json'}")
    failed = [name for one in results.get("runs", [results]) for name in one.get("failed_metrics", [])]
    if failed:
        if process_group().is_main:
            print(f"error: metric(s) failed on every item: {', '.join(failed)} (see results.md)", file=sys.stderr)
        return 1
    splits = list(_split_entries(results))
    if not splits or all(entry.get("n_scored") == 0 for _, entry in splits):
        if process_group().is_main:
            why = "; ".join(_nothing_scored(split, entry) for split, entry in splits) or "no split ran"
            print(f"error: nothing was scored ({why}); check that the predictions' ids belong to the benchmark "
                  "and config you asked for", file=sys.stderr)
        return 1
    return 0


def _nothing_scored(split: str, entry: dict) -> str:
    missing = int((entry.get("data_quality") or {}).get("missing_predictions") or 0)
    total = int(entry.get("n_records") or 0) + missing  # records without a prediction were dropped before scoring
    return f"{split}: 0 of {total} record(s) scored" + (f", {missing} without a prediction" if missing else "")


def _split_entries(results: dict):
    """``(split, entry)`` for every split of a run or of a grid's runs (nested grids included)."""
    benchmarks = results.get("benchmarks")
    for split, entry in (benchmarks.items() if isinstance(benchmarks, dict) else ()):
        if isinstance(entry, dict):
            yield split, entry
    for run in results.get("runs") or []:
        if isinstance(run, dict):
            yield from _split_entries(run)


def _generation_plan(args: argparse.Namespace):
    """Lengths per benchmark / answer type (:mod:`medheval.run.generation`) unless ``--max-new-tokens`` was
    given (then that one length for every record, as the backend has it); none for a predictions file."""
    from medheval.run.generation import GenerationPlan
    from medheval.run.grids import CLI_GENERATION, given_options

    if args.predictions:
        return None
    if getattr(args, "protocol", "clean") != "clean":  # the protocol's layers; the generation flags typed beat them
        given = given_options(list(getattr(args, "argv", None) or [])[1:])
        return GenerationPlan(fixed={dest: getattr(args, dest) for dest in CLI_GENERATION if dest in given})
    if args.max_new_tokens is not None:
        return None
    return GenerationPlan()


def cmd_grid(args: argparse.Namespace) -> int:
    """``medheval run --config grid.yaml [flags]``: models × benchmarks × mitigations (:mod:`medheval.run.grids`)."""
    from medheval.run.grids import apply_cli, given_options, load_grid_config, run_config

    argv = list(getattr(args, "argv", None) or [])
    config = apply_cli(load_grid_config(args.config), args, given_options(argv[1:]))
    from medheval.run.outputs import check_output_folder

    args.output_folder = check_output_folder(config.output)  # before any model loads
    return _finish(run_config(config, allow_remote_credentialed=list(args.allow_remote_credentialed or ())),
                   Path(config.output))


def cmd_detect(args: argparse.Namespace) -> int:
    """``--task detection``: no model; the level source judges Med-HallMark's released answers."""
    from medheval.data.images import parse_image_root_args
    from medheval.run.runner import RunError, RunSpec
    from medheval.families.med_hallmark.detection import run_detection

    if not args.output:
        raise RunError("give --output FOLDER")
    if args.model or args.predictions or args.mitigation or [c for c in getattr(args, "control", None) or [] if c != "none"]:
        raise RunError("--task detection scores a level source (--judge / --detector) on the released answers: "
                       "drop --model, --predictions, --mitigation and --control")
    spec = RunSpec(benchmarks=split_list(args.benchmark) or [], output=args.output, data_dir=args.data_dir,
                   image_roots=parse_image_root_args(args.image_root) or None, on_missing=args.on_missing,
                   limit=args.limit, metric_options=parse_metric_options(args.metric_option), judge=args.judge,
                   detector=args.detector)
    results = run_detection(spec)
    print((Path(args.output) / "results.md").read_text())
    print(f"results: {Path(args.output) / 'results.json'}")
    return 0 if results["benchmarks"] else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from medheval.cli.demo import run_demo
    from medheval.run.outputs import check_output_folder

    args.output_folder = check_output_folder(args.output)  # one line before anything is written; Ctrl-C counts it
    run_demo(args.output, batch_size=args.batch_size)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``medheval list``: one line per benchmark (configs with item counts), metric and mitigation;
    ``--json`` for scripts. Counts come from annotation files already on this machine (``--data-dir`` or
    the download cache): ``list`` never downloads; ``–`` means the files are not here yet (or are
    another config's revision of the same path)."""
    from medheval.data.benchmarks import benchmark_configs, list_benchmarks
    from medheval.data.registry import list_units

    benchmarks = {name: benchmark_configs(name) for name in list_benchmarks()}
    counts = {name: {config: _local_count(name, config, args.data_dir) for config in configs}
              for name, configs in benchmarks.items()}
    from medheval.run.paper_protocols import list_protocols

    metrics, mitigations = list_units("metrics"), list_units("mitigations")
    protocols = {protocol.name: protocol.title for protocol in list_protocols()}
    if args.json:
        print(json.dumps({"benchmarks": benchmarks, "item_counts": counts, "metrics": metrics,
                          "mitigations": mitigations, "protocols": protocols}, indent=2))
        return 0
    width = max(len(name) for name in [*benchmarks, *metrics, *mitigations])
    lines = [f"Benchmarks ({len(benchmarks)}): configs with their item counts (– = annotation files not on this "
             "machine, or --data-dir holds another config's revision: `medheval run` says which; --data-dir DIR, "
             "or run once to download them)"]
    lines += [f"  {name:<{width}}  " + " · ".join(f"{config} {'–' if n is None else n}"
                                                  for config, n in counts[name].items()) for name in benchmarks]
    for kind, names in (("Metrics", metrics), ("Mitigations", mitigations)):
        lines += ["", f"{kind} ({len(names)})"]
        lines += [f"  {name:<{width}}  {_card_title(kind.lower(), name)}" for name in names]
    lines += ["", f"Protocols ({len(protocols)}): --protocol NAME (cards: docs/protocols/NAME.md)"]
    lines += [f"  {name:<{width}}  {title}" for name, title in protocols.items()]
    print("\n".join(lines))
    return 0


def _local_count(name: str, config: str, data_dir: str | None) -> int | None:
    """Records of one split when its annotation files are on this machine (nothing is downloaded), else None."""
    import contextlib
    import io
    import os

    from medheval.data.benchmarks import builder_class, prepare_benchmark

    if data_dir is None and hasattr(builder_class(name), "input_files"):  # reads the Hub or the user's folder
        return None
    previous = os.environ.get("MEDHEVAL_OFFLINE")
    os.environ["MEDHEVAL_OFFLINE"] = "1"  # read local files and the cache only
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the builders' progress bars
            return len(prepare_benchmark(name, config, data_dir=data_dir).dataset)
    except Exception:  # noqa: BLE001 - not local (or not readable here): shown as –, `run` gives the reason
        return None
    finally:
        if previous is None:
            os.environ.pop("MEDHEVAL_OFFLINE", None)
        else:
            os.environ["MEDHEVAL_OFFLINE"] = previous


def _card_title(kind: str, name: str) -> str:
    """A unit's one-line title: its card's ``pretty_name``/``title``, else the card's first heading."""
    import yaml

    from medheval.data.registry import unit_dir

    path = unit_dir(kind, name) / "README.md"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    front = re.match(r"---\n(.*?)\n---\n", text, re.S)
    meta = (yaml.safe_load(front.group(1)) or {}) if front else {}
    heading = re.search(r"^# (.+)$", text, re.M)
    return str(meta.get("pretty_name") or meta.get("title") or (heading.group(1) if heading else "")).strip()


def cmd_publish(args: argparse.Namespace) -> int:
    from medheval.publish import hub
    from medheval.run.provenance import ALLOW_FLAGS

    if args.results and not args.model_repo:
        raise ValueError("--results needs --model-repo ORG/MODEL (the Hub repo of the evaluated model)")
    out_dir = args.to
    if out_dir is None and not args.push:
        raise ValueError("nothing to do: give --to DIR (write one folder per Hub repo) and/or --push --org ORG")
    if out_dir is not None:
        from medheval.run.outputs import check_output_folder

        check_output_folder(out_dir, flag="--to")  # a file or an unwritable folder: one line, before any export
    if out_dir is None:
        import tempfile

        out_dir = tempfile.mkdtemp(prefix="medheval-publish-")
    allow = [key for key, flag in ALLOW_FLAGS.items() if getattr(args, flag[2:].replace("-", "_"))]
    units = not args.results or args.kind or args.name
    repos = hub.export_all(out_dir, org=args.org, kinds=(split_list(args.kind) or tuple(hub.REPO_TYPES)) if units else (),
                           names=split_list(args.name), data_dir=args.data_dir,
                           results=(args.results, args.model_repo) if args.results else None,
                           allow=allow, lock_timeout=args.lock_timeout)
    for repo in repos:
        gated = " (gated: PhysioNet)" if repo.gated else ""
        print(f"{repo.repo_type:8s} {repo.repo_id:40s} {repo.folder}{gated}")
        for warning in repo.warnings:
            print(f"  warning: {warning}", file=sys.stderr)
    if args.push:
        for url in hub.push(repos, create_pr=args.create_pr):
            print(f"pushed: {url}")
    return 0


def cmd_install_metrics(args: argparse.Namespace) -> int:
    from medheval.publish.hub import install_metrics

    for path in install_metrics(split_list(args.name)):
        namespace, name = path.name.split("--", 1)
        module_id = name if namespace == "evaluate-metric" else f"{namespace}/{name}"
        print(f"installed {name}: evaluate.load(\"{module_id}\") -> {path}")
    return 0


def add_hub_commands(commands: argparse._SubParsersAction) -> None:
    """``medheval publish`` and ``medheval install-metrics``."""
    publish = commands.add_parser("publish", help="write Hub repo folders for datasets/metrics/mitigations/results; "
                                                  "--push uploads them")
    publish.add_argument("--to", metavar="DIR", help="write one folder per Hub repo here (default with --push: a temp dir)")
    publish.add_argument("--push", action="store_true", help="upload (create_repo + upload_folder; token from HF_TOKEN "
                                                              "or `hf auth login`; endpoint from HF_ENDPOINT)")
    publish.add_argument("--org", default="medheval", help="Hub organisation or user owning the repos (default: medheval)")
    publish.add_argument("--kind", action="append", help="datasets, metrics, mitigations (repeatable; default: all)")
    publish.add_argument("--name", action="append", help="only these units (repeatable or comma list)")
    publish.add_argument("--data-dir", help="local copy of MedHEval's benchmark_data/ (default: pinned download)")
    publish.add_argument("--results", metavar="RUN_DIR", help="a run's output folder, or an inspect .eval log of a "
                                                              "medheval task (or a folder of them): its results become "
                                                              ".eval_results/*.yaml for --model-repo")
    publish.add_argument("--model-repo", metavar="ORG/MODEL", help="the evaluated model's Hub repo (with --results)")
    publish.add_argument("--allow-random-weights", action="store_true", help="results: publish answers of a "
                         "random-weight model anyway (said in each entry's notes)")
    publish.add_argument("--allow-fixture", action="store_true", help="results: publish numbers scored on the "
                         "embedded fixture data anyway (said in each entry's notes)")
    publish.add_argument("--allow-limit", action="store_true", help="results: publish a --limit run anyway (said "
                         "in each entry's notes)")
    publish.add_argument("--lock-timeout", type=seconds_argument, default=0.0, metavar="SECONDS",
                         help="another publish into the same --to folder holds it: wait up to SECONDS for it "
                              "(default 0: refuse at once, naming it). Folders are built aside and each replaces "
                              "its target in one rename, so a kill never leaves a half-written repo folder listed")
    publish.add_argument("--create-pr", action="store_true", help="results: open a PR on the model repo instead of "
                                                                  "committing to main")
    publish.set_defaults(handler=cmd_publish)
    install = commands.add_parser("install-metrics", help="make evaluate.load(\"<metric>\") and "
                                                          "evaluate.load(\"medheval/<metric>\") find this package's "
                                                          "metrics offline (evaluate's module cache)")
    install.add_argument("--name", action="append", help="only these metrics (default: all)")
    install.set_defaults(handler=cmd_install_metrics)


def cmd_lmms_eval_path(args: argparse.Namespace) -> int:
    """``medheval integrations lmms-eval-path``: the task folder for ``lmms-eval --include_path``."""
    from medheval.integrations.lmms_eval import tasks_path

    print(tasks_path())
    return 0


def add_integrations_command(commands: argparse._SubParsersAction) -> None:
    """``medheval integrations …``: our benchmarks inside other harnesses (docs/interop.md, "Use from lmms-eval / inspect")."""
    integrations = commands.add_parser("integrations", help="run our benchmarks from lmms-eval or inspect_ai")
    sub = integrations.add_subparsers(dest="integration", required=True)
    path = sub.add_parser("lmms-eval-path", help="print the folder of our lmms-eval tasks (for --include_path)")
    path.set_defaults(handler=cmd_lmms_eval_path)
    check = sub.add_parser("check", help="name each missing or wrong-version dependency of the harness tasks "
                                         "(decord, filelock<4, rouge-score, lmms-eval, inspect-ai), one line each")
    check.set_defaults(handler=lambda args: __import__("medheval.integrations.stack", fromlist=["main"]).main())


def cmd_selftest(args: argparse.Namespace) -> int:
    from medheval.mitigations import selftest

    return selftest.main(split_list(args.family), split_list(args.method), quiet=args.quiet,
                         compiled=args.compiled)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="medheval", description=HELP_DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="benchmarks × model → predictions → metrics → tables")
    add_run_arguments(run_parser)
    run_parser.set_defaults(handler=cmd_run)
    demo = commands.add_parser("demo", help="the whole pipeline on the embedded fixtures with a tiny random model")
    demo.add_argument("--output", default="runs/demo",
                      help="folder for the fixture data and the runs (default: runs/demo)")
    demo.add_argument("--batch-size", type=int, default=8, help="records per generate call (default 8)")
    demo.set_defaults(handler=cmd_demo)
    listing = commands.add_parser("list", help="benchmarks (configs, item counts), metrics, mitigations, protocols: "
                                                   "one line each")
    listing.add_argument("--json", action="store_true", help="machine-readable output for scripts")
    listing.add_argument("--data-dir", help="count items in this local copy of the annotation files (never "
                                            "downloads; default: the download cache)")
    listing.set_defaults(handler=cmd_list)
    check = commands.add_parser("selftest", help="check every mitigation's decoding invariants on the installed "
                                                 "transformers/torch (tiny random models, under a minute on CPU)")
    check.add_argument("--family", action="append", help="only these model families (repeatable or comma list; "
                                                         "default: llava, llava_next, qwen2_5_vl, qwen3_vl, gemma3)")
    check.add_argument("--method", action="append", help="only these mitigations (repeatable or comma list)")
    check.add_argument("--quiet", action="store_true", help="print the table and the verdict only")
    check.add_argument("--compiled", action="store_true",
                       help="also check the compiled decode steps (static cache + torch.compile) against eager")
    check.set_defaults(handler=cmd_selftest)
    from medheval.cli.inputs import add_inputs_command

    add_inputs_command(commands)
    add_hub_commands(commands)
    add_integrations_command(commands)
    from medheval.report.build import add_report_command

    add_report_command(commands)
    from medheval.report.published import add_published_command

    add_published_command(commands)
    return parser


def _interrupted(args: argparse.Namespace) -> int:
    """Ctrl-C: one line saying what is safe and how to resume (re-running the same command), exit 130."""
    import shlex

    from medheval.run.outputs import saved_predictions

    folder = getattr(args, "output_folder", None)
    command = "medheval " + shlex.join(getattr(args, "argv", []))
    from medheval.net.secrets import redact

    command = redact(command)  # a key given on the command line stays out of the terminal's scrollback
    if folder is None:
        print(f"interrupted before anything was written; run again with: {command}", file=sys.stderr)
    else:
        saved = saved_predictions(folder)
        print(f"interrupted: {saved} prediction(s) are saved in {folder}; resume with the same command "
              f"(done records are not redone): {command}", file=sys.stderr)
    return 130


ERROR_CHARS = 2000  # an error message longer than this is cut (a config value can expand to gigabytes)


def bounded(text: str, limit: int = ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters not shown)"


def disk_full_message(error: OSError) -> str:
    """One line for a full disk (or quota): the file being written and the free space left where it lives."""
    import shutil

    name = error.filename or "a file"
    folder = Path(str(error.filename)).parent if error.filename else Path.cwd()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free on {folder}"
    except OSError:
        free = "free space unknown"
    return (f"no space left writing {name} ({free}); the previous results are intact: free some space and "
            f"re-run the same command (it resumes)")


def _silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's flush at exit does not raise again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _url_in_text(url: str) -> str:
    """``url`` as found in a value, without a YAML flow value's closing bracket or comma after it
    (``x.y={base_url: http://h:8000}``, ``[http://[::1]]``); an IPv6 literal keeps its own ``]``."""
    url = url.rstrip(",;)}")
    while url.endswith("]") and url.count("]") > url.count("["):
        url = url[:-1].rstrip(",;)}")
    return url


def cli_key_hosts(args: argparse.Namespace) -> list[str]:
    """The hosts the user named on the command line, where API keys from the environment may go
    (:mod:`medheval.net.keys`): ``--api-key-host`` (entries argparse checked), and the ``host`` / ``host:port``
    (:func:`~medheval.net.hosts.host_entry`) of each URL in a ``--judge`` / ``--model`` spec or a
    ``--metric-option`` value (a ``vllm:``/``ollama:`` spec's default local server included). A URL found inside
    a value names its host or nothing (``file:///tmp``, a bad port): it is never an entry to refuse, and the
    judge or model built from the spec reports a URL it cannot use."""
    from medheval.judges.spec import _DEFAULT_BASE
    from medheval.net.hosts import host_entry
    from medheval.net.secrets import URL_PATTERN

    urls: list[str] = []
    for value in (getattr(args, "judge", None), getattr(args, "model", None),
                  *(getattr(args, "metric_option", None) or [])):
        if isinstance(value, str):
            urls += map(_url_in_text, URL_PATTERN.findall(value))
            alias = value.split(":", 1)[0].strip().lower()
            if alias in _DEFAULT_BASE and "@http" not in value:
                urls.append(_DEFAULT_BASE[alias])
    found = [entry for entry in map(host_entry, urls) if entry]
    return [*(getattr(args, "api_key_host", None) or []), *found]


def entry_point(argv: Sequence[str] | None = None) -> int:
    """The command line's entry (the ``medheval`` script, ``python -m medheval``, ``run_eval.py``): :func:`main`,
    and a process of a data-parallel launch ends here, whether main returns, exits or raises
    (:func:`medheval.run.distributed.run_to_end`)."""
    from medheval.run.distributed import run_to_end

    return run_to_end(lambda: main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one clear message and exit 2."""
    from medheval.errors import USER_ERRORS

    from medheval.judges import endpoints
    from medheval.net import keys, transport
    from medheval.net.named import check_environment
    from medheval.net.secrets import install_redacting_hooks, redact, register_environment, register_urls_in
    from medheval.net.untrusted import printable
    from medheval.publish.hub_access import register_hub_credentials

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # which flags were typed (a grid config's overrides)
    register_environment()  # OPENAI_API_KEY, HF_TOKEN, PHYSIONET_PASSWORD …: redacted wherever they appear
    register_hub_credentials()  # the token of `hf auth login` (a file, not a variable) and HF_ENDPOINT's password
    register_urls_in(args.argv)  # a password or ?api-key= in a --model/--judge/--image-root URL, before any error
    install_redacting_hooks()  # uncaught tracebacks and log records too
    # the host lists of this command line, in place of earlier ones (restored at the end), and those of the
    # environment (MEDHEVAL_PROXY_FOR …), read inside the try: a bad entry is one user error before anything runs
    before = transport.set_proxy_for(()), keys.set_key_hosts(()), endpoints.set_approved_endpoints(())
    try:
        check_environment()
        transport.set_proxy_for(tuple(getattr(args, "proxy_for", None) or ()))
        keys.set_key_hosts(cli_key_hosts(args))  # a config file never names them
        # endpoints approved for credentialed (MIMIC) records: typed flags only, never a config file's
        endpoints.set_approved_endpoints(getattr(args, "allow_remote_credentialed", None) or ())
        status = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except KeyboardInterrupt:
        return _interrupted(args)
    except USER_ERRORS as error:
        # a KeyError's str() is the repr of its message: print the message itself, without the quotes
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {printable(redact(bounded(str(message))))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `medheval list --json | head`: the reader left; end quietly, as a Unix tool does
        _silence_stdout()
        return 141  # 128 + SIGPIPE: what a shell reports for a tool the closed pipe stopped
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: {redact(disk_full_message(error))}", file=sys.stderr)
        return 1
    finally:
        transport.set_proxy_for(before[0])
        keys.set_key_hosts(before[1])
        endpoints.set_approved_endpoints(before[2])


if __name__ == "__main__":
    sys.exit(entry_point())

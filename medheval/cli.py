"""``medheval`` command line (``run_eval.py`` is the same as ``medheval run``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

TINY_MODEL = "tiny-random-llava"
RANDOM_WEIGHTS_LABEL = ("RANDOM WEIGHTS: the built-in tiny-random-llava is a demo model; its numbers mean nothing. "
                        "Point --model at a real checkpoint for real numbers.")


def _split_list(values: Sequence[str] | None) -> list[str] | None:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``; ``None`` when the flag was not given (``[]`` when it was
    given but names nothing, e.g. ``--metrics ,``: the runner refuses that)."""
    if values is None:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``medheval run`` / ``run_eval.py``."""
    parser.add_argument("--config", metavar="GRID.yaml",
                        help="a run grid (models × benchmarks × mitigations × settings, see configs/); flags "
                             "given as well override its values")
    parser.add_argument("--benchmark", action="append", metavar="NAME[:CONFIG]",
                        help="benchmark split, e.g. cxr_vishal, mm_vishal:slake, knowledge:open (repeatable, or comma list)")
    who = parser.add_mutually_exclusive_group(required=False)  # one of them, except with --task detection
    who.add_argument("--model", help=f"HF image-text-to-text model (Hub id or local dir), '{TINY_MODEL}', or a model "
                                     "behind an API: openai:<model>@<base_url> (vLLM, SGLang, TGI, OpenAI), "
                                     "azure:<deployment>@<endpoint>, anthropic:<model>")
    who.add_argument("--predictions", help="score a JSONL of {\"id\", \"prediction\"} made elsewhere")
    parser.add_argument("--output", help="output folder (re-running resumes it)")
    parser.add_argument("--mitigation", action="append", metavar="NAME[:KEY=VALUE,...]",
                        help="decoding-time mitigation, e.g. vcd:alpha=1,beta=0.1, pai, none (repeatable: a grid "
                             "run side by side; default: none)")
    parser.add_argument("--data-dir", help="local copy of MedHEval's benchmark_data/ (default: pinned download)")
    parser.add_argument("--image-root", action="append", default=[], metavar="SOURCE=ROOT",
                        help="image root per source: a folder, a URL template with {path}, or hf://dataset (repeatable)")
    parser.add_argument("--on-missing", choices=("error", "skip"), default="error",
                        help="missing images: stop with the list of ids (default) or skip and count them")
    parser.add_argument("--metrics", action="append", help="metric names (default: by answer type)")
    parser.add_argument("--limit", type=int, help="only the first N records of each split")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int,
                        help="one length for every record (default: per answer type / benchmark, see "
                             "medheval/generation.py: 16 yes/no … 512 reports, 4096 ClinHallu traces)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--upstream-compat", action="store_true",
                        help="score close-ended answers with MedHEval's released rules (to match published numbers)")
    parser.add_argument("--metric-option", action="append", default=[], metavar="METRIC.KEY=VALUE",
                        help="an option for one metric, e.g. chair.variant=medheval_code; the value is checked "
                             "against the option's type before anything runs (booleans true/false, numbers, JSON "
                             "lists/objects; repeatable)")
    parser.add_argument("--judge", metavar="BACKEND:MODEL[@BASE_URL]",
                        help="LLM judge for judge-based metrics, e.g. openai:gpt-4o@http://127.0.0.1:8000/v1 "
                             "(keys from OPENAI_API_KEY / ANTHROPIC_API_KEY)")
    parser.add_argument("--allow-missing-predictions", action="store_true",
                        help="with --predictions: score the records present, count the others as missing")
    parser.add_argument("--allow-remote-credentialed", action="append", default=[], metavar="HOST_OR_URL",
                        help="a non-local judge or model endpoint approved under your PhysioNet agreement for "
                             "credentialed (MIMIC-derived) records, e.g. myorg.openai.azure.com (repeatable; recorded "
                             "in results)")
    parser.add_argument("--lock-timeout", type=float, default=0.0, metavar="SECONDS",
                        help="when another run holds --output: wait up to SECONDS for it (default 0: refuse at once)")
    parser.add_argument("--task", choices=("generate", "detection"), default="generate",
                        help="generate: a model answers, metrics score it (default); detection: score a MediHall "
                             "level source (--judge or --detector) against Med-HallMark's human levels")
    parser.add_argument("--detector", metavar="rule|PATH",
                        help="MediHall level source: 'rule' (offline classifier) or a local detector checkpoint "
                             "folder (default with neither this nor --judge: rule)")
    parser.add_argument("--benchmark-option", action="append", default=[], metavar="BENCHMARK.KEY=VALUE",
                        help="a run option of one benchmark, e.g. med_stepbench.knowledge=prior, "
                             "med_stepbench.rationale=clinician, med_stepbench.modality=separate (repeatable)")
    parser.add_argument("--api-concurrency", type=int, default=16, metavar="N",
                        help="--model openai:/azure:/anthropic:… : requests in flight at once (default 16)")
    parser.add_argument("--api-option", action="append", default=[], metavar="KEY=VALUE",
                        help="--model openai:/azure:/anthropic:… : timeout, max_retries, requests_per_minute, "
                             "continue_final_message, api_version, cache_dir, max_consecutive_failures, headers, "
                             "extra_body (values read as JSON when they parse; repeatable)")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="encode the prompt prefix of records sharing images once and reuse its KV cache "
                             "(same greedy answers; Med-StepBench: statements of one study)")


def parse_metric_options(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """``["chair.variant=paper", "text_generation.bertscore_model=/m"]`` -> ``{metric: {key: "text"}}``.

    Values stay text here: the runner converts each to the type its metric declares
    (:mod:`medheval.metric_options`), so ``upstream_compat=False`` is ``False``, not the string."""
    options: dict[str, dict[str, object]] = {}
    for item in items:
        target, sep, raw = item.partition("=")
        metric, dot, key = target.partition(".")
        if not (sep and dot and metric and key):
            raise ValueError(f"--metric-option {item!r}: expected METRIC.KEY=VALUE, e.g. chair.variant=paper")
        options.setdefault(metric.strip(), {})[key.strip()] = raw
    return options


def parse_benchmark_options(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """``["med_stepbench.knowledge=prior"]`` -> ``{"med_stepbench": {"knowledge": "prior"}}``."""
    for item in items:
        target, sep, _ = item.partition("=")
        name, dot, key = target.partition(".")
        if not (sep and dot and name and key):
            raise ValueError(f"--benchmark-option {item!r}: expected BENCHMARK.KEY=VALUE, e.g. med_stepbench.knowledge=prior")
    return parse_metric_options(items)


def build_backend(args: argparse.Namespace):
    """The backend named by ``--model`` / ``--predictions``; labels for the report."""
    from medheval.backends.hf import HFBackend
    from medheval.backends.predictions import PredictionsFileBackend
    from medheval.distributed import device_for

    if args.predictions:
        return PredictionsFileBackend(args.predictions), {}
    from medheval.backends.api import is_api_model
    from medheval.generation import FALLBACK_MAX_NEW_TOKENS

    if is_api_model(args.model):
        return build_api_backend(args), {}
    common = dict(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens or FALLBACK_MAX_NEW_TOKENS,
                  do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                  device=device_for(args.device), dtype=args.dtype)
    if getattr(args, "prefix_cache", False):
        common["prefix_cache"] = True
    if args.model == TINY_MODEL:
        from medheval.backends.tiny import build_tiny_llava

        model, processor = build_tiny_llava(seed=args.seed)
        model.name_or_path = TINY_MODEL
        backend = HFBackend(model, processor, **common)
        backend.name = TINY_MODEL
        return backend, {"random_weights": RANDOM_WEIGHTS_LABEL}
    return HFBackend(args.model, **common), {}


def build_api_backend(args: argparse.Namespace):
    """``--model openai:…|azure:…|anthropic:…``: :class:`medheval.backends.api.APIBackend`."""
    from medheval.backends.api import APIBackend
    from medheval.backends.base import BackendError
    from medheval.generation import FALLBACK_MAX_NEW_TOKENS

    local_only = [flag for flag, given in (("--device", args.device), ("--dtype", args.dtype),
                                           ("--prefix-cache", getattr(args, "prefix_cache", False))) if given]
    if local_only:
        raise BackendError(f"{', '.join(local_only)} apply to a local model; {args.model!r} runs on its server")
    options: dict[str, object] = {}
    for item in getattr(args, "api_option", []):
        key, sep, raw = item.partition("=")
        if not (sep and key.strip()):
            raise ValueError(f"--api-option {item!r}: expected KEY=VALUE, e.g. timeout=600")
        try:
            options[key.strip()] = json.loads(raw)
        except ValueError:
            options[key.strip()] = raw
    return APIBackend(args.model, max_new_tokens=args.max_new_tokens or FALLBACK_MAX_NEW_TOKENS, do_sample=args.do_sample,
                      temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                      concurrency=getattr(args, "api_concurrency", 16),
                      batch_size=max(args.batch_size, 4 * getattr(args, "api_concurrency", 16)),
                      allow_remote_credentialed=list(args.allow_remote_credentialed) or None, **options)


def cmd_run(args: argparse.Namespace) -> int:
    from medheval.images import parse_image_root_args
    from medheval.runner import RunError, RunSpec, run_grid

    if getattr(args, "config", None):
        return cmd_grid(args)
    if args.task == "detection":
        return cmd_detect(args)
    if not args.output:
        raise RunError("give --output FOLDER (or --config GRID.yaml)")
    if not (args.model or args.predictions):
        raise RunError("give --model (a model answers) or --predictions (a file of answers), "
                       "or --task detection to score a level source on Med-HallMark's released answers")
    backend, labels = build_backend(args)
    spec = RunSpec(
        benchmarks=_split_list(args.benchmark) or [],
        output=args.output,
        data_dir=args.data_dir,
        image_roots=parse_image_root_args(args.image_root) or None,
        on_missing=args.on_missing,
        metrics=_split_list(args.metrics),
        limit=args.limit,
        allow_missing_predictions=args.allow_missing_predictions,
        upstream_compat=args.upstream_compat,
        metric_options=parse_metric_options(args.metric_option),
        judge=args.judge,
        labels=labels,
        allow_remote_credentialed=tuple(args.allow_remote_credentialed),
        lock_timeout=args.lock_timeout,
        detector=args.detector,
        benchmark_options=parse_benchmark_options(getattr(args, "benchmark_option", [])),
        generation=_generation_plan(args),
    )
    results = run_grid(spec, backend, args.mitigation or ["none"], batch_size=getattr(backend, "batch_size", args.batch_size))
    return _finish(results, Path(args.output))


def _finish(results: dict, output: Path) -> int:
    """Print the run's (or grid's) results.md once per launch; the exit code: 1 when a metric failed on
    every item (every process exits 1; the main one says why) or nothing was scored, else 0."""
    from medheval.distributed import group as process_group

    if process_group().is_main:  # one report per launch, not one per process
        print((output / "results.md").read_text())
        print(f"results: {output / 'results.json'}")
    failed = [name for one in results.get("runs", [results]) for name in one.get("failed_metrics", [])]
    if failed:
        if process_group().is_main:
            print(f"error: metric(s) failed on every item: {', '.join(failed)} (see results.md)", file=sys.stderr)
        return 1
    return 0 if results.get("benchmarks") or results.get("runs") else 1


def _generation_plan(args: argparse.Namespace):
    """Lengths per benchmark / answer type (:mod:`medheval.generation`) unless ``--max-new-tokens`` was
    given (then that one length for every record, as the backend has it); none for a predictions file."""
    from medheval.generation import GenerationPlan

    if args.predictions or args.max_new_tokens is not None:
        return None
    return GenerationPlan()


def cmd_grid(args: argparse.Namespace) -> int:
    """``medheval run --config grid.yaml [flags]``: models × benchmarks × mitigations (:mod:`medheval.grid_config`)."""
    from medheval.grid_config import apply_cli, given_options, load_grid_config, run_config

    argv = list(getattr(args, "argv", None) or [])
    config = apply_cli(load_grid_config(args.config), args, given_options(argv[1:]))
    return _finish(run_config(config), Path(config.output))


def cmd_detect(args: argparse.Namespace) -> int:
    """``--task detection``: no model; the level source judges Med-HallMark's released answers."""
    from medheval.images import parse_image_root_args
    from medheval.runner import RunError, RunSpec
    from medheval.tasks.detection import run_detection

    if not args.output:
        raise RunError("give --output FOLDER")
    if args.model or args.predictions or args.mitigation:
        raise RunError("--task detection scores a level source (--judge / --detector) on the released answers: "
                       "drop --model, --predictions and --mitigation")
    spec = RunSpec(benchmarks=_split_list(args.benchmark) or [], output=args.output, data_dir=args.data_dir,
                   image_roots=parse_image_root_args(args.image_root) or None, on_missing=args.on_missing,
                   limit=args.limit, metric_options=parse_metric_options(args.metric_option), judge=args.judge,
                   detector=args.detector)
    results = run_detection(spec)
    print((Path(args.output) / "results.md").read_text())
    print(f"results: {Path(args.output) / 'results.json'}")
    return 0 if results["benchmarks"] else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from medheval.demo import run_demo

    run_demo(args.output, batch_size=args.batch_size)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from medheval.benchmarks import benchmark_configs, list_benchmarks
    from medheval.registry import list_units

    listing = {"benchmarks": {name: benchmark_configs(name) for name in list_benchmarks()},
               "metrics": list_units("metrics"), "mitigations": list_units("mitigations")}
    print(json.dumps(listing, indent=2))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from medheval import hub

    if args.results and not args.model_repo:
        raise ValueError("--results needs --model-repo ORG/MODEL (the Hub repo of the evaluated model)")
    out_dir = args.to
    if out_dir is None and not args.push:
        raise ValueError("nothing to do: give --to DIR (write one folder per Hub repo) and/or --push --org ORG")
    if out_dir is None:
        import tempfile

        out_dir = tempfile.mkdtemp(prefix="medheval-publish-")
    repos = []
    if args.results:
        repos.append(hub.export_results(args.results, out_dir, args.model_repo, org=args.org))
        hub.write_manifest(out_dir, repos)
    if not args.results or args.kind or args.name:
        repos += hub.export_all(out_dir, org=args.org, kinds=_split_list(args.kind) or tuple(hub.REPO_TYPES),
                                names=_split_list(args.name), data_dir=args.data_dir)
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
    from medheval.hub import install_metrics

    for path in install_metrics(_split_list(args.name)):
        print(f"installed {path.name.split('--', 1)[1]}: evaluate.load(\"{path.name.split('--', 1)[1]}\") -> {path}")
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
    publish.add_argument("--results", metavar="RUN_DIR", help="a run's output folder: its results become "
                                                              ".eval_results/*.yaml for --model-repo")
    publish.add_argument("--model-repo", metavar="ORG/MODEL", help="the evaluated model's Hub repo (with --results)")
    publish.add_argument("--create-pr", action="store_true", help="results: open a PR on the model repo instead of "
                                                                  "committing to main")
    publish.set_defaults(handler=cmd_publish)
    install = commands.add_parser("install-metrics", help="make evaluate.load(\"<metric>\") (bare names) find this "
                                                          "package's metrics")
    install.add_argument("--name", action="append", help="only these metrics (default: all)")
    install.set_defaults(handler=cmd_install_metrics)


def cmd_selftest(args: argparse.Namespace) -> int:
    from medheval.mitigations import selftest

    return selftest.main(_split_list(args.family), _split_list(args.method), quiet=args.quiet)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="medheval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="benchmarks × model → predictions → metrics → tables")
    add_run_arguments(run_parser)
    run_parser.set_defaults(handler=cmd_run)
    demo = commands.add_parser("demo", help="the whole pipeline on the embedded fixtures with a tiny random model")
    demo.add_argument("--output", default="runs/demo")
    demo.add_argument("--batch-size", type=int, default=8)
    demo.set_defaults(handler=cmd_demo)
    listing = commands.add_parser("list", help="benchmarks (with configs), metrics, mitigations")
    listing.set_defaults(handler=cmd_list)
    check = commands.add_parser("selftest", help="check every mitigation's decoding invariants on the installed "
                                                 "transformers/torch (tiny random models, under a minute on CPU)")
    check.add_argument("--family", action="append", help="only these model families (repeatable or comma list; "
                                                         "default: llava, llava_next, qwen2_5_vl, qwen3_vl, gemma3)")
    check.add_argument("--method", action="append", help="only these mitigations (repeatable or comma list)")
    check.add_argument("--quiet", action="store_true", help="print the table and the verdict only")
    check.set_defaults(handler=cmd_selftest)
    add_hub_commands(commands)
    from medheval.report.build import add_report_command

    add_report_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one clear message and exit 2."""
    from medheval.errors import USER_ERRORS

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # which flags were typed (a grid config's overrides)
    try:
        return args.handler(args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

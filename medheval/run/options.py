"""Run options shared by the ``medheval run`` command and the YAML grid loader: the run arguments, their
parsers (``--metric-option``, ``--benchmark-option``, comma lists) and the backend a model argument names."""

from __future__ import annotations

import argparse
import difflib
import json
import math
from pathlib import Path
from typing import Iterable, Sequence

from medheval.net.hosts import check_host_entry
from medheval.net.secrets import register_named


TINY_MODEL = "tiny-random-llava"
RANDOM_WEIGHTS_LABEL = ("RANDOM WEIGHTS: the built-in tiny-random-llava is a demo model; its numbers mean nothing. "
                        "Point --model at a real checkpoint for real numbers.")


def split_list(values: Sequence[str] | None) -> list[str] | None:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``; ``None`` when the flag was not given (``[]`` when it was
    given but names nothing, e.g. ``--metrics ,``: the runner refuses that)."""
    if values is None:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def positive_int(value: str) -> int:
    """An argument that must be a whole number >= 1 (``--limit``, ``--max-new-tokens``, ``--api-concurrency``):
    refused while the arguments are parsed."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a mistyped ``name`` (``mitigation`` → ``mitigations``),
    ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def generation_number(key: str):
    """The argparse type of a generation flag holding a number (``--temperature``, ``--top-p``): a finite number
    within the setting's range (:func:`medheval.run.generation.setting_problem`), refused while the arguments are
    parsed (``--top-p 2`` was recorded and ignored, ``--temperature nan`` stopped the run at its first batch)."""
    from medheval.run.generation import setting_problem

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        problem = setting_problem(key, number)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {value!r}")
        return number

    parse.__name__ = key  # what argparse names in "invalid <name> value"
    return parse


def seconds_argument(value: str) -> float:
    """``--lock-timeout``: seconds >= 0 (``inf``: wait as long as it takes), refused while the arguments are parsed:
    ``nan`` waited forever, a negative number was read as 0."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}")
    return number


def seed_argument(value: str) -> int:
    """``--seed``: a whole number from 0 to :data:`medheval.run.seeds.MAX_SEED`, refused while the arguments are
    parsed (as ``--seeds`` is)."""
    from medheval.run.seeds import MAX_SEED, seed_problem

    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or seed_problem(number):
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {value!r}")
    return number


def check_sampling_flags(args: argparse.Namespace) -> None:
    """Refuse ``--temperature`` / ``--top-p`` typed without ``--do-sample`` under the clean protocol, where decoding
    is then greedy: the values would be recorded and change nothing. A paper protocol sets ``do_sample`` per
    mitigation (and a grid config in its generation layers), so there the typed values are left to apply where it
    samples. A temperature of 0 with ``--do-sample`` is refused too for a local model (sampling divides by it). ``medheval run`` and
    ``medheval inputs`` both check it."""
    from medheval.run.protocol import RunError

    from medheval.backends.api import is_api_model

    # a local model's sampling divides by the temperature (transformers refused it at the first batch, after the
    # model loaded); an API model takes temperature 0 with --do-sample's seed and top_p, sent as such
    if args.do_sample and args.temperature == 0 and args.model and not is_api_model(args.model):
        raise RunError("--temperature 0 with --do-sample: sampling needs a temperature > 0; for greedy decoding "
                       "drop --do-sample and --temperature")
    if args.do_sample or args.protocol != "clean" or not args.model:
        return
    typed = [(flag, value) for flag, value in (("--temperature", args.temperature), ("--top-p", args.top_p))
             if value is not None]
    if typed:
        named = " and ".join(f"{flag} {value}" for flag, value in typed)
        raise RunError(f"{named} {'has' if len(typed) == 1 else 'have'} no effect without --do-sample (decoding is "
                       f"greedy); add --do-sample, or drop {' and '.join(flag for flag, _ in typed)}")


def host_list_entry(value: str) -> str:
    """``--api-key-host``, ``--proxy-for``, ``--allow-remote-credentialed``: a host, ``host:port`` or URL
    (:func:`medheval.net.hosts.check_host_entry`), refused while the arguments are parsed."""
    try:
        return check_host_entry(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def batch_size_argument(value: str) -> int | str:
    """``--batch-size``: a positive integer or ``auto``."""
    if value == "auto":
        return value
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}") from None


# the --api-option keys of an API model (docs/api-models.md); api_version is Azure's alone, anthropic takes no
# json/extra_body options
API_OPTIONS = ("timeout", "deadline", "max_retries", "requests_per_minute", "cache_dir", "api_version", "headers",
               "extra_body", "continue_final_message", "max_consecutive_failures", "backoff_base", "backoff_max",
               "name", "api_key", "api_key_env")
_API_OPTIONS_NOT_FOR = {"api_version": ("openai", "anthropic"), "extra_body": ("anthropic",)}
# what build_api_backend sets from a flag of its own: an --api-option of the same name is refused, naming the flag
_API_OPTIONS_WITH_A_FLAG = {
    "max_new_tokens": "--max-new-tokens", "do_sample": "--do-sample", "temperature": "--temperature",
    "top_p": "--top-p", "seed": "--seed", "concurrency": "--api-concurrency", "batch_size": "--batch-size",
    "allow_remote_credentialed": "--allow-remote-credentialed",
}


def api_option_names() -> str:
    """The ``--api-option`` keys, those for some model kinds only marked so: what ``--help`` and the error of an
    unknown key both list."""
    kinds = ("openai", "azure", "anthropic")
    return ", ".join(key + (f" ({'/'.join(k for k in kinds if k not in _API_OPTIONS_NOT_FOR[key])} only)"
                            if key in _API_OPTIONS_NOT_FOR else "") for key in API_OPTIONS)


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
    parser.add_argument("--control", action="append", choices=("none", "no_image", "blank", "noise"),
                        help="image-blind control: the same prompt with no image, a black image of the same size, "
                             "or seeded noise (--seed; recorded); repeatable: a grid axis beside --mitigation, e.g. "
                             "--control none --control no_image (default: none; medheval/run/control.py)")
    parser.add_argument("--data-dir", help="local copy of MedHEval's benchmark_data/ (default: pinned download)")
    parser.add_argument("--image-root", action="append", default=[], metavar="SOURCE=ROOT",
                        help="image root per source: a folder, a URL template with {path}, or hf://dataset (repeatable)")
    parser.add_argument("--on-missing", choices=("error", "skip"), default="error",
                        help="missing or undecodable images: stop with the list of ids (default) or skip and "
                             "count them")
    parser.add_argument("--metrics", action="append", help="metric names (default: by answer type)")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N records of each split (N >= 1)")
    parser.add_argument("--batch-size", type=batch_size_argument, default=8, metavar="N|auto",
                        help="records per generate call; 'auto': the largest batch that fits the device's memory, "
                             "per split and method (backs off on out-of-memory; recorded in results.json)")
    parser.add_argument("--no-compile", dest="compile", action="store_const", const=False, default=None,
                        help="decode eagerly (default on CUDA: the decode steps run on a static cache through "
                             "torch.compile with CUDA graphs, which gives eager's tokens in float32)")
    parser.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                        help="one length for every record (default: per answer type / benchmark, see "
                             "medheval/run/generation.py: 16 yes/no … 512 reports, 4096 ClinHallu traces)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=generation_number("temperature"), help="sampling temperature; needs --do-sample (or a protocol "
                                                          "that samples): refused without it")
    parser.add_argument("--top-p", type=generation_number("top_p"), help="nucleus sampling's p; needs --do-sample (or a protocol that "
                                                    "samples): refused without it")
    parser.add_argument("--seed", type=seed_argument, default=0,
                        help="sampling seed (each record samples from its own generator seeded from seed and its "
                             "id: batch size never changes a sample) and the noise control's seed")
    parser.add_argument("--seeds", metavar="S1,S2,...",
                        help="sample once per seed, e.g. 0,1,2: each seed a full pass in its own sub-folder "
                             "(<cell>__seed-<s>/), the report giving the mean and spread over seeds beside the interval "
                             "over items; needs sampling (--do-sample or a sampling protocol); medheval/run/seeds.py")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--upstream-compat", action=argparse.BooleanOptionalAction, default=None,
                        help="score with MedHEval's released rules (close-ended parsing, text cleaning), to match "
                             "published numbers (default: on under the medheval-* protocols, off under clean)")
    parser.add_argument("--metric-option", action="append", default=[], metavar="METRIC.KEY=VALUE",
                        help="an option for one metric, e.g. chair.variant=medheval_code; the value is checked "
                             "against the option's type before anything runs (booleans true/false, numbers, JSON "
                             "lists/objects; repeatable)")
    parser.add_argument("--judge", metavar="BACKEND:MODEL[@BASE_URL]",
                        help="LLM judge for judge-based metrics, e.g. openai:gpt-4o@http://127.0.0.1:8000/v1 "
                             "(keys from OPENAI_API_KEY / ANTHROPIC_API_KEY, sent to the provider's host or the "
                             "host named here)")
    parser.add_argument("--api-key-host", action="append", type=host_list_entry, default=[], metavar="HOST[:PORT]",
                        help="a host an API key from the environment (OPENAI_API_KEY, a judge dict's api_key_env …) "
                             "may be sent to, besides the provider's own and the hosts of --judge/--model: for a "
                             "judge named in a grid config (repeatable; or MEDHEVAL_API_KEY_HOSTS=host1,host2)")
    parser.add_argument("--allow-missing-predictions", action="store_true",
                        help="with --predictions: score the records present, count the others as missing")
    parser.add_argument("--allow-remote-credentialed", action="append", type=host_list_entry, default=[],
                        metavar="HOST_OR_URL",
                        help="a non-local judge or model endpoint approved under your PhysioNet agreement for "
                             "credentialed (MIMIC-derived) records, e.g. myorg.openai.azure.com (repeatable; recorded "
                             "in results; or MEDHEVAL_ALLOW_REMOTE_CREDENTIALED=host1,host2). A grid config cannot "
                             "approve an endpoint: its allow_remote_credentialed entries must be given here too")
    parser.add_argument("--proxy-for", action="append", type=host_list_entry, default=[], metavar="HOST",
                        help="let credentialed traffic to HOST (PhysioNet images, an approved endpoint) use the proxy "
                             "from HTTP(S)_PROXY/ALL_PROXY; without it such traffic never goes through a proxy "
                             "(repeatable; or MEDHEVAL_PROXY_FOR=host1,host2)")
    parser.add_argument("--cluster", choices=("auto", "none"), default="auto",
                        help="what report.html's intervals resample: auto (default) each split's declared unit "
                             "(image, study, report or item), none items one by one (as `medheval report --cluster`)")
    parser.add_argument("--compare-published", action="store_true",
                        help="report.html gets the Reproduction table: each cell beside the papers' published "
                             "value, with the difference where the run is comparable (as `medheval report "
                             "--compare-published`; docs/reproduction.md)")
    parser.add_argument("--lock-timeout", type=seconds_argument, default=0.0, metavar="SECONDS",
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
    parser.add_argument("--api-concurrency", type=positive_int, default=16, metavar="N",
                        help="--model openai:/azure:/anthropic:… : requests in flight at once (N >= 1; default 16)")
    parser.add_argument("--api-option", action="append", default=[], metavar="KEY=VALUE",
                        help=f"--model openai:/azure:/anthropic:… : {api_option_names()} (values read as JSON "
                             "when they parse; repeatable; docs/api-models.md)")
    parser.add_argument("--protocol", default="clean", metavar="NAME",
                        help="what the model receives and how it decodes (instructions, conversation template, "
                             "sampling, lengths, mitigation settings): " + protocol_help())
    parser.add_argument("--chat-template", metavar="NAME",
                        help="conversation template of a LLaVA-family model: model (the processor's own), vicuna_v1, "
                             "llava_v1, mistral_instruct (read from the pinned upstream conversation.py; default: "
                             "the protocol's choice, under clean the model's own)")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="encode the prompt prefix of records sharing images once and reuse its KV cache "
                             "(same greedy answers; Med-StepBench: statements of one study)")


def protocol_help() -> str:
    """One line per paper protocol, for ``--help``."""
    from medheval.run.paper_protocols import list_protocols

    return "; ".join(f"{p.name}: {p.title}" for p in list_protocols()) + " (cards: docs/protocols/)"


def parse_metric_options(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """``["chair.variant=paper", "text_generation.bertscore_model=/m"]`` -> ``{metric: {key: "text"}}``.

    Values stay text here: the runner converts each to the type its metric declares
    (:mod:`medheval.scoring.metric_options`), so ``upstream_compat=False`` is ``False``, not the string."""
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


def protocol_dtype(protocol: str | None, device: str | None) -> str | None:
    """The precision a paper protocol's published runs loaded the model in (MedHEval: float16), on a GPU when
    ``--dtype`` is not given; ``None`` (the backend's default) on CPU or under ``clean``."""
    import torch

    from medheval.run.paper_protocols import get_protocol

    dtype = get_protocol(protocol or "clean").gpu_dtype
    on_gpu = device.startswith("cuda") if device else torch.cuda.is_available()
    return dtype if dtype and on_gpu else None


class ModelConfigError(ValueError):
    """A ``--model`` that is neither a model folder nor a Hub id (the message says which)."""


def model_config_file(model: str) -> Path:
    """The ``config.json`` of a ``--model`` (a local folder's, or a Hub id's, cached or fetched), without loading
    weights. :class:`ModelConfigError` for a folder without one or text that is no Hub id; the Hub's own error when
    the file cannot be fetched (offline and not cached, gated, no such repo)."""
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise ModelConfigError(f"{path} is not a model folder (no config.json)")
        return path / "config.json"
    if model.count("/") != 1:
        raise ModelConfigError("not a Hub id (ORG/NAME), a local folder or tiny-random-llava")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(model, "config.json"))


def model_type_before_loading(model: str) -> str | None:
    """``config.model_type`` of a local ``--model`` read from its ``config.json`` alone (:func:`model_config_file`),
    without loading weights; ``None`` for an API model or where the file cannot be read (loading the model then
    says why)."""
    from medheval.backends.api import is_api_model

    if model == TINY_MODEL:  # build_tiny_llava's
        from transformers import LlavaConfig

        return LlavaConfig.model_type
    if is_api_model(model):
        return None
    try:
        model_type = json.loads(model_config_file(model).read_text()).get("model_type")
    except Exception:  # noqa: BLE001 - offline, gated, no such model, not JSON: loading names the reason
        return None
    return model_type if isinstance(model_type, str) else None


def build_backend(args: argparse.Namespace):
    """The backend named by ``--model`` / ``--predictions``; labels for the report."""
    from medheval.backends.hf import HFBackend
    from medheval.backends.predictions import PredictionsFileBackend
    from medheval.run.distributed import device_for

    if args.predictions:
        return PredictionsFileBackend(args.predictions), {}
    from medheval.backends.api import is_api_model
    from medheval.run.generation import FALLBACK_MAX_NEW_TOKENS

    if is_api_model(args.model):
        return build_api_backend(args), {}
    device = device_for(args.device)
    common = dict(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens or FALLBACK_MAX_NEW_TOKENS,
                  do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                  device=device, dtype=args.dtype or protocol_dtype(getattr(args, "protocol", None), device))
    if getattr(args, "chat_template", None):
        common["chat_template"] = args.chat_template
    if getattr(args, "prefix_cache", False):
        common["prefix_cache"] = True
    if getattr(args, "compile", None) is not None:
        common["compile"] = args.compile
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
    from medheval.run.generation import FALLBACK_MAX_NEW_TOKENS

    local_only = [flag for flag, given in (("--device", args.device), ("--dtype", args.dtype),
                                           ("--prefix-cache", getattr(args, "prefix_cache", False)),
                                           ("--chat-template", getattr(args, "chat_template", None) not in (None, "model")))
                  if given]
    if local_only:
        raise BackendError(f"{', '.join(local_only)} apply to a local model; {args.model!r} runs on its server")
    options: dict[str, object] = {}
    for item in getattr(args, "api_option", []):
        key, sep, raw = item.partition("=")
        if not (sep and key.strip()):
            raise ValueError(f"--api-option {item!r}: expected KEY=VALUE, e.g. timeout=600")
        key = key.strip()
        if key in _API_OPTIONS_WITH_A_FLAG:
            raise BackendError(f"--api-option {item!r}: {key} has its own flag, give {_API_OPTIONS_WITH_A_FLAG[key]} "
                               "instead")
        kind = str(args.model).split(":", 1)[0].lower()
        kind = {"azure-openai": "azure", "azure_openai": "azure", "claude": "anthropic"}.get(kind, kind)
        if key not in API_OPTIONS:
            raise BackendError(f"--api-option {key!r} is not an option of an API model{did_you_mean(key, API_OPTIONS)}"
                               f"; the options are {api_option_names()} (docs/api-models.md)")
        if kind in _API_OPTIONS_NOT_FOR.get(key, ()):
            raise BackendError(f"--api-option {key!r} does not apply to {kind}: models (it is for "
                               + ("azure" if key == "api_version" else "openai and azure") + " models)")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    register_named(options)  # api_key=…, extra_body={"api_key": …}: redacted by value from every output
    return APIBackend(args.model, max_new_tokens=args.max_new_tokens or FALLBACK_MAX_NEW_TOKENS, do_sample=args.do_sample,
                      temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                      concurrency=getattr(args, "api_concurrency", 16),
                      batch_size=max(args.batch_size if isinstance(args.batch_size, int) else 8,
                                     4 * getattr(args, "api_concurrency", 16)),
                      allow_remote_credentialed=list(args.allow_remote_credentialed) or None, **options)

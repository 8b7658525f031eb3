"""Run grids from YAML: ``medheval run --config grid.yaml`` runs models × benchmarks × mitigations.

A grid config (see ``configs/`` for the papers' tables)::

    output: runs/medheval_table3            # one sub-folder per model, combined results.md on top
    models: [llava-hf/llava-1.5-7b-hf, Qwen/Qwen2.5-VL-7B-Instruct]
    benchmarks: [mm_vishal, cxr_vishal]     # name or name:config
    mitigations: [none, "vcd:alpha=1"]      # default [none]
    controls: [none, no_image]              # image-blind controls, a grid axis (default [none]; run/control.py)
    seeds: [0, 1, 2]                        # one pass per sampling seed, a grid axis (needs sampling; run/seeds.py)
    generation:                             # medheval.run.generation (built-in table per answer type applies)
      defaults: {do_sample: false}
      answer_types: {report: {max_new_tokens: 512}}
      benchmarks: {clinhallu: {max_new_tokens: 1024}}

Every key is checked before anything runs (unknown key, wrong type: the error names the file and the
key). Command-line flags given explicitly override the config's value of the same setting: lists and
scalars are replaced (``--model X`` replaces ``models``, ``--benchmark`` replaces ``benchmarks``),
mappings are merged per entry (``--image-root SOURCE=…``, ``--metric-option M.K=V``,
``--benchmark-option B.K=V``), and generation flags (``--max-new-tokens`` …) beat every
``generation`` layer. Every model is checked to be loadable (a local folder with ``config.json``, or
a Hub repo whose ``config.json`` can be fetched) before the first generation; a model that fails
later (out of memory …) stops the grid, and re-running the same config resumes every cell.

A config never decides where data or keys go: a judge or API model it names gets a key from the environment only
at a host the user named (:func:`check_key_destinations`), and an endpoint it approves for credentialed (MIMIC)
records must be approved by the user too (:func:`check_credentialed_approvals`); both are checked first in
:func:`run_config` (:func:`check_config_policy`), from the command line and from Python alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from medheval.net.secrets import URL_PATTERN, register_urls_in
from medheval.run.control import CONTROLS, Control, ControlError
from medheval.run.generation import GenerationPlan, check_settings
from medheval.run.grid_plan import GRID_FILE, PlannedCell, plan_cells, record_plan
from medheval.run.options import did_you_mean
from medheval.run.runner import RunError, RunSpec, check_before_model, configure_run, run_configured, write_report_html

# key -> (accepted types, description for the error). ``None`` is accepted for every optional key.
CONFIG_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "description": ((str,), "text"),
    "output": ((str,), "a folder path"),
    "models": ((list,), "a list of model ids (Hub ids, local folders, tiny-random-llava)"),
    "benchmarks": ((list,), "a list of NAME[:CONFIG]"),
    "mitigations": ((list,), "a list of mitigation specs (none, vcd:alpha=1 …)"),
    "controls": ((list,), "a list of image controls (none, no_image, blank, noise)"),
    "generation": ((dict,), "a mapping with defaults / answer_types / benchmarks / builtin"),
    "metrics": ((list,), "a list of metric names"),
    "metric_options": ((dict,), "a mapping {metric: {option: value}}"),
    "benchmark_options": ((dict,), "a mapping {benchmark: {option: value}}"),
    "judge": ((str,), "a judge spec BACKEND:MODEL[@BASE_URL]"),
    "image_roots": ((dict,), "a mapping {source: folder, URL template or hf://…}"),
    "data_dir": ((str,), "a folder path"),
    "limit": ((int,), "an integer"),
    "batch_size": ((int,), "an integer"),
    "seed": ((int,), "an integer"),
    "seeds": ((list,), "a list of sampling seeds, one pass each (medheval.run.seeds)"),
    "device": ((str,), "cpu, cuda, cuda:1 …"),
    "dtype": ((str,), "float32, bfloat16, float16"),
    "upstream_compat": ((bool,), "true or false"),
    "on_missing": ((str,), "error or skip"),
    "allow_remote_credentialed": ((list,), "a list of hosts/URLs (each also approved on the command line)"),
    "prefix_cache": ((bool,), "true or false"),
    "lock_timeout": ((int, float), "seconds"),
    "cluster": ((str,), "auto or none (what report.html's intervals resample)"),
    "compare_published": ((bool,), "true or false (report.html's Reproduction table)"),
    "detector": ((str,), "rule or a detector folder"),
    "protocol": ((str,), "a paper protocol name (clean, medheval-baseline, … ; medheval/run/paper_protocols)"),
    "chat_template": ((str,), "model, vicuna_v1, llava_v1 or mistral_instruct"),
}
REQUIRED_KEYS = ("output", "models", "benchmarks")
GENERATION_SECTIONS = ("defaults", "answer_types", "benchmarks", "builtin")
# command-line dest -> config key, for flags that replace the config's value
CLI_REPLACES = {"data_dir": "data_dir", "limit": "limit", "batch_size": "batch_size",
                "seed": "seed", "device": "device", "dtype": "dtype", "upstream_compat": "upstream_compat",
                "on_missing": "on_missing", "judge": "judge", "lock_timeout": "lock_timeout",
                "detector": "detector", "prefix_cache": "prefix_cache", "cluster": "cluster",
                "compare_published": "compare_published",
                "protocol": "protocol", "chat_template": "chat_template"}
CLI_GENERATION = ("max_new_tokens", "do_sample", "temperature", "top_p")


class GridConfigError(ValueError):
    """A grid config is malformed; the message names the file and the key."""


@dataclass
class GridConfig:
    """A validated grid config (``source``: the YAML file, for messages)."""

    source: str
    output: str
    models: list[str]
    benchmarks: list[str]
    mitigations: list[str] = field(default_factory=lambda: ["none"])
    controls: list[str] = field(default_factory=lambda: ["none"])  # image-blind controls (medheval.run.control)
    generation: GenerationPlan = field(default_factory=GenerationPlan)
    options: dict[str, Any] = field(default_factory=dict)  # every other key, validated

    def get(self, key: str, default: Any = None) -> Any:
        value = self.options.get(key)
        return default if value is None else value


MAX_CONFIG_BYTES = 1 << 20  # a grid file larger than this is refused
MAX_CONFIG_NODES = 100_000  # values in a grid once every YAML alias is expanded ("billion laughs" refused)
MAX_MESSAGE_CHARS = 500  # an error quotes at most this much of a value


def _fail(source: str, key: str, text: str) -> GridConfigError:
    if len(text) > MAX_MESSAGE_CHARS:
        text = f"{text[:MAX_MESSAGE_CHARS]}… ({len(text) - MAX_MESSAGE_CHARS} more characters not shown)"
    return GridConfigError(f"{source}: {key[:200]}: {text}")


def _expanded_size(value: Any, source: str) -> int:
    """How many values ``value`` holds once YAML aliases are expanded, counted without expanding them (each shared
    list or mapping is counted once per reference, from a memo); :class:`GridConfigError` past
    :data:`MAX_CONFIG_NODES` or for a structure that contains itself."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(item: Any) -> int:
        if not isinstance(item, (dict, list)):
            return 1
        key = id(item)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise GridConfigError(f"{source}: a YAML alias refers to a value that contains it; write the value out")
        active.add(key)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_CONFIG_NODES:
                raise GridConfigError(
                    f"{source}: more than {MAX_CONFIG_NODES} values once its YAML aliases (*name) are expanded; "
                    "a grid is a short list of settings: write them out without nested aliases")
        active.discard(key)
        sizes[key] = total
        return total

    return size(value)


def _string_list(source: str, key: str, value: list) -> list[str]:
    bad = [item for item in value if not isinstance(item, str) or not item.strip()]
    if bad:
        raise _fail(source, key, f"every entry must be a non-empty string, got {bad[0]!r}")
    return [item.strip() for item in value]


def _nested_mapping(source: str, key: str, value: dict) -> dict[str, dict[str, Any]]:
    for name, inner in value.items():
        if not isinstance(inner, dict):
            raise _fail(source, f"{key}.{name}", f"expected a mapping of options, got {type(inner).__name__}")
    return {str(name): dict(inner) for name, inner in value.items()}


def _generation_plan(source: str, value: Mapping[str, Any], models: Sequence[str] = ()) -> GenerationPlan:
    from medheval.backends.api import is_api_model
    from medheval.data.benchmarks import list_benchmarks, parse_benchmark_spec
    from medheval.data.schema import ANSWER_TYPES

    unknown = sorted(set(value) - set(GENERATION_SECTIONS))
    if unknown:
        raise _fail(source, f"generation.{unknown[0]}", f"unknown key{did_you_mean(str(unknown[0]), GENERATION_SECTIONS)}"
                                                         f"; known: {', '.join(GENERATION_SECTIONS)}")

    def settings(where: str, given: Any) -> dict[str, Any]:
        try:
            return check_settings(given, where, local=not models or not all(map(is_api_model, models)))
        except ValueError as error:
            raise GridConfigError(f"{source}: {error}") from None

    builtin = value.get("builtin", True)
    if not isinstance(builtin, bool):
        raise _fail(source, "generation.builtin", f"expected true or false, got {builtin!r}")
    sections: dict[str, dict[str, dict[str, Any]]] = {}
    for section, allowed in (("answer_types", set(ANSWER_TYPES)), ("benchmarks", set(list_benchmarks()))):
        given = value.get(section) or {}
        if not isinstance(given, dict):
            raise _fail(source, f"generation.{section}", f"expected a mapping, got {type(given).__name__}")
        for name in given:
            base = parse_benchmark_spec(str(name))[0] if section == "benchmarks" else str(name)
            if base not in allowed:
                raise _fail(source, f"generation.{section}.{name}", f"unknown; known: {', '.join(sorted(allowed))}")
        sections[section] = {str(name): settings(f"generation.{section}.{name}", inner) for name, inner in given.items()}
    return GenerationPlan(defaults=settings("generation.defaults", value.get("defaults") or {}),
                          answer_types=sections["answer_types"], benchmarks=sections["benchmarks"], builtin=builtin)


def parse_grid_config(data: Any, source: str = "<config>") -> GridConfig:
    """Check a parsed YAML document strictly and return it as a :class:`GridConfig`."""
    from medheval.data.benchmarks import list_benchmarks, parse_benchmark_spec
    from medheval.mitigations import get_mitigation

    if not isinstance(data, dict):
        raise GridConfigError(f"{source}: expected a mapping of settings at the top, got {type(data).__name__}")
    _expanded_size(data, source)
    # a key in a model's or judge's URL (?api-key=, user:pass@) or a judge dict's api_key: redacted from every file
    # and message from here on (grid.json is written before any model or judge registers its own)
    register_urls_in(data)
    for key, value in data.items():
        if key not in CONFIG_KEYS:
            raise _fail(source, str(key), f"unknown key{did_you_mean(str(key), CONFIG_KEYS)}; known: "
                                          f"{', '.join(CONFIG_KEYS)}")
        types, wanted = CONFIG_KEYS[key]
        if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise _fail(source, key, f"expected {wanted}, got {type(value).__name__} {value!r}")
    missing = [key for key in REQUIRED_KEYS if not data.get(key)]
    if missing:
        raise _fail(source, missing[0], "required (and must not be empty)")
    models = _string_list(source, "models", data["models"])
    benchmarks = _string_list(source, "benchmarks", data["benchmarks"])
    for key, values in (("models", [model_slug(m) for m in models]), ("benchmarks", benchmarks)):
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            raise _fail(source, key, f"listed twice: {repeated[0]!r} (each model writes one folder)")
    known = set(list_benchmarks())
    for index, spec in enumerate(benchmarks):
        if parse_benchmark_spec(spec)[0] not in known:
            raise _fail(source, f"benchmarks[{index}]", f"unknown benchmark {spec!r}; known: {', '.join(sorted(known))}")
    mitigations = _string_list(source, "mitigations", data.get("mitigations") or ["none"])
    for index, spec in enumerate(mitigations):
        try:
            get_mitigation(spec)
        except ValueError as error:
            raise _fail(source, f"mitigations[{index}]", str(error)) from None
    controls = _string_list(source, "controls", data.get("controls") or ["none"])
    for index, kind in enumerate(controls):
        if kind not in CONTROLS:
            raise _fail(source, f"controls[{index}]", f"unknown control {kind!r}; known: {', '.join(CONTROLS)}")
    if len(set(controls)) < len(controls):
        raise _fail(source, "controls", "a control is listed twice (each writes one folder)")
    try:
        for kind in controls:
            Control(kind).check_mitigations(mitigations)
    except ControlError as error:
        raise _fail(source, "controls", str(error)) from None
    options: dict[str, Any] = {}
    for key in ("metrics", "allow_remote_credentialed"):
        if data.get(key) is not None:
            options[key] = _string_list(source, key, data[key])
    for key in ("metric_options", "benchmark_options"):
        if data.get(key) is not None:
            options[key] = _nested_mapping(source, key, data[key])
    if data.get("image_roots") is not None:
        bad = [name for name, root in data["image_roots"].items() if not isinstance(root, str) or not root]
        if bad:
            raise _fail(source, f"image_roots.{bad[0]}", "expected a folder, URL template or hf:// root")
        options["image_roots"] = {str(name): root for name, root in data["image_roots"].items()}
    if data.get("on_missing") not in (None, "error", "skip"):
        raise _fail(source, "on_missing", f"expected error or skip, got {data['on_missing']!r}")
    if data.get("protocol") is not None:
        from medheval.run.paper_protocols import get_protocol

        try:
            get_protocol(data["protocol"])
        except ValueError as error:
            raise _fail(source, "protocol", str(error)) from None
    if data.get("chat_template") is not None:
        from medheval.backends.conversation import check_template_name

        try:
            check_template_name(data["chat_template"])
        except ValueError as error:
            raise _fail(source, "chat_template", str(error)) from None
    if data.get("cluster") not in (None, "auto", "none"):
        raise _fail(source, "cluster", f"expected auto or none, got {data['cluster']!r}")
    if data.get("seeds") is not None:
        from medheval.run.seeds import parse_seeds

        try:
            options["seeds"] = parse_seeds(data["seeds"], "seeds")
        except RunError as error:
            raise GridConfigError(f"{source}: {error}") from None
    for key in ("limit", "batch_size"):
        if data.get(key) is not None and data[key] < 1:
            raise _fail(source, key, f"must be >= 1, got {data[key]}")
    if data.get("seed") is not None:
        from medheval.run.seeds import seed_problem

        problem = seed_problem(data["seed"])
        if problem:
            raise _fail(source, "seed", f"{problem}; a seed is a whole number >= 0")
    if data.get("lock_timeout") is not None and not data["lock_timeout"] >= 0:  # NaN would wait forever
        raise _fail(source, "lock_timeout", f"must be a number of seconds >= 0, got {data['lock_timeout']}")
    for key in set(CONFIG_KEYS) - set(options) - {"output", "models", "benchmarks", "mitigations", "controls",
                                                   "generation"}:
        if data.get(key) is not None:
            options[key] = data[key]
    return GridConfig(source=source, output=data["output"], models=models, benchmarks=benchmarks,
                      mitigations=mitigations, controls=controls, generation=_generation_plan(source, data.get("generation") or {}, models),
                      options=options)


def load_grid_config(path: str | Path) -> GridConfig:
    """Read and check a grid YAML file (errors name the file and the key)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise GridConfigError(f"--config {path}: no such file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise GridConfigError(f"--config {path}: {path.stat().st_size} bytes; a grid file holds at most "
                              f"{MAX_CONFIG_BYTES} bytes")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, RecursionError) as error:
        text = str(error)
        raise GridConfigError(f"{path}: not valid YAML ({text[:MAX_MESSAGE_CHARS]})") from None
    return parse_grid_config(data, str(path))


def apply_cli(config: GridConfig, args: argparse.Namespace, given: set[str]) -> GridConfig:
    """``config`` with the command-line flags in ``given`` (the dests the user typed) applied on top."""
    from medheval.run.options import parse_benchmark_options, parse_metric_options, split_list
    from medheval.data.images import parse_image_root_args

    if "predictions" in given:
        raise GridConfigError(f"{config.source}: --predictions scores one file; a grid runs models (use --model)")
    if getattr(args, "task", "generate") != "generate":
        raise GridConfigError(f"{config.source}: --task {args.task} takes no --config (grids generate)")
    config = replace(config, options=dict(config.options))
    if "model" in given:
        config.models = [args.model]
    if "benchmark" in given:
        config.benchmarks = split_list(args.benchmark) or []
    if "mitigation" in given:
        config.mitigations = list(args.mitigation)
    if "control" in given:
        config.controls = list(dict.fromkeys(args.control))
    if "metrics" in given:
        config.options["metrics"] = split_list(args.metrics)
    if "seeds" in given:
        from medheval.run.seeds import parse_seeds

        config.options["seeds"] = parse_seeds(args.seeds)
    for dest, key in CLI_REPLACES.items():
        if dest in given:
            config.options[key] = getattr(args, dest)
    if "output" in given:
        config.output = args.output
    if "image_root" in given:
        config.options["image_roots"] = {**config.get("image_roots", {}), **parse_image_root_args(args.image_root)}
    if "allow_remote_credentialed" in given:
        config.options["allow_remote_credentialed"] = list(args.allow_remote_credentialed)
    for dest, key, parse in (("metric_option", "metric_options", parse_metric_options),
                             ("benchmark_option", "benchmark_options", parse_benchmark_options)):
        if dest in given:
            merged = {name: dict(values) for name, values in config.get(key, {}).items()}
            for name, values in parse(getattr(args, dest)).items():
                merged.setdefault(name, {}).update(values)
            config.options[key] = merged
    fixed = {dest: getattr(args, dest) for dest in CLI_GENERATION if dest in given}
    config.generation = replace(config.generation, fixed={**config.generation.fixed, **fixed})
    return config


def _approval_fields(value: Any, where: str) -> list[tuple[str, Any]]:
    """``(field, value)`` of every ``allow_remote_credentialed`` in ``value``: in nested mappings and lists, and in
    text holding a JSON object or list (a metric option's text is parsed as JSON)."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            field_name = f"{where}.{key}" if where else str(key)
            if key == "allow_remote_credentialed":
                found.append((field_name, inner))
            else:
                found += _approval_fields(inner, field_name)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _approval_fields(inner, f"{where}[{index}]")
    return found


def check_credentialed_approvals(config: GridConfig, typed: Sequence[str] = ()) -> None:
    """:class:`GridConfigError` naming the file, the field and the endpoint when the config approves an endpoint
    for credentialed (MIMIC) records that the user did not approve: ``typed`` (``--allow-remote-credentialed``
    on this command line), or :func:`medheval.judges.endpoints.approved_endpoints` (the command line as
    ``main()`` recorded it, ``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED``). Checks the top-level key, ``metric_options``
    and ``benchmark_options`` (judge dicts in them included). Sends nothing."""
    from medheval.judges.endpoints import check_config_approval

    for field_name, value in _approval_fields(config.options, ""):
        if field_name == "allow_remote_credentialed" and not value:
            continue
        try:
            check_config_approval(value, typed)
        except (PermissionError, ValueError) as error:
            raise _fail(config.source, field_name, str(error)) from None


def check_key_destinations(config: GridConfig) -> None:
    """:class:`GridConfigError` naming the file and key when a judge or API model the config names would be sent
    a key from the environment at a host that is neither the provider's nor one the user named on the command
    line or in ``MEDHEVAL_API_KEY_HOSTS`` (:mod:`medheval.net.keys`); also an ``api_key_env`` that names no
    ``*_API_KEY`` variable. Sends nothing."""
    from medheval.judges.base import JudgeError
    from medheval.judges.spec import check_key_destination

    places: list[tuple[str, Any]] = [("judge", config.get("judge"))]
    places += [(f"models[{index}]", model) for index, model in enumerate(config.models)]
    for metric, options in config.get("metric_options", {}).items():
        places += [(f"metric_options.{metric}.{key}", value) for key, value in dict(options).items()]
    for key, spec in places:
        try:
            check_key_destination(spec)
        except JudgeError as error:
            raise _fail(config.source, key, str(error)) from None


def model_slug(model: str) -> str:
    """A folder name for one model (``llava-hf/llava-1.5-7b-hf`` -> ``llava-hf__llava-1.5-7b-hf``); never ``.`` or
    ``..`` (a model named ``..``, the local folder above, would write its cell into the grid folder's parent), and
    never a URL's user-info, query or fragment (an API key in ``?api-key=`` would name a folder)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", URL_PATTERN.sub(_url_without_secrets, model).replace("/", "__")).strip("_")
    return slug if slug not in ("", ".", "..") else "model"


def _url_without_secrets(match: re.Match[str]) -> str:
    """A URL in a model spec without its user-info, query and fragment, which may hold a key
    (``openai:m@https://host/v1?api-key=…``): a folder name is never redacted."""
    try:
        parts = urlsplit(match.group(0))
    except ValueError:
        return "url"
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def check_model(model: str) -> str | None:
    """Why ``model`` cannot be loaded (``None`` when it looks loadable), without loading weights:
    the tiny demo model and API specs pass; a local folder needs ``config.json``; a Hub id needs a
    ``config.json`` that can be fetched (or is cached, offline)."""
    from medheval.run.options import TINY_MODEL, ModelConfigError, model_config_file

    if model == TINY_MODEL or re.match(r"^(openai|azure|anthropic):", model):
        return None
    try:
        model_config_file(model)
    except ModelConfigError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - offline, gated, missing: the reason is the message
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def run_spec(config: GridConfig, model: str, labels: Mapping[str, str]) -> RunSpec:
    """The :class:`RunSpec` of one model's cells (its mitigations run through :func:`run_grid`)."""
    return RunSpec(benchmarks=config.benchmarks, output=Path(config.output) / model_slug(model),
                   data_dir=config.get("data_dir"), image_roots=config.get("image_roots") or None,
                   on_missing=config.get("on_missing", "error"), metrics=config.get("metrics"),
                   limit=config.get("limit"), upstream_compat=config.get("upstream_compat"),
                   metric_options=config.get("metric_options", {}), judge=config.get("judge"), labels=dict(labels),
                   allow_remote_credentialed=tuple(config.get("allow_remote_credentialed", ())),
                   lock_timeout=float(config.get("lock_timeout", 0.0)), detector=config.get("detector"),
                   benchmark_options=config.get("benchmark_options", {}), generation=config.generation,
                   report_cluster=config.get("cluster", "auto"),
                   compare_published=bool(config.get("compare_published", False)), control_seed=int(config.get("seed", 0)),
                   protocol=config.get("protocol", "clean"), chat_template=config.get("chat_template"))


def backend_args(config: GridConfig, model: str) -> argparse.Namespace:
    """The ``--model`` arguments :func:`medheval.run.options.build_backend` takes, from the config."""
    from medheval.run.generation import FALLBACK_MAX_NEW_TOKENS

    fixed = config.generation.fixed
    return argparse.Namespace(
        model=model, predictions=None, batch_size=int(config.get("batch_size", 8)),
        max_new_tokens=fixed.get("max_new_tokens") or FALLBACK_MAX_NEW_TOKENS,
        do_sample=bool(fixed.get("do_sample", False)), temperature=fixed.get("temperature"),
        top_p=fixed.get("top_p"), seed=int(config.get("seed", 0)), device=config.get("device"),
        dtype=config.get("dtype"), prefix_cache=bool(config.get("prefix_cache", False)),
        chat_template=config.get("chat_template"), protocol=config.get("protocol", "clean"),
        allow_remote_credentialed=list(config.get("allow_remote_credentialed", ())))  # checked by run_config


def grid_plan(config: GridConfig) -> list[PlannedCell]:
    """Every cell :func:`run_config` runs, in its order (model × mitigation × control × seed), with the folder
    each writes relative to ``config.output`` and the mitigation spec it records (the protocol's method options
    added, as :func:`medheval.run.runner.run_grid` adds them)."""
    from medheval.mitigations import get_mitigation
    from medheval.run.paper_protocols import get_protocol

    protocol = get_protocol(config.get("protocol", "clean"))
    labels = []
    for text in config.mitigations:
        method = get_mitigation(protocol.mitigation_spec(text))
        labels.append(method.spec() if method is not None else "none")
    controls = list(dict.fromkeys(config.controls))
    return [cell for model in config.models
            for cell in plan_cells(model, config.benchmarks, labels, controls, config.get("seeds"), model_slug(model))]


def check_config_policy(config: GridConfig, approved: Sequence[str] = ()) -> None:
    """What a config may not decide, checked before anything runs (:class:`GridConfigError` naming the file and
    the field): where keys from the environment go (:func:`check_key_destinations`) and which endpoints get
    credentialed records (:func:`check_credentialed_approvals`, within ``approved`` and what the user approved
    elsewhere)."""
    check_key_destinations(config)
    check_credentialed_approvals(config, approved)


def run_config(config: GridConfig, build_backend: Callable[[argparse.Namespace], tuple[Any, dict]] | None = None,
               allow_remote_credentialed: Sequence[str] = ()) -> dict[str, Any]:
    """Run every model × mitigation × control cell of ``config``; writes ``<output>/<model>/…`` and a combined
    ``<output>/results.json`` / ``results.md``. Returns the combined results (``{"runs": [...]}``).

    First, whoever calls it, the config is held to what the user decides (:func:`check_config_policy`): its
    ``allow_remote_credentialed`` entries must be within ``allow_remote_credentialed`` (the user's approvals:
    ``--allow-remote-credentialed`` on the command line, or the caller's from Python), ``MEDHEVAL_ALLOW_REMOTE_
    CREDENTIALED`` or :func:`medheval.judges.endpoints.approve_endpoints`; keys go only to hosts the user named
    (:mod:`medheval.net.keys`)."""
    from medheval.run.distributed import group as process_group
    from medheval.run.outputs import atomic_write_text
    from medheval.report.tables import write_grid_markdown

    if not isinstance(config, GridConfig):  # a plain mapping failed deep inside with an AttributeError
        raise TypeError(f"run_config takes a GridConfig, got {type(config).__name__}: build it with "
                        "parse_grid_config(mapping) or load_grid_config(path), which check every key")
    check_config_policy(config, allow_remote_credentialed)
    if build_backend is None:
        from medheval.run.options import build_backend
    problems = [(model, check_model(model)) for model in config.models]
    problems = [(model, why) for model, why in problems if why]
    if problems:
        raise GridConfigError(f"{config.source}: models: cannot be loaded, nothing was run: "
                              + "; ".join(f"{model!r} ({why})" for model, why in problems))
    splits = None
    if config.models:  # annotation and pinned files, image roots, mitigation options, templates: before any model loads
        splits = check_before_model(run_spec(config, config.models[0], {}), config.mitigations, config.models,
                                    controls=config.controls)
    output = Path(config.output)
    if (output / "run.json").exists():
        raise RunError(f"{output} holds a single run (run.json); a grid there would overwrite its results. "
                       f"Choose another output folder.")
    runs: list[dict[str, Any]] = []
    group = process_group()  # one launch of several processes (accelerate) is one grid run
    with group.lock(output, float(config.get("lock_timeout", 0.0))):
        plan = output / GRID_FILE
        before = plan.read_bytes() if plan.exists() else None
        with group.together("recording the grid plan"):  # a refused plan stops every process of a launch
            if group.is_main:  # the plan of every cell, before the first model loads (medheval.run.grid_plan)
                record_plan(output, {"models": list(config.models), "mitigations": list(config.mitigations),
                                     "controls": list(config.controls)}, grid_plan(config))
        for position, model in enumerate(config.models):
            backend, labels = build_backend(backend_args(config, model))
            spec = run_spec(config, model, labels)
            with _plan_restored_on_refusal(plan if group.is_main and position == 0 else None, before):
                configured = configure_run(spec, backend, config.mitigations, config.controls, config.get("seeds"))
            result = run_configured(configured, int(config.get("batch_size", 8)), splits)
            runs.extend(result["runs"] if "runs" in result else [result])
            del backend
            _free_memory()
        combined = {"config": config.source, "models": config.models, "benchmarks": config.benchmarks,
                    "mitigations": config.mitigations, "runs": runs}
        if config.controls != ["none"]:
            combined["controls"] = config.controls
        if config.get("seeds"):
            combined["seeds"] = config.get("seeds")
        if group.is_main:
            atomic_write_text(output / "results.json", json.dumps(combined, indent=2, sort_keys=True, default=str))
            write_grid_markdown(runs, output / "results.md", heading="models × mitigations")
            write_report_html(output, combined, config.get("cluster", "auto"),
                              bool(config.get("compare_published", False)))
    return combined


@contextlib.contextmanager
def _plan_restored_on_refusal(plan: Path | None, before: bytes | None) -> Iterator[None]:
    """Around the checks the first loaded model decides (:func:`medheval.run.runner.configure_run`): when they
    refuse the grid, ``plan`` (``grid.json``; ``None``: not this process's to write) is put back as it was
    (``before``: its bytes, ``None``: absent), so the corrected grid starts in the same folder as if the refused
    one never ran."""
    from medheval.run.outputs import atomic_write_bytes

    try:
        yield
    except Exception:
        if plan is not None and before is None:
            plan.unlink(missing_ok=True)
        elif plan is not None and plan.read_bytes() != before:
            atomic_write_bytes(plan, before)
        raise


def _free_memory() -> None:
    """Release a finished model before the next one loads (GPU memory too)."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


def given_options(argv: Sequence[str]) -> set[str]:
    """The ``medheval run`` dests the user typed in ``argv`` (after the ``run`` word), whatever their defaults."""
    from medheval.run.options import add_run_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_run_arguments(parser)
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to drop every default
        action.default = argparse.SUPPRESS
    namespace, _ = parser.parse_known_args(list(argv))
    return set(vars(namespace))


__all__ = ["GridConfig", "GridConfigError", "apply_cli", "check_config_policy", "check_credentialed_approvals",
           "check_model", "given_options", "grid_plan",
           "load_grid_config", "model_slug", "parse_grid_config", "run_config"]

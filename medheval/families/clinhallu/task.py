"""``run_eval --benchmark clinhallu`` : the ClinHallu protocol (:mod:`medheval.families.clinhallu.protocol`)
driven by the runner through its split interface (:class:`ClinHalluProtocol`, which ``datasets/clinhallu``
declares in ``PROTOCOLS``).

Per item: ORG, Rep-V, Rep-K and Rep-VK traces from the run's model, answer and step judges from
``--judge`` (temperature 0.01), then ``metrics/clinhallu`` on the judged columns. The protocol's
logs (``clinhallu_generations.jsonl``, ``clinhallu_judgments.jsonl``, ``clinhallu_run.json``) go to
``<output>/clinhallu/<config>/``; a second identical run resumes from them (no new model or judge call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from medheval.run.control import Control
from medheval.run.protocol import RunError, SplitJob, SplitProtocol, load_metric, split_entry

PROMPT_STYLES = ("own", "upstream")


def check_backend_and_judge(name: str, backend: Any, judge: Any) -> None:
    """Refuse, before any generation, a backend without ``generate_chat`` or a run without ``--judge``."""
    if not callable(getattr(backend, "generate_chat", None)):
        raise RunError(f"benchmark {name} runs the ClinHallu protocol, which needs a model that takes system/user "
                       f"messages and an assistant prefix (generate_chat): pass --model, not --predictions "
                       f"(backend {getattr(backend, 'name', backend)!r} has no generate_chat)")
    if not judge:
        raise RunError(f"benchmark {name} needs --judge BACKEND:MODEL[@BASE_URL] (the answer and stage judges "
                       f"of the ClinHallu protocol), e.g. --judge openai:gpt-4o@http://127.0.0.1:8000/v1")


def _number(key: str, value: Any, cast: type, low: float) -> Any:
    """``value`` as ``cast`` (text is parsed), at least ``low`` and within the generation setting's range
    (:func:`~medheval.run.generation.setting_problem`: finite, ``top_p`` at most 1); a fraction is no integer."""
    from medheval.run.generation import setting_problem

    try:
        number = cast(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if cast is int and isinstance(value, float) and not value.is_integer():
        number = None  # 2.5 attempts: refused, not truncated to 2
    kind = "an integer" if cast is int else "a number"
    problem = None if number is None or isinstance(value, bool) else setting_problem(key, number)
    if problem:
        raise ValueError(f"clinhallu.{key}={value!r}: {problem}")
    if number is None or isinstance(value, bool) or not number >= low:
        raise ValueError(f"clinhallu.{key}={value!r}: expected {kind} >= {low:g}")
    return number


ORDERS = ("images_first", "text_first")


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise ValueError(f"clinhallu.{key}={value!r}: expected true or false")


def apply_run_options(dataset: Any, options: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """``--benchmark-option clinhallu.KEY=VALUE``: ``prompts=own|upstream`` (default ``own``),
    ``temperature=T`` (default 0.7; 0 = greedy traces), ``top_p=P`` (0.9), ``max_attempts=N`` (generations
    per item and setting until a trace parses, default 3; ClinHallu's code: 51), ``order=images_first|text_first``
    (where the images sit in the user turn; ClinHallu's code: text first), ``enable_thinking=true|false`` (sent
    to the chat template; ClinHallu's code: false; default: not sent), ``judge_settings=own|upstream`` (the
    judge's request: this project's, or ClinHallu's, :func:`~medheval.families.clinhallu.protocol.clinhallu_judge`;
    default own). The trace length is a generation setting like
    any benchmark's (:mod:`medheval.run.generation`: ClinHallu's 4096 built in; ``--max-new-tokens`` or a
    grid's ``generation`` replace it). Returns (dataset, recorded); the ``clinhallu`` paper protocol sets
    ClinHallu's values (``medheval/run/paper_protocols/others.py``)."""
    from medheval.families.clinhallu.protocol import JUDGE_SETTINGS, ProtocolConfig

    options = dict(options or {})
    default = ProtocolConfig()
    style = str(options.pop("prompts", "own"))
    recorded: dict[str, Any] = {
        "prompts": style,
        "temperature": _number("temperature", options.pop("temperature", default.temperature), float, 0),
    }
    for key, cast, low in (("top_p", float, 0), ("max_attempts", int, 1)):
        if key in options:
            recorded[key] = _number(key, options.pop(key), cast, low)
    if "order" in options:
        recorded["order"] = str(options.pop("order"))
        if recorded["order"] not in ORDERS:
            raise ValueError(f"clinhallu.order={recorded['order']!r}: expected one of {ORDERS}")
    if "enable_thinking" in options:
        recorded["enable_thinking"] = _flag("enable_thinking", options.pop("enable_thinking"))
    if "judge_settings" in options:
        recorded["judge_settings"] = str(options.pop("judge_settings"))
        if recorded["judge_settings"] not in JUDGE_SETTINGS:
            raise ValueError(f"clinhallu.judge_settings={recorded['judge_settings']!r}: expected one of {JUDGE_SETTINGS}")
    if options:
        raise ValueError(f"unknown clinhallu run option(s) {sorted(options)}; known: "
                         f"prompts={'|'.join(PROMPT_STYLES)}, temperature=T, top_p=P, max_attempts=N, "
                         f"order={'|'.join(ORDERS)}, enable_thinking=true|false, "
                         f"judge_settings={'|'.join(JUDGE_SETTINGS)} (the trace length: --max-new-tokens)")
    if style not in PROMPT_STYLES:
        raise ValueError(f"clinhallu.prompts={style!r}: expected one of {PROMPT_STYLES}")
    return dataset, recorded


def trace_length(spec: Any, loaded: Any, backend: Any) -> int:
    """``max_new_tokens`` of a trace: the run's generation plan for this split (built-in: ClinHallu's
    4096); a run without a plan (``--max-new-tokens N``, ``RunSpec(generation=None)``) keeps the
    backend's own length, like every other benchmark."""
    from medheval.families.clinhallu.protocol import ProtocolConfig

    plan = getattr(spec, "generation", None)
    if plan is not None:
        return int(plan.for_record(loaded.name, loaded.config, None).get("max_new_tokens",
                                                                          ProtocolConfig().max_new_tokens))
    return int(getattr(backend, "max_new_tokens", None) or ProtocolConfig().max_new_tokens)


def protocol_config(run_options: Mapping[str, Any] | None, backend: Any, max_new_tokens: int | None = None) -> Any:
    """The run's :class:`~medheval.families.clinhallu.protocol.ProtocolConfig`: the temperature from the run
    options (:func:`apply_run_options`), the trace length given (default ClinHallu's), the seed from ``--seed``."""
    from medheval.families.clinhallu.protocol import ProtocolConfig

    options = dict(run_options or {})
    default = ProtocolConfig()
    return ProtocolConfig(max_new_tokens=int(max_new_tokens or default.max_new_tokens),
                          temperature=float(options.get("temperature", default.temperature)),
                          top_p=float(options.get("top_p", default.top_p)),
                          max_attempts=int(options.get("max_attempts", default.max_attempts)),
                          text_first=options.get("order", "images_first") == "text_first",
                          enable_thinking=options.get("enable_thinking"),
                          seed=int(getattr(backend, "seed", 0)))


def check_protocol(loaded: Any, backend: Any) -> None:
    """Refuse, before any generation, a run the protocol cannot do with this backend (e.g. a mitigation
    that cannot sample, while the traces are sampled)."""
    from medheval.families.clinhallu.protocol import check_backend

    try:
        check_backend(backend, protocol_config(loaded.run_options, backend))
    except Exception as err:  # noqa: BLE001 - one message naming the benchmark
        raise RunError(f"benchmark {loaded.name}: {err}") from None


def run_split(loaded: Any, backend: Any, spec: Any, output: Path,
              metric_options: Mapping[str, Any] | None = None, warnings: list[str] | None = None) -> dict[str, Any]:
    """Run the protocol on one split; returns ``{"generated_this_run", "metrics", "clinhallu_run"}``.

    ``metrics["clinhallu"]`` is ``metrics/clinhallu`` on :func:`metric_inputs` with ``metric_options``
    (the runner's checked ``--metric-option clinhallu.*`` and ``--upstream-compat``); ``clinhallu_run`` is the content of ``clinhallu_run.json`` (temperatures, counts).
    With ``--on-missing skip`` an item whose image does not decode is left out and counted as the main path
    counts it (:func:`medheval.run.runner.record_skipped_undecodable`: ``skipped_undecodable_images`` in
    results.json, a line in ``warnings``); else it is an error naming the item and the file."""
    from medheval.families.clinhallu.prompts import prompt_set
    from medheval.families.clinhallu.protocol import GENERATIONS, LOG_FIELDS, RUN_INFO, ClinHalluRun, clinhallu_judge
    from medheval.run.predictions_log import read_log
    from medheval.run.runner import record_skipped_undecodable

    folder = Path(output) / "clinhallu" / loaded.config
    run_options = loaded.run_options or {}
    style = run_options.get("prompts", "own")
    judge_options: dict[str, Any] = {}
    if spec.allow_remote_credentialed:
        judge_options["allow_remote_credentialed"] = list(spec.allow_remote_credentialed)
    judge_settings = run_options.get("judge_settings", "own")
    judge = clinhallu_judge(spec.judge, judge_settings, **judge_options)
    records = loaded.dataset.to_list()
    before = len(read_log(folder / GENERATIONS, required=LOG_FIELDS)) if (folder / GENERATIONS).exists() else 0
    # ClinHallu's sampling (temperature 0.7, top-p 0.9) unless the run options say otherwise; the trace
    # length from the run's generation plan (built-in: ClinHallu's 4096, medheval.run.generation)
    config = protocol_config(loaded.run_options, backend, trace_length(spec, loaded, backend))
    images_for = loaded.resolver.load_record_images if loaded.resolver else None
    control = getattr(spec, "image_control", None) or Control()  # --control (medheval.run.control)
    protocol = ClinHalluRun(backend, judge, prompt_set(style, spec.data_dir), folder, config, images_for=images_for,
                            control=control, skip_undecodable=getattr(spec, "on_missing", "error") == "skip",
                            judge_settings=judge_settings)
    result = protocol.run(records)
    for during in ("generation", "judging"):  # an item left out while judging has its traces: a re-run judges it
        record_skipped_undecodable(loaded, [record for record in result["skipped"] if during == (
            "judging" if record.record_id in result["skipped_judging"] else "generation")],
            [] if warnings is None else warnings, during=during)
    skipped = {record.record_id for record in result["skipped"]}
    write_clusters(folder, [record for record in records if str(record["id"]) not in skipped])
    after = len(read_log(folder / GENERATIONS, required=LOG_FIELDS))
    inputs = dict(result["metric_inputs"])
    metric = load_metric("clinhallu").compute(**{**inputs, **dict(metric_options or {})})
    return {"generated_this_run": after - before, "metrics": {"clinhallu": metric},
            "clinhallu_run": json.loads((folder / RUN_INFO).read_text()), "logs": str(folder)}


CLUSTERS = "clinhallu_clusters.json"  # item id -> cluster label, beside the protocol logs


def write_clusters(folder: Path, records: list[dict[str, Any]]) -> None:
    """``clinhallu_clusters.json`` in the logs folder: each item's cluster label under the benchmark's unit
    (:func:`medheval.data.schema.cluster_id`; ``image``: the items asking about one image share one), kept
    with the labels of items logged by earlier runs into the folder; the report's intervals resample them."""
    from medheval.data.schema import cluster_id
    from medheval.run.outputs import atomic_write_text
    from medheval.run.protocol import benchmark_cluster_unit

    unit = benchmark_cluster_unit("clinhallu")
    path = Path(folder) / CLUSTERS
    known = json.loads(path.read_text()) if path.exists() else {}
    known.update({str(record["id"]): cluster_id(record, unit) for record in records})
    atomic_write_text(path, json.dumps(known, sort_keys=True))


def check_inputs(name: str, run_options: Mapping[str, Any], data_dir: Any, judge: Any) -> None:
    """Before the model loads: ClinHallu's pinned files when ``prompts=upstream`` (found and sha256-checked,
    :func:`medheval.families.clinhallu.prompts.upstream_file`) and a judge that takes ``judge_settings``."""
    from medheval.data.fetch import AnnotationUnavailable
    from medheval.families.clinhallu.prompts import prompt_set
    from medheval.families.clinhallu.protocol import check_judge_settings
    from medheval.judges import JudgeError

    try:
        if run_options.get("prompts", "own") == "upstream":
            prompt_set("upstream", data_dir)
        if judge:
            check_judge_settings(judge, run_options.get("judge_settings", "own"))
    except (AnnotationUnavailable, ValueError, JudgeError) as error:
        raise RunError(f"benchmark {name}: {error}") from None


class ClinHalluProtocol(SplitProtocol):
    """ClinHallu through the runner: a chat model and a judge; four traces per item, then the stage
    judges, run on the main process (not sharded; the others wait); scored by ``metrics/clinhallu`` on
    the judged columns. Its per-item columns are read back from the protocol's logs (:meth:`item_columns`)."""

    name = "clinhallu"

    def check_inputs(self, benchmark: str, spec: Any) -> None:
        check_inputs(benchmark, spec.benchmark_options.get(benchmark, {}), spec.data_dir, spec.judge)

    def check(self, benchmark: str, backend: Any, spec: Any) -> None:
        check_backend_and_judge(benchmark, backend, spec.judge)
        self.check_inputs(benchmark, spec)

    def prepare(self, loaded: Any, backend: Any, spec: Any) -> list[str]:
        check_protocol(loaded, backend)
        return ["clinhallu"]

    def run_split(self, job: SplitJob) -> dict[str, Any] | None:
        if not job.group.is_main:
            return None
        return run_split(job.loaded, job.backend, job.spec, job.output, job.options["clinhallu"], job.warnings)

    def score_split(self, job: SplitJob, generated: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        counts = generated["metrics"]["clinhallu"].get("counts", {})
        entry = split_entry(job.loaded, n_scored=counts.get("n", len(job.loaded.dataset)),
                            generated_this_run=generated["generated_this_run"], metrics=generated["metrics"],
                            clinhallu_run=generated["clinhallu_run"], logs=generated["logs"])
        return entry, []

    def item_columns(self, run_folder: Path, split: str, entry: Mapping[str, Any]
                     ) -> tuple[dict[str, list] | None, str | None]:
        """Per-item columns of a ClinHallu split, as the run gave them to ``metrics/clinhallu``:
        :func:`medheval.families.clinhallu.protocol.metric_inputs` on the protocol's judgments log, over the
        items of its generations log (``<run>/clinhallu/<config>/``, else the folder ``results.json`` names in
        ``logs`` when it lies inside the run folder: one outside, or a split name leading out, is refused). Items are taken in id order (so an interval does not depend on the order the log was
        written in), with ``clusters`` (each item's cluster label, ``None`` where unknown) when the run wrote
        :data:`CLUSTERS`. Returns (columns plus ``ids``, ``None``) or (``None``, why not); the logs are only read,
        never repaired."""
        from medheval.families.clinhallu.prompts import SETTINGS
        from medheval.families.clinhallu.protocol import GENERATIONS, JUDGMENTS, LOG_FIELDS, metric_inputs
        from medheval.run.predictions_log import read_log

        folder = Path(run_folder) / "clinhallu" / split.partition(":")[2]
        if not (folder / GENERATIONS).exists() and isinstance(entry.get("logs"), str):
            folder = Path(entry["logs"])
        base = Path(run_folder).resolve()
        if not folder.resolve().is_relative_to(base):  # results.json is input: read no other folder's logs
            return None, (f"the ClinHallu protocol logs named for {split} ({folder}) are outside the run folder "
                          f"{run_folder}; only logs inside it are read: move them under "
                          f"{Path(run_folder) / 'clinhallu'}/<config>/")
        if not (folder / GENERATIONS).exists():
            return None, f"no ClinHallu protocol logs ({GENERATIONS}) in {folder}"
        try:
            generations = read_log(folder / GENERATIONS, repair=False, required=LOG_FIELDS)
            judgments = read_log(folder / JUDGMENTS, repair=False, required=LOG_FIELDS)
            ids = sorted({generation["id"] for generation in generations})
            records = [{"id": rid, "config": rid.split("/")[1] if rid.count("/") >= 2 else split.partition(":")[2]}
                       for rid in ids]
            protocol = (entry.get("clinhallu_run") or {}).get("protocol") or {}
            known = json.loads((folder / CLUSTERS).read_text()) if (folder / CLUSTERS).exists() else {}
            clusters = {"clusters": [known.get(rid) for rid in ids]} if known else {}
            return {**metric_inputs(records, judgments, protocol.get("settings") or SETTINGS), "ids": ids,
                    **clusters}, None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return None, f"the ClinHallu protocol logs in {folder} could not be read ({error})"

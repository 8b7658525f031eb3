"""``run_eval --benchmark clinhallu`` : the ClinHallu protocol (:mod:`medheval.clinhallu.protocol`)
driven by the runner, for splits whose builder declares ``PROTOCOL = "clinhallu"``.

Per item: ORG, Rep-V, Rep-K and Rep-VK traces from the run's model, answer and step judges from
``--judge`` (temperature 0.01), then ``metrics/clinhallu`` on the judged columns. The protocol's
logs (``clinhallu_generations.jsonl``, ``clinhallu_judgments.jsonl``, ``clinhallu_run.json``) go to
``<output>/clinhallu/<config>/``; a second identical run resumes from them (no new model or judge call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

PROMPT_STYLES = ("own", "upstream")


def check_backend_and_judge(name: str, backend: Any, judge: Any) -> None:
    """Refuse, before any generation, a backend without ``generate_chat`` or a run without ``--judge``."""
    from medheval.runner import RunError

    if not callable(getattr(backend, "generate_chat", None)):
        raise RunError(f"benchmark {name} runs the ClinHallu protocol, which needs a model that takes system/user "
                       f"messages and an assistant prefix (generate_chat): pass --model, not --predictions "
                       f"(backend {getattr(backend, 'name', backend)!r} has no generate_chat)")
    if not judge:
        raise RunError(f"benchmark {name} needs --judge BACKEND:MODEL[@BASE_URL] (the answer and stage judges "
                       f"of the ClinHallu protocol), e.g. --judge openai:gpt-4o@http://127.0.0.1:8000/v1")


def _number(key: str, value: Any, cast: type, low: float) -> Any:
    try:
        number = cast(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < low:
        kind = "an integer" if cast is int else "a number"
        raise ValueError(f"clinhallu.{key}={value!r}: expected {kind} >= {low:g}")
    return number


def apply_run_options(dataset: Any, options: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """``--benchmark-option clinhallu.KEY=VALUE``: ``prompts=own|upstream`` (default ``own``),
    ``temperature=T`` (default 0.7; 0 = greedy traces). The trace length is a generation setting like
    any benchmark's (:mod:`medheval.generation`: ClinHallu's 4096 built in; ``--max-new-tokens`` or a
    grid's ``generation`` replace it). Returns (dataset, recorded)."""
    from medheval.clinhallu.protocol import ProtocolConfig

    options = dict(options or {})
    default = ProtocolConfig()
    style = str(options.pop("prompts", "own"))
    recorded = {
        "prompts": style,
        "temperature": _number("temperature", options.pop("temperature", default.temperature), float, 0),
    }
    if options:
        raise ValueError(f"unknown clinhallu run option(s) {sorted(options)}; known: "
                         f"prompts={'|'.join(PROMPT_STYLES)}, temperature=T (the trace length: --max-new-tokens)")
    if style not in PROMPT_STYLES:
        raise ValueError(f"clinhallu.prompts={style!r}: expected one of {PROMPT_STYLES}")
    return dataset, recorded


def trace_length(spec: Any, loaded: Any, backend: Any) -> int:
    """``max_new_tokens`` of a trace: the run's generation plan for this split (built-in: ClinHallu's
    4096); a run without a plan (``--max-new-tokens N``, ``RunSpec(generation=None)``) keeps the
    backend's own length, like every other benchmark."""
    from medheval.clinhallu.protocol import ProtocolConfig

    plan = getattr(spec, "generation", None)
    if plan is not None:
        return int(plan.for_record(loaded.name, loaded.config, None).get("max_new_tokens",
                                                                          ProtocolConfig().max_new_tokens))
    return int(getattr(backend, "max_new_tokens", None) or ProtocolConfig().max_new_tokens)


def protocol_config(run_options: Mapping[str, Any] | None, backend: Any, max_new_tokens: int | None = None) -> Any:
    """The run's :class:`~medheval.clinhallu.protocol.ProtocolConfig`: the temperature from the run
    options (:func:`apply_run_options`), the trace length given (default ClinHallu's), the seed from ``--seed``."""
    from medheval.clinhallu.protocol import ProtocolConfig

    options = dict(run_options or {})
    default = ProtocolConfig()
    return ProtocolConfig(max_new_tokens=int(max_new_tokens or default.max_new_tokens),
                          temperature=float(options.get("temperature", default.temperature)),
                          seed=int(getattr(backend, "seed", 0)))


def check_protocol(loaded: Any, backend: Any) -> None:
    """Refuse, before any generation, a run the protocol cannot do with this backend (e.g. a mitigation
    that cannot sample, while the traces are sampled)."""
    from medheval.clinhallu.protocol import check_backend
    from medheval.runner import RunError

    try:
        check_backend(backend, protocol_config(loaded.run_options, backend))
    except Exception as err:  # noqa: BLE001 - one message naming the benchmark
        raise RunError(f"benchmark {loaded.name}: {err}") from None


def run_split(loaded: Any, backend: Any, spec: Any, output: Path,
              metric_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run the protocol on one split; returns ``{"generated_this_run", "metrics", "clinhallu_run"}``.

    ``metrics["clinhallu"]`` is ``metrics/clinhallu`` on :func:`metric_inputs` with ``metric_options``
    (the runner's checked ``--metric-option clinhallu.*`` and ``--upstream-compat``); ``clinhallu_run`` is the content of ``clinhallu_run.json`` (temperatures, counts)."""
    from medheval.clinhallu.prompts import prompt_set
    from medheval.clinhallu.protocol import GENERATIONS, LOG_FIELDS, RUN_INFO, ClinHalluRun, clinhallu_judge
    from medheval.predictions_log import read_log
    from medheval.runner import _load_metric

    folder = Path(output) / "clinhallu" / loaded.config
    style = (loaded.run_options or {}).get("prompts", "own")
    judge_options: dict[str, Any] = {}
    if spec.allow_remote_credentialed:
        judge_options["allow_remote_credentialed"] = list(spec.allow_remote_credentialed)
    judge = clinhallu_judge(spec.judge, **judge_options)
    records = loaded.dataset.to_list()
    before = len(read_log(folder / GENERATIONS, required=LOG_FIELDS)) if (folder / GENERATIONS).exists() else 0
    # ClinHallu's sampling (temperature 0.7, top-p 0.9) unless the run options say otherwise; the trace
    # length from the run's generation plan (built-in: ClinHallu's 4096, medheval.generation)
    config = protocol_config(loaded.run_options, backend, trace_length(spec, loaded, backend))
    protocol = ClinHalluRun(backend, judge, prompt_set(style, spec.data_dir), folder, config,
                            images_for=loaded.resolver.load_record_images if loaded.resolver else None)
    result = protocol.run(records)
    after = len(read_log(folder / GENERATIONS, required=LOG_FIELDS))
    inputs = dict(result["metric_inputs"])
    metric = _load_metric("clinhallu").compute(**{**inputs, **dict(metric_options or {})})
    return {"generated_this_run": after - before, "metrics": {"clinhallu": metric},
            "clinhallu_run": json.loads((folder / RUN_INFO).read_text()), "logs": str(folder)}

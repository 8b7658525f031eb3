"""Generation settings per benchmark and answer type: the built-in defaults (one table, here) and the
layered plan a run applies per record.

A yes/no answer needs a few tokens, a radiology report hundreds, a ClinHallu reasoning trace (Visual
Recognition → Knowledge Recall → Reasoning → Answer) around a thousand; one ``--max-new-tokens`` for
all truncates the long ones or wastes time on the short ones. The built-in ``max_new_tokens`` apply
when the user did not set ``--max-new-tokens``:

================================  ==============  ===================================================
what                              max_new_tokens  why
================================  ==============  ===================================================
answer type ``yes_no``            16              "Yes." plus a short justification at most
answer type ``multiple_choice``   32              a letter or the option text
answer type ``statement``         16              Med-StepBench true/false verdicts
answer type ``open``              256             a sentence or short paragraph (knowledge:open …)
answer type ``report``            512             a full radiology report (vishal_report)
benchmark ``clinhallu``           4096            a four-stage reasoning trace (ClinHallu's config.yaml)
================================  ==============  ===================================================

Layers, later wins (:meth:`GenerationPlan.for_record`): the built-in table (a benchmark entry beats
an answer-type entry) → ``generation.defaults`` of a grid config → ``generation.answer_types.<type>``
→ ``generation.benchmarks.<name>`` → ``generation.benchmarks.<name:config>`` → generation flags
given on the command line (``--max-new-tokens``, ``--do-sample``, ``--temperature``, ``--top-p``).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

# Settings a plan may set (``model.generate`` names; a backend maps them to its own API).
GENERATION_KEYS: dict[str, type | tuple[type, ...]] = {
    "max_new_tokens": int, "do_sample": bool, "temperature": (int, float), "top_p": (int, float),
    "top_k": int, "num_beams": int, "repetition_penalty": (int, float),
}
BUILTIN_BY_ANSWER_TYPE: dict[str, dict[str, Any]] = {
    "yes_no": {"max_new_tokens": 16},
    "multiple_choice": {"max_new_tokens": 32},
    "statement": {"max_new_tokens": 16},
    "open": {"max_new_tokens": 256},
    "report": {"max_new_tokens": 512},
}
BUILTIN_BY_BENCHMARK: dict[str, dict[str, Any]] = {"clinhallu": {"max_new_tokens": 4096}}  # ClinHallu's config.yaml
FALLBACK_MAX_NEW_TOKENS = 64  # the backend's own value when no layer sets one


# The range of each numeric setting: (lowest, highest, whether the lowest itself is allowed); every value finite.
SETTING_RANGES: dict[str, tuple[float, float, bool]] = {
    "max_new_tokens": (1, math.inf, True), "num_beams": (1, math.inf, True), "top_k": (0, math.inf, True),
    "temperature": (0, math.inf, True), "top_p": (0, 1, True), "repetition_penalty": (0, math.inf, False),
}


def setting_problem(key: str, value: Any) -> str | None:
    """What is wrong with the number ``value`` of the generation setting ``key`` (NaN, infinite, out of its range
    in :data:`SETTING_RANGES`), or ``None`` when it is usable: e.g. ``"must be between 0 and 1"`` for
    ``top_p=2``, which the decoders would otherwise ignore without a word."""
    if key not in SETTING_RANGES or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, high, low_allowed = SETTING_RANGES[key]
    if not math.isfinite(value):
        return "must be a finite number"
    if value < low or (value == low and not low_allowed) or value > high:
        if math.isfinite(high):
            return f"must be between {low} and {high}"
        return f"must be >= {low}" if low_allowed else f"must be > {low}"
    return None


def check_settings(settings: Any, where: str, local: bool = True) -> dict[str, Any]:
    """A mapping of known generation keys with values of the right type and range (:func:`setting_problem`);
    errors name ``where``. ``local``: the settings may reach a local model, which cannot sample at temperature 0
    (an API takes it, as it was sent before: ``local=False`` where every model is an API model)."""
    if not isinstance(settings, Mapping):
        raise ValueError(f"{where}: expected a mapping of generation settings, got {type(settings).__name__}")
    for key, value in settings.items():
        if key not in GENERATION_KEYS:
            raise ValueError(f"{where}: unknown generation setting {key!r}; known: {', '.join(GENERATION_KEYS)}")
        wanted = GENERATION_KEYS[key]
        if (isinstance(value, bool) and wanted is not bool) or not isinstance(value, wanted):
            names = " or ".join(t.__name__ for t in (wanted if isinstance(wanted, tuple) else (wanted,)))
            raise ValueError(f"{where}.{key}: expected {names}, got {value!r}")
        problem = setting_problem(key, value)
        if problem:
            raise ValueError(f"{where}.{key}: {problem}, got {value}")
    if local and settings.get("do_sample") is True and settings.get("temperature") == 0:
        raise ValueError(f"{where}.temperature: must be > 0 where do_sample is true (sampling divides by it), got 0; "
                         f"for greedy decoding set do_sample: false")
    return dict(settings)


@dataclass(frozen=True)
class GenerationPlan:
    """Generation settings per record, layered as in the module docstring.

    ``builtin=False`` drops the built-in table (only the given layers apply)."""

    defaults: dict[str, Any] = field(default_factory=dict)
    answer_types: dict[str, dict[str, Any]] = field(default_factory=dict)
    benchmarks: dict[str, dict[str, Any]] = field(default_factory=dict)  # "name" or "name:config"
    fixed: dict[str, Any] = field(default_factory=dict)  # command-line flags: beat every other layer
    builtin: bool = True

    def for_record(self, benchmark: str, config: str | None, answer_type: str | None) -> dict[str, Any]:
        """The settings one record of ``benchmark:config`` with ``answer_type`` is generated with."""
        settings: dict[str, Any] = {}
        if self.builtin:
            settings.update(BUILTIN_BY_ANSWER_TYPE.get(answer_type or "", {}))
            settings.update(BUILTIN_BY_BENCHMARK.get(benchmark, {}))
        settings.update(self.defaults)
        settings.update(self.answer_types.get(answer_type or "", {}))
        settings.update(self.benchmarks.get(benchmark, {}))
        settings.update(self.benchmarks.get(f"{benchmark}:{config}", {}))
        settings.update(self.fixed)
        return settings

    def describe(self) -> dict[str, Any]:
        """The plan as recorded in ``run.json`` (a resumed run must use the same)."""
        described: dict[str, Any] = {"builtin": self.builtin}
        for name in ("defaults", "answer_types", "benchmarks", "fixed"):
            if getattr(self, name):
                described[name] = getattr(self, name)
        return described


def settings_for(plan: GenerationPlan | None, benchmark: str, config: str | None) -> Callable[[str], dict[str, Any]]:
    """A record's answer type -> its settings under ``plan`` for one split (``{}`` for all without a plan)."""
    if plan is None:
        return lambda answer_type: {}
    return functools.lru_cache(maxsize=None)(lambda answer_type: plan.for_record(benchmark, config, answer_type))


def group_by_settings(records: list[dict], images: list[list[Any]], settings: Callable[[str], dict[str, Any]]
                      ) -> Iterator[tuple[list[dict], list[list[Any]], dict[str, Any]]]:
    """A batch as (records, their images, settings) groups sharing generation settings, in first-seen order."""
    groups: dict[str, tuple[list[dict], list[list[Any]], dict[str, Any]]] = {}
    for record, record_images in zip(records, images):
        chosen = settings(record["answer_type"])
        group = groups.setdefault(json.dumps(chosen, sort_keys=True), ([], [], chosen))
        group[0].append(record)
        group[1].append(record_images)
    yield from groups.values()


def effective_settings(backend_settings: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """What a record was generated with: the backend's generation settings, then the per-call overrides."""
    base = {key: backend_settings[key] for key in GENERATION_KEYS if key in backend_settings}
    return {**base, **overrides}


def accepts_overrides(backend: Any) -> bool:
    """Whether ``backend.generate`` takes ``overrides=`` (by name or ``**kwargs``)."""
    try:
        parameters = inspect.signature(backend.generate).parameters
    except (TypeError, ValueError):
        return False
    return "overrides" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def generate_with(backend: Any, records: list[dict], images: list[list[Any]],
                  overrides: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """``backend.generate`` with per-call ``overrides`` when it takes them; a backend that does not (a
    predictions file, an older backend) gets the plain call. Returns the outputs and the settings they
    were generated with (recorded per prediction)."""
    if overrides and accepts_overrides(backend):
        return backend.generate(records, images, overrides=dict(overrides)), used_settings(backend, overrides)
    return backend.generate(records, images), used_settings(backend, overrides)


def used_settings(backend: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The settings :func:`generate_with` records for a call with ``overrides`` (a log line's ``"generation"``)."""
    return effective_settings(backend.settings(), overrides if overrides and accepts_overrides(backend) else {})


def rendered_prompt(backend: Any, record: dict, images: list[Any]) -> dict[str, str]:
    """``{"prompt": full model input text}`` from a backend with ``format_prompt(record, num_images)``; from a
    predictions file (``recorded_prompt(id)``, a re-score), the prompt the answer's own line recorded, so a
    re-score of the re-score can compare the questions too; ``{}`` where there is none."""
    recorded = getattr(backend, "recorded_prompt", None)
    if callable(recorded):
        prompt = recorded(record["id"])
        return {} if prompt is None else {"prompt": prompt}
    render = getattr(backend, "format_prompt", None)
    return {"prompt": render(record, len(images))} if callable(render) else {}


__all__ = ["BUILTIN_BY_ANSWER_TYPE", "BUILTIN_BY_BENCHMARK", "FALLBACK_MAX_NEW_TOKENS", "GENERATION_KEYS",
           "GenerationPlan", "SETTING_RANGES", "accepts_overrides", "check_settings", "effective_settings", "generate_with",
           "group_by_settings", "rendered_prompt", "settings_for", "used_settings"]

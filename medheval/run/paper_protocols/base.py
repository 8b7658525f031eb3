"""The paper-protocol types (:mod:`medheval.run.paper_protocols` has the registry and the docs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from medheval.run.generation import GenerationPlan

CLEAN = "clean"


@dataclass(frozen=True)
class Conflict:
    """One setting on which the released code and the paper disagree (the code's value is the default)."""

    setting: str  # "mitigation opera.scale_factor" (a method option) or "metric chair.variant" (a scoring option)
    code: Any
    paper: Any
    paper_option: str  # the command-line text that selects the paper's value
    where: str  # where each value is stated


@dataclass(frozen=True)
class PaperProtocol:
    """Everything a run's model receives and decodes with, for one source of published numbers.

    ``instruction(record, script)`` builds the text of one record (``None``: :func:`medheval.run.prompts.build_prompt`);
    ``scripts`` maps a model's ``config.model_type`` to the upstream script variant it follows, and
    ``templates`` to its conversation template (:mod:`medheval.backends.conversation`; ``"*"`` = other
    models, ``"model"`` = the processor's own). ``generation[mitigation]`` holds the generation layers
    (``defaults``, ``answer_types``, ``benchmarks``) of plain decoding (``"none"``) and of each mitigation;
    (``"*"``: every mitigation); ``mitigation_options[name]`` the method options that apply unless the user
    gives them; ``benchmark_options[name]`` a family's run options (``--benchmark-option``), under the user's.
    ``upstream_compat`` scores with the paper's released scorer unless the user says otherwise
    (``--no-upstream-compat``); ``metric_options[metric]`` are scoring options under the user's
    (``--metric-option``); ``scoring_notes`` say on the card what else decides the scores (one line each);
    ``gpu_dtype`` is the precision the published runs loaded the model in, used on a GPU
    when ``--dtype`` is not given (a CPU run keeps float32); ``grey_padding`` puts a grayscale image on
    LLaVA-Med-1.5's grey square canvas where the processor pads to a square (:mod:`medheval.backends.grey_padding`);
    ``upstream_tokens`` names the model types (``config.model_type``) whose prompt ids are built by LLaVA's
    ``tokenizer_image_token`` rule, each piece around ``<image>`` tokenized alone
    (:mod:`medheval.backends.llava_tokens`), instead of the processor's whole-string tokenization.
    """

    name: str
    title: str  # one line, shown by `medheval run --help` and `medheval list`
    reproduces: str
    source: str  # the code (URL at a commit) or "no inference code released"
    benchmarks: tuple[str, ...] = ()  # benchmark names it covers; () = any
    instruction: Callable[[dict, str], str] | None = None
    prompt_version: str = ""
    scripts: Mapping[str, str] = field(default_factory=dict)
    templates: Mapping[str, str] = field(default_factory=dict)
    generation: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    mitigation_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    benchmark_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    upstream_compat: bool = False
    metric_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    scoring_notes: tuple[str, ...] = ()
    gpu_dtype: str | None = None
    grey_padding: bool = False
    upstream_tokens: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    conflicts: tuple[Conflict, ...] = ()
    inferred: tuple[str, ...] = ()

    # -- what a run records ----------------------------------------------------------------
    def describe(self, seed: int | None = None) -> dict[str, Any]:
        """``results.json`` / ``run.json`` ``"protocol"``: the name, and for a paper protocol its source and
        seeds: ``[seed]`` when the run used that one (``--seed``), the protocol's own otherwise."""
        if self.name == CLEAN:
            return {"name": CLEAN}
        return {"name": self.name, "source": self.source, "prompt_version": self.prompt_version,
                "seeds": [seed] if seed is not None else list(self.seeds)}

    # -- per model --------------------------------------------------------------------------
    def script_for(self, model_type: str | None) -> str:
        return self.scripts.get(model_type or "", self.scripts.get("*", ""))

    def template_for(self, model_type: str | None) -> str | None:
        """The conversation template name for a model type (``None``: leave the backend's choice)."""
        return self.templates.get(model_type or "", self.templates.get("*"))

    def instruction_for(self, model_type: str | None) -> Callable[[dict], str] | None:
        """The record -> text function for one model type (``None`` under ``clean``)."""
        if self.instruction is None:
            return None
        return Instruction(self.instruction, self.script_for(model_type), self.prompt_version)

    # -- per mitigation ----------------------------------------------------------------------
    def check_mitigation(self, name: str) -> None:
        from medheval.run.protocol import RunError

        if self.generation and name not in self.generation and "*" not in self.generation:
            raise RunError(f"protocol {self.name!r} has no settings for mitigation {name!r} (it covers "
                           f"{', '.join(self.generation)}); use another --protocol, e.g. clean")

    def mitigation_spec(self, spec: str) -> str:
        """``spec`` with this protocol's method options added where the user gave none (a user ``preset=``
        replaces them all: the user chose the method's values)."""
        from medheval.decoding.loop import spec_value
        from medheval.mitigations import parse_spec

        name, given = parse_spec(spec)
        extra = dict(self.mitigation_options.get(name, {}))
        if not extra or "preset" in given:
            return spec
        merged = {**extra, **given}
        return f"{name}:" + ",".join(f"{key}={spec_value(value)}" for key, value in merged.items())

    def plan(self, mitigation: str, user: GenerationPlan | None, accepted: Sequence[str] | None = None
             ) -> GenerationPlan | None:
        """The generation plan of one cell: this protocol's layers for ``mitigation`` under the user's
        (a grid's ``generation`` layers and the generation flags typed win, layer by layer); ``accepted``:
        the setting names the backend takes (others are dropped, e.g. ``top_k`` for an API model)."""
        if not self.generation:
            return user
        self.check_mitigation(mitigation)
        layers = self.generation.get(mitigation) or self.generation["*"]
        keep = (lambda d: {k: v for k, v in d.items() if accepted is None or k in accepted})
        user = user or GenerationPlan()
        return GenerationPlan(
            defaults={**keep(layers.get("defaults", {})), **user.defaults},
            answer_types={name: {**keep(layers.get("answer_types", {}).get(name, {})), **user.answer_types.get(name, {})}
                          for name in {*layers.get("answer_types", {}), *user.answer_types}},
            benchmarks={name: {**keep(layers.get("benchmarks", {}).get(name, {})), **user.benchmarks.get(name, {})}
                        for name in {*layers.get("benchmarks", {}), *user.benchmarks}},
            fixed=dict(user.fixed), builtin=False)

    def check_benchmarks(self, benchmarks: Sequence[str]) -> None:
        from medheval.data.benchmarks import parse_benchmark_spec
        from medheval.run.protocol import RunError

        outside = [spec for spec in benchmarks if self.benchmarks and parse_benchmark_spec(spec)[0] not in self.benchmarks]
        if outside:
            raise RunError(f"protocol {self.name!r} reproduces {self.reproduces} and covers only "
                           f"{', '.join(self.benchmarks)}; {', '.join(outside)} is not one of them (run it under "
                           f"its own paper's protocol, or --protocol clean)")


@dataclass(frozen=True)
class Instruction:
    """A protocol's record -> text function bound to one upstream script variant (recorded as ``version``)."""

    build: Callable[[dict, str], str]
    script: str
    version: str

    def __call__(self, record: dict) -> str:
        return self.build(record, self.script)


__all__ = ["CLEAN", "Conflict", "Instruction", "PaperProtocol"]

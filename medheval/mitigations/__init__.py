"""Hallucination-mitigation decoding methods, each a ``custom_generate`` callable.

>>> from medheval.mitigations import VCD
>>> out = model.generate(**inputs, max_new_tokens=64, custom_generate=VCD(alpha=1.0))   # doctest: +SKIP
>>> out = generate_with("vcd:alpha=1,beta=0.1", model, **inputs, max_new_tokens=64)      # doctest: +SKIP

Every method runs on the shared loop of :mod:`medheval.decoding`, so the base decoding
(greedy unless ``do_sample=True``, the generation config's processors and stopping
criteria) is the same for all of them and for plain ``generate``.

Methods: VCD, M3ID, PAI, DoLa, AvisC, DAMRO (shared loop) and OPERA (its own beam search).
Each has named presets (:mod:`medheval.mitigations.presets`): ``medheval`` (MedHEval's settings, the
default) and ``official`` (the method's own code), e.g. ``OPERA(preset="official")`` or
``"opera:preset=official"``; explicit options override the preset's values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from medheval.decoding.loop import DecodingMethod
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError
from medheval.mitigations.avisc import AVISC, AvisC
from medheval.mitigations.damro import DAMRO
from medheval.mitigations.dola import DoLa
from medheval.mitigations.m3id import M3ID
from medheval.mitigations.opera import OPERA
from medheval.mitigations.pai import PAI
from medheval.mitigations.vcd import VCD

MITIGATIONS: dict[str, type[DecodingMethod]] = {
    "vcd": VCD, "m3id": M3ID, "pai": PAI, "dola": DoLa, "avisc": AvisC, "damro": DAMRO, "opera": OPERA,
}
"""Method classes by their CLI name."""

NO_MITIGATION = ("none", "", "original", "greedy")


def _parse_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if "/" in text:  # a list of layers: "0/2/4"
        return [_parse_value(part) for part in text.split("/") if part]
    return text.strip()


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"vcd:alpha=1,beta=0.1"`` → ``("vcd", {"alpha": 1, "beta": 0.1})``; lists as ``layers=0/2/4``."""
    name, _, rest = spec.partition(":")
    kwargs: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise MitigationError(f"mitigation option {item!r} in {spec!r} is not key=value")
        kwargs[key.strip()] = _parse_value(value)
    return name.strip().lower(), kwargs


def get_mitigation(spec: str | DecodingMethod | None, **overrides: Any) -> DecodingMethod | None:
    """A method instance from a spec string, an instance (returned as is) or ``None``/``"none"`` (→ ``None``).

    Raises:
        MitigationError: unknown name or option (the message lists the valid ones).
    """
    if spec is None or isinstance(spec, DecodingMethod):
        return spec
    name, kwargs = parse_spec(spec)
    kwargs.update(overrides)
    if name in NO_MITIGATION:
        if kwargs:
            raise MitigationError(f"the plain decoding {name!r} takes no options, got {sorted(kwargs)}")
        return None
    if name not in MITIGATIONS:
        raise MitigationError(f"unknown mitigation {name!r}; available: none, {', '.join(sorted(MITIGATIONS))}")
    cls = MITIGATIONS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise MitigationError(f"{name} has no option(s) {unknown}; options: {sorted(fields)}")
    return cls(**kwargs)


def generate_with(method: str | DecodingMethod | None, model, **inputs: Any):
    """``model.generate(**inputs)`` with the mitigation ``method`` (a spec, an instance, or ``None``)."""
    resolved = get_mitigation(method)
    if resolved is None:
        return model.generate(**inputs)
    return model.generate(**inputs, custom_generate=resolved)


__all__ = [
    "AVISC",
    "AvisC",
    "DAMRO",
    "DoLa",
    "M3ID",
    "MITIGATIONS",
    "MissingInternalError",
    "MitigationError",
    "OPERA",
    "PAI",
    "VCD",
    "generate_with",
    "get_mitigation",
    "parse_spec",
]

"""Named parameter presets of the mitigation methods.

Every method has at least two presets:

- ``medheval`` (the default): the settings MedHEval reports for its mitigation baselines
  (its appendix A.4, and its released runner ``model_vqa.py`` where the appendix says nothing else);
- ``official``: the settings of the method's own paper / official code.

A field declared with :func:`from_preset` takes its value from the chosen preset unless the
caller passes it explicitly, so explicit arguments always win::

    VCD()                              # preset "medheval"
    OPERA(preset="official")           # OPERA's own evaluation settings
    OPERA(preset="official", threshold=25)   # ... with the threshold overridden
    get_mitigation("opera:preset=official,threshold=25")   # the same from a spec string

The instance then holds the resolved values, so ``method.settings()`` and ``method.spec()``
(what the runner writes to ``run.json`` / ``results.json``) carry the preset name *and* every
resolved parameter. The preset is applied at construction: ``dataclasses.replace(method,
preset="official")`` keeps the other (already resolved) values; build a new instance instead.
:func:`preset_table` renders a method's presets as the table in its card
(``python -m medheval.mitigations.cards`` rewrites those tables).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from typing import Any

from medheval.decoding.loop import spec_value
from medheval.decoding.visual_tokens import MitigationError

DEFAULT_PRESET = "medheval"
"""The preset used when none is given."""


class _FromPreset:
    """Sentinel default of a preset-managed field (replaced in ``__post_init__``)."""

    def __repr__(self) -> str:
        return "<from preset>"

    def __deepcopy__(self, memo: dict) -> "_FromPreset":
        return self


FROM_PRESET: Any = _FromPreset()


def from_preset() -> Any:
    """A dataclass field whose default comes from the method's preset (``PRESETS[preset][name]``)."""
    return dataclasses.field(default=FROM_PRESET)


def resolve_preset(method: Any) -> None:
    """Fill ``method``'s fields still at :data:`FROM_PRESET` from ``PRESETS[method.preset]``, then check every
    field's value against its declared type (:func:`check_option_types`).

    Raises:
        MitigationError: unknown preset (the message lists the method's presets), or an option of the wrong type.
    """
    presets: dict[str, dict[str, Any]] = type(method).PRESETS
    name = method.preset
    if not isinstance(name, str) or name not in presets:
        raise MitigationError(
            f"{method.name}: unknown preset {name!r}; presets: {', '.join(presets)} "
            f"(default {DEFAULT_PRESET!r}; explicit options override the preset's values)"
        )
    values = presets[name]
    for field in dataclasses.fields(method):
        if getattr(method, field.name) is FROM_PRESET:
            if field.name not in values:  # a definition error in the method, not a user error
                raise MitigationError(f"{method.name}: preset {name!r} has no value for {field.name!r}")
            setattr(method, field.name, copy.deepcopy(values[field.name]))
    check_option_types(method)


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the declared type ``hint`` (``float`` takes an int; no number takes a bool); a hint
    this check does not read (``Any``, ``Literal``, ``dict[...]``, ``tuple[...]``) takes any value."""
    if hint is type(None):
        return value is None
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_fits(value, option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is list and typing.get_args(hint):
        return isinstance(value, (list, tuple)) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    try:
        return isinstance(value, hint)
    except TypeError:  # Any, Literal[...], dict[...]: not a class isinstance can test
        return True


def _described(hint: Any) -> str:
    """``float`` -> ``"a number (float)"``; unions joined with "or" (``None`` written as ``none``, the spec form)."""
    if hint is type(None):
        return "none"
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_described(option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return "a list of whole numbers such as 0/2/4 (list[int])"
    names = {float: "a number (float)", int: "a whole number (int)", bool: "true or false (bool)", str: "text (str)"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def check_option_types(method: Any) -> None:
    """Check each of ``method``'s dataclass fields against its declared type, at construction (so a typo in
    ``--mitigation pai:alpha=x`` fails before a model loads, not at the first generation).

    A number must also be finite: ``nan`` or ``inf`` (``--mitigation vcd:alpha=nan``) would turn every score into
    NaN and the answers into noise without an error.

    Raises:
        MitigationError: naming the method, the option, the value, the expected type and the preset's value.
    """
    hints = typing.get_type_hints(type(method))
    for field in dataclasses.fields(method):
        value, hint = getattr(method, field.name), hints[field.name]
        fits = _fits(value, hint)
        if not fits or (isinstance(value, float) and not math.isfinite(value)):
            example = type(method).PRESETS.get(DEFAULT_PRESET, {}).get(field.name, field.default)
            expected = _described(hint) if not fits else "a finite number"
            raise MitigationError(
                f"{method.name}: option {field.name}={value!r} must be {expected}, e.g. "
                f"--mitigation {method.name}:{field.name}={spec_value(example)}")


def _cell(value: Any) -> str:
    if value is None:
        return "`None`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def preset_table(cls: type) -> str:
    """A markdown table of ``cls``'s presets: one row per parameter, one column per preset, and the source."""
    presets: dict[str, dict[str, Any]] = cls.PRESETS
    sources: dict[str, str] = cls.PRESET_SOURCES
    names = list(presets)
    parameters = [f.name for f in dataclasses.fields(cls) if f.default is FROM_PRESET]
    missing = [p for p in parameters if p not in sources]
    if missing:
        raise MitigationError(f"{cls.name}: no source given for preset parameter(s) {missing}")
    lines = ["| parameter | " + " | ".join(f"`{n}`" for n in names) + " | source |",
             "|---|" + "---|" * len(names) + "---|"]
    for parameter in parameters:
        cells = [_cell(presets[n][parameter]) for n in names]
        same = "" if len({repr(presets[n][parameter]) for n in names}) > 1 else " (presets agree)"
        lines.append(f"| `{parameter}` | " + " | ".join(cells) + f" | {sources[parameter]}{same} |")
    return "\n".join(lines)


__all__ = ["DEFAULT_PRESET", "FROM_PRESET", "check_option_types", "from_preset", "preset_table", "resolve_preset"]


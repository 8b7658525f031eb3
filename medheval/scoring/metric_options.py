"""Typed metric options: every ``--metric-option METRIC.KEY=VALUE`` is checked against the type the
metric declares for ``KEY`` and converted to it, before anything is generated.

A metric's option types come from, in order: the annotations of its ``_compute`` signature, the
``OPTION_TYPES`` dict of its module (``{"chexbert_path": str | None, ...}``), and the type of the
option's default when that is ``bool``, ``int``, ``float`` or ``str``. An option with none of these
is refused (its metric must declare it). Text from the command line is parsed by type:
booleans from ``true/false/yes/no/on/off/1/0`` (any case), numbers with ``int``/``float``,
lists and dicts as JSON; ``null``/``none`` for an optional option. Anything else is an error
naming the option, the value and the expected type (``upstream_compat='False'`` is ``False``, never
the truthy string ``"False"``).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import types
import typing
from typing import Any, Callable, Mapping

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NULL = {"null", "none"}
# Arguments the runner fills itself (the texts, the per-record fields, the outputs of the metrics computed
# before on the same items for a composite metric): never options.
NOT_OPTIONS = frozenset({"self", "predictions", "references", "run_results"})


class MetricOptionError(ValueError):
    """A metric option is unknown, has no declared type, or its value does not fit the type."""


def _describe(tp: Any) -> str:
    members = _union_members(tp)
    if members is not None:
        return " or ".join(_describe(member) for member in members)
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
             type(None): "null", dict: "a JSON object", list: "a JSON list", object: "an object (Python API)"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"a JSON list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a JSON object"
    return getattr(tp, "__name__", str(tp))


def _union_members(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


class _Mismatch(Exception):
    pass


def _convert(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp``; text is parsed, other values must already have the type."""
    members = _union_members(tp)
    if members is not None:
        # Text: the specific members first ("null" is None, "[...]" a list), then ``object``, then text.
        ordered = sorted(members, key=lambda member: (member is object, member is str))
        for member in ordered:
            try:
                return _convert(value, member)
            except _Mismatch:
                continue
        raise _Mismatch
    if tp is Any:
        return value
    if tp is type(None):
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULL):
            return None
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _Mismatch
    if tp in (int, float):  # an int fits a float option; a float never fits an int option; bools fit neither
        numeric = (int,) if tp is int else (int, float)
        if isinstance(value, numeric) and not isinstance(value, bool):
            return tp(value)
        if isinstance(value, str):
            try:
                return tp(value.strip())
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    origin = typing.get_origin(tp) or tp
    if origin in (list, dict):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _Mismatch from None
        if origin is list and isinstance(value, (list, tuple)):
            (item,) = typing.get_args(tp) or (Any,)
            return [_convert(element, item) for element in value]
        if origin is dict and isinstance(value, dict):
            return dict(value)
        raise _Mismatch
    if isinstance(tp, type):  # a class (``object``: anything the Python API passes, e.g. a Judge instance)
        if isinstance(value, tp):
            return value
        raise _Mismatch
    raise MetricOptionError(f"unsupported option type {tp!r}")


@functools.lru_cache(maxsize=256)
def _parameters(compute: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(compute).parameters


def compute_parameters(metric: Any) -> Mapping[str, inspect.Parameter]:
    """The parameters of ``metric._compute`` (its signature is read once per metric)."""
    return _parameters(metric._compute)


def takes(metric: Any, name: str) -> bool:
    """Whether ``metric._compute`` takes ``name`` (a record field, an option, ``images``, ``run_results`` …)."""
    return name in compute_parameters(metric)


def option_types(metric: Any) -> dict[str, Any]:
    """``{option: type}`` for every option of ``metric._compute`` whose type is declared or derivable."""
    compute = metric._compute
    parameters = compute_parameters(metric)
    try:
        hints = typing.get_type_hints(compute)
    except Exception:  # unresolvable string annotations: fall back to OPTION_TYPES and defaults
        hints = {}
    module = sys.modules.get(type(metric).__module__)
    declared = dict(getattr(module, "OPTION_TYPES", {}) or {})
    out: dict[str, Any] = {}
    for name, parameter in parameters.items():
        if name in NOT_OPTIONS or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in hints:
            out[name] = hints[name]
        elif name in declared:
            out[name] = declared[name]
        elif type(parameter.default) in (bool, int, float, str):
            out[name] = type(parameter.default)
    return out


def check_options(metric_name: str, metric: Any, options: Mapping[str, Any],
                  record_inputs: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """``options`` converted to the declared types; raises :class:`MetricOptionError` naming the
    option, the value and the expected type, or the options the metric accepts."""
    accepted = [name for name in compute_parameters(metric)
                if name not in NOT_OPTIONS and name not in record_inputs]
    types_ = option_types(metric)
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in record_inputs:
            raise MetricOptionError(f"{metric_name}.{key} is filled per record by the runner; it is not an option")
        if key not in accepted:
            raise MetricOptionError(f"metric {metric_name!r} takes no option {key!r}; it accepts: "
                                    + ", ".join(accepted))
        if key not in types_:
            raise MetricOptionError(f"metric {metric_name!r} declares no type for option {key!r} (add it to "
                                    f"OPTION_TYPES in metrics/{metric_name}/{metric_name}.py)")
        try:
            out[key] = _convert(value, types_[key])
        except _Mismatch:
            raise MetricOptionError(f"option {metric_name}.{key}={value!r}: expected "
                                    f"{_describe(types_[key])}") from None
    return out


def non_default_options(metric: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` (already typed) whose value differs from the default of ``metric._compute``
    (what ``results.md`` lists under "How items were scored"); an option without a default is always listed."""
    parameters = compute_parameters(metric)
    out: dict[str, Any] = {}
    for key, value in options.items():
        parameter = parameters.get(key)
        if parameter is None or parameter.default is inspect.Parameter.empty or parameter.default != value:
            out[key] = value
    return out


"""The ``-M mitigation=…`` model arg as inspect hands it over, back to our spec string (no inspect import:
:mod:`medheval.integrations.inspect.logs` reads it from a log's ``model_args`` too).

inspect's CLI reads ``-M key=value`` with YAML and then splits a string value at its commas, so
``-M mitigation=vcd:alpha=1,beta=0.1`` arrives as ``["vcd:alpha=1", "beta=0.1"]``: the list is joined back
with commas. A YAML mapping survives unsplit, ``-M 'mitigation={name: vcd, alpha: 1, beta: 0.1}'``; it is
the same spec. Anything else is refused naming what arrived and what is expected.
"""

from __future__ import annotations

from typing import Any, Mapping

from medheval.mitigations import DecodingMethod, MitigationError, get_mitigation

EXPECTED = ("expected -M mitigation=NAME or -M mitigation=NAME:KEY=VALUE,KEY=VALUE (inspect splits that at the "
            "commas; the list is joined back) or -M 'mitigation={name: NAME, KEY: VALUE, ...}', e.g. "
            "-M mitigation=vcd:alpha=1,beta=0.1")


def _option(value: Any) -> str:
    """One option value in our spec syntax (a list as ``0/2/4``, as ``layers=0/2/4``)."""
    return "/".join(str(part) for part in value) if isinstance(value, (list, tuple)) else str(value)


def mitigation_spec(value: Any) -> str | None:
    """Our spec string for the ``mitigation`` model arg as inspect parsed it (module docstring)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(part, (str, int, float)) for part in value):
        return ",".join(str(part) for part in value)
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):
        options = ",".join(f"{key}={_option(item)}" for key, item in value.items() if key != "name")
        return value["name"] + (f":{options}" if options else "")
    raise MitigationError(f"-M mitigation received {value!r} ({type(value).__name__}); {EXPECTED}")


def resolve_mitigation(value: Any) -> DecodingMethod | None:
    """The mitigation named by the model arg (``None`` for none); a bad one raises :class:`MitigationError`
    naming what was received, how it was read, and the accepted forms."""
    spec = mitigation_spec(value)
    try:
        return get_mitigation(spec)
    except MitigationError as error:
        read = f" (read as {spec!r})" if spec != value else ""
        raise MitigationError(f"-M mitigation received {value!r}{read}: {error}; {EXPECTED}") from None

"""Input checks shared by the metric modules in ``metrics/``."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

_MISSING = object()

# What to pass instead of None, per input of the metric modules.
_NONE_HINTS = {
    "predictions": "pass the model's answer as a string (\"\" for an empty answer, which the metric counts)",
    "references": "pass the reference as a string, or leave the item out",
    "answer_types": "pass \"yes_no\" or \"multiple_choice\"",
}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def none_checked(batch: Mapping[str, Any], missing_as: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``batch`` (input name -> column) with missing values (``None``, float NaN) handled the same at every index.

    ``evaluate`` checks the declared features on the first row only, so a ``None`` there failed with
    no field or index while a later one passed. In an input of ``missing_as`` a missing value becomes
    the value given there (the module counts such items); anywhere else it is a ``ValueError`` naming
    the input and index.
    """
    missing_as = missing_as or {}
    out: dict[str, Any] = {}
    for name, column in batch.items():
        if column is None or isinstance(column, (str, bytes)) or not isinstance(column, Iterable):
            out[name] = column
            continue
        values = list(column)
        for index, value in enumerate(values):
            if _missing(value):
                if name not in missing_as:
                    hint = _NONE_HINTS.get(name, "pass a value of the documented type")
                    raise ValueError(f"{name}[{index}] is {value!r}; {hint}")
                values[index] = missing_as[name]
        out[name] = values
    return out


class NoneChecked:
    """Mixin placed before ``evaluate.Metric``: :func:`none_checked` runs before ``evaluate``'s own checks.

    ``MISSING_AS`` maps the inputs whose ``None`` the module's docs allow to what it stands for.
    ``compute`` is covered too: it stores its inputs through ``add_batch``.
    """

    MISSING_AS: Mapping[str, Any] = {}

    def add_batch(self, *, predictions: Any = None, references: Any = None, **kwargs: Any) -> None:
        """``evaluate``'s ``add_batch`` after :func:`none_checked` (``evaluate`` appends the inputs' description)."""
        batch = none_checked({"predictions": predictions, "references": references, **kwargs}, self.MISSING_AS)
        super().add_batch(**batch)  # type: ignore[misc]


def per_item_column(name: str, values: Iterable[Any] | None, n: int, missing: Any = _MISSING) -> list[Any] | None:
    """An optional per-item input as a list of length ``n``; a length mismatch is a ``ValueError`` naming it.

    ``values=None`` gives ``None``, or ``[missing] * n`` when ``missing`` is given.
    """
    if values is None:
        return None if missing is _MISSING else [missing] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"Mismatch in the number of predictions ({n}) and {name} ({len(values)})")
    return values


def credentialed_column(values: bool | Iterable[Any] | None, n: int) -> list[bool | None]:
    """The per-item ``credentialed`` input of a judge-taking metric: ``True``/``False`` per item, ``None``
    where unknown. ``None`` (not given) means unknown for every item; one bool applies to every item.

    Unknown items are treated as credentialed by the judge guard (:mod:`medheval.judges.endpoints`):
    they may go to a local endpoint only, unless the caller says the data is not credentialed.
    """
    if values is None or isinstance(values, bool):
        return [values] * n
    column = per_item_column("credentialed", values, n)
    for index, value in enumerate(column):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"credentialed[{index}] must be True, False or None (unknown), got {value!r}")
    return column

"""Input checks shared by the metric modules in ``metrics/``."""

from __future__ import annotations

from typing import Any, Iterable

_MISSING = object()


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

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

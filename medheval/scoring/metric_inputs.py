"""Input checks shared by the metric modules in ``metrics/``.

Every module's declared inputs (``predictions``, ``references``, ...) pass :class:`NoneChecked` before
``evaluate`` stores them, and its per-item keyword inputs pass :func:`per_item_column`. What they refuse
is a ``ValueError`` naming the input, the item's index and what to pass instead; nothing is converted
behind the caller's back (``evaluate`` itself checks the first row only, then turns any later value into
its ``str()``: ``5`` into ``"5"``, a list of references into ``"['a', 'b']"``).

Text with a surrogate code point (U+D800-U+DFFF, e.g. from a JSON ``"\\ud800"`` escape without its pair) is
not valid Unicode and cannot be stored or scored: it is refused, naming the item and the character, with
the repair to apply (:data:`SURROGATE_REPAIR`); no metric replaces it silently.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import Any

import numpy as np

_MISSING = object()

# What to pass instead of None, per input of the metric modules.
_NONE_HINTS = {
    "predictions": "pass the model's answer as a string (\"\" for an empty answer, which the metric counts)",
    "references": "pass the reference as a string, or leave the item out",
    "answer_types": "pass \"yes_no\" or \"multiple_choice\"",
}

# What to pass instead of a value of the wrong type, per input.
_TYPE_HINTS = {
    "predictions": "pass the model's answer as a string",
    "references": "pass one reference string per item (several references per item are not supported: "
                  "pass one of them)",
    "answer_types": "pass \"yes_no\" or \"multiple_choice\"",
}

#: How to repair text that holds surrogate code points: a split pair is joined, a lone half becomes U+FFFD.
SURROGATE_REPAIR = "text.encode('utf-16', 'surrogatepass').decode('utf-16', 'replace')"


def _missing(value: Any) -> bool:
    """``None``, a float NaN (pandas' and numpy's missing value) or ``pandas.NA``."""
    if value is None or type(value).__name__ == "NAType":
        return True
    return (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
            and math.isnan(value))


def _is_bool(value: Any) -> bool:
    """Python's or numpy's bool (numpy 2 names its type ``bool``, numpy 1 ``bool_``; it is no ``numbers.Real``)."""
    return isinstance(value, (bool, np.bool_))


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _described(value: Any) -> str:
    return f"{type(value).__name__} {_preview(value)}"


def surrogate_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored or scored (a surrogate code point, with its position), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = text[err.start]
        return (f"holds a surrogate code point U+{ord(char):04X} at character {err.start} (not valid Unicode, e.g. "
                f"half of a JSON \\u escape pair; it cannot be stored or scored); repair the text first, e.g. "
                f"{SURROGATE_REPAIR}")
    return None


def _column(name: str, column: Any) -> list[Any]:
    """``column`` (a list, tuple, numpy array, pandas Series, any iterable of items) as a list; a single string,
    a mapping or a non-iterable is a ``ValueError`` (a string would be read one character per item)."""
    if isinstance(column, (str, bytes)):
        raise ValueError(f"{name} is a single {type(column).__name__} ({_preview(column)}), not a list: pass a "
                         f"list with one entry per item (e.g. {name}=[text])")
    if hasattr(column, "columns") and hasattr(column, "iloc"):  # a DataFrame iterates over its column names
        raise ValueError(f"{name} is a {type(column).__name__}: pass one of its columns (e.g. df['{name}'])")
    if isinstance(column, Mapping):
        raise ValueError(f"{name} is a {type(column).__name__}, not a list: pass a list with one entry per item "
                         "(for a dict keyed by id, pass list(d.values()) and the ids in the same order)")
    if not isinstance(column, Iterable):
        raise ValueError(f"{name} is {_described(column)}, not a list: pass a list with one entry per item")
    return list(column)


def _kind(feature: Any) -> str | None:
    """"string", "int", "float", "bool", "strings" (a list of strings per item) or None (not checked here)."""
    import datasets

    if isinstance(feature, datasets.Value):
        dtype = feature.dtype
        if dtype in ("string", "large_string"):
            return "string"
        if dtype == "bool":
            return "bool"
        if dtype.startswith(("int", "uint")):
            return "int"
        if dtype.startswith("float"):
            return "float"
        return None
    inner = getattr(feature, "feature", None)
    if isinstance(inner, datasets.Value) and inner.dtype in ("string", "large_string"):
        return "strings"
    return None


_INT_RANGES = {"int8": (-(2 ** 7), 2 ** 7 - 1), "int16": (-(2 ** 15), 2 ** 15 - 1),
               "int32": (-(2 ** 31), 2 ** 31 - 1), "uint8": (0, 2 ** 8 - 1)}


def _item_problem(kind: str, value: Any, feature: Any) -> str | None:
    """Why ``value`` does not fit ``kind`` (``value`` is not missing), or ``None``."""
    if kind == "string":
        if not isinstance(value, str):
            return f"is {_described(value)}, not a string"
        return surrogate_problem(value)
    if kind == "strings":
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            return f"is {_described(value)}, not a list of strings"
        for j, entry in enumerate(value):
            if entry is None:
                continue
            if not isinstance(entry, str):
                return f"[{j}] is {_described(entry)}, not a string"
            problem = surrogate_problem(entry)
            if problem:
                return f"[{j}] {problem}"
        return None
    if kind == "bool":
        if _is_bool(value):
            return None
        return f"is {_described(value)}, not a bool"
    if kind in ("int", "float"):
        if _is_bool(value):  # numpy's bool too (a bool column's .to_numpy()), as Python's bool counts as 0/1
            value = bool(value)
        if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
            return f"is {_described(value)}, not a number"
        if kind == "int":
            if not isinstance(value, numbers.Integral) and not float(value).is_integer():
                return f"is {_preview(value)}, not a whole number"
            low, high = _INT_RANGES.get(getattr(feature, "dtype", ""), (-math.inf, math.inf))
            if not low <= value <= high:
                return f"is {_preview(value)}, out of the range of {feature.dtype} ({low}..{high})"
    return None


def _shape_fits(kind: str, value: Any) -> bool:
    """Whether ``value`` has the shape of ``kind`` (how ``evaluate`` tells alternative formats apart)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "strings":
        return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
    return isinstance(value, numbers.Real) and not isinstance(value, (str, bytes))


def _chosen_format(batch: Mapping[str, list[Any] | None], features: Any) -> Mapping[str, Any] | None:
    """The declared format ``evaluate`` will use for ``batch``: the only one, or (a list of alternatives) the
    first that fits the first row, as ``evaluate`` chooses; ``None`` when no alternative fits."""
    if isinstance(features, Mapping):
        return features
    for option in features:
        if all(_shape_fits(kind, batch[name][0]) for name, kind in
               ((name, _kind(feature)) for name, feature in option.items())
               if kind is not None and batch.get(name) and not _missing(batch[name][0])):
            return option
    return None


def none_checked(batch: Mapping[str, Any], missing_as: Mapping[str, Any] | None = None,
                 features: Any = None) -> dict[str, Any]:
    """``batch`` (input name -> column) with every column a list, missing values handled the same at every index
    and, given the module's declared ``features``, every value of the declared type.

    ``evaluate`` checks the declared features on the first row only, so a ``None`` there failed with
    no field or index while a later one passed, and a later value of another type was stored as its
    ``str()``. A missing value (``None``, float NaN, ``pandas.NA``) in an input of ``missing_as`` becomes the
    value given there (the module counts such items); anywhere else it is a ``ValueError`` naming the input and
    index. So is a value of another type than declared (a number or a list where a string is declared, a
    fraction where an integer is), text with a surrogate code point (:func:`surrogate_problem`), a column
    that is a single string, and columns of different lengths.
    """
    missing_as = missing_as or {}
    out: dict[str, Any] = {}
    for name, column in batch.items():
        if column is None:
            out[name] = column
            continue
        values = _column(name, column)
        for index, value in enumerate(values):
            if _missing(value):
                if name not in missing_as:
                    hint = _NONE_HINTS.get(name, "pass a value of the documented type")
                    raise ValueError(f"{name}[{index}] is {value!r}; {hint}")
                values[index] = missing_as[name]
        out[name] = values
    lengths = {name: len(column) for name, column in out.items() if column is not None}
    if len(set(lengths.values())) > 1:
        first, *others = lengths
        other = next(name for name in others if lengths[name] != lengths[first])
        raise ValueError(f"Mismatch in the number of {first} ({lengths[first]}) and {other} ({lengths[other]})")
    if features is not None:
        _check_types(out, features)
    return out


def _check_types(batch: Mapping[str, list[Any] | None], features: Any) -> None:
    chosen = _chosen_format(batch, features)
    if chosen is None:  # alternatives (e.g. a string or a list of strings per item), none fits the first row
        for name, column in batch.items():
            kinds = [kind for kind in (_kind(option[name]) for option in features if name in option) if kind]
            if column and kinds and not _missing(column[0]) and not any(_shape_fits(k, column[0]) for k in kinds):
                wanted = " or ".join(dict.fromkeys(_WANTED[kind] for kind in kinds))
                hint = _TYPE_HINTS.get(name, "")
                if hint and "strings" in kinds:
                    hint += ", or a list of strings per item where the metric takes several (e.g. mode='multi')"
                hint = f"; {hint}" if hint else ""
                raise ValueError(f"{name}[0] is {_described(column[0])}, not {wanted}{hint}")
        return
    for name, feature in chosen.items():
        kind, column = _kind(feature), batch.get(name)
        if kind is None or not column:
            continue
        for index, value in enumerate(column):
            if _missing(value):  # a missing value the module allows (``missing_as`` None)
                continue
            problem = _item_problem(kind, value, feature)
            if problem is None:
                continue
            if "surrogate code point" in problem:  # the problem says what to do
                raise ValueError(f"{name}[{index}]{'' if problem.startswith('[') else ' '}{problem}")
            hint = _TYPE_HINTS.get(name, f"pass {_WANTED[kind]}") if kind == "string" else (
                "pass one string (or None) per entry" if kind == "strings" else f"pass {_WANTED[kind]}")
            raise ValueError(f"{name}[{index}]{'' if problem.startswith('[') else ' '}{problem}; {hint}")


_WANTED = {"string": "a string", "strings": "a list of strings", "int": "a whole number", "float": "a number",
           "bool": "a bool"}


class NoneChecked:
    """Mixin placed before ``evaluate.Metric``: :func:`none_checked` runs before ``evaluate``'s own checks.

    ``MISSING_AS`` maps the inputs whose ``None`` the module's docs allow to what it stands for.
    The declared ``features`` are enforced on every row (``evaluate`` checks the first).
    ``compute`` is covered too: it stores its inputs through ``add_batch``.
    """

    MISSING_AS: Mapping[str, Any] = {}

    def add_batch(self, *, predictions: Any = None, references: Any = None, **kwargs: Any) -> None:
        """``evaluate``'s ``add_batch`` after :func:`none_checked` (``evaluate`` appends the inputs' description)."""
        batch = none_checked({"predictions": predictions, "references": references, **kwargs}, self.MISSING_AS,
                             features=getattr(self, "features", None))
        super().add_batch(**batch)  # type: ignore[misc]

    def _infer_feature_from_batch(self, batch: Mapping[str, Any]) -> Any:
        """``evaluate``'s choice among alternative formats reads the first row: empty inputs take the first
        format (``evaluate`` failed with an ``IndexError``), so they score as no items everywhere."""
        features = getattr(self, "features", None)
        if not isinstance(features, Mapping) and features and all(
                not len(column) for column in batch.values() if column is not None):
            return features[0]
        return super()._infer_feature_from_batch(batch)  # type: ignore[misc]


def as_list(values: Any) -> Any:
    """A one-pass iterator (a generator) as a list, so it can be read twice; anything else as it is."""
    return list(values) if isinstance(values, Iterator) else values


def _label_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return surrogate_problem(value)
    if _is_bool(value) or not isinstance(value, numbers.Real):
        return f"is {_described(value)}; pass a string or a whole number (or None)"
    if isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer()):
        return None
    return f"is {_described(value)}, not a whole number; pass a string or a whole number (or None)"


def _label_text(value: Any) -> str:
    """A group key as text: a string as it is; a whole number (an int, numpy's too, or a float such as the ``1.0``
    of a pandas int column with NaN) as its digits, so ``1``, ``np.int64(1)``, ``1.0`` and ``"1"`` are one group."""
    return value if isinstance(value, str) else str(int(value))


def _text_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return surrogate_problem(value)
    return f"is {_described(value)}; pass a string (or None)"


_ITEM_CHECKS = {"text": _text_problem, "label": _label_problem}


def per_item_column(name: str, values: Iterable[Any] | None, n: int, missing: Any = _MISSING,
                    kind: str | None = None) -> list[Any] | None:
    """An optional per-item input as a list of length ``n``; a length mismatch is a ``ValueError`` naming it.

    ``values=None`` gives ``None``, or ``[missing] * n`` when ``missing`` is given. A single string (which
    would be read one character per item) or a mapping is a ``ValueError``. With ``kind`` each item is
    checked: ``"text"`` a string, ``"label"`` a string or a whole number (a group key, given back as text:
    :func:`_label_text`; a fraction such as ``1.5`` is refused); a missing item (``None``, NaN, ``pandas.NA``) is
    ``None``; anything else is a ``ValueError`` naming ``name[index]``.
    """
    if values is None:
        return None if missing is _MISSING else [missing] * n
    values = _column(name, values)
    if len(values) != n:
        raise ValueError(f"Mismatch in the number of predictions ({n}) and {name} ({len(values)})")
    if kind is not None:
        check = _ITEM_CHECKS[kind]
        for index, value in enumerate(values):
            if _missing(value):
                values[index] = None
                continue
            problem = check(value)
            if problem:
                raise ValueError(f"{name}[{index}] {problem}")
            if kind == "label":
                values[index] = _label_text(value)
    return values


def _options_problem(value: Any) -> str | None:
    """Why ``value`` (one item's options, not missing) is not a list of strings or one ``'A. x, B. y'`` string."""
    if isinstance(value, str):
        return surrogate_problem(value)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        return f"is {_described(value)}; pass the options as a list of strings (or one 'A. x, B. y' string)"
    if isinstance(value, Set):  # read in hash order, which for strings changes from process to process
        return (f"is {_described(value)}; pass the options as a list of strings, in their order (a set has no "
                "order: which option is A would change from run to run)")
    return None


def _option_problem(option: Any) -> str | None:
    """Why ``option`` (one entry of an item's option list) is not an option's text."""
    if isinstance(option, str):
        return surrogate_problem(option)
    return f"is {'None' if option is None else _described(option)}; pass every option as a string"


def options_column(name: str, values: Iterable[Any] | None, n: int, missing: Any = _MISSING) -> list[Any] | None:
    """:func:`per_item_column` of per-item option lists (``choices``), each item checked: a list (tuple, numpy
    array: each cell of a list column of ``Dataset.to_pandas()`` or of a parquet file read by pandas) of strings,
    given back as a list, or one ``'A. x, B. y'`` string; a missing item (``None``, NaN, ``pandas.NA``) is ``None``.
    Anything else (a number, a dict, a set: its order is the hash's, an option that is not a string) is a
    ``ValueError`` naming ``name[index]`` (``name[index][option]``) and what to pass."""
    column = per_item_column(name, values, n, missing)
    if column is None:
        return None
    out: list[Any] = []
    for index, value in enumerate(column):
        if _missing(value):
            out.append(None)
            continue
        problem = _options_problem(value)
        if problem:
            raise ValueError(f"{name}[{index}] {problem}")
        if not isinstance(value, str):
            value = value.tolist() if isinstance(value, np.ndarray) else list(value)
            for position, option in enumerate(value):
                problem = _option_problem(option)
                if problem:
                    raise ValueError(f"{name}[{index}][{position}] {problem}")
        out.append(value)
    return out


# How far past its bound a value may lie and still be taken as rounding: float32 scores (bert_score's F1, rescaled
# by 1/(1 - baseline); a float32 cosine) of an identical pair land up to a few 1e-7 above 1, a percentage far out.
_ROUNDING = 1e-5


def number_column(name: str, values: Iterable[Any] | None, n: int, low: float = -math.inf,
                  high: float = math.inf, hint: str = "") -> list[float | None] | None:
    """A per-item numeric input as floats (numpy scalars included); ``None``, NaN and infinities are ``None``
    (missing: the caller skips and counts the item). A value that is not a number (a string, a list, a bool)
    or lies outside ``[low, high]`` (beyond float32 rounding, :data:`_ROUNDING`) is a ``ValueError`` naming
    ``name[index]``."""
    column = per_item_column(name, values, n)
    if column is None:
        return None
    out: list[float | None] = []
    for index, value in enumerate(column):
        if _missing(value):
            out.append(None)
            continue
        if _is_bool(value) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name}[{index}] is {_described(value)}; pass a number (None where it is missing)")
        number = float(value)
        if not math.isfinite(number):
            out.append(None)
            continue
        if not low - _ROUNDING <= number <= high + _ROUNDING:
            span = f"outside [{low:g}, {high:g}]" if math.isfinite(low) else f"above {high:g}"
            raise ValueError(f"{name}[{index}] is {number!r}, {span}{'; ' + hint if hint else ''}")
        out.append(number)
    return out


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

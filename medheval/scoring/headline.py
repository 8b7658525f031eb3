"""A metric's headline numbers: the one definition of what a split reports and publishes.

Every consumer reads :data:`HEADLINE_NUMBERS`: ``medheval publish --results`` (``.eval_results`` entries,
``task_id`` ``<config>/<metric>/<key>``), ``eval.yaml`` (one task per number, the same id), lmms-eval's
``metric_list`` (``<metric>.<key>``) and inspect's split metric (``<metric>/<key>``). Everything else a
metric returns (counts, standard deviations, per-item lists, breakdowns, and settings such as
``text_generation``'s ``bertscore_num_layers``) is never a score, so never published. Each number also
declares its direction and its unit (:data:`UNITS`: ``fraction`` 0-1, ``percent`` 0-100, ...), which the
published entries name.
"""

from __future__ import annotations

from typing import Any, Mapping

# The scale a headline number is on: name -> (lowest, highest) (None: no fixed range). Published with every
# value (``.eval_results`` notes, the provenance file beside them), so 45.2 ROUGE-L (0-100) is never read
# next to 0.75 accuracy (0-1) as the same kind of number.
UNITS: dict[str, tuple[float, float] | None] = {
    "fraction": (0.0, 1.0),  # a share or ratio: accuracy, F1, CHAIR, RadGraph F1, RaTEScore, GREEN ...
    "percent": (0.0, 100.0),  # text_generation's BLEU, ROUGE-L, METEOR (MedHEval Table 7's 0-100 scale)
    "points_0_5": (0.0, 5.0),  # S_h: an LLM judge's mean 0-5 rating
    "coefficient": (-1.0, 1.0),  # Cohen's kappa, cosine similarity
    "unbounded": None,  # RadCliQ-v1: an estimated error count (about -1.44 for a perfect report)
}

# metric -> ((key, higher is better, unit), ...); tests/test_headline_numbers.py checks every metric unit has an
# entry and every unit is one of UNITS (each metric's card states the scale: metrics/<name>/README.md)
HEADLINE_NUMBERS: dict[str, tuple[tuple[str, bool, str], ...]] = {
    "close_ended_accuracy": (("accuracy", True, "fraction"),),
    # CHAIR_i, CHAIR_s, finding recall
    "chair": (("chair", False, "fraction"), ("chair_s", False, "fraction"), ("recall", True, "fraction")),
    "text_generation": (("bleu", True, "percent"), ("rougeL", True, "percent"), ("meteor", True, "percent")),
    "medihall_score": (("medihall_score", True, "fraction"), ("accuracy", True, "fraction")),
    "stepbench": (("macro_f1", True, "fraction"), ("f1", True, "fraction"), ("accuracy", True, "fraction")),
    "sh_judge": (("sh", False, "points_0_5"),),  # a mean 0-5 rating, 5 = entirely hallucinated (MedHEval)
    "clinhallu": (("acc", True, "fraction"), ("acc_rep_v", True, "fraction"), ("acc_rep_k", True, "fraction"),
                  ("acc_rep_vk", True, "fraction"), ("h_v", False, "fraction"), ("h_k", False, "fraction"),
                  ("h_r", False, "fraction")),
    "medihall_detection": (("accuracy", True, "fraction"), ("macro_f1", True, "fraction"),
                           ("cohen_kappa", True, "coefficient"), ("quadratic_kappa", True, "coefficient")),
    "radgraph_f1": (("radgraph_f1", True, "fraction"), ("radgraph_entity_f1", True, "fraction"),
                    ("radgraph_relation_f1", True, "fraction")),
    "ratescore": (("ratescore", True, "fraction"),),
    "chexbert_similarity": (("chexbert_similarity", True, "coefficient"),),
    "radcliq": (("radcliq", False, "unbounded"),),
    "green": (("green", True, "fraction"),),
}


def headline_numbers(metric: str, values: Mapping[str, Any] | None) -> dict[str, int | float]:
    """``{key: value}``: the headline numbers of one metric's results that it gave (a ``None`` is left out)."""
    out: dict[str, int | float] = {}
    for key, _, _ in HEADLINE_NUMBERS.get(metric, ()):
        value = (values or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def headline_values(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``{"<metric>/<key>": value}`` over a split's metric results: inspect's split metric names, and the
    ``<metric>/<key>`` of the published ``task_id``."""
    return {f"{metric}/{key}": float(value) for metric, values in results.items()
            for key, value in headline_numbers(metric, values).items()}


def headline_unit(metric: str, key: str) -> str | None:
    """The unit (a name in :data:`UNITS`) of one headline number, ``None`` when it is not a headline number."""
    return next((unit for name, _, unit in HEADLINE_NUMBERS.get(metric, ()) if name == key), None)


def unit_label(unit: str) -> str:
    """``"fraction (0-1)"``, ``"percent (0-100)"``, ``"unbounded"``: a unit as the published notes name it."""
    bounds = UNITS[unit]
    return unit if bounds is None else f"{unit} ({bounds[0]:g}-{bounds[1]:g})"

"""A metric's headline numbers: the one definition of what a split reports and publishes.

Every consumer reads :data:`HEADLINE_NUMBERS`: ``medheval publish --results`` (``.eval_results`` entries,
``task_id`` ``<config>/<metric>/<key>``), ``eval.yaml`` (one task per number, the same id), lmms-eval's
``metric_list`` (``<metric>.<key>``) and inspect's split metric (``<metric>/<key>``). Everything else a
metric returns (counts, standard deviations, per-item lists, breakdowns, and settings such as
``text_generation``'s ``bertscore_num_layers``) is never a score, so never published.
"""

from __future__ import annotations

from typing import Any, Mapping

# metric -> ((key, higher is better), ...); tests/test_headline_numbers.py checks every metric unit has an entry
HEADLINE_NUMBERS: dict[str, tuple[tuple[str, bool], ...]] = {
    "close_ended_accuracy": (("accuracy", True),),
    "chair": (("chair", False), ("chair_s", False), ("recall", True)),  # CHAIR_i, CHAIR_s, finding recall
    "text_generation": (("bleu", True), ("rougeL", True), ("meteor", True)),
    "medihall_score": (("medihall_score", True), ("accuracy", True)),
    "stepbench": (("macro_f1", True), ("f1", True), ("accuracy", True)),
    "sh_judge": (("sh", True),),
    "clinhallu": (("acc", True), ("acc_rep_v", True), ("acc_rep_k", True), ("acc_rep_vk", True),
                  ("h_v", False), ("h_k", False), ("h_r", False)),
    "medihall_detection": (("accuracy", True), ("macro_f1", True), ("cohen_kappa", True), ("quadratic_kappa", True)),
    "radgraph_f1": (("radgraph_f1", True), ("radgraph_entity_f1", True), ("radgraph_relation_f1", True)),
    "ratescore": (("ratescore", True),),
    "chexbert_similarity": (("chexbert_similarity", True),),
    "radcliq": (("radcliq", False),),
    "green": (("green", True),),
}


def headline_numbers(metric: str, values: Mapping[str, Any] | None) -> dict[str, int | float]:
    """``{key: value}``: the headline numbers of one metric's results that it gave (a ``None`` is left out)."""
    out: dict[str, int | float] = {}
    for key, _ in HEADLINE_NUMBERS.get(metric, ()):
        value = (values or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def headline_values(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``{"<metric>/<key>": value}`` over a split's metric results: inspect's split metric names, and the
    ``<metric>/<key>`` of the published ``task_id``."""
    return {f"{metric}/{key}": float(value) for metric, values in results.items()
            for key, value in headline_numbers(metric, values).items()}

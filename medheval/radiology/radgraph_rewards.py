"""Comparing two RadGraph graphs: MedHEval's entity/relation F1 and the F1RadGraph rewards.

**Graph format.** One report's graph is the dict the ``radgraph`` package (and RadGraph's own
PhysioNet inference script) produces; only ``tokens``, ``label`` and ``relations`` are read::

    {"text": "small left pleural effusion",
     "entities": {"1": {"tokens": "small", "label": "OBS-DP", "start_ix": 0, "end_ix": 0,
                        "relations": [["modify", "4"]]},
                  "2": {"tokens": "left", "label": "ANAT-DP", "start_ix": 1, "end_ix": 1,
                        "relations": [["modify", "3"]]},
                  "3": {"tokens": "pleural", "label": "ANAT-DP", "start_ix": 2, "end_ix": 2,
                        "relations": []},
                  "4": {"tokens": "effusion", "label": "OBS-DP", "start_ix": 3, "end_ix": 3,
                        "relations": [["located_at", "3"]]}}}

A relation is ``[relation_type, target_entity_id]``; labels are RadGraph's (v1: ``ANAT-DP``,
``OBS-DP``, ``OBS-U``, ``OBS-DA``; XL: ``Anatomy::definitely present`` …); relation types are
``modify``, ``located_at``, ``suggestive_of``.

**MedHEval's "RadGraph F1"** (``CXR-Report-Metric`` ``radgraph_evaluate_model.py``): per report, the
entity set ``{(tokens, label)}`` and the relation set
``{((tokens, label), (target_tokens, target_label), relation_type)}`` of the generated and the
reference graph are compared with F1 = 2PR/(P+R), P = |G∩R|/|G|, R = |G∩R|/|R|; the report's score
is ``(entity_F1 + relation_F1) / 2`` (``radgraph_combined``), averaged over reports.
Upstream, an empty set on either side gives P = R = 0, so two reports that both have no relations
score relation F1 = 0 and an identical pair of relation-free reports scores only 0.5. Here two
*empty* sets agree (F1 = 1) unless ``upstream_compat=True``; one empty side is still 0.

**F1RadGraph rewards** (Delbrouck et al., 2022; ``radgraph==0.1.18`` ``radgraph/rewards.py``), each
an F1 between two *sets* built per report (precision over the generated set, recall over the
reference set, 0 when a side is empty):

- ``simple`` (RG_E): ``(tokens, label)`` for every entity;
- ``partial`` (RG_ER): ``(tokens, label)`` for entities without relations and
  ``(tokens, label, True)`` for entities with at least one relation;
- ``complete`` (RG_ER-bar): ``(tokens, label)`` for entities without relations and one
  ``(tokens.lower(), label, relation_type, target_tokens.lower())`` per relation otherwise (0.1.18
  lowercases only these relation tuples; repository HEAD after 2026-05 lowercases every token
  string — this module pins 0.1.18).

All three are 0 when either graph has no entity (``compute_reward``). No model is needed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Graph = Mapping[str, Any]
Entity = tuple[str, str]
Relation = tuple[Entity, Entity, str]

REWARD_LEVELS = ("simple", "partial", "complete")


def _entities(graph: Graph) -> Mapping[str, Mapping[str, Any]]:
    entities = graph.get("entities") if isinstance(graph, Mapping) else None
    if not isinstance(entities, Mapping):
        raise ValueError(f"a RadGraph graph must be a dict with an 'entities' dict, got {type(graph).__name__}"
                         + (f" with keys {sorted(graph)[:5]}" if isinstance(graph, Mapping) else ""))
    return entities


def _target(entities: Mapping[str, Mapping[str, Any]], entity_id: str, relation: Any) -> Mapping[str, Any]:
    try:
        return entities[str(relation[1])]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"entity {entity_id!r}: relation {relation!r} does not point at an entity of the same "
                         f"graph (ids: {sorted(entities)[:10]})") from None


def entity_set(graph: Graph) -> set[Entity]:
    """``{(tokens, label)}`` over the graph's entities (duplicates collapse)."""
    return {(entity["tokens"], entity["label"]) for entity in _entities(graph).values()}


def relation_set(graph: Graph) -> set[Relation]:
    """``{((tokens, label), (target_tokens, target_label), relation_type)}`` over all relations."""
    entities = _entities(graph)
    relations: set[Relation] = set()
    for entity_id, entity in entities.items():
        for relation in entity.get("relations") or ():
            target = _target(entities, entity_id, relation)
            relations.add(((entity["tokens"], entity["label"]), (target["tokens"], target["label"]), relation[0]))
    return relations


def set_f1(generated: Iterable[Any], reference: Iterable[Any], both_empty: float = 0.0) -> float:
    """F1 of two sets: P = |G∩R|/|G|, R = |G∩R|/|R|, F1 = 2PR/(P+R); 0 when P+R = 0.

    ``both_empty`` is returned when both sets are empty (upstream: 0).
    """
    generated, reference = set(generated), set(reference)
    if not generated and not reference:
        return float(both_empty)
    hits = len(generated & reference)
    precision = hits / len(generated) if generated else 0.0
    recall = hits / len(reference) if reference else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def medheval_scores(generated: Graph, reference: Graph, upstream_compat: bool = False) -> dict[str, float]:
    """MedHEval's per-report RadGraph scores: ``entity_f1``, ``relation_f1`` and their mean ``radgraph_f1``.

    With ``upstream_compat=False`` two empty sets agree (F1 1.0); with ``True`` they score 0 as in
    ``CXR-Report-Metric``'s ``compute_f1``.
    """
    both_empty = 0.0 if upstream_compat else 1.0
    entity_f1 = set_f1(entity_set(generated), entity_set(reference), both_empty)
    relation_f1 = set_f1(relation_set(generated), relation_set(reference), both_empty)
    return {"entity_f1": entity_f1, "relation_f1": relation_f1, "radgraph_f1": (entity_f1 + relation_f1) / 2}


def simple_set(graph: Graph) -> set[tuple]:
    """RG_E items: ``(tokens, label)`` per entity."""
    return {(entity["tokens"], entity["label"]) for entity in _entities(graph).values()}


def partial_set(graph: Graph) -> set[tuple]:
    """RG_ER items: ``(tokens, label)`` without relations, ``(tokens, label, True)`` with relations."""
    return {(entity["tokens"], entity["label"], True) if entity.get("relations")
            else (entity["tokens"], entity["label"]) for entity in _entities(graph).values()}


def complete_set(graph: Graph) -> set[tuple]:
    """RG_ER-bar items: ``(tokens, label)`` without relations, else one lowercased tuple per relation."""
    entities = _entities(graph)
    items: set[tuple] = set()
    for entity_id, entity in entities.items():
        relations = entity.get("relations") or ()
        if not relations:
            items.add((entity["tokens"], entity["label"]))
        for relation in relations:
            target = _target(entities, entity_id, relation)
            items.add((entity["tokens"].lower(), entity["label"], relation[0], target["tokens"].lower()))
    return items


def _reward_f1(generated: set, reference: set) -> float:
    hits = len(generated & reference)
    precision = hits / len(generated) if generated else 0.0
    recall = hits / len(reference) if reference else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def f1radgraph_rewards(generated: Graph, reference: Graph) -> dict[str, float]:
    """The three F1RadGraph rewards of one report pair; all 0 when either graph has no entity."""
    if not _entities(generated) or not _entities(reference):
        return {level: 0.0 for level in REWARD_LEVELS}
    return {
        "simple": _reward_f1(simple_set(generated), simple_set(reference)),
        "partial": _reward_f1(partial_set(generated), partial_set(reference)),
        "complete": _reward_f1(complete_set(generated), complete_set(reference)),
    }


def count_relations(graph: Graph) -> int:
    """Number of relations in the graph (edges, before deduplication)."""
    return sum(len(entity.get("relations") or ()) for entity in _entities(graph).values())


EMPTY_GRAPH: dict[str, Any] = {"text": "", "entities": {}}

__all__ = [
    "EMPTY_GRAPH", "REWARD_LEVELS", "complete_set", "count_relations", "entity_set", "f1radgraph_rewards",
    "medheval_scores", "partial_set", "relation_set", "set_f1", "simple_set",
]

"""Turning a RadGraph (DyGIE++) forward pass into a report graph in time and memory (near-)linear in its size.

``radgraph==0.1.18`` runs a report of W words as one DyGIE "sentence". Its NER head labels spans
of up to ``max_span_width`` words (N entities, N = O(W)); its relation head keeps K = ceil(0.5 * W)
candidate spans and labels each of the K**2 ordered pairs (R relations, R <= K**2). The package then
decodes in super-linear time and memory:

- every predicted entity and relation is wrapped in ``dygie`` ``Span`` objects, and each ``Span``
  keeps its own copy of the whole report (``" ".join(words)``): O((N + R) * W);
- ``radgraph.utils.get_entity`` finds each entity's relations by scanning all R relations, and each
  relation's target by scanning all N entities: O(N * R);
- the relation head builds the (K, K, 3 * D) tensor of pair features ``[e_i, e_j, e_i * e_j]``
  in one piece (D = span embedding size: 2 * 768 + 20 = 1556 with a BERT-base encoder and the
  dygiepp template's 20-wide span-width feature).

With R up to K**2 that is O(W**3) time; degenerate (repeated) generations make W large. This
module gives the *same* graph (entity ids, order, tokens, labels, offsets, relations) from the
same scores, after the forward pass in O(W + N + R log R) time and O(W + N + R) memory (sorted-array
look-ups and a stable sort, no per-prediction objects), and with the pair features built in row
blocks (:func:`blockwise_relation_scores`) once they would exceed ``PAIR_BLOCK_BYTES``. Blocks use the
package's formula; their smaller matrix products may round differently in the last bit (BLAS
kernels depend on the shape and thread count), so only a label tie within that rounding could
differ from the one-piece computation.
:func:`install` swaps the heads' decoding methods on one loaded model (that instance only, not the
package's classes); :func:`graph_from_output` replaces ``make_output_human_readable`` +
``postprocess_reports``.

Graph rules (``get_entity``'s), entities numbered 1..N in the NER head's order:

- entity i: ``tokens = " ".join(words[start:end + 1])``, ``label``, ``start_ix``, ``end_ix``;
- its relations: the relation rows whose source span is (start, end), in row order, as
  ``[label, str(j)]``, j = the first entity whose span is the target span; a row whose target span
  is no entity's is dropped.
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

NerRow = tuple[int, int, str]  # (start, end, label), document word offsets
# Largest relation-head pair tensor (bytes) built in one piece, exactly as the package does; above it,
# row blocks of at most this size. 1 GiB keeps a report of up to ~478 words in one piece with D = 1556 (K <= 239).
PAIR_BLOCK_BYTES = 1 << 30


class RelationTable(NamedTuple):
    """R predicted relations, in the relation head's row-major pair order."""

    spans: np.ndarray   # (R, 4) int64: source start, source end, target start, target end
    labels: np.ndarray  # (R,) object: relation label names

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> RelationTable:
        """From package-style rows ``(start, end, target start, target end, label, ...)``."""
        spans = np.array([list(row[:4]) for row in rows], dtype=np.int64).reshape(-1, 4)
        labels = np.empty(len(rows), dtype=object)
        labels[:] = [row[4] for row in rows]
        return cls(spans, labels)


class PairSource(NamedTuple):
    """Stands in for the relation head's pair tensor when that would exceed the block budget."""

    embeddings: Any  # (batch, K, D) candidate span embeddings


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while millions of small lists are built.

    Its full passes walk every live object, so building R lists with it on costs O(R * heap); the
    graph's lists hold no reference cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _names(vocab: Any, namespace: str) -> np.ndarray:
    """Label names indexed by label id (an object array, for vectorised look-up)."""
    index = vocab.get_index_to_token_vocabulary(namespace)
    names = np.empty(max(index, default=-1) + 1, dtype=object)
    for label_id, name in index.items():
        names[label_id] = name
    return names


def ner_rows(ner_scores: Any, spans: Any, span_mask: Any, sentences: Sequence[Any], names: np.ndarray
             ) -> list[list[NerRow]]:
    """Per sentence, ``(start, end, label)`` of every unmasked span whose best label is not null (id 0).

    The package's NER ``predict`` choice: ``max`` over the label scores, first index on ties.
    """
    rows: list[list[NerRow]] = []
    for scores, sentence_spans, mask, sentence in zip(ner_scores, spans, span_mask, sentences):
        _, best = scores.max(dim=1)
        keep = (best != 0) & mask.bool()
        offset = sentence.sentence_start
        rows.append([(start + offset, end + offset, names[label])
                     for (start, end), label in zip(sentence_spans[keep].tolist(), best[keep].tolist())])
    return rows


def relation_table(top_spans: Any, relation_scores: Any, num_spans_to_keep: Any, sentence: Any,
                   names: np.ndarray) -> RelationTable:
    """Every candidate pair (i, j) whose best label is not null, in row-major order.

    The package's ``_predict_sentence`` choice: ``max`` over labels (id 0 = null, relation id =
    label id - 1), and the mask of the first ``num_spans_to_keep`` candidates applied, as there,
    along the last axis (to j).
    """
    import torch

    _, best = relation_scores.max(dim=-1)
    keep = torch.zeros(len(top_spans), dtype=torch.bool)
    keep[: int(num_spans_to_keep)] = True
    pairs = ((best > 0) & keep).nonzero(as_tuple=False)
    spans = torch.cat([top_spans[pairs[:, 0]], top_spans[pairs[:, 1]]], dim=1).long() + sentence.sentence_start
    return RelationTable(spans.numpy().reshape(-1, 4), names[(best[pairs[:, 0], pairs[:, 1]] - 1).numpy()])


def pair_tensor_bytes(embeddings: Any) -> int:
    """Size of the package's pair tensor ``[e_i, e_j, e_i * e_j]`` for (batch, K, D) span embeddings."""
    batch, k, dim = embeddings.shape
    return batch * k * k * 3 * dim * embeddings.element_size()


def blockwise_relation_scores(relation: Any, embeddings: Any, mention_scores: Any, block_bytes: int) -> Any:
    """The relation head's scores, a block of candidate rows i at a time.

    For candidates i, j and label l (l = 0 the null label, score 0):
        score[i, j, l] = scorer(feedforward([e_i, e_j, e_i * e_j]))[l - 1] + m_i + m_j,
    m the pruner's mention scores: the package's formula, on row blocks whose pair tensor holds at
    most ``block_bytes``, so memory is O(K**2 * labels) instead of O(K**2 * D).
    """
    import torch

    feedforward = relation._relation_feedforwards[relation._active_namespace]
    scorer = relation._relation_scorers[relation._active_namespace]
    batch, k, dim = embeddings.shape
    rows = max(1, block_bytes // max(1, batch * k * 3 * dim * embeddings.element_size()))
    columns = embeddings.unsqueeze(1)  # (batch, 1, K, D)
    blocks = []
    for first in range(0, k, rows):
        block = embeddings[:, first:first + rows].unsqueeze(2)  # (batch, n, 1, D)
        n = block.size(1)
        pairs = torch.cat([block.expand(batch, n, k, dim), columns.expand(batch, n, k, dim), block * columns], dim=3)
        scores = scorer(feedforward(pairs.reshape(-1, 3 * dim))).view(batch, n, k, -1)
        del pairs
        scores += mention_scores[:, first:first + n].unsqueeze(-1) + mention_scores.transpose(1, 2).unsqueeze(-1)
        blocks.append(torch.cat([scores.new_zeros(batch, n, k, 1), scores], dim=-1))
    return torch.cat(blocks, dim=1)


def install(model: Any, dataset: str, pair_block_bytes: int = PAIR_BLOCK_BYTES) -> Any:
    """Make ``model``'s heads decode with :func:`ner_rows` / :func:`relation_table` and score pairs blockwise.

    Only this model instance changes; all scores are the package's. The relation head's per-pair
    dict (read only for training metrics, with gold labels) is left empty.
    """
    ner_names = _names(model.vocab, f"{dataset}__ner_labels")
    relation_names = _names(model.vocab, f"{dataset}__relation_labels")
    relation = model._relation
    package_pairs = relation._compute_span_pair_embeddings
    package_scores = relation._compute_relation_scores

    def predict_ner(self: Any, ner_scores: Any, spans: Any, span_mask: Any, metadata: Any) -> list[list[NerRow]]:
        return ner_rows(ner_scores, spans, span_mask, list(metadata), ner_names)

    def predict_relations(self: Any, top_spans: Any, relation_scores: Any, num_spans_to_keep: Any,
                          sentence: Any) -> tuple[dict, RelationTable]:
        return {}, relation_table(top_spans, relation_scores, num_spans_to_keep, sentence, relation_names)

    def pair_embeddings(embeddings: Any) -> Any:
        if pair_tensor_bytes(embeddings) <= pair_block_bytes:
            return package_pairs(embeddings)
        return PairSource(embeddings)

    def relation_scores(pairs: Any, mention_scores: Any) -> Any:
        if isinstance(pairs, PairSource):
            return blockwise_relation_scores(relation, pairs.embeddings, mention_scores, pair_block_bytes)
        return package_scores(pairs, mention_scores)

    model._ner.predict = types.MethodType(predict_ner, model._ner)
    relation._predict_sentence = types.MethodType(predict_relations, relation)
    relation._compute_span_pair_embeddings = pair_embeddings
    relation._compute_relation_scores = relation_scores
    return model


def graph_entities(ner: Sequence[Sequence[Any]], relations: RelationTable, words: Sequence[str]) -> dict[str, dict]:
    """The graph's ``entities`` dict (``radgraph.utils.get_entity``'s result) from NER rows
    ``(start, end, label, ...)`` and a relation table: O(N + R log R) with sorted-array look-ups
    instead of ``get_entity``'s O(N * R) list scans."""
    ids = np.array([str(number) for number in range(len(ner) + 1)], dtype=object)
    first: dict[tuple[int, int], int] = {}  # span -> first entity number
    for number, row in enumerate(ner, start=1):
        first.setdefault((int(row[0]), int(row[1])), number)
    spans = relations.spans
    width = 1 + max([end for _, end in first] + [int(spans[:, [1, 3]].max(initial=0))])
    keys = np.array([start * width + end for start, end in first], dtype=np.int64)
    numbers = np.array(list(first.values()), dtype=np.int64)
    order = np.argsort(keys)
    keys, numbers = keys[order], numbers[order]

    def entity_number(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """First entity number of each span (start, end), 0 where no entity has it."""
        if not len(keys):
            return np.zeros(len(starts), dtype=np.int64)
        wanted = starts * width + ends
        at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
        return np.where(keys[at] == wanted, numbers[at], 0)

    source = entity_number(spans[:, 0], spans[:, 1])
    target = entity_number(spans[:, 2], spans[:, 3])
    kept = np.flatnonzero((source > 0) & (target > 0))
    grouped = kept[np.argsort(source[kept], kind="stable")]  # by source entity, row order kept within one
    links = np.stack([relations.labels[grouped], ids[target[grouped]]], axis=1).tolist()  # [label, id] lists
    bounds = np.searchsorted(source[grouped], np.arange(len(ner) + 2)).tolist()

    entities: dict[str, dict] = {}
    handed_out: set[int] = set()  # a span named by two entities gives both its relations, as separate lists
    for number, row in enumerate(ner, start=1):
        start, end = int(row[0]), int(row[1])
        owner = first[(start, end)]
        own = links[bounds[owner]:bounds[owner + 1]]
        if owner in handed_out:
            own = [list(link) for link in own]
        handed_out.add(owner)
        entities[ids[number]] = {"tokens": " ".join(words[start:end + 1]), "label": row[2], "start_ix": row[0],
                                 "end_ix": row[1], "relations": own}
    return entities


def graph_from_output(output: dict) -> dict:
    """``{"text", "entities"}`` of a one-report forward pass of a model set up by :func:`install`."""
    try:
        ner, relations = output["ner"]["predictions"][0], output["relation"]["predictions"][0]
    except (KeyError, IndexError) as error:
        raise RuntimeError(f"the RadGraph model returned no NER/relation predictions ({error!r}); its config's "
                           f"loss_weights must enable both 'ner' and 'relation'") from error
    words = list(output["metadata"].sentences[0].text)
    return {"text": " ".join(words), "entities": graph_entities(ner, relations, words)}


__all__ = ["PAIR_BLOCK_BYTES", "NerRow", "PairSource", "RelationTable", "blockwise_relation_scores",
           "graph_entities", "graph_from_output", "install", "ner_rows", "pair_tensor_bytes", "paused_gc",
           "relation_table"]

"""RaTEScore arithmetic: type-weighted entity matching and the harmonic mean (no model needed).

RaTEScore (Zhao et al., EMNLP 2024; ``MAGIC-AI4Med/RaTEScore``, PyPI ``ratescore`` 0.5.0/0.6.0, MIT)
compares two reports through their medical entities. A NER model tags each entity with one of five
types — ``ABNORMALITY``, ``NON-ABNORMALITY``, ``DISEASE``, ``NON-DISEASE``, ``ANATOMY`` (the
``NON-`` types carry negation: "no effusion" is a NON-ABNORMALITY) — and a synonym encoder embeds
each entity string. For entities ``A`` (types ``t_a``) matched against entities ``B``:

    b*(a)      = argmax_b cos(e_a, e_b)                      (top-1, cosine of the embeddings)
    S(A -> B)  = Σ_a cos(e_a, e_b*) · W[t_a, t_b*] · p(t_a, t_b*)  /  Σ_a W[t_a, t_b*]

with ``W`` the 5×5 type-pair weight ("affinity") matrix and ``p = neg_weight`` when the pair is one
of (NON-DISEASE, DISEASE), (NON-ABNORMALITY, ABNORMALITY), (DISEASE, NON-DISEASE),
(ABNORMALITY, NON-ABNORMALITY), (NON-DISEASE, ABNORMALITY), (NON-ABNORMALITY, DISEASE),
(DISEASE, NON-ABNORMALITY), (ABNORMALITY, NON-DISEASE) — a negated finding matched to an
affirmed one — else ``p = 1``; ``S = 0`` when ``Σ W = 0``. For a generated report G and reference R:

    RaTEScore = 2 · S(R -> G) · S(G -> R) / (S(R -> G) + S(G -> R)),   0 when the sum is 0,
                0.5 when either report has no entity.

(The package calls ``S(R -> G)`` "precision" and ``S(G -> R)`` "recall"; by meaning it is the
other way round. The harmonic mean does not care; this module names them ``ref_to_pred`` and
``pred_to_ref``.) Cosines can be negative, so a score outside [0, 1] is possible in principle, as
upstream; with real models entity cosines are positive in practice.

**Weights.** ``"long"`` and ``"short"`` are the package's ``DEFAULT_MATRIX_LONG`` /
``DEFAULT_MATRIX_SHORT`` (0.6.0; 25 type-pair weights plus ``neg_weight`` 0.8717 / 0.3612). RaTEScore
**0.5.0** — the version MedHEval installed — used the long matrix with a hard-coded
``neg_weight = 0.3612``; :data:`UPSTREAM_050_NEG_WEIGHT` reproduces it.

**Entity spans** come from the NER tags by :func:`decode_bio`, which reproduces the package's
``post_process`` state machine exactly, quirks included (see its docstring).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from medheval.scoring.text_cues import RATESCORE_SENTENCES, keep_sentence, split_sentences

ENTITY_TYPES: tuple[str, ...] = ("ABNORMALITY", "NON-ABNORMALITY", "DISEASE", "NON-DISEASE", "ANATOMY")

# RaTEScore 0.6.0 RaTEScore/scorer.py DEFAULT_MATRIX_LONG / DEFAULT_MATRIX_SHORT (MIT, MAGIC-AI4Med).
AFFINITY_LONG: dict[str, float] = {
    "abnormality_abnormality": 0.4276119164393705, "abnormality_anatomy": 0.6240929990607657,
    "abnormality_disease": 0.0034478181112993847, "abnormality_non-abnormality": 0.5431049700217344,
    "abnormality_non-disease": 0.27005425386213877, "anatomy_abnormality": 0.7487824274337533,
    "anatomy_anatomy": 0.2856134859160784, "anatomy_disease": 0.4592143222158069,
    "anatomy_non-abnormality": 0.02097055139911715, "anatomy_non-disease": 0.00013736314126696204,
    "disease_abnormality": 0.8396510075734789, "disease_anatomy": 0.9950209388542061,
    "disease_disease": 0.8460555030578727, "disease_non-abnormality": 0.9820689020512646,
    "disease_non-disease": 0.3789136708096537, "non-abnormality_abnormality": 0.16546764653692908,
    "non-abnormality_anatomy": 0.018670610691852826, "non-abnormality_disease": 0.719397354576018,
    "non-abnormality_non-abnormality": 0.0009357166071730684, "non-abnormality_non-disease": 0.0927333564267591,
    "non-disease_abnormality": 0.7759420231214385, "non-disease_anatomy": 0.1839139293714062,
    "non-disease_disease": 0.10073046076318157, "non-disease_non-abnormality": 0.03860183811876373,
    "non-disease_non-disease": 0.34065681486566446, "neg_weight": 0.8716553966489615,
}
AFFINITY_SHORT: dict[str, float] = {
    "abnormality_abnormality": 0.4070293318365468, "abnormality_anatomy": 0.6952639610605605,
    "abnormality_disease": 0.28342529466226446, "abnormality_non-abnormality": 0.9479148658006686,
    "abnormality_non-disease": 0.23875064111146294, "anatomy_abnormality": 0.5829759950441763,
    "anatomy_anatomy": 0.7709590751917746, "anatomy_disease": 0.0006059634829551632,
    "anatomy_non-abnormality": 0.794672584951181, "anatomy_non-disease": 0.27982942400798977,
    "disease_abnormality": 0.8840397619834857, "disease_anatomy": 0.9637659445696822,
    "disease_disease": 0.19018958438059513, "disease_non-abnormality": 0.6962283914800402,
    "disease_non-disease": 0.943727057946997, "non-abnormality_abnormality": 0.1712744286898638,
    "non-abnormality_anatomy": 0.4485149671497294, "non-abnormality_disease": 0.00045065329822896076,
    "non-abnormality_non-abnormality": 0.0007887930317199857, "non-abnormality_non-disease": 0.8555432840895761,
    "non-disease_abnormality": 0.9555801066212176, "non-disease_anatomy": 0.13122106162635216,
    "non-disease_disease": 0.6072996585919443, "non-disease_non-abnormality": 0.05650711141169969,
    "non-disease_non-disease": 0.3214769399791204, "neg_weight": 0.3611577852354489,
}
# RaTEScore 0.5.0 RaTEScore/utils.py compute(): ``neg_weight = 0.3612`` (with the long matrix).
UPSTREAM_050_NEG_WEIGHT = 0.3612

NEGATION_PAIRS: frozenset[tuple[str, str]] = frozenset({
    ("NON-DISEASE", "DISEASE"), ("NON-ABNORMALITY", "ABNORMALITY"), ("DISEASE", "NON-DISEASE"),
    ("ABNORMALITY", "NON-ABNORMALITY"), ("NON-DISEASE", "ABNORMALITY"), ("NON-ABNORMALITY", "DISEASE"),
    ("DISEASE", "NON-ABNORMALITY"), ("ABNORMALITY", "NON-DISEASE"),
})
EMPTY_REPORT_SCORE = 0.5


@dataclass(frozen=True)
class Affinity:
    """Type-pair weights ``W[(type_a, type_b)]`` and the negation factor ``neg_weight``."""

    weights: Mapping[tuple[str, str], float]
    neg_weight: float
    name: str = "custom"
    types: tuple[str, ...] = field(default=ENTITY_TYPES)

    def weight(self, type_a: str, type_b: str) -> float:
        try:
            return self.weights[(type_a, type_b)]
        except KeyError:
            raise ValueError(f"the {self.name!r} affinity matrix has no weight for the entity type pair "
                             f"({type_a}, {type_b}); its types are {', '.join(self.types)}") from None


def _parse_matrix(raw: Mapping[str, Any], name: str, neg_weight: float | None) -> Affinity:
    weights: dict[tuple[str, str], float] = {}
    found_neg = None
    for key, value in raw.items():
        if key.lower() == "neg_weight":
            found_neg = float(value)
            continue
        parts = key.split("_")
        if len(parts) != 2:
            raise ValueError(f"affinity matrix {name!r}: key {key!r} is not 'typea_typeb'")
        weights[(parts[0].upper(), parts[1].upper())] = float(value)
    chosen = neg_weight if neg_weight is not None else found_neg
    if chosen is None:
        raise ValueError(f"affinity matrix {name!r} has no 'neg_weight'; pass neg_weight=")
    found = {t for pair in weights for t in pair}
    types = tuple(t for t in ENTITY_TYPES if t in found) + tuple(sorted(found - set(ENTITY_TYPES)))
    missing = [(a, b) for a in types for b in types if (a, b) not in weights]
    if missing:
        raise ValueError(f"affinity matrix {name!r} lacks weights for {missing[:5]}")
    return Affinity(weights=weights, neg_weight=float(chosen), name=name, types=types)


def load_affinity(spec: str | Mapping[str, Any] | Affinity = "long", neg_weight: float | None = None) -> Affinity:
    """``"long"`` (default), ``"short"``, a JSON file path, a ``{"typea_typeb": w, "neg_weight": x}`` dict,
    or an :class:`Affinity`. ``neg_weight`` overrides the matrix's own."""
    if isinstance(spec, Affinity):
        return spec if neg_weight is None else Affinity(spec.weights, float(neg_weight), spec.name, spec.types)
    if isinstance(spec, Mapping):
        return _parse_matrix(spec, "custom", neg_weight)
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"affinity_matrix must be 'long', 'short', a JSON path or a dict, got {type(spec).__name__}")
    text = os.fspath(spec)
    if text.lower() == "long":
        return _parse_matrix(AFFINITY_LONG, "long", neg_weight)
    if text.lower() == "short":
        return _parse_matrix(AFFINITY_SHORT, "short", neg_weight)
    try:
        with open(text, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the affinity matrix {text!r} ({error}); expected 'long', 'short' or a JSON "
                         f"file of {{'typea_typeb': weight, ..., 'neg_weight': x}}") from error
    return _parse_matrix(raw, text, neg_weight)


def upstream_050_affinity() -> Affinity:
    """RaTEScore 0.5.0's weights (what MedHEval ran): the long matrix with ``neg_weight = 0.3612``."""
    return Affinity(load_affinity("long").weights, UPSTREAM_050_NEG_WEIGHT, "long (ratescore 0.5.0, neg_weight 0.3612)")


# --------------------------------------------------------------------------------------------------
# NER tags -> entity spans

SKIPPED_TOKENS = frozenset({"[CLS]", "[SEP]"})


def decode_bio(tokens: Sequence[str], labels: Sequence[str]) -> list[tuple[int, int, str]]:
    """Entity spans ``(start, end, type)`` (inclusive token indices) from per-token IOB tags.

    Exactly the package's ``post_process`` (``RaTEScore/utils.py``): a token's tag is read with the
    *next* tag; ``[CLS]``/``[SEP]`` tokens are skipped (but their tags are still read as "next");
    ``B-x`` then ``I-`` opens a span; ``B-x`` then ``B-``/``O`` emits a one-token span (after
    ``B-`` it also re-opens at the same token); ``I-x`` then ``B-``/``O`` closes the open span (if
    any) and — before ``B-`` — re-opens at the ``I-`` token with the ``I-`` token's type; a span
    still open at the end, with no end set since the last emission, runs to the second-last token.
    The last tag is never read as "current" (``i < len(labels) - 1``).
    """
    spans: list[tuple[int, int, str]] = []
    start: int | None = None
    end: int | None = None
    entity_type: str | None = None
    for i, (token, label) in enumerate(zip(tokens, labels[: len(tokens)])):
        if token in SKIPPED_TOKENS:
            continue
        if label != "O" and i < len(labels) - 1:
            following = labels[i + 1]
            if label.startswith("B-") and following.startswith("I-"):
                start, entity_type = i, label[2:]
            elif label.startswith("B-") and following.startswith("B-"):
                start = end = i
                spans.append((start, end, label[2:]))
                start, entity_type = i, label[2:]
            elif label.startswith("B-") and following.startswith("O"):
                start = end = i
                spans.append((start, end, label[2:]))
                start = end = entity_type = None
            elif label.startswith("I-") and following.startswith("B-"):
                end = i
                if start is not None:
                    spans.append((start, end, entity_type))
                start, entity_type = i, label[2:]
            elif label.startswith("I-") and following.startswith("O"):
                end = i
                if start is not None:
                    spans.append((start, end, entity_type))
                start = end = entity_type = None
    if start is not None and end is None:
        spans.append((start, len(tokens) - 2, entity_type))
    return spans


# --------------------------------------------------------------------------------------------------
# Scoring


def directional_score(source_embeddings: Any, target_embeddings: Any, source_types: Sequence[str],
                      target_types: Sequence[str], affinity: Affinity) -> float:
    """``S(source -> target)``: each source entity's best cosine match in target, type-weighted (see module doc)."""
    import torch
    import torch.nn.functional as F

    source = torch.as_tensor(source_embeddings)
    target = torch.as_tensor(target_embeddings)
    if source.ndim != 2 or target.ndim != 2 or source.shape[1] != target.shape[1]:
        raise ValueError(f"embeddings must be 2-d with the same width, got {tuple(source.shape)} "
                         f"and {tuple(target.shape)}")
    if len(source_types) != source.shape[0] or len(target_types) != target.shape[0]:
        raise ValueError(f"{source.shape[0]}/{target.shape[0]} embeddings for "
                         f"{len(source_types)}/{len(target_types)} types")
    if target.dtype != source.dtype:
        target = target.to(source.dtype)
    source, target = F.normalize(source, p=2, dim=1), F.normalize(target, p=2, dim=1)
    numerator = denominator = 0.0
    for row, source_type in zip(source, source_types):
        # One matrix-vector product and top-1 per source entity, as upstream's topk_similarity: near-ties
        # (equal strings typed differently) then resolve exactly as upstream does.
        value, index = torch.topk(torch.matmul(target, row), 1, largest=True)
        value, matched_type = float(value[0]), target_types[int(index[0])]
        weight = affinity.weight(source_type, matched_type)
        factor = affinity.neg_weight if (source_type, matched_type) in NEGATION_PAIRS else 1.0
        numerator += value * weight * factor
        denominator += weight
    return numerator / denominator if denominator != 0 else 0.0


def pair_score(prediction_embeddings: Any, reference_embeddings: Any, prediction_types: Sequence[str],
               reference_types: Sequence[str], affinity: Affinity) -> dict[str, float]:
    """RaTEScore of one (generated, reference) pair: ``score``, ``ref_to_pred``, ``pred_to_ref``.

    0.5 (and ``None`` directional scores) when either side has no entity.
    """
    if len(prediction_types) == 0 or len(reference_types) == 0:
        return {"score": EMPTY_REPORT_SCORE, "ref_to_pred": None, "pred_to_ref": None}
    ref_to_pred = directional_score(reference_embeddings, prediction_embeddings, reference_types, prediction_types,
                                    affinity)
    pred_to_ref = directional_score(prediction_embeddings, reference_embeddings, prediction_types, reference_types,
                                    affinity)
    total = ref_to_pred + pred_to_ref
    score = 0.0 if total == 0 else 2 * ref_to_pred * pred_to_ref / total
    return {"score": score, "ref_to_pred": ref_to_pred, "pred_to_ref": pred_to_ref}


# --------------------------------------------------------------------------------------------------
# Sentences

def split_sentences_rules(text: str) -> list[str]:
    """A dependency-free approximation of the package's medspacy/PyRuSH sentence splitting.

    Boundaries: blank lines; ``.``/``!``/``?`` followed by white space and a character that is not
    a lower-case letter ("2.5 cm" and "e.g. the" stay whole, "Impression: 1. No ..." splits after
    "1." as PyRuSH does), except after a bare list number ("2. Stable ..." stays one sentence); a
    line break before a capital, digit or bullet. Sentences are stripped and filtered with
    :func:`keep_sentence`. (:data:`medheval.scoring.text_cues.RATESCORE_SENTENCES`.)
    """
    return split_sentences(text, RATESCORE_SENTENCES)


__all__ = [
    "AFFINITY_LONG", "AFFINITY_SHORT", "Affinity", "EMPTY_REPORT_SCORE", "ENTITY_TYPES", "NEGATION_PAIRS",
    "UPSTREAM_050_NEG_WEIGHT", "decode_bio", "directional_score", "keep_sentence", "load_affinity", "pair_score",
    "split_sentences_rules", "upstream_050_affinity",
]

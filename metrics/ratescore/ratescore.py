# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""RaTEScore: entity-aware radiology report similarity (NER + synonym embeddings + type weights)."""


import datasets
import evaluate
import medheval.radiology.ratescore_model
import medheval.scoring.metric_inputs
import medheval.scoring.parsing
import medheval.radiology.ratescore_scoring


_CITATION = """\
@inproceedings{zhao2024ratescore,
  title     = {{RaTEScore}: A Metric for Radiology Report Generation},
  author    = {Zhao, Weike and Wu, Chaoyi and Zhang, Xiaoman and Zhang, Ya and Wang, Yanfeng and Xie, Weidi},
  booktitle = {Proceedings of the 2024 Conference on Empirical Methods in Natural Language Processing},
  pages     = {15004--15019},
  year      = {2024}
}
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
"""

_DESCRIPTION = """\
RaTEScore (Zhao et al., EMNLP 2024), the "RaTEScore" column of MedHEval's Table 5. A NER model
finds the medical entities of each report, typed ABNORMALITY, NON-ABNORMALITY, DISEASE,
NON-DISEASE or ANATOMY (NON- = negated), and a synonym encoder (BioLORD) embeds each entity. Each
entity a of one report is matched to its most cosine-similar entity b* of the other, and
    S(A -> B) = Σ_a cos(a, b*) · W[t_a, t_b*] · p(t_a, t_b*) / Σ_a W[t_a, t_b*],
with W a learned 5x5 type-pair weight matrix and p = neg_weight when a negated type meets an
affirmed one (else 1). The score of a pair is the harmonic mean of S(reference -> generated) and
S(generated -> reference) (0 when both are 0; 0.5 when either report has no entity), and the metric
is the mean over pairs. It needs the two models as local folders (or Hub ids); without them it
raises an error that says where to get them and how to point at them.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports.
    ner_model_path (`str`, *optional*): the NER model folder (Angelakeke/RaTE-NER-Deberta) or
        Hub id. Default: `$MEDHEVAL_RATESCORE_NER_PATH`.
    embedding_model_path (`str`, *optional*): the synonym encoder folder
        (FremyCompany/BioLORD-2023-C) or Hub id. Default: `$MEDHEVAL_RATESCORE_EMBEDDING_PATH`.
    affinity_matrix (`str` or `dict`, *optional*, defaults to "long"): "long", "short", a JSON
        file or a dict of type-pair weights (RaTEScore 0.6.0's choices).
    neg_weight (`float`, *optional*): overrides the matrix's negation factor.
    upstream_compat (`bool`, *optional*, defaults to `False`): score as MedHEval did with
        RaTEScore 0.5.0: the long matrix with neg_weight 0.3612 (0.6.0's "long" has 0.8717),
        predictions cleaned with `text.strip("Assistant:")` (a character-set strip), and the
        package's batching (one sentence per NER call, one embedding batch per report).
    sentence_splitter (`str`, *optional*, defaults to "auto"): "medspacy" (PyRuSH, as upstream;
        needs medspacy), "rules" (built-in approximation) or "auto" (medspacy when installed).
    batch_size (`int`, *optional*, defaults to 16): sentences per NER forward pass.
    device (`str`, *optional*): "cpu", "cuda", … (default: CUDA when available).
    return_entities (`bool`, *optional*, defaults to `False`): also return the entities found.

Returns:
    ratescore (`float`): mean RaTEScore over the `n` pairs.
    ratescore_per_item (`list` of `float`): per pair, input order.
    ref_to_pred_per_item, pred_to_ref_per_item (`list`): S(reference -> generated) and
        S(generated -> reference) per pair (`None` where a side has no entity).
    n (`int`); n_no_entity_predictions, n_no_entity_references (`int`): reports without entities
        (their pairs score 0.5); n_sentences (`int`): sentences tagged;
    mean_entities_prediction, mean_entities_reference (`float`).
    affinity_matrix (`str`), neg_weight (`float`), sentence_splitter (`str`), upstream_compat (`bool`).

Examples:
    >>> import evaluate
    >>> from medheval.radiology.tiny_models import build_random_ratescore_models
    >>> ner, embedding = build_random_ratescore_models("/tmp/tiny_rate")  # random weights: numbers mean nothing
    >>> metric = evaluate.load("metrics/ratescore")  # doctest: +SKIP
    >>> results = metric.compute(
    ...     predictions=["No pleural effusion. Mild cardiomegaly.", "Lungs are clear."],
    ...     references=["No pleural effusion. Mild cardiomegaly.", "Small left pleural effusion."],
    ...     ner_model_path=str(ner), embedding_model_path=str(embedding), sentence_splitter="rules",
    ... )  # doctest: +SKIP
    >>> round(results["ratescore_per_item"][0], 4), results["n"]  # doctest: +SKIP
    (1.0, 2)
"""



def clean_prediction(text, upstream_compat=False):
    """See `medheval.scoring.parsing.clean_generated_text` (native role-prefix trim, or MedHEval's character-set strip)."""
    return medheval.scoring.parsing.clean_generated_text(text, upstream_compat=upstream_compat)


def _mean(values):
    return sum(values) / len(values) if values else None


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"ner_model_path": str | None, "embedding_model_path": str | None, "affinity_matrix": str | dict,
                "neg_weight": float | None, "device": str | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Ratescore(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """RaTEScore from local NER and synonym-encoder models."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                }
            ),
            homepage="https://github.com/MAGIC-AI4Med/RaTEScore",
            codebase_urls=["https://github.com/MAGIC-AI4Med/RaTEScore", "https://github.com/Aofei-Chang/MedHEval"],
            reference_urls=["https://aclanthology.org/2024.emnlp-main.836/", "https://arxiv.org/abs/2503.02157"],
        )

    def _scorer(self, ner_model_path, embedding_model_path, device):
        """The two models, loaded once per (NER path, embedding path, device) for this metric instance."""
        model = medheval.radiology.ratescore_model
        ner = model.resolve_model_path(ner_model_path, model.RATESCORE_NER_ENV, "ner_model_path", "entity recognizer")
        embedding = model.resolve_model_path(embedding_model_path, model.RATESCORE_EMBEDDING_ENV,
                                             "embedding_model_path", "synonym encoder")
        key = (ner, embedding, device)
        cache = self.__dict__.setdefault("_ratescore_scorers", {})
        if key not in cache:
            cache.clear()  # one pair of models at a time
            cache[key] = model.RaTEScorer(ner, embedding, device=device)
        return cache[key]

    def _compute(
        self,
        predictions,
        references,
        ner_model_path=None,
        embedding_model_path=None,
        affinity_matrix="long",
        neg_weight=None,
        upstream_compat=False,
        sentence_splitter="auto",
        batch_size=16,
        device=None,
        return_entities=False,
    ):
        scoring = medheval.radiology.ratescore_scoring
        if upstream_compat:
            affinity = scoring.upstream_050_affinity()
            if neg_weight is not None:
                affinity = scoring.load_affinity(affinity, neg_weight)
        else:
            affinity = scoring.load_affinity(affinity_matrix, neg_weight)
        splitter_name, split = medheval.radiology.ratescore_model.make_sentence_splitter(sentence_splitter)
        scorer = self._scorer(ner_model_path, embedding_model_path, device)
        predictions = [clean_prediction(text, upstream_compat) for text in predictions]
        references = ["" if text is None else str(text) for text in references]
        out = scorer.score(predictions, references, affinity, split, batch_size=batch_size,
                           upstream_batching=bool(upstream_compat))
        rows = out["rows"]
        result = {
            "ratescore": _mean([row["score"] for row in rows]),
            "ratescore_per_item": [row["score"] for row in rows],
            "ref_to_pred_per_item": [row["ref_to_pred"] for row in rows],
            "pred_to_ref_per_item": [row["pred_to_ref"] for row in rows],
            "n": len(rows),
            "n_no_entity_predictions": sum(1 for row in rows if not row["prediction_entities"]),
            "n_no_entity_references": sum(1 for row in rows if not row["reference_entities"]),
            "n_sentences": out["n_sentences"],
            "mean_entities_prediction": _mean([len(row["prediction_entities"]) for row in rows]),
            "mean_entities_reference": _mean([len(row["reference_entities"]) for row in rows]),
            "affinity_matrix": affinity.name,
            "neg_weight": affinity.neg_weight,
            "sentence_splitter": splitter_name,
            "upstream_compat": bool(upstream_compat),
        }
        if return_entities:
            result["prediction_entities"] = [[list(entity) for entity in row["prediction_entities"]] for row in rows]
            result["reference_entities"] = [[list(entity) for entity in row["reference_entities"]] for row in rows]
        return result

# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""RadGraph F1 (MedHEval's entity/relation F1) and the F1RadGraph rewards, from a local RadGraph model."""

import os

import datasets
import evaluate
import medheval.radiology.radgraph_model
import medheval.scoring.metric_inputs
import medheval.scoring.parsing
import medheval.radiology.radgraph_rewards


_CITATION = """\
@inproceedings{jain2021radgraph,
  title     = {RadGraph: Extracting Clinical Entities and Relations from Radiology Reports},
  author    = {Jain, Saahil and Agrawal, Ashwin and Saporta, Adriel and Truong, Steven QH and Duong, Du Nguyen and
               Bui, Tan and Chambon, Pierre and Zhang, Yuhao and Lungren, Matthew P. and Ng, Andrew Y. and
               Langlotz, Curtis P. and Rajpurkar, Pranav},
  booktitle = {Thirty-fifth Conference on Neural Information Processing Systems Datasets and Benchmarks Track},
  year      = {2021}
}
@inproceedings{delbrouck2022improving,
  title     = {Improving the Factual Correctness of Radiology Report Generation with Semantic Rewards},
  author    = {Delbrouck, Jean-Benoit and Chambon, Pierre and Bluethgen, Christian and Tsai, Emily and
               Almusa, Omar and Langlotz, Curtis P.},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2022},
  year      = {2022}
}
@article{yu2022evaluating,
  title   = {Evaluating Progress in Automatic Chest {X}-Ray Radiology Report Generation},
  author  = {Yu, Feiyang and Endo, Mark and Krishnan, Rayan and Pan, Ian and Tsai, Andy and Reis, Eduardo Pontes and
             Fonseca, Eduardo Kaiser Ururahy Nunes and Ho Lee, Henrique Min and Abad, Zahra Shakeri Hossein and
             Ng, Andrew Y. and Langlotz, Curtis P. and Venugopal, Vasantha Kumar and Rajpurkar, Pranav},
  journal = {medRxiv},
  doi     = {10.1101/2022.08.30.22279318},
  year    = {2022}
}
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
"""

_DESCRIPTION = """\
RadGraph F1, the "RadGraph" column of MedHEval's Table 5. A RadGraph model (DyGIE++; Jain et al.,
2021) turns each report into a graph of entities (anatomy / observation, with certainty) and
relations (modify, located_at, suggestive_of). Per report pair, with G the generated and R the
reference graph:
    entity F1   = F1 of the sets {(tokens, label)},
    relation F1 = F1 of the sets {((tokens, label), (target tokens, target label), relation)},
    F1 = 2PR/(P+R), P = |G∩R|/|G|, R = |G∩R|/|R|,
    RadGraph F1 = (entity F1 + relation F1) / 2,
averaged over reports (CXR-Report-Metric's `radgraph_combined`, as MedHEval reports it). The
F1RadGraph rewards (Delbrouck et al., 2022; radgraph 0.1.18) are returned too: `simple` (RG_E,
entities), `partial` (RG_ER, entities flagged by whether they have a relation) and `complete`
(RG_ER-bar, entities with their relations). The model runs through the `radgraph` package's model
code from a local model folder or archive; without one the metric raises an error saying where
to get it. Long reports are not truncated; the model's predictions become graphs in time near-linear in
the graph's size (the package's own decoding grows with the cube of the report length).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports.
    radgraph_path (`str`, *optional*): a RadGraph model folder (config.json, weights.th,
        vocabulary/), a folder holding one, its `.tar.gz` (extracted once into the medheval cache)
        or `hf://StanfordAIMI/RRG_scorers/radgraph.tar.gz`. Default: `$MEDHEVAL_RADGRAPH_PATH`.
    encoder_path (`str`, *optional*): the encoder's tokenizer/config folder. Default:
        `$MEDHEVAL_RADGRAPH_ENCODER`, else `<model folder>/encoder/`, else the name in config.json.
    model_type (`str`, *optional*): "radgraph" (v1, MedHEval's), "radgraph-xl",
        "modern-radgraph-xl" or "echograph"; picks the tokenization. Default: from the folder
        name, else "radgraph".
    reward_level (`str`, *optional*, defaults to "all"): which F1RadGraph rewards to return:
        "simple", "partial", "complete" or "all".
    upstream_compat (`bool`, *optional*, defaults to `False`): score as MedHEval did: predictions
        cleaned like its CSV conversion (`text.strip("Assistant:")`, a character-set strip, and
        predictions under 10 characters replaced by "No report generated."), and two empty
        entity or relation sets scoring F1 0 (native: 1).
    device (`str`, *optional*): "cpu", "cuda", … (default: CUDA when available).
    return_graphs (`bool`, *optional*, defaults to `False`): also return the extracted graphs.
    prediction_graphs, reference_graphs (`list` of `dict`, *optional*): graphs already extracted
        (the radgraph package's format); given for both sides, no model is loaded.

Returns:
    radgraph_f1 (`float`): mean of the per-report (entity F1 + relation F1) / 2.
    radgraph_entity_f1, radgraph_relation_f1 (`float`): their means.
    radgraph_simple, radgraph_partial, radgraph_complete (`float`): mean F1RadGraph rewards
        (those asked for by `reward_level`).
    radgraph_f1_per_item, entity_f1_per_item, relation_f1_per_item, simple_per_item,
        partial_per_item, complete_per_item (`list` of `float`): per report pair, input order.
    n (`int`): number of pairs; n_empty_predictions, n_empty_references (`int`): empty texts;
    n_no_entity_predictions (`int`): generated reports in which no entity was found;
    mean_entities_prediction, mean_entities_reference, mean_relations_prediction,
        mean_relations_reference (`float`): graph sizes.
    model_type (`str`), upstream_compat (`bool`).

Examples:
    >>> import evaluate
    >>> from medheval.radiology.tiny_models import build_random_radgraph
    >>> folder = build_random_radgraph("/tmp/tiny_radgraph")  # random weights: numbers mean nothing
    >>> metric = evaluate.load("metrics/radgraph_f1")  # doctest: +SKIP
    >>> results = metric.compute(
    ...     predictions=["No acute cardiopulmonary process.", "Small left pleural effusion."],
    ...     references=["No acute cardiopulmonary process.", "No pleural effusion."],
    ...     radgraph_path=str(folder),
    ... )  # doctest: +SKIP
    >>> results["radgraph_f1_per_item"][0], results["n"]  # doctest: +SKIP
    (1.0, 2)
"""

_REWARD_LEVELS = ("simple", "partial", "complete")


def clean_prediction(text, upstream_compat=False):
    """See `medheval.scoring.parsing.clean_generated_text`; upstream also replaces reports under 10 characters."""
    return medheval.scoring.parsing.clean_generated_text(text, upstream_compat=upstream_compat, report_csv=True)


def _mean(values):
    return sum(values) / len(values) if values else None


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"radgraph_path": str | None, "encoder_path": str | None, "model_type": str | None,
                "device": str | None, "prediction_graphs": list | None, "reference_graphs": list | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RadgraphF1(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """RadGraph entity/relation F1 (MedHEval) and F1RadGraph rewards."""

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
            homepage="https://github.com/Stanford-AIMI/radgraph",
            codebase_urls=[
                "https://github.com/Stanford-AIMI/radgraph",
                "https://github.com/rajpurkarlab/CXR-Report-Metric",
                "https://github.com/Aofei-Chang/MedHEval",
            ],
            reference_urls=["https://arxiv.org/abs/2106.14463", "https://arxiv.org/abs/2210.12186",
                            "https://arxiv.org/abs/2503.02157"],
        )

    def _annotator(self, radgraph_path, encoder_path, model_type, device):
        """The RadGraph model, loaded once per (model folder, encoder, type, device) for this metric instance."""
        model = medheval.radiology.radgraph_model
        folder = model.resolve_radgraph_dir(radgraph_path, model_type)
        weights = os.stat(folder / "weights.th")
        key = (str(folder.resolve()), weights.st_mtime_ns, weights.st_size, encoder_path, model_type, device)
        cache = self.__dict__.setdefault("_radgraph_annotators", {})
        if key not in cache:
            cache.clear()  # one model at a time
            cache[key] = model.RadGraphAnnotator(folder, encoder_path=encoder_path, model_type=model_type,
                                                 device=device)
        return cache[key]

    def _compute(
        self,
        predictions,
        references,
        radgraph_path=None,
        encoder_path=None,
        model_type=None,
        reward_level="all",
        upstream_compat=False,
        device=None,
        return_graphs=False,
        prediction_graphs=None,
        reference_graphs=None,
    ):
        rewards = medheval.radiology.radgraph_rewards
        if reward_level not in (*_REWARD_LEVELS, "all"):
            raise ValueError(f"reward_level must be one of {', '.join(_REWARD_LEVELS)} or 'all', got {reward_level!r}")
        levels = _REWARD_LEVELS if reward_level == "all" else (reward_level,)
        n = len(predictions)
        predictions = [clean_prediction(text, upstream_compat) for text in predictions]
        references = ["" if text is None else str(text).strip() for text in references]
        for name, graphs in (("prediction_graphs", prediction_graphs), ("reference_graphs", reference_graphs)):
            if graphs is not None and len(graphs) != n:
                raise ValueError(f"{name} has {len(graphs)} graphs for {n} predictions")
            for i, graph in enumerate(graphs or []):
                if not isinstance(graph, dict) or not isinstance(graph.get("entities"), dict):
                    raise ValueError(f"{name}[{i}] is {type(graph).__name__} {graph!r:.60}, not a RadGraph graph: "
                                     "give a dict with an 'entities' dict (as radgraph_f1 returns with "
                                     "return_graphs=True)")

        used_type = model_type
        if prediction_graphs is None or reference_graphs is None:
            annotator = self._annotator(radgraph_path, encoder_path, model_type, device)
            used_type = annotator.model_type
            todo = ([] if prediction_graphs is not None else predictions) + \
                   ([] if reference_graphs is not None else references)
            extracted = annotator.annotate(todo)
            if prediction_graphs is None:
                prediction_graphs, extracted = extracted[:n], extracted[n:]
            if reference_graphs is None:
                reference_graphs = extracted[:n]

        scores = [rewards.medheval_scores(g, r, upstream_compat) for g, r in zip(prediction_graphs, reference_graphs)]
        reward_rows = [rewards.f1radgraph_rewards(g, r) for g, r in zip(prediction_graphs, reference_graphs)]

        result = {
            "radgraph_f1": _mean([s["radgraph_f1"] for s in scores]),
            "radgraph_entity_f1": _mean([s["entity_f1"] for s in scores]),
            "radgraph_relation_f1": _mean([s["relation_f1"] for s in scores]),
        }
        for level in levels:
            result[f"radgraph_{level}"] = _mean([row[level] for row in reward_rows])
        result["radgraph_f1_per_item"] = [s["radgraph_f1"] for s in scores]
        result["entity_f1_per_item"] = [s["entity_f1"] for s in scores]
        result["relation_f1_per_item"] = [s["relation_f1"] for s in scores]
        for level in levels:
            result[f"{level}_per_item"] = [row[level] for row in reward_rows]
        result.update({
            "n": n,
            "n_empty_predictions": sum(1 for text in predictions if not text),
            "n_empty_references": sum(1 for text in references if not text),
            "n_no_entity_predictions": sum(1 for graph in prediction_graphs if not graph["entities"]),
            "mean_entities_prediction": _mean([len(graph["entities"]) for graph in prediction_graphs]),
            "mean_entities_reference": _mean([len(graph["entities"]) for graph in reference_graphs]),
            "mean_relations_prediction": _mean([rewards.count_relations(graph) for graph in prediction_graphs]),
            "mean_relations_reference": _mean([rewards.count_relations(graph) for graph in reference_graphs]),
            "model_type": used_type,
            "upstream_compat": bool(upstream_compat),
        })
        if return_graphs:
            result["prediction_graphs"] = list(prediction_graphs)
            result["reference_graphs"] = list(reference_graphs)
        return result

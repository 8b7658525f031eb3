# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""CheXbert vector similarity: cosine of the CheXbert [CLS] embeddings of reference and generated report."""

import math

import datasets
import evaluate
import torch
import medheval.labelers.chexbert
import medheval.scoring.metric_inputs
import medheval.scoring.parsing


_CITATION = """\
@misc{smit2020chexbert,
  title         = {CheXbert: Combining Automatic Labelers and Expert Annotations for Accurate Radiology Report Labeling Using BERT},
  author        = {Akshay Smit and Saahil Jain and Pranav Rajpurkar and Anuj Pareek and Andrew Y. Ng and Matthew P. Lungren},
  year          = {2020},
  eprint        = {2004.09167},
  archivePrefix = {arXiv},
  primaryClass  = {cs.CL}
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
CheXbert vector similarity ("s_emb", `semb_score` in rajpurkarlab/CXR-Report-Metric), the
"CheXbert" column of MedHEval's Table 5. Each report is encoded by CheXbert (a bert-base-uncased
model fine-tuned to label the 14 CheXpert observations; Smit et al., 2020); its representation
is the final-layer [CLS] hidden state (768-d; no pooler, no dropout, no heads). The score of a
pair is the cosine similarity of the reference and generated embeddings,
    s = (r . g) / (||r|| ||g||),
and the metric is the mean over pairs (in [-1, 1]; higher is closer). It needs the CheXbert
weights (`chexbert.pth`) and a bert-base-uncased tokenizer folder; without them it raises an
error that says where to get them and how to point at them.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports, one per prediction.
    chexbert_path (`str`, *optional*): the original CheXbert checkpoint `chexbert.pth`
        (default: `$MEDHEVAL_CHEXBERT_PATH`). `hf://StanfordAIMI/RRG_scorers/chexbert.pth` is
        fetched from the Hub where it can be reached.
    tokenizer_path (`str`, *optional*): a local bert-base-uncased folder (`vocab.txt` or
        `tokenizer.json`, plus `config.json`). Default: `$MEDHEVAL_CHEXBERT_TOKENIZER`, else the
        checkpoint's folder or its `bert-base-uncased/` subfolder.
    batch_size (`int`, *optional*, defaults to 32): reports per forward pass.
    device (`str`, *optional*): "cpu", "cuda", "cuda:1" … (default: CUDA when available).
    upstream_compat (`bool`, *optional*, defaults to `False`): prepare the predictions as
        MedHEval's CSV conversion does before encoding: `text.strip("Assistant:")` (a character-set
        strip) and predictions shorter than 10 characters replaced by "No report generated.".

Returns:
    chexbert_similarity (`float`): mean cosine similarity over the `n` pairs.
    chexbert_similarity_std (`float`): population standard deviation (ddof=0) of the similarities.
    similarities (`list` of `float`): the per-pair cosine similarities, in input order.
    n (`int`): number of pairs.

Examples:
    >>> import evaluate
    >>> from medheval.labelers.chexbert import build_random_chexbert
    >>> checkpoint = build_random_chexbert("/tmp/tiny_chexbert")  # random weights: numbers mean nothing
    >>> metric = evaluate.load("metrics/chexbert_similarity")  # doctest: +SKIP
    >>> results = metric.compute(
    ...     predictions=["No acute cardiopulmonary process.", "Small left pleural effusion."],
    ...     references=["No acute cardiopulmonary process.", "No pleural effusion."],
    ...     chexbert_path=str(checkpoint),
    ... )  # doctest: +SKIP
    >>> round(results["similarities"][0], 6), results["n"]  # doctest: +SKIP
    (1.0, 2)
"""



def upstream_prediction(text):
    """A prediction as MedHEval's report CSV holds it (`medheval.scoring.parsing.clean_generated_text`)."""
    return medheval.scoring.parsing.clean_generated_text(text, upstream_compat=True, report_csv=True)


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"chexbert_path": str | None, "tokenizer_path": str | None, "device": str | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ChexbertSimilarity(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """Mean cosine similarity of CheXbert [CLS] embeddings (reference vs generated report)."""

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
            homepage="https://github.com/stanfordmlgroup/CheXbert",
            codebase_urls=[
                "https://github.com/stanfordmlgroup/CheXbert",
                "https://github.com/rajpurkarlab/CXR-Report-Metric",
                "https://github.com/Aofei-Chang/MedHEval",
            ],
            reference_urls=["https://arxiv.org/abs/2004.09167", "https://arxiv.org/abs/2503.02157"],
        )

    def _labeler(self, chexbert_path, tokenizer_path, device):
        """The CheXbert model, loaded once per (checkpoint, tokenizer, device) and shared process-wide."""
        cache = self.__dict__.setdefault("_chexbert_labelers", {})
        key = (chexbert_path, tokenizer_path, device)
        if key not in cache:
            cache[key] = medheval.labelers.chexbert.get_chexbert_labeler(chexbert_path, tokenizer_path, device)
        return cache[key]

    def _compute(
        self,
        predictions,
        references,
        chexbert_path=None,
        tokenizer_path=None,
        batch_size=32,
        device=None,
        upstream_compat=False,
    ):
        checkpoint = medheval.labelers.chexbert.resolve_chexbert_path(chexbert_path, what="chexbert_similarity")
        labeler = self._labeler(checkpoint, tokenizer_path, device)
        if upstream_compat:
            predictions = [upstream_prediction(text) for text in predictions]
        n = len(predictions)
        if n == 0:
            return {"chexbert_similarity": None, "chexbert_similarity_std": None, "similarities": [], "n": 0}
        embeddings = labeler.embed(list(references) + list(predictions), batch_size=batch_size).double()
        similarities = torch.nn.functional.cosine_similarity(embeddings[:n], embeddings[n:], dim=1, eps=1e-12)
        values = [float(value) for value in similarities.tolist()]
        mean = sum(values) / n
        std = math.sqrt(sum((value - mean) ** 2 for value in values) / n)
        return {
            "chexbert_similarity": mean,
            "chexbert_similarity_std": std,
            "similarities": values,
            "n": n,
        }

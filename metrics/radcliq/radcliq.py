# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""RadCliQ-v1: a linear composite of four report metrics, fitted to radiologists' error counts (lower is better)."""

import math

import datasets
import evaluate
from nltk.translate.bleu_score import SmoothingFunction
from nltk.translate.bleu_score import sentence_bleu
import medheval.scoring.metric_inputs


_CITATION = """\
@article{yu2023evaluating,
  title   = {Evaluating Progress in Automatic Chest {X}-Ray Radiology Report Generation},
  author  = {Yu, Feiyang and Endo, Mark and Krishnan, Rayan and Pan, Ian and Tsai, Andy and Reis, Eduardo Pontes and
             Fonseca, Eduardo Kaiser Ururahy Nunes and Ho Lee, Henrique Min and Abad, Zahra Shakeri Hossein and
             Ng, Andrew Y. and Langlotz, Curtis P. and Venugopal, Vasantha Kumar and Rajpurkar, Pranav},
  journal = {Patterns},
  volume  = {4},
  number  = {9},
  year    = {2023},
  doi     = {10.1016/j.patter.2023.100802}
}
"""

_DESCRIPTION = """\
RadCliQ-v1 (Yu et al., 2023), the composite report metric of the ReXrank leaderboard. Per report
pair, with x = (radgraph_combined, bertscore, semb_score, bleu_score):
    z_k = (x_k - mean_k) / scale_k            (a standard scaler fitted on 160 reports)
    RadCliQ-v1 = sum_k coef_k * z_k + intercept
and the metric is the mean over pairs. It estimates the number of errors a radiologist would find:
LOWER IS BETTER, and it is unbounded (negative for reports closer than average). The normaliser and
coefficients are numbers transcribed from the released model (see `PARAMETERS`); nothing is
unpickled. The components are:
    radgraph_combined: (RadGraph entity F1 + relation F1) / 2 (our `radgraph_f1_per_item`);
    bertscore: BERTScore F1, distilroberta-base layer 5, baseline-rescaled, idf off by default;
    semb_score: cosine of CheXbert [CLS] embeddings (our `chexbert_similarity` `similarities`);
    bleu_score: sentence BLEU-2 on lower-cased, space-split words with "." split off (computed here).
In a `medheval run` the first three are read from the metrics already computed for the split
(`radgraph_f1`, `text_generation`, `chexbert_similarity`); where their settings differ from
RadCliQ-v1's, `component_notes` says so and `comparable` is false.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports.
    radgraph_combined (`list` of `float`, *optional*): per pair, (entity F1 + relation F1) / 2 in [0, 1].
    bertscore (`list` of `float`, *optional*): per pair, BERTScore F1 as a fraction (RadCliQ-v1's
        variant: distilroberta-base, layer 5, rescaled with the bert-score baseline).
    semb_score (`list` of `float`, *optional*): per pair, CheXbert embedding cosine similarity.
    bleu_score (`list` of `float`, *optional*): per pair, BLEU-2 as a fraction (default: computed here).
    run_results (`dict`, *optional*): metric name -> output of the metrics already computed on
        the same items (`medheval run` passes it); components not given are taken from it.

    A pair with a missing (None or non-finite) component is skipped and counted, never scored. A given
    component that is not a number, or lies outside its range (radgraph_combined and bleu_score in [0, 1],
    semb_score in [-1, 1], bertscore at most 1: a 0-100 percentage is refused), is an error naming the
    pair. A component neither given nor in `run_results` is an error; in a run (`run_results` given) every
    pair is skipped instead and `unavailable_reason` says which metrics to add (the predictions are kept).

Returns:
    radcliq (`float`): mean RadCliQ-v1 over scored pairs (lower is better); `None` if none scored.
    radcliq_std (`float`): population standard deviation over scored pairs.
    radcliq_per_item (`list` of `float`/`None`): per pair, input order.
    n (`int`): scored pairs; n_skipped (= n_failed, `int`) and skipped (`dict` pair index -> missing components).
    components (`dict`): per component, where it came from and its mean.
    component_notes (`list` of `str`): how the components differ from RadCliQ-v1's; comparable (`bool`).
    lower_is_better (`bool`): always True.

Examples:
    >>> import evaluate
    >>> radcliq = evaluate.load("metrics/radcliq")  # doctest: +SKIP
    >>> out = radcliq.compute(predictions=["x"], references=["x"], radgraph_combined=[0.5], bertscore=[0.5],
    ...                       semb_score=[0.8], bleu_score=[0.3])  # doctest: +SKIP
    >>> round(out["radcliq"], 4)  # doctest: +SKIP
    0.2063
"""

#: RadCliQ-v1's normaliser and linear model, transcribed (full float64 precision) from
#: rajpurkarlab/CXR-Report-Metric, CXRMetric/radcliq-v1.pkl at commit
#: 9c9ecad39be6cb2be8e75be1d1c50ef8888a3e40 (sha256 ddc38dc9bd93993509aa41416dac11daf2bb74f498508109d2c806ac1de931ae),
#: read with pickletools (not executed): a sklearn 1.1.1 StandardScaler (n_samples_seen_ 160) and a coefficient
#: vector whose last entry is the intercept. Column order is `COLUMNS` (CXRMetric/run_eval.py `COLS`). The same
#: numbers (8 digits) are restated in jbdel/RadEval radeval/metrics/RadCliQv1/radcliq.py.
COLUMNS = ("radgraph_combined", "bertscore", "semb_score", "bleu_score")
PARAMETERS = {
    "mean": (0.5379231241355762, 0.6175725628125001, 0.7647942121140658, 0.44738335396242174),
    "scale": (0.3028258411486429, 0.22430938459304575, 0.2539439110169773, 0.2989271671041838),
    "coef": (-0.37708368261038905, -0.37030009974480316, -0.25261621789593225, 4.315048405024756e-12),
    "intercept": 2.466552561323256e-10,
}
#: RadCliQ-v1's BERTScore: CXRMetric/run_eval.py `add_bertscore_col` (bert-score's layer 5 for this model).
BERTSCORE_SETTINGS = {"bertscore_model": "distilroberta-base", "bertscore_num_layers": 5, "bertscore_rescaled": True,
                      "bertscore_idf": False}


def radcliq_v1(radgraph_combined: float, bertscore: float, semb_score: float, bleu_score: float) -> float:
    """RadCliQ-v1 of one pair: sum_k coef_k (x_k - mean_k) / scale_k + intercept (Yu et al., 2023)."""
    values = (radgraph_combined, bertscore, semb_score, bleu_score)
    return sum(coef * (x - mean) / scale for x, mean, scale, coef in
               zip(values, PARAMETERS["mean"], PARAMETERS["scale"], PARAMETERS["coef"])) + PARAMETERS["intercept"]


def _words(text: str) -> list[str]:
    """CXR-Report-Metric's `prep_reports`: lower-case, "." -> " .", split on single spaces, drop empties."""
    return [word for word in str(text).lower().replace(".", " .").split(" ") if word != ""]


def bleu2(prediction: str, reference: str) -> float:
    """Sentence BLEU-2 (weights 1/2, 1/2) of one pair; NLTK with method1 smoothing (CXR-Report-Metric uses
    fast_bleu; with a coefficient of 4.3e-12 the difference cannot move RadCliQ-v1 by 1e-10)."""
    hypothesis, ref = _words(prediction), _words(reference)
    if not hypothesis or not ref:
        return 0.0
    return float(sentence_bleu([ref], hypothesis, weights=(0.5, 0.5), smoothing_function=SmoothingFunction().method1))


#: The range of each given component (beyond float rounding a value outside it is an error: most likely a
#: percentage, e.g. text_generation's 0-100 bertscore_per_item), and what to do about it. A baseline-rescaled
#: BERTScore can fall below 0 (and below -1), so it has an upper bound only.
_RANGES = {
    "radgraph_combined": (0.0, 1.0, "give it as a fraction (radgraph_f1's radgraph_f1_per_item)"),
    "bertscore": (-math.inf, 1.0, "give it as a fraction: text_generation's bertscore_per_item is on a 0-100 "
                                  "scale, divide it by 100"),
    "semb_score": (-1.0, 1.0, "give the cosine similarity (chexbert_similarity's similarities)"),
    "bleu_score": (0.0, 1.0, "give it as a fraction: text_generation's bleu_per_item is on a 0-100 scale "
                             "(and is BLEU-4, not RadCliQ's BLEU-2); leave bleu_score out to compute it here"),
}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _from_run(run_results: dict, n: int) -> tuple[dict, list[str]]:
    """Components found in the outputs of metrics already computed on these items, and notes on differences."""
    found, notes = {}, []
    radgraph = run_results.get("radgraph_f1") or {}
    if isinstance(radgraph.get("radgraph_f1_per_item"), list):
        found["radgraph_combined"] = ("radgraph_f1.radgraph_f1_per_item", radgraph["radgraph_f1_per_item"])
        if not radgraph.get("upstream_compat"):
            notes.append("radgraph_combined: two empty graphs score F1 1 here, 0 in CXR-Report-Metric "
                         "(radgraph_f1 upstream_compat=True scores them 0)")
    chexbert = run_results.get("chexbert_similarity") or {}
    if isinstance(chexbert.get("similarities"), list):
        found["semb_score"] = ("chexbert_similarity.similarities", chexbert["similarities"])
    text = run_results.get("text_generation") or {}
    if isinstance(text.get("bertscore_per_item"), list):
        values = [v / 100.0 if _finite(v) else None for v in text["bertscore_per_item"]]
        found["bertscore"] = ("text_generation.bertscore_per_item / 100", values)
        got = {**text, "bertscore_model": str(text.get("bertscore_model") or "").rstrip("/").rsplit("/", 1)[-1]}
        differ = {key: got.get(key) for key, want in BERTSCORE_SETTINGS.items() if got.get(key) != want}
        if differ:
            notes.append(f"bertscore: text_generation ran with {differ}, RadCliQ-v1 uses {BERTSCORE_SETTINGS} "
                         "(pass --metric-option text_generation.bertscore_model=<distilroberta-base folder> "
                         "bertscore_num_layers=5 bertscore_baseline_path=<its baseline .tsv>)")
    for name, (_, values) in found.items():
        if len(values) != n:
            raise ValueError(f"run_results {name}: {len(values)} values for {n} predictions")
    return found, notes


OPTION_TYPES = {"radgraph_combined": list | None, "bertscore": list | None, "semb_score": list | None,
                "bleu_score": list | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Radcliq(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """RadCliQ-v1 from its four component metrics (lower is better)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
            homepage="https://github.com/rajpurkarlab/CXR-Report-Metric",
            codebase_urls=["https://github.com/rajpurkarlab/CXR-Report-Metric", "https://github.com/jbdel/RadEval"],
            reference_urls=["https://doi.org/10.1016/j.patter.2023.100802"],
        )

    def _compute(self, predictions, references, radgraph_combined=None, bertscore=None, semb_score=None,
                 bleu_score=None, run_results=None):
        n = len(predictions)
        given = {"radgraph_combined": radgraph_combined, "bertscore": bertscore, "semb_score": semb_score,
                 "bleu_score": bleu_score}
        from_run, notes = _from_run(run_results or {}, n)
        columns, sources = {}, {}
        for name in COLUMNS:
            if given[name] is not None:
                low, high, hint = _RANGES[name]
                columns[name] = medheval.scoring.metric_inputs.number_column(name, given[name], n, low, high, hint)
                sources[name] = "given"
            elif name in from_run:
                sources[name], columns[name] = from_run[name]
            elif name == "bleu_score":
                columns[name] = [bleu2(p, r) for p, r in zip(predictions, references)]
                sources[name] = "computed here (BLEU-2)"
        missing = [name for name in COLUMNS if name not in columns]
        reason = None
        if missing:
            reason = (f"radcliq needs per-report {missing}: pass them (radgraph_combined=, bertscore=, semb_score=), "
                      "or in `medheval run` also compute the metrics that give them (--metrics radgraph_f1 "
                      "text_generation chexbert_similarity radcliq)")
            unavailable = ((run_results or {}).get("text_generation") or {}).get("bertscore_unavailable_reason")
            if "bertscore" in missing and unavailable:
                reason += f"; text_generation ran without BERTScore: {unavailable}"
            if run_results is None:
                raise ValueError(reason)
            # in a run the predictions are kept: the split reports radcliq as failed on every item, with the reason
            columns.update({name: [None] * n for name in missing})
            sources.update({name: "missing" for name in missing})
        scores, skipped = [], {}
        for i in range(n):
            row = [columns[name][i] for name in COLUMNS]
            bad = [name for name, value in zip(COLUMNS, row) if not _finite(value)]
            if bad:
                skipped[str(i)] = bad
                scores.append(None)
            else:
                scores.append(radcliq_v1(*(float(v) for v in row)))
        scored = [s for s in scores if s is not None]
        mean = sum(scored) / len(scored) if scored else None
        std = (sum((s - mean) ** 2 for s in scored) / len(scored)) ** 0.5 if scored else None
        components = {name: {"source": sources[name],
                             "mean": (lambda v: sum(v) / len(v) if v else None)(
                                 [float(x) for x in columns[name] if _finite(x)])} for name in COLUMNS}
        return {"radcliq": mean, "radcliq_std": std, "radcliq_per_item": scores, "n": len(scored),
                "n_skipped": len(skipped), "n_failed": len(skipped), "skipped": skipped, "components": components,
                "component_notes": notes, "comparable": not notes, "lower_is_better": True,
                **({"unavailable_reason": reason} if reason else {})}

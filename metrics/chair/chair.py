# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""CHAIR and Recall over the 14 CheXpert findings for generated radiology reports (MedHEval Table 5)."""

import os

import datasets
import evaluate
import medheval.labelers
import medheval.scoring.metric_inputs
import medheval.scoring.parsing
import medheval.labelers.chexpert_rules


_CITATION = """\
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
@inproceedings{rohrbach2018object,
  title     = {Object Hallucination in Image Captioning},
  author    = {Rohrbach, Anna and Hendricks, Lisa Anne and Burns, Kaylee and Darrell, Trevor and Saenko, Kate},
  booktitle = {Proceedings of the 2018 Conference on Empirical Methods in Natural Language Processing},
  pages     = {4035--4045},
  year      = {2018}
}
@inproceedings{irvin2019chexpert,
  title     = {CheXpert: A Large Chest Radiograph Dataset with Uncertainty Labels and Expert Comparison},
  author    = {Irvin, Jeremy and Rajpurkar, Pranav and Ko, Michael and Yu, Yifan and Ciurea-Ilcus, Silviana and
               Chute, Chris and Marklund, Henrik and Haghgoo, Behzad and Ball, Robyn and Shpanskaya, Katie and
               others},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  volume    = {33},
  pages     = {590--597},
  year      = {2019}
}
"""

_DESCRIPTION = """\
CHAIR (Caption Hallucination Assessment with Image Relevance, Rohrbach et al. 2018) adapted to
radiology reports as in MedHEval: the "objects" are the 14 CheXpert observations. Both the
generated and the reference report are labelled (1 positive, 0 negative, -1 uncertain, blank)
by a report labeler: the offline rule labeler `medheval.labelers.chexpert_rules` (default) or
CheXbert from local weights.

variant="paper" (default), the paper's definition, micro-averaged over all reports:
    G_i = findings positive in generated report i, S_i = findings positive in reference i
    CHAIR  = sum_i |G_i - S_i| / sum_i |G_i|        (hallucinated share of asserted findings)
    Recall = sum_i |G_i & S_i| / sum_i |S_i|
Uncertain (-1) is not an assertion: it is in neither G nor S (`uncertain_as_positive=True`
counts it as positive on both sides, CheXpert's "U-Ones" policy). CHAIR_s is the share of
reports with at least one hallucinated finding.

variant="medheval_code" reproduces MedHEval's released code (`CXRMetric/run_extraction.py`,
`calculate_metrics`) cell by cell: per condition, cells whose reference label is -1 are dropped;
TP = pred 1 & ref 1, TN = pred 0 & ref 0, FP = pred 1 & ref 0, FN = pred 0 & ref 1;
    CHAIR = sum(FP + FN) / #(pred in {0, 1}),   Recall = sum TP / #(ref == 1),
    Specificity = sum TN / (sum TN + sum FP),   Accuracy = (TP + TN) / (TP + TN + FP + FN).
That counts contradictions, not unsupported findings: a finding asserted in the prediction but
blank in the reference enlarges the denominator and is never a hallucination.

upstream_compat=True labels each prediction as MedHEval's `run_chair.py` writes it to its report CSV:
`text.strip("Assistant:")` (a character set, so "... effusion" becomes "... effusio"), the raw text
if that leaves nothing, and "No report generated." for a text under 10 characters. References are
used as given, as upstream does. The MedHEval paper protocols score with variant="medheval_code"
and upstream_compat=True.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports, one per prediction.
    labeler (`str`, *optional*, defaults to "rule"): "rule" (CheXpert-style rules, offline, no
        weights) or "chexbert" (needs `chexbert_path`). An object with a `label(reports)` method
        returning 14-value rows in `medheval.labelers.CONDITIONS` order is accepted too.
    chexbert_path (`str`, *optional*): the CheXbert checkpoint `chexbert.pth` for
        labeler="chexbert" (default: `$MEDHEVAL_CHEXBERT_PATH`).
    chexbert_tokenizer_path (`str`, *optional*): a bert-base-uncased tokenizer/config folder
        for CheXbert (default: next to the checkpoint, or `$MEDHEVAL_CHEXBERT_TOKENIZER`).
    device (`str`, *optional*): device for CheXbert ("cpu", "cuda" …).
    batch_size (`int`, *optional*, defaults to 32): CheXbert batch size.
    variant (`str`, *optional*, defaults to "paper"): "paper" or "medheval_code" (see above).
    uncertain_as_positive (`bool`, *optional*, defaults to `False`): variant="paper" only:
        count uncertain (-1) labels as positive in both reports.
    findings (`list` of `str` or a comma-separated `str`, *optional*): the conditions to score
        (default: all 14 of `medheval.labelers.CONDITIONS`, "No Finding" included as MedHEval does).
    upstream_compat (`bool`, *optional*, defaults to `False`): clean the predictions as MedHEval's
        report CSV conversion does before labelling (see above); default: labelled as given.

Returns:
    chair (`float` or `None`): micro CHAIR (`None` when nothing was generated).
    recall (`float` or `None`): micro recall (`None` when the references have no positives).
    chair_s (`float` or `None`): variant="paper": share of reports with >= 1 hallucinated finding.
    specificity, accuracy (`float` or `None`): variant="medheval_code" only.
    per_finding (`dict`): condition -> counts and rates (see the card).
    n (`int`): number of report pairs.
    n_generated, n_reference, n_hallucinated, n_matched, n_missed (`int`): micro counts
        (variant="medheval_code": n_generated = #(pred in {0, 1}), n_reference = #(ref == 1),
        n_hallucinated = FP + FN, n_matched = TP, n_missed = #(ref == 1 and pred != 1); plus tp,
        tn, fp, fn).
    hallucinated_findings (`list` of `list` of `str`): per report, the hallucinated findings
        (variant="medheval_code": the contradicted ones).
    missed_findings (`list` of `list` of `str`): per report, reference positives the generated
        report does not assert.
    report_chair (`list` of `float` or `None`): per report, its own CHAIR.
    n_generated_per_item, n_reference_per_item, n_hallucinated_per_item, n_matched_per_item (`list` of
        `int`): per report, its part of the micro counts above (they sum to them).
    labeler (`str`), variant (`str`), upstream_compat (`bool`): what was used.

Examples:
    >>> import evaluate
    >>> chair = evaluate.load("metrics/chair")  # doctest: +SKIP
    >>> results = chair.compute(
    ...     predictions=["Mild cardiomegaly. Small left pleural effusion.", "No acute process."],
    ...     references=["Mild cardiomegaly. No pleural effusion.", "No acute process."],
    ... )  # doctest: +SKIP
    >>> round(results["chair"], 4), results["recall"], results["hallucinated_findings"]  # doctest: +SKIP
    (0.3333, 1.0, [['Pleural Effusion'], []])
"""

VARIANTS = ("paper", "medheval_code")
CHEXBERT_PATH_ENV = "MEDHEVAL_CHEXBERT_PATH"

CHEXBERT_MISSING = """\
CHAIR with labeler="chexbert" needs the CheXbert checkpoint (chexbert.pth), and none was given.
CheXbert weights are not redistributed with this package. Get them from the README of
https://github.com/stanfordmlgroup/CheXbert (https://stanfordmedicine.box.com/s/c3stck6w6dol3h36grdc97xoydzxd7w9)
or from the Hugging Face Hub (StanfordAIMI/RRG_scorers, file chexbert.pth), plus a bert-base-uncased
tokenizer/config folder next to it. Then pass it with one of:
  Python / evaluate:  chair.compute(..., labeler="chexbert", chexbert_path="/path/chexbert/chexbert.pth")
  run_eval.py:        --metric-option chair.labeler=chexbert \\
                      --metric-option chair.chexbert_path=/path/chexbert/chexbert.pth
  environment:        export MEDHEVAL_CHEXBERT_PATH=/path/chexbert/chexbert.pth
Without weights, labeler="rule" (the default) works offline."""


class _WithBatchSize:
    """A shared CheXbert labeler called with this metric's batch size."""

    def __init__(self, labeler, batch_size):
        self.labeler = labeler
        self.batch_size = batch_size
        self.name = getattr(labeler, "name", "chexbert")

    def label(self, reports):
        return self.labeler.label(reports, batch_size=self.batch_size)


def clean_prediction(text):
    """A prediction as MedHEval's ``run_chair.py`` writes it to its report CSV
    (`medheval.scoring.parsing.clean_generated_text` with ``upstream_compat`` and ``report_csv``)."""
    return medheval.scoring.parsing.clean_generated_text(text, upstream_compat=True, report_csv=True)


def _ratio(num, den):
    return float(num) / den if den else None


def _as_bool(value, name):
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def _finding_indices(findings):
    conditions = medheval.labelers.CONDITIONS
    if findings is None:
        return list(range(len(conditions)))
    if isinstance(findings, str):
        findings = [name.strip() for name in findings.split(",") if name.strip()]
    by_lower = {name.lower(): i for i, name in enumerate(conditions)}
    indices = []
    for name in findings:
        if str(name).lower() not in by_lower:
            raise ValueError(f"unknown finding {name!r}; expected names from: {', '.join(conditions)}")
        indices.append(by_lower[str(name).lower()])
    if not indices:
        raise ValueError("findings is empty; leave it out to score all 14 conditions")
    return sorted(set(indices))


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"chexbert_path": str | None, "chexbert_tokenizer_path": str | None, "device": str | None,
                "findings": str | list[str] | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Chair(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """CHAIR / Recall over CheXpert findings, the paper's definition or MedHEval's released code."""

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
            homepage="https://github.com/Aofei-Chang/MedHEval",
            codebase_urls=[
                "https://github.com/Aofei-Chang/MedHEval",
                "https://github.com/stanfordmlgroup/chexpert-labeler",
                "https://github.com/stanfordmlgroup/CheXbert",
            ],
            reference_urls=["https://arxiv.org/abs/2503.02157", "https://arxiv.org/abs/1809.02156"],
        )

    def _get_labeler(self, labeler, chexbert_path, chexbert_tokenizer_path, device, batch_size):
        """A labeler, created once per metric instance and configuration."""
        if not isinstance(labeler, str):
            if not callable(getattr(labeler, "label", None)):
                raise ValueError(f"labeler must be 'rule', 'chexbert' or an object with .label(), got {labeler!r}")
            return labeler
        kind = labeler.strip().lower()
        if kind in ("rule", "rules", "chexpert_rules"):
            key = ("rule",)
        elif kind == "chexbert":
            chexbert_path = chexbert_path or os.environ.get(CHEXBERT_PATH_ENV) or None
            if not chexbert_path:
                raise ValueError(CHEXBERT_MISSING)
            key = ("chexbert", str(chexbert_path), chexbert_tokenizer_path, device, int(batch_size))
        else:
            raise ValueError(f"unknown labeler {labeler!r}; expected 'rule' (offline default) or 'chexbert'")
        cache = self.__dict__.setdefault("_labelers", {})
        if key not in cache:
            if key[0] == "rule":
                cache[key] = medheval.labelers.chexpert_rules.RuleLabeler()
            else:
                import medheval.labelers.chexbert as chexbert  # torch + transformers: only when asked for

                if hasattr(chexbert, "get_chexbert_labeler"):  # shared with chexbert_similarity: loaded once
                    shared = chexbert.get_chexbert_labeler(str(chexbert_path), chexbert_tokenizer_path, device)
                    cache[key] = _WithBatchSize(shared, int(batch_size))
                else:
                    cache[key] = chexbert.CheXbertLabeler(str(chexbert_path), tokenizer_path=chexbert_tokenizer_path,
                                                          device=device, batch_size=int(batch_size))
        return cache[key]

    def _compute(
        self,
        predictions,
        references,
        labeler="rule",
        chexbert_path=None,
        chexbert_tokenizer_path=None,
        device=None,
        batch_size=32,
        variant="paper",
        uncertain_as_positive=False,
        findings=None,
        upstream_compat=False,
    ):
        n = len(predictions)
        if len(references) != n:
            raise ValueError(f"Mismatch in the number of predictions ({n}) and references ({len(references)})")
        if variant not in VARIANTS:
            raise ValueError(f"chair.variant={variant!r}: expected one of {VARIANTS} "
                             f"(--metric-option chair.variant=paper|medheval_code)")
        uncertain_as_positive = _as_bool(uncertain_as_positive, "uncertain_as_positive")
        upstream_compat = _as_bool(upstream_compat, "upstream_compat")
        if upstream_compat:
            predictions = [clean_prediction(text) for text in predictions]
        if uncertain_as_positive and variant != "paper":
            raise ValueError("uncertain_as_positive applies to variant='paper' only; "
                             "variant='medheval_code' reproduces the released code as it is")
        columns = _finding_indices(findings)
        model = self._get_labeler(labeler, chexbert_path, chexbert_tokenizer_path, device, batch_size)

        # label every distinct text once
        texts = list(dict.fromkeys([t or "" for t in predictions] + [t or "" for t in references]))
        rows = model.label(texts) if texts else []
        by_text = dict(zip(texts, rows))
        generated = [by_text[t or ""] for t in predictions]
        reference = [by_text[t or ""] for t in references]

        if variant == "paper":
            result = _paper(generated, reference, columns, uncertain_as_positive)
        else:
            result = _medheval_code(generated, reference, columns)
        result["labeler"] = getattr(model, "name", type(model).__name__)
        result["variant"] = variant
        result["upstream_compat"] = upstream_compat
        if variant == "paper":
            result["uncertain_as_positive"] = uncertain_as_positive
        return result


# Per-report counts (lists, one int per report) whose sums are the micro counts: CHAIR =
# sum(n_hallucinated) / sum(n_generated), recall = sum(n_matched) / sum(n_reference), so a report can
# resample reports and recompute both (bootstrap intervals).
ITEM_COUNTS = ("n_generated_per_item", "n_reference_per_item", "n_hallucinated_per_item", "n_matched_per_item")


def _count_item(item_counts: dict[str, list[int]], **counts: int) -> None:
    for name, value in counts.items():
        item_counts[f"n_{name}_per_item"].append(value)


def _paper(generated, reference, columns, uncertain_as_positive):
    names = medheval.labelers.CONDITIONS
    asserted = (1, -1) if uncertain_as_positive else (1,)
    per = {names[c]: {"n_generated": 0, "n_reference": 0, "n_hallucinated": 0, "n_matched": 0} for c in columns}
    hallucinated, missed, report_chair = [], [], []
    item_counts: dict[str, list[int]] = {key: [] for key in ITEM_COUNTS}
    for gen, ref in zip(generated, reference):
        g = [c for c in columns if gen[c] in asserted]
        s = {c for c in columns if ref[c] in asserted}
        bad = [names[c] for c in g if c not in s]
        miss = [names[c] for c in sorted(s) if c not in g]
        for c in g:
            per[names[c]]["n_generated"] += 1
            per[names[c]]["n_matched" if c in s else "n_hallucinated"] += 1
        for c in s:
            per[names[c]]["n_reference"] += 1
        hallucinated.append(bad)
        missed.append(miss)
        report_chair.append(_ratio(len(bad), len(g)))
        _count_item(item_counts, generated=len(g), reference=len(s), hallucinated=len(bad), matched=len(g) - len(bad))
    for counts in per.values():
        counts["chair"] = _ratio(counts["n_hallucinated"], counts["n_generated"])
        counts["recall"] = _ratio(counts["n_matched"], counts["n_reference"])
        counts["n_missed"] = counts["n_reference"] - counts["n_matched"]
    n_gen = sum(c["n_generated"] for c in per.values())
    n_ref = sum(c["n_reference"] for c in per.values())
    n_bad = sum(c["n_hallucinated"] for c in per.values())
    n_hit = sum(c["n_matched"] for c in per.values())
    n = len(generated)
    return {
        "chair": _ratio(n_bad, n_gen),
        "recall": _ratio(n_hit, n_ref),
        "chair_s": _ratio(sum(1 for bad in hallucinated if bad), n),
        "per_finding": per,
        "n": n,
        "n_generated": n_gen,
        "n_reference": n_ref,
        "n_hallucinated": n_bad,
        "n_matched": n_hit,
        "n_missed": n_ref - n_hit,
        "hallucinated_findings": hallucinated,
        "missed_findings": missed,
        "report_chair": report_chair,
        **item_counts,
    }


def _medheval_code(generated, reference, columns):
    names = medheval.labelers.CONDITIONS
    per = {names[c]: {"tp": 0, "tn": 0, "fp": 0, "fn": 0, "n_generated": 0, "n_reference": 0} for c in columns}
    hallucinated, missed, report_chair = [], [], []
    item_counts: dict[str, list[int]] = {key: [] for key in ITEM_COUNTS}
    for gen, ref in zip(generated, reference):
        bad, miss, n_gen, n_ref, n_hit = [], [], 0, 0, 0
        for c in columns:
            g, r = gen[c], ref[c]
            if r == -1:  # upstream drops the rows whose ground truth is uncertain, per condition
                continue
            counts = per[names[c]]
            if g in (0, 1):
                counts["n_generated"] += 1
                n_gen += 1
            if r == 1:
                counts["n_reference"] += 1
                n_ref += 1
                if g != 1:
                    miss.append(names[c])
            if g == 1 and r == 1:
                counts["tp"] += 1
                n_hit += 1
            elif g == 0 and r == 0:
                counts["tn"] += 1
            elif g == 1 and r == 0:
                counts["fp"] += 1
                bad.append(names[c])
            elif g == 0 and r == 1:
                counts["fn"] += 1
                bad.append(names[c])
        hallucinated.append(bad)
        missed.append(miss)
        report_chair.append(_ratio(len(bad), n_gen))
        _count_item(item_counts, generated=n_gen, reference=n_ref, hallucinated=len(bad), matched=n_hit)
    for counts in per.values():
        counts["n_hallucinated"] = counts["fp"] + counts["fn"]
        counts["n_matched"] = counts["tp"]
        counts["n_missed"] = counts["n_reference"] - counts["tp"]
        counts["chair"] = _ratio(counts["n_hallucinated"], counts["n_generated"])
        counts["recall"] = _ratio(counts["tp"], counts["n_reference"])
        counts["specificity"] = _ratio(counts["tn"], counts["tn"] + counts["fp"])
        counts["accuracy"] = _ratio(counts["tp"] + counts["tn"],
                                    counts["tp"] + counts["tn"] + counts["fp"] + counts["fn"])
    total = {key: sum(c[key] for c in per.values()) for key in ("tp", "tn", "fp", "fn", "n_generated", "n_reference")}
    return {
        "chair": _ratio(total["fp"] + total["fn"], total["n_generated"]),
        "recall": _ratio(total["tp"], total["n_reference"]),
        "specificity": _ratio(total["tn"], total["tn"] + total["fp"]),
        "accuracy": _ratio(total["tp"] + total["tn"], total["tp"] + total["tn"] + total["fp"] + total["fn"]),
        "per_finding": per,
        "n": len(generated),
        "n_generated": total["n_generated"],
        "n_reference": total["n_reference"],
        "n_hallucinated": total["fp"] + total["fn"],
        "n_matched": total["tp"],
        "n_missed": total["n_reference"] - total["tp"],
        "tp": total["tp"],
        "tn": total["tn"],
        "fp": total["fp"],
        "fn": total["fn"],
        "hallucinated_findings": hallucinated,
        "missed_findings": missed,
        "report_chair": report_chair,
        **item_counts,
    }

# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""MediHall detection: how well a hallucination-level source (LLM judge, detector, rules) matches human levels."""

import datasets
import evaluate
import numpy as np
import medheval.families.med_hallmark
import medheval.scoring.metric_inputs


_CITATION = """\
@article{chen2024medhallmark,
  title   = {Detecting and Evaluating Medical Hallucinations in Large Vision Language Models},
  author  = {Chen, Jiawei and Yang, Dingkang and others},
  journal = {arXiv preprint arXiv:2406.10185},
  year    = {2024}
}
"""

_DESCRIPTION = """\
Scores predicted Med-HallMark hallucination levels against human ones, as the paper evaluates
MediHallDetector: accuracy, macro F1, Cohen's kappa, quadratic-weighted kappa over the ordered
levels (catastrophic < critical < attribute < prompt-induced < minor < correct), per-level
precision/recall/F1/support and the confusion matrix (rows = human level, columns = predicted).

    accuracy   = sum_k C[k,k] / n
    kappa      = (p_o - p_e) / (1 - p_e),  p_o = accuracy,  p_e = sum_k (row_k / n) (col_k / n)
    kappa_q    = 1 - sum_ij w_ij C_ij / sum_ij w_ij E_ij,  w_ij = (i - j)^2 / (K - 1)^2,
                 E_ij = row_i col_j / n,  i, j = positions in the full level order (K levels)
    macro_f1   = mean F1 over the levels that occur in the references or the predictions

Both kappas equal sklearn.metrics.cohen_kappa_score(..., labels=<all K levels in order>). A kappa is
not computable (`None`, with `kappa_note` saying why) when the human levels hold one class (kappa is
then 0 or 0/0 whatever the predictions) or chance agreement is total (sklearn's nan).
Predictions without a readable level are counted in `n_failed` / `failed` and left out of the
statistics, never silently treated as a level.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): predicted levels: keys ("attribute") or Med-HallMark names
        ("Attribute Hallucinations"); `None`/"" or an unreadable text = no level (counted as failed).
    references (`list` of `str`): the human levels (same spellings); every one must be readable.
    levels (`str` or `list`, defaults to "vqa"): the ordered level set: "vqa" (6 levels), "irg" (4)
        or an explicit list of level keys, most severe first.
    ids (`list` of `str`, *optional*): item ids used in `failed`.

Returns:
    accuracy, macro_f1, cohen_kappa, quadratic_kappa (`float` or `None` when undefined),
    kappa_note (`str` or `None`): why the kappas are not computable,
    per_level (`dict`): level -> {"precision", "recall", "f1", "support"} (`None` where undefined),
    confusion (`dict`): {"levels": [...], "rows": [[...], ...]} with rows = human, columns = predicted,
    distribution_human, distribution_predicted (`dict`): level -> count,
    n (`int`, scored pairs), n_failed (`int`), failed (`list` of {"id", "prediction"}).

Examples:
    >>> import evaluate
    >>> det = evaluate.load("metrics/medihall_detection")  # doctest: +SKIP
    >>> out = det.compute(predictions=["correct", "minor", "catastrophic", "critical"],
    ...                   references=["correct", "catastrophic", "catastrophic", "critical"])  # doctest: +SKIP
    >>> out["accuracy"], round(out["cohen_kappa"], 4)  # doctest: +SKIP
    (0.75, 0.6667)
"""

_LEVEL_SETS = {"vqa": medheval.families.med_hallmark.VQA_LEVELS, "irg": medheval.families.med_hallmark.IRG_LEVELS}


def _level_set(levels):
    if isinstance(levels, str):
        if levels not in _LEVEL_SETS:
            raise ValueError(f"levels must be 'vqa', 'irg' or a list of level keys, got {levels!r}")
        return tuple(_LEVEL_SETS[levels])
    chosen = tuple(str(level) for level in levels)
    unknown = [level for level in chosen if level not in medheval.families.med_hallmark.LEVELS]
    if unknown or len(set(chosen)) != len(chosen) or len(chosen) < 2:
        raise ValueError(f"levels must be at least two distinct keys of {medheval.families.med_hallmark.LEVELS}, got {list(chosen)}")
    return chosen


def _ratio(num, den):
    return None if den == 0 else float(num) / float(den)


def detection_scores(human, predicted, levels):
    """The statistics of `_DESCRIPTION` from paired level keys (both fully readable)."""
    k = len(levels)
    index = {level: i for i, level in enumerate(levels)}
    confusion = np.zeros((k, k), dtype=np.int64)
    for h, p in zip(human, predicted):
        confusion[index[h], index[p]] += 1
    n = int(confusion.sum())
    rows, cols, diag = confusion.sum(axis=1), confusion.sum(axis=0), np.diag(confusion)
    per_level, f1s = {}, []
    for i, level in enumerate(levels):
        precision, recall = _ratio(diag[i], cols[i]), _ratio(diag[i], rows[i])
        f1 = None
        if rows[i] or cols[i]:
            f1 = _ratio(2 * diag[i], rows[i] + cols[i])
            f1s.append(f1)
        per_level[level] = {"precision": precision, "recall": recall, "f1": f1, "support": int(rows[i])}
    out = {"accuracy": _ratio(diag.sum(), n), "macro_f1": (sum(f1s) / len(f1s)) if f1s else None,
           "cohen_kappa": None, "quadratic_kappa": None, "kappa_note": None, "per_level": per_level}
    used = [level for level, count in zip(levels, rows) if count]
    if len(used) == 1:  # one human class: kappa is 0 or 0/0 whatever the predictions, so it says nothing
        out["kappa_note"] = (f"not computable: every human level is {used[0]} (one class), so chance agreement "
                             f"explains all agreement; see accuracy")
    elif n:
        expected = np.outer(rows, cols) / n
        i, j = np.indices((k, k))
        for key, weights in (("cohen_kappa", (i != j).astype(float)),
                             ("quadratic_kappa", (i - j) ** 2 / float((k - 1) ** 2))):
            chance = float((weights * expected).sum())
            disagreement = float((weights * confusion).sum())
            out[key] = None if chance == 0 else 1.0 - disagreement / chance
            if chance == 0:
                out["kappa_note"] = "not computable: chance agreement is total (as sklearn's nan)"
    out["confusion"] = {"levels": list(levels), "rows": confusion.tolist()}
    return out


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MedihallDetection(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """Agreement of predicted MediHall levels with human levels."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            homepage="https://github.com/ydk122024/Med-HallMark",
            codebase_urls=["https://github.com/ydk122024/Med-HallMark"],
            reference_urls=["https://arxiv.org/abs/2406.10185"],
        )

    def _compute(self, predictions, references, levels="vqa", ids=None):
        mh = medheval.families.med_hallmark
        chosen = _level_set(levels)
        n = len(predictions)
        ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
        if len(ids) != n:
            raise ValueError(f"ids has {len(ids)} entries for {n} predictions")
        human, predicted, failed = [], [], []
        for i, (pred, ref) in enumerate(zip(predictions, references)):
            h = mh.parse_level(ref, chosen)
            if h is None:
                raise ValueError(f"reference #{i} (id {ids[i]}): {ref!r} is not one of the levels {list(chosen)}")
            p = mh.parse_level(pred, chosen)
            if p is None:
                failed.append({"id": ids[i], "prediction": pred})
                continue
            human.append(h)
            predicted.append(p)
        out = detection_scores(human, predicted, chosen)
        out.update(
            distribution_human=mh.level_distribution(human, chosen),
            distribution_predicted=mh.level_distribution(predicted, chosen),
            n=len(human), n_failed=len(failed), failed=failed, levels=list(chosen),
        )
        return out

# Copyright 2026 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""Med-StepBench: per-step precision, recall and F1 of statement verification, hallucination as the positive class."""

import datasets
import evaluate
import numpy as np
import medheval.scoring.metric_inputs
import medheval.families.stepbench.source


_CITATION = """\
@misc{medstepbench,
  title = {Med-StepBench},
  note = {arXiv:2605.10002}
}
"""

_DESCRIPTION = """\
A model reads a statement about a PET/CT study and says whether it is consistent with the
images. Each statement belongs to one of four diagnostic steps (S1 anatomical mapping, S2 lesion
identification, S3 feature characterization, S4 diagnostic synthesis) and is labelled
`ground_truth` or `hallucination`. Per step, with **hallucination as the positive class**
(the model's job is to catch hallucinated statements; the paper implies this choice but its
definitions were not public when this module was written):

    precision = TP / (TP + FP)    recall = TP / (TP + FN)    f1 = 2 P R / (P + R)

TP: a hallucination answered inconsistent; FN: a hallucination answered consistent; FP: a
ground-truth statement answered inconsistent; TN: a ground-truth statement answered consistent.
An answer that cannot be parsed is a miss on its true class (an FN for a hallucination, an FP
for a ground-truth statement) and is counted in `n_unparsed`. A ratio with a zero denominator is 0;
with no statements at all (empty inputs) every rate and `macro_f1` is `None`.
`macro_f1` is the mean F1 over the steps present. Everything is also given per language.
Answers are parsed by `medheval.families.stepbench.source.parse_verdict`, which reads the verdict of a
verbose answer rather than its first matching word ("There is no lesion in the liver, so the statement
is consistent" is consistent): the opening verdict word, else the verdict tied to the statement, else the
last verdict word (consistent/inconsistent, true/false, correct/incorrect, yes/no, "hallucination", and
their Vietnamese forms). The labels themselves ("ground_truth", "ground truth", "hallucination") are
accepted as predictions, so a file of labels scores as written.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): model answers, free text.
    references (`list` of `str`): "ground_truth" or "hallucination".
    steps (`list` of `int`): the step (1-4) of each statement; step names ("lesion_identification") work too.
    languages (`list` of `str`, *optional*): "en"/"vi" per statement; gives `by_language`. A `None`
        entry is scored overall but left out of `by_language` (counted in `n_without_language`).

Returns:
    per_step (`dict`): step (1-4) -> {precision, recall, f1, accuracy, tp, fp, fn, tn, n, n_unparsed}.
    macro_f1 (`float`): mean F1 over the steps present.
    precision, recall, f1, accuracy (`float`): over all statements (micro).
    n (`int`), n_unparsed (`int`): statements scored, answers not parsed.
    by_language (`dict`): language -> the same fields (when `languages` is given).
    n_without_language (`int`): statements whose language is `None` (when `languages` is given).
    positive_class (`str`): "hallucination".
    correct (`list` of `bool`), parsed (`list` of `bool`): per statement.

Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/stepbench")  # doctest: +SKIP
    >>> out = metric.compute(predictions=["Inconsistent.", "Consistent", "Yes", "maybe"],
    ...                      references=["hallucination", "hallucination", "ground_truth", "ground_truth"],
    ...                      steps=[1, 1, 1, 2])  # doctest: +SKIP
    >>> out["per_step"][1]["recall"], out["per_step"][2]["precision"], out["n_unparsed"]  # doctest: +SKIP
    (0.5, 0.0, 1)
"""


def _ratio(num, den):
    return float(num) / den if den else 0.0


def _scores(truth, said, parsed):
    """Confusion counts and P/R/F1 (positive = hallucination) for boolean arrays of one group."""
    tp = int(np.sum(truth & said))
    fn = int(np.sum(truth & ~said))
    fp = int(np.sum(~truth & said))
    tn = int(np.sum(~truth & ~said))
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    empty = not len(truth)  # no statement at all: no rate (None), not 0
    return {
        "precision": None if empty else precision,
        "recall": None if empty else recall,
        "f1": None if empty else _ratio(2 * precision * recall, precision + recall),
        "accuracy": None if empty else _ratio(tp + tn, len(truth)),
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "n": int(len(truth)),
        "n_unparsed": int(np.sum(~parsed)),
    }


def _summary(truth, said, parsed, steps):
    per_step = {int(step): _scores(truth[steps == step], said[steps == step], parsed[steps == step])
                for step in np.unique(steps)}
    overall = _scores(truth, said, parsed)
    return {
        "per_step": per_step,
        "macro_f1": float(np.mean([s["f1"] for s in per_step.values()])) if per_step else None,
        **{key: overall[key] for key in ("precision", "recall", "f1", "accuracy", "n", "n_unparsed")},
    }


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class StepBench(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """Per-step precision/recall/F1 of Med-StepBench statement verification (hallucination = positive)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://arxiv.org/abs/2605.10002"],
        )

    def _compute(self, predictions, references, steps, languages=None):
        sb = medheval.families.stepbench.source
        n = len(predictions)
        if len(references) != n:
            raise ValueError(f"Mismatch in the number of predictions ({n}) and references ({len(references)})")
        steps = medheval.scoring.metric_inputs.per_item_column("steps", steps, n)
        languages = medheval.scoring.metric_inputs.per_item_column("languages", languages, n, kind="label")
        refs = np.asarray(references, dtype=object)
        bad = np.flatnonzero(~np.isin(refs, sb.LABELS))
        if bad.size:
            raise ValueError(f"item {bad[0]}: reference {refs[bad[0]]!r} is not one of {list(sb.LABELS)}")
        step_ids = np.asarray([sb.STEP_OF_CATEGORY.get(s, s) if isinstance(s, str) else None if isinstance(s, bool)
                               else s for s in steps], dtype=object)  # True is not step 1
        bad = np.flatnonzero(~np.isin(step_ids, list(sb.STEPS)))
        if bad.size:
            raise ValueError(f"item {bad[0]}: step {steps[bad[0]]!r} is not one of 1, 2, 3, 4 (or a step name)")
        step_ids = step_ids.astype(np.int64)

        verdict_of = {text: sb.parse_verdict(text) for text in set(predictions)}  # answers repeat a lot
        verdicts = np.asarray([verdict_of[text] for text in predictions], dtype=object)
        truth = refs == sb.POSITIVE_LABEL
        parsed = verdicts != None  # noqa: E711 - element-wise
        # an unparsed answer is a miss on its true class: it "says" the opposite label
        said = np.where(parsed, verdicts == sb.POSITIVE_LABEL, ~truth).astype(bool)
        result = _summary(truth, said, parsed, step_ids)
        result["positive_class"] = sb.POSITIVE_LABEL
        if languages is not None:
            langs = np.asarray(languages, dtype=object)
            result["by_language"] = {
                lang: _summary(truth[langs == lang], said[langs == lang], parsed[langs == lang],
                               step_ids[langs == lang])
                for lang in sorted({lang for lang in languages if lang is not None})
            }
            result["n_without_language"] = sum(lang is None for lang in languages)
        result["correct"] = (said == truth).tolist()
        result["parsed"] = parsed.tolist()
        return result

# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""Close-ended accuracy (yes/no and multiple choice) for medical VQA hallucination benchmarks."""

import numbers
from collections import defaultdict

import datasets
import evaluate
import medheval.scoring.metric_inputs
import medheval.scoring.parsing


_CITATION = """\
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
"""

_DESCRIPTION = """\
Accuracy of free-text answers to close-ended medical VQA questions (yes/no and multiple
choice), as used by MedHEval's visual, knowledge and context close-ended splits. Each
prediction is parsed by `medheval.scoring.parsing`: yes/no answers with a negation- and hedge-aware
rule parser, multiple-choice answers by letter ("B", "(B)", "The answer is B"), by option
text, or by a fuzzy match. Unparsed predictions count as wrong (`n_unparsed`); items whose
reference is itself unusable (label noise such as a binary answer "Abnormal") count as wrong
and are reported (`n_bad_reference`). Accuracy is also broken down by category (for the
visual splits: anatomy, measurement, symptom, radiology = Acc-A/M/S/R) and by answer type.
With `upstream_compat=True` the original MedHEval scorer is reproduced instead (token rule
for yes/no, difflib argmax over letter-prefixed options for multiple choice, its group-level
stale-variable bug and its weighted per-category means).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): model answers, free text.
    references (`list` of `str`): reference answers as released ("Yes", "B. Pneumonia", "B", "Pneumonia").
    answer_types (`list` of `str`): "yes_no" or "multiple_choice" per item ("binary" and
        "multi-choice" are accepted too).
    choices (`list` of `list` of `str`, *optional*): option texts per item (without letters;
        a raw "A. x, B. y" string per item is also accepted). Needed for multiple choice.
    categories (`list` of `str`, *optional*): category per item (e.g. anatomy, measurement,
        symptom, radiology). Gives `accuracy_by_category`; `None` entries are left out of it.
    raw_choices (`list` of `str`, *optional*): the upstream choices strings, used by
        `upstream_compat=True` (rebuilt as "A. x, B. y" from `choices` when absent).
    questions (`list` of `str`, *optional*): the question per item. With it, a yes/no answer
        without a yes/no word counts only where it affirms or denies the question's finding
        (native scoring; the runner passes it).
    sources (`list` of `str`, *optional*): the source file per item (slake, vqa_rad, ...). Upstream
        mode scores yes/no items in groups of one source and one category, as MedHEval does.
    upstream_compat (`bool`, *optional*, defaults to `False`): score exactly as MedHEval's
        `eval_yesno.py` / `eval_multichoice.py` / `type1_utils.py`, bugs included (see the card).
        Items upstream skips (no option B) are left out of `n` and counted in
        `n_skipped_upstream`, but weigh in the accuracies as upstream's means do.
    threshold (`float`, *optional*, defaults to 0.6): minimum difflib ratio for a fuzzy
        option-text match (native scoring only).

Returns:
    accuracy (`float` or `None`): fraction of the `n` items answered correctly (upstream mode: MedHEval's
        weighted mean over the (source, category) groups); `None` when no item was scored (`n` 0).
    accuracy_by_category (`dict`): category -> accuracy (empty without `categories`).
    accuracy_by_answer_type (`dict`): "yes_no"/"multiple_choice" -> accuracy.
    n (`int`): number of items scored.
    n_unparsed (`int`): predictions that could not be parsed (counted wrong).
    n_bad_reference (`int`): items whose reference is unusable (counted wrong; 0 in upstream mode).
    n_skipped_upstream (`int`): only with `upstream_compat=True`.
    correct (`list` of `bool`): per item (`None` for items skipped in upstream mode).
    parsed (`list` of `bool`): per item, whether the prediction could be parsed.

Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/close_ended_accuracy")  # doctest: +SKIP
    >>> results = metric.compute(
    ...     predictions=["No, there is no effusion.", "The answer is B.", "Cannot be determined."],
    ...     references=["No", "B. Pneumonia", "Yes"],
    ...     answer_types=["yes_no", "multiple_choice", "yes_no"],
    ...     choices=[[], ["Pleural effusion", "Pneumonia"], []],
    ...     categories=["symptom", "symptom", "anatomy"],
    ... )  # doctest: +SKIP
    >>> round(results["accuracy"], 4), results["n_unparsed"], results["accuracy_by_category"]  # doctest: +SKIP
    (0.6667, 1, {'anatomy': 0.0, 'symptom': 1.0})
"""


def _ratio(hits, total):
    return float(hits) / total if total else 0.0


def _upstream_items(predictions, references, kinds, choices, raw_choices, categories, sources):
    """Per-item results of MedHEval's scorer: (correct, parsed, n_skipped).

    Yes/no items are scored per group (source, category) in input order, as upstream's
    ``evaluate_yes_no`` sees them, so its stale-variable bug applies: a group whose last
    answer is blank or starts with "." is wrong throughout. ``parsed`` is False where
    upstream has no reading (-1: a broken group); an empty answer in an intact group
    reads as "yes". Multiple-choice items upstream skips are ``None``.
    """
    parsing = medheval.scoring.parsing
    n = len(predictions)
    correct, parsed, n_skipped = [None] * n, [False] * n, 0
    groups = defaultdict(list)
    for i in range(n):
        if kinds[i] == "yes_no":
            groups[_group_key(i, categories, sources)].append(i)
            continue
        raw = raw_choices[i] if raw_choices is not None and raw_choices[i] else None
        if raw is None:
            item_choices = choices[i] if choices is not None else None
            if isinstance(item_choices, str):
                item_choices = parsing.split_choices(item_choices)
            raw = parsing.join_choices(item_choices or [])
        ok = parsing.upstream_multiple_choice_correct(predictions[i], references[i], raw)
        correct[i], parsed[i] = ok, ok is not None
        n_skipped += ok is None
    for members in groups.values():
        preds = [predictions[i] or "" for i in members]
        broken = parsing.upstream_group_breaks(preds[-1])
        results = parsing.upstream_yes_no_group(preds, [references[i] or "" for i in members])
        for i, ok in zip(members, results):
            correct[i], parsed[i] = ok, not broken
    return correct, parsed, n_skipped


def _group_key(i, categories, sources):
    return (sources[i] if sources is not None else None, categories[i] if categories is not None else None)


def _ratios_by_label(counts):
    """{label: ratio} from {label: [sum, count]}, in label order (labels are text: ``per_item_column`` kind "label")."""
    return {label: _ratio(*count) for label, count in sorted(counts.items())}


def _upstream_means(correct, kinds, categories, sources):
    """MedHEval's weighted means: per (source, category) group ``upstream_group_accuracy``, then
    each category's groups and all groups weighted by their item counts (skipped items included)."""
    parsing = medheval.scoring.parsing
    groups = defaultdict(lambda: ([], []))
    for i, ok in enumerate(correct):
        yn, mc = groups[_group_key(i, categories, sources)]
        (yn if kinds[i] == "yes_no" else mc).append(ok)
    by_category = defaultdict(lambda: [0.0, 0])
    total = [0.0, 0]
    for (_, category), (yn, mc) in groups.items():
        size = len(yn) + len(mc)
        weighted = parsing.upstream_group_accuracy(yn, mc) * size
        total[0] += weighted
        total[1] += size
        if category is not None:
            by_category[category][0] += weighted
            by_category[category][1] += size
    overall = _ratio(*total) if total[1] else None  # no item at all: no accuracy, not 0 %
    return overall, _ratios_by_label(by_category)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CloseEndedAccuracy(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """Close-ended (yes/no, multiple-choice) accuracy with robust answer parsing."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                    "answer_types": datasets.Value("string"),
                }
            ),
            homepage="https://github.com/Aofei-Chang/MedHEval",
            codebase_urls=["https://github.com/Aofei-Chang/MedHEval"],
            reference_urls=["https://arxiv.org/abs/2503.02157"],
        )

    def _compute(
        self,
        predictions,
        references,
        answer_types,
        choices=None,
        categories=None,
        raw_choices=None,
        upstream_compat=False,
        threshold=0.6,
        questions=None,
        sources=None,
    ):
        parsing = medheval.scoring.parsing
        n = len(predictions)
        if len(references) != n or len(answer_types) != n:
            raise ValueError(
                f"Mismatch in the number of predictions ({n}), references ({len(references)}) "
                f"and answer_types ({len(answer_types)})"
            )
        inputs = medheval.scoring.metric_inputs
        choices = inputs.options_column("choices", choices, n)
        categories = inputs.per_item_column("categories", categories, n, kind="label")
        raw_choices = inputs.per_item_column("raw_choices", raw_choices, n, kind="text")
        questions = inputs.per_item_column("questions", questions, n, kind="text")
        sources = inputs.per_item_column("sources", sources, n, kind="label")
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 <= threshold <= 1:
            raise ValueError(f"threshold={threshold!r}: expected a number from 0 to 1 (the minimum difflib ratio of "
                             "a fuzzy option match; default 0.6)")

        kinds = []
        for i, answer_type in enumerate(answer_types):
            try:
                kinds.append(parsing.canonical_answer_type(answer_type))
            except ValueError:
                raise ValueError(
                    f"item {i}: unknown answer_type {answer_type!r} (expected 'yes_no' or 'multiple_choice')"
                ) from None
            if kinds[-1] == "multiple_choice" and not (choices and choices[i]) and not (raw_choices and raw_choices[i]):
                raise ValueError(f"item {i}: answer_type {answer_type!r} needs choices, got none")

        if upstream_compat:
            correct, parsed, n_skipped = _upstream_items(predictions, references, kinds, choices, raw_choices,
                                                         categories, sources)
            n_bad_reference = 0
        else:
            correct, parsed = [], []
            n_bad_reference = n_skipped = 0
            for i in range(n):
                item_choices = choices[i] if choices is not None else None
                if isinstance(item_choices, str):
                    item_choices = parsing.split_choices(item_choices)
                question = questions[i] if questions is not None else None
                score = parsing.score_item(predictions[i], references[i], kinds[i], item_choices, threshold,
                                           question=question)
                correct.append(score.correct)
                parsed.append(score.parsed)
                n_bad_reference += not score.reference_ok

        scored = [i for i in range(n) if correct[i] is not None]
        by_category, by_type = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
        for i in scored:
            by_type[kinds[i]][0] += bool(correct[i])
            by_type[kinds[i]][1] += 1
            if categories is not None and categories[i] is not None:
                by_category[categories[i]][0] += bool(correct[i])
                by_category[categories[i]][1] += 1

        if upstream_compat:
            accuracy, accuracy_by_category = _upstream_means(correct, kinds, categories, sources)
        else:
            # no item scored: no accuracy (None, as the other metrics give), not 0 %
            accuracy = _ratio(sum(bool(correct[i]) for i in scored), len(scored)) if scored else None
            accuracy_by_category = _ratios_by_label(by_category)
        result = {
            "accuracy": accuracy,
            "accuracy_by_category": accuracy_by_category,
            "accuracy_by_answer_type": {k: _ratio(*v) for k, v in sorted(by_type.items())},
            "n": len(scored),
            "n_unparsed": sum(1 for i in scored if not parsed[i]),
            "n_bad_reference": n_bad_reference,
            "correct": correct,
            "parsed": parsed,
        }
        if upstream_compat:
            result["n_skipped_upstream"] = n_skipped
        return result

# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""MediHall Score (Med-HallMark): hierarchical hallucination score for medical VQA and report generation."""

import json
import numbers
import os

import datasets
import evaluate
import medheval.scoring.metric_inputs
import medheval.families.med_hallmark.source
import medheval.families.med_hallmark
import medheval.data.schema
import medheval.scoring.parsing


_CITATION = """\
@article{chen2024medhallmark,
  title   = {Detecting and Evaluating Medical Hallucinations in Large Vision Language Models},
  author  = {Chen, Jiawei and Yang, Dingkang and others},
  journal = {arXiv preprint arXiv:2406.10185},
  year    = {2024}
}
"""

_DESCRIPTION = """\
MediHall Score (Med-HallMark). Each answer (task "vqa") or each sentence of a generated report
(task "irg") gets a hallucination level with a weight: Catastrophic 0.0, Critical 0.2,
Attribute 0.4, Prompt-induced 0.6, Minor 0.8, Correct 1.0 (reports use the first three and
Correct). A report scores the mean over its sentences; the MediHall Score is the mean over
answers/reports (higher is better, 1.0 = no hallucination). Levels come from a classifier:
"rule" (offline default: answer correctness by medheval.scoring.parsing plus the question's aspect;
for reports, findings and their polarity sentence by sentence), "judge" (any LLM judge of
medheval.judges, prompted with Med-HallMark's hierarchy) or "detector" (a local
MediHallDetector-style checkpoint through the judge layer's transformers backend). Items that
cannot be classified are reported in `failed` and left out of the score, never scored 0; with the
"rule" classifier these include empty answers and unparsed yes/no or multiple-choice answers.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): model answers (vqa) or generated reports (irg).
    references (`list` of `str`): ground-truth answers / reports. `None`/"" is allowed with
        classifier "judge"/"detector" and `images` (Med-HallMark's no-ground-truth prompt); the
        "rule" classifier reports such items as failed.
    questions (`list` of `str`, *optional*): the questions (vqa; used by every classifier).
    task (`str`, *optional*): "vqa" (one level per answer, 6 levels) or "irg" (one level per
        report sentence, 4 levels); default "irg" when every `answer_types` entry is "report"
        (as run_eval.py passes for report splits), else "vqa".
    question_types (`list` of `str`, *optional*): the question's type per item, mapped to the
        aspect the rule classifier uses: VQA-RAD (MODALITY, PLANE, ORGAN, ABN, PRES, POS, SIZE,
        COUNT, ATTRIB, COLOR), SLAKE (Modality, Plane, Organ, Position, Quantity, Size, Shape,
        Color, KG), MedHEval (anatomy, measurement, symptom, radiology) or Med-HallMark
        (counterfactual -> a false premise; conventional, confidence_weakening -> the text decides,
        a confidence-weakening prefix dropped). Unknown types (and hallucination-level labels, which
        are what is predicted) fall back to the question text.
    categories (`list` of `str`, *optional*): the records' `category` (run_eval.py passes it);
        used as `question_types` when those are not given.
    answer_types (`list` of `str`, *optional*): "yes_no"/"multiple_choice"/"open" per item (rule).
    choices (`list` of `list` of `str`, *optional*): options of multiple-choice items (rule).
    ids (`list` of `str`, *optional*): item ids used in `failed` (default: the item index).
    credentialed (`list` of `bool`/`None`, or one `bool`, *optional*): items derived from credentialed
        (PhysioNet) data; the judge refuses to send them to a non-local endpoint without opt-in.
        Not given (or `None` for an item): unknown, treated as credentialed; pass `False` for data
        that is not credentialed. run_eval.py passes each record's meta['credentialed'].
    images (`list` of `list`, *optional*): images per item (PIL images, paths or bytes) sent to
        the judge/detector.
    classifier (`str`, *optional*): "rule", "judge" or "detector"; default "judge" when `judge`
        is given (as `run_eval.py --judge` does), "detector" when `detector_path` is, else "rule".
    judge (`str` or `dict`): the judge for classifier "judge": "backend:model[@base_url]" or a
        dict (`medheval.judges.make_judge`), e.g. "openai:gpt-4o@http://127.0.0.1:8000/v1".
    detector_path (`str`): local folder of the detector checkpoint (classifier "detector").
    cache_dir, concurrency, allow_remote_credentialed: passed to `make_judge`.
    overlap (`float` in (0, 1], defaults to 1.0): rule classifier, open answers: the fraction of the
        reference's content words the answer must contain to count as correct.
    prompt_style (`str`, defaults to "json"): judge/detector prompt: "json" (this project's wording,
        JSON reply) or "upstream" (Med-HallMark's exact prompts, read at run time from the pinned,
        sha256-verified upstream files; plain-text replies as the paper's detector gives).
    upstream_dir (`str`, *optional*): a local folder with Med-HallMark's files for
        prompt_style="upstream" (default: the pinned download / cache).
    rule_without_reference (`bool`, defaults to False): rule classifier, VQA items without a
        reference: instead of failing, give the level a wrong answer to that question would get
        (the question's aspect alone; the answer is assumed wrong). Only for sets where nearly every
        answer hallucinates, such as Med-HallMark's released answers (the detection task).
    premise_rule (`bool`, defaults to True): Med-HallMark's counterfactual rule: an answer to a
        question of type "counterfactual" that is not correct counts as prompt-induced (0.6),
        whatever level the classifier gave (not confidence_weakening: its level comes from the answer).

Returns:
    medihall_score (`float` or `None`): mean item score over the classified items.
    accuracy (`float` or `None`): Med-HallMark's ACC (Table 1, vqa only; `None` for irg): the share of
        classified answers whose level is "correct" (weight 1.0), 0-1.
    correct (`list` of `bool`, vqa only): per item, whether its level is "correct"; `None` if failed.
    level_distribution (`dict`): level -> count (answers for vqa, sentences for irg).
    levels (`list`): per item, the level key (vqa) or the list of sentence levels (irg); `None` if failed.
    item_scores (`list` of `float`): per item score; `None` if failed.
    reasons (`list`): per item, why (the rule that fired, or the judge's reason for irg).
    failed (`list` of `dict`): `{"id", "reason"}` for items without a level.
    n (`int`), n_failed (`int`), task, classifier, prompt_version,
    usage (`dict` or `None`): judge calls/tokens (`None` for the rule classifier),
    judge (`dict` or `None`): the judge's description (backend, model, endpoint; never a key).

Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/medihall_score")  # doctest: +SKIP
    >>> out = metric.compute(
    ...     predictions=["Yes, the lungs are normal.", "The image is an axial CT.", "No."],
    ...     references=["No", "Coronal", "No"],
    ...     questions=["Are the lungs normal?", "In which plane is this image?", "Is there a fracture?"],
    ... )  # doctest: +SKIP
    >>> out["levels"], round(out["medihall_score"], 4)  # doctest: +SKIP
    (['catastrophic', 'minor', 'correct'], 0.6)
"""

_TASKS = {"vqa": medheval.families.med_hallmark.VQA_LEVELS, "irg": medheval.families.med_hallmark.IRG_LEVELS}
_CLASSIFIERS = ("rule", "judge", "detector")


def _check_answer_type(index, answer_type):
    """Refuse an ``answer_types`` entry that is neither ``None``, a canonical answer type nor a close-ended spelling
    (``binary``, ``closed`` ...): the rules would read a typo as an open answer."""
    if answer_type is None or answer_type in medheval.data.schema.ANSWER_TYPES:
        return
    try:
        medheval.scoring.parsing.canonical_answer_type(answer_type)
    except ValueError:
        raise ValueError(f"answer_types[{index}] is {answer_type!r}: expected one of "
                         f"{list(medheval.data.schema.ANSWER_TYPES)} (or None)") from None


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"classifier": str | None, "judge": str | dict | object | None, "detector_path": str | None,
                "cache_dir": str | bool | None, "allow_remote_credentialed": str | list[str] | None,
                "question_types": list | None, "images": list | None, "task": str | None,
                "upstream_dir": str | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MedihallScore(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """MediHall Score with a rule, LLM-judge or detector classifier."""
    MISSING_AS = {"references": ""}  # no ground truth, at any index

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

    def compute(self, *args, **kwargs):
        """`evaluate.Metric.compute`, then close the SQLite cache connections of judges this metric made."""
        try:
            return super().compute(*args, **kwargs)
        finally:
            from medheval.judges import close_judges

            close_judges(self)

    def _judge(self, spec, **options):
        """One judge per (spec, options) for the life of this metric instance (`medheval.judges.judge_for`)."""
        from medheval.judges import judge_for

        return judge_for(self, spec, **options)

    def _compute(
        self,
        predictions,
        references,
        questions=None,
        task=None,
        question_types=None,
        categories=None,
        answer_types=None,
        choices=None,
        ids=None,
        credentialed=None,
        images=None,
        classifier=None,
        judge=None,
        detector_path=None,
        cache_dir=None,
        concurrency=16,
        allow_remote_credentialed=None,
        overlap=1.0,
        prompt_style="json",
        upstream_dir=None,
        premise_rule=True,
        rule_without_reference=False,
    ):
        mh = medheval.families.med_hallmark
        if task is None:  # (answer_types may be a pandas Series or numpy array: no truth value of its own)
            types = [] if answer_types is None else list(answer_types)
            task = "irg" if types and all(t == "report" for t in types) else "vqa"
        if prompt_style not in mh.PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {mh.PROMPT_STYLES}, got {prompt_style!r}")
        if task not in _TASKS:
            raise ValueError(f"task must be 'vqa' or 'irg', got {task!r}")
        if classifier is None:  # run_eval.py --judge sets judge= for every metric that takes one
            classifier = "judge" if judge is not None else "detector" if detector_path else "rule"
        if classifier not in _CLASSIFIERS:
            raise ValueError(f"classifier must be one of {_CLASSIFIERS}, got {classifier!r}")
        if isinstance(overlap, bool) or not isinstance(overlap, numbers.Real) or not 0 < overlap <= 1:
            raise ValueError(f"overlap={overlap!r}: expected a number in (0, 1], the fraction of the reference's content "
                             "words an open answer must contain to count as correct (1 = all, the default)")
        n = len(predictions)
        questions = medheval.scoring.metric_inputs.per_item_column("questions", questions, n, missing=None,
                                                                  kind="text")
        question_types = medheval.scoring.metric_inputs.per_item_column(
            "question_types" if question_types is not None else "categories",
            question_types if question_types is not None else categories, n, missing=None, kind="label")
        answer_types = medheval.scoring.metric_inputs.per_item_column("answer_types", answer_types, n, missing=None,
                                                                     kind="text")
        for i, answer_type in enumerate(answer_types or []):
            _check_answer_type(i, answer_type)
        choices = medheval.scoring.metric_inputs.options_column("choices", choices, n, missing=None)
        credentialed = medheval.scoring.metric_inputs.credentialed_column(credentialed, n)
        images = medheval.scoring.metric_inputs.per_item_column("images", images, n, missing=None)
        ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in medheval.scoring.metric_inputs.per_item_column("ids", ids, n, missing=None)]

        levels, reasons, failures = [None] * n, [None] * n, {}
        judge_obj, usage = None, None
        if classifier == "rule":
            for i in range(n):
                if task == "vqa":
                    unreadable = mh.unreadable_vqa_answer(predictions[i], references[i], answer_types[i], choices[i])
                    if unreadable is not None:
                        failures[i] = unreadable
                        continue
                    got = mh.classify_vqa_rule(predictions[i], references[i], questions[i], question_types[i],
                                               answer_types[i], choices[i], overlap=float(overlap))
                    if got is None and rule_without_reference:
                        got = mh.classify_vqa_aspect(questions[i], question_types[i])
                    if got is not None:
                        levels[i], reasons[i] = got.level, got.reason
                else:
                    got = mh.classify_irg_rule(predictions[i], references[i])
                    if got is not None and got:
                        levels[i] = [c.level for _, c in got]
                        reasons[i] = [c.reason for _, c in got]
                    elif got is not None:
                        failures[i] = "the generated report has no sentences"
                if got is None:
                    failures[i] = "no reference: the rule classifier compares with a reference (use classifier='judge')"
        else:
            judge_obj = self._classifier_judge(classifier, judge, detector_path, cache_dir, concurrency,
                                               allow_remote_credentialed)
            before = judge_obj.usage()
            self._run_judge(judge_obj, task, predictions, references, questions, ids, credentialed, images,
                            levels, reasons, failures, prompt_style, upstream_dir)
            usage = {key: value - before.get(key, 0) for key, value in judge_obj.usage().items()}

        if task == "vqa" and premise_rule:
            for i, level in enumerate(levels):
                moved = mh.premise_level(level, question_types[i])
                if moved != level:
                    levels[i], reasons[i] = moved, f"counterfactual premise: {level} counted as prompt-induced"
        if task == "vqa":
            item_scores = [None if level is None else mh.WEIGHTS[level] for level in levels]
            flat = levels
        else:
            item_scores = [None if level is None else mh.report_score(level) for level in levels]
            flat = [level for item in levels if item for level in item]
        return {
            "medihall_score": mh.medihall_score(item_scores),
            "accuracy": mh.vqa_accuracy(levels) if task == "vqa" else None,
            **({"correct": mh.vqa_correct(levels)} if task == "vqa" else {}),
            "level_distribution": mh.level_distribution(flat, _TASKS[task]),
            "levels": levels,
            "item_scores": item_scores,
            "reasons": reasons,
            "failed": [{"id": ids[i], "reason": failures[i]} for i in sorted(failures)],
            "n": n - len(failures),
            "n_failed": len(failures),
            "task": task,
            "classifier": classifier,
            "prompt_version": None if classifier == "rule" else mh.PROMPT_VERSION if prompt_style == "json"
            else "med-hallmark-upstream@" + medheval.families.med_hallmark.source.COMMIT[:8],
            "usage": usage,
            "judge": None if judge_obj is None else judge_obj.describe(),
        }

    def _classifier_judge(self, classifier, judge, detector_path, cache_dir, concurrency, allow_remote_credentialed):
        options = {"cache_dir": cache_dir, "concurrency": int(concurrency),
                   "allow_remote_credentialed": allow_remote_credentialed}
        if classifier == "judge":
            if judge is None:
                raise ValueError("classifier='judge' needs judge=, e.g. 'openai:gpt-4o@http://127.0.0.1:8000/v1', "
                                 "'anthropic:claude-3-5-sonnet-20240620' or a dict (see medheval.judges.make_judge)")
            return self._judge(judge, **options)
        if not detector_path:
            raise ValueError("classifier='detector' needs detector_path=: the local folder of a MediHallDetector-style "
                             "checkpoint (Med-HallMark has not released MediHallDetector's weights)")
        path = os.path.expanduser(str(detector_path))
        if not os.path.isdir(path):
            raise ValueError(f"detector_path {detector_path!r} is not a folder: give the local folder of the detector "
                             "checkpoint (config.json, weights, tokenizer/processor)")
        return self._judge({"backend": "transformers", "model": path}, **options)

    @staticmethod
    def _run_judge(judge, task, predictions, references, questions, ids, credentialed, images,
                   levels, reasons, failures, prompt_style="json", upstream_dir=None):
        from medheval.judges import JudgeRequest

        mh = medheval.families.med_hallmark
        requests, index = [], []
        for i in range(len(predictions)):
            has_ref = references[i] is not None and str(references[i]).strip() != ""
            item_images = list(images[i] or [])
            common = {"id": ids[i], "credentialed": credentialed[i], "images": item_images}
            if task == "vqa":
                if not has_ref and not item_images:
                    failures[i] = "no reference and no image: nothing to judge the answer against"
                    continue
                system, user = mh.vqa_prompt(questions[i] or "", predictions[i] or "", references[i],
                                             style=prompt_style, upstream_dir=upstream_dir)
                validate = mh.vqa_validator() if prompt_style == "json" else mh.vqa_text_validator()
                requests.append(JudgeRequest(system=system, user=user, validate=validate,
                                             reply_format="json" if prompt_style == "json" else "text", **common))
            else:
                if not has_ref:
                    failures[i] = "no reference report"
                    continue
                sentences = mh.split_sentences(predictions[i])
                if not sentences:
                    failures[i] = "the generated report has no sentences"
                    continue
                if prompt_style == "json":
                    system, user = mh.irg_prompt(references[i], sentences=sentences)
                    request = JudgeRequest(system=system, user=user, validate=mh.irg_validator(len(sentences)), **common)
                else:
                    system, user = mh.irg_prompt(references[i], predictions[i], style="upstream",
                                                 upstream_dir=upstream_dir)
                    request = JudgeRequest(system=system, user=user, validate=mh.irg_text_validator(),
                                           reply_format="text", **common)
                requests.append(request)
            index.append(i)
        for i, result in zip(index, judge.run(requests)):
            if not result.ok:
                failures[i] = result.error or "the judge gave no usable answer"
            elif task == "vqa":
                levels[i] = result.value
            else:
                levels[i] = [c.level for c in result.value]
                reasons[i] = [c.reason for c in result.value]

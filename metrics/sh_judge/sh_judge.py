# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""S_h: MedHEval's LLM-judged 0-5 hallucination score for open-ended medical answers."""

import json

import datasets
import evaluate
import medheval.scoring.metric_inputs
import medheval.families.medheval.sh_prompt


_CITATION = """\
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
"""

_DESCRIPTION = """\
S_h, the knowledge hallucination score of MedHEval: an LLM judge rates each open-ended answer
against the ground truth on an integer scale 0-5 (0 = agrees fully, 1-2 = mostly accurate with
minor unconfirmed details, 3-4 = significant deviations or unsupported claims, 5 = entirely
incorrect or harmful; judged on directness, accuracy and relevance, accurate extra information
not penalised). Lower is better. Reported as mean +- std over the set, with per-item scores and
the judge's rationales. Items the judge could not score (invalid output after the retry budget,
no reference) are listed in `failed` and left out of the mean, never scored 0. The judge is any
backend of `medheval.judges` (OpenAI-compatible, Anthropic, local transformers): cached on
disk, concurrent, with retries, and refusing to send credentialed (PhysioNet-derived) records
to a non-local endpoint without an explicit opt-in. Mode "single" judges one answer per call;
mode "multi" judges several models' answers to one question in one call, as the paper did.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: mode "single": `list` of `str`, one answer per item. Mode "multi": per item a
        `dict` model -> answer, or a `list` of answers in the order of `models`.
    references (`list` of `str`): ground-truth answers.
    questions (`list` of `str`): the questions.
    ids (`list` of `str`, *optional*): item ids used in `failed` (default: the item index).
    credentialed (`list` of `bool`/`None`, or one `bool`, *optional*): items derived from credentialed
        (PhysioNet) data. Not given (or `None` for an item): unknown, treated as credentialed, so
        only a local judge (or one named in allow_remote_credentialed) gets them; pass `False` for
        data that is not credentialed. run_eval.py passes each record's meta['credentialed'].
    judge (`str`, `dict` or `medheval.judges.Judge`): "backend:model[@base_url]", e.g.
        "openai:gpt-4o@http://127.0.0.1:8000/v1" or "anthropic:claude-3-5-sonnet-20240620", or a
        dict {"backend", "model", "base_url", "api_key", ...} (keys otherwise from the environment).
    mode (`str`, defaults to "single"): "single" or "multi".
    models (`list` of `str` or `dict`, *optional*): mode "multi": the model names for list
        predictions, or a dict model -> list of answers (then `predictions` may be omitted).
    cache_dir, concurrency (defaults to 16), allow_remote_credentialed: passed to `make_judge`.
    prompt_style (`str`, defaults to "json"): "json" (this project's wording, score + rationale) or
        "upstream" (MedHEval's exact prompt, read at run time with `ast` from the pinned,
        sha256-verified `knowledge_hallucination_score.py`; answers keyed model_1..k, bare scores).
    upstream_dir (`str`, *optional*): local copy of the MedHEval repository root for
        prompt_style="upstream" (default: the pinned download / cache).

Returns:
    sh (`float`; `dict` model -> `float` in mode "multi"): mean score over the scored items.
    sh_std: population standard deviation (same shape as `sh`).
    scores (`list`): per item, the score (`None` if failed); in mode "multi" a dict model -> score.
    rationales (`list`): per item, the judge's one-sentence rationale (dict per item in "multi").
    failed (`list` of `dict`): `{"id", "reason"}` (plus `"model"` in mode "multi").
    n (`int` or `dict`), n_failed (`int`), usage (`dict`: judge requests, cache hits, failures,
    retries, tokens), judge (`dict`: backend, model, endpoint; never a key), prompt_version, mode.

Examples:
    >>> import evaluate
    >>> sh = evaluate.load("metrics/sh_judge")  # doctest: +SKIP
    >>> out = sh.compute(predictions=["Metformin is first-line."], references=["Metformin"],
    ...                  questions=["What is the first-line drug for type 2 diabetes?"],
    ...                  judge="openai:qwen2.5-7b-instruct@http://127.0.0.1:8000/v1")  # doctest: +SKIP
    >>> out["sh"], out["scores"]  # doctest: +SKIP
    (0.0, [0])
"""


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"judge": str | dict | object | None, "models": list | dict | None, "cache_dir": str | bool | None,
                "allow_remote_credentialed": str | list[str] | None, "upstream_dir": str | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ShJudge(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """S_h hallucination score (0-5, lower is better) from an LLM judge."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
                datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                   "references": datasets.Value("string")}),
            ],
            homepage="https://github.com/Aofei-Chang/MedHEval",
            codebase_urls=["https://github.com/Aofei-Chang/MedHEval"],
            reference_urls=["https://arxiv.org/abs/2503.02157"],
        )

    def compute(self, *, predictions=None, references=None, **kwargs):
        """Multi-mode inputs (dict per item, or ``models`` as a dict of answer lists) become lists of
        answers in a fixed model order before evaluate stores them."""
        models = kwargs.get("models")
        predictions = medheval.scoring.metric_inputs.as_list(predictions)  # a generator is read twice below
        if isinstance(models, dict):
            names = [str(m) for m in models]
            columns = [list(v) for v in models.values()]
            if predictions is not None:
                raise ValueError("give predictions= or models= as a dict of answer lists, not both")
            if len({len(c) for c in columns}) > 1:
                lengths = {m: len(c) for m, c in zip(names, columns)}
                raise ValueError(f"models= answer lists differ in length: {lengths}")
            predictions = [list(row) for row in zip(*columns)]
            kwargs.update(models=names, mode="multi")
        elif predictions is not None and not isinstance(predictions, (str, bytes, dict)) and any(
                isinstance(p, dict) for p in predictions):
            for i, p in enumerate(predictions):
                if p is not None and not isinstance(p, dict):
                    raise ValueError(f"predictions[{i}] is {type(p).__name__} {p!r:.60}: with answers given as dicts "
                                     "(model name -> answer), give every item as one (None or {} for no answer)")
            if models is None:  # every model named in any item, in first-seen order
                models = dict.fromkeys(k for p in predictions for k in (p or {}))
            names = list(models)
            predictions = [[(p or {}).get(name) for name in names] for p in predictions]
            kwargs.update(models=[str(m) for m in names], mode="multi")
        try:
            return super().compute(predictions=predictions, references=references, **kwargs)
        finally:  # the SQLite cache connections of judges this metric made (they reopen on the next call)
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
        ids=None,
        credentialed=None,
        judge=None,
        mode="single",
        models=None,
        cache_dir=None,
        concurrency=16,
        allow_remote_credentialed=None,
        prompt_style="json",
        upstream_dir=None,
    ):
        from medheval.judges import JudgeRequest

        sp = medheval.families.medheval.sh_prompt
        if prompt_style not in sp.PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {sp.PROMPT_STYLES}, got {prompt_style!r}")
        upstream = prompt_style == "upstream"
        if mode not in ("single", "multi"):
            raise ValueError(f"mode must be 'single' or 'multi', got {mode!r}")
        if judge is None:
            raise ValueError("sh_judge needs judge=: a spec 'backend:model[@base_url]' (e.g. "
                             "'openai:gpt-4o@http://127.0.0.1:8000/v1', 'anthropic:claude-3-5-sonnet-20240620') "
                             "or a dict (see medheval.judges.make_judge)")
        n = len(predictions)
        questions = medheval.scoring.metric_inputs.per_item_column("questions", questions, n, missing=None,
                                                                  kind="text")
        credentialed = medheval.scoring.metric_inputs.credentialed_column(credentialed, n)
        ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in medheval.scoring.metric_inputs.per_item_column("ids", ids, n, missing=None)]
        if mode == "single" and any(isinstance(p, (list, tuple)) for p in predictions):
            raise ValueError("predictions hold several answers per item: use mode='multi' (with models=[names])")
        if mode == "multi":
            width = max((len(p) for p in predictions if p is not None), default=0)
            names = [str(m) for m in models] if models is not None else [f"model_{k + 1}" for k in range(width)]
            if any(p is not None and len(p) != len(names) for p in predictions):
                raise ValueError(f"mode 'multi': every item needs one answer per model ({len(names)}: {names})")
        judge_obj = self._judge(judge, cache_dir=cache_dir, concurrency=int(concurrency),
                                allow_remote_credentialed=allow_remote_credentialed)

        usage_before = judge_obj.usage()
        failed, requests, slots = [], [], []
        for i in range(n):
            reference = references[i]
            if reference is None or not str(reference).strip():
                failed.append((i, None, "no reference answer to judge against"))
                continue
            common = {"id": ids[i], "credentialed": credentialed[i]}
            if mode == "single" and upstream:  # the upstream prompt always takes a dict of answers
                system, user = sp.render_upstream(questions[i], reference, [predictions[i]], upstream_dir)
                validate = sp.multi_validator(1, sp.upstream_label)
                requests.append(JudgeRequest(system=system, user=user, validate=lambda r, v=validate: v(r)[0],
                                             **common))
                slots.append((i, None))
                continue
            if mode == "single":
                system, user = sp.render_single(questions[i], reference, predictions[i])
                requests.append(JudgeRequest(system=system, user=user, validate=sp.validate_single, **common))
                slots.append((i, None))
                continue
            present = [k for k, answer in enumerate(predictions[i] or []) if answer is not None]
            failed.extend((i, names[k], "no answer from this model") for k in range(len(names)) if k not in present)
            if not present:
                continue
            answers = [predictions[i][k] for k in present]
            if upstream:
                system, user = sp.render_upstream(questions[i], reference, answers, upstream_dir)
                validate = sp.multi_validator(len(present), sp.upstream_label)
            else:
                system, user = sp.render_multi(questions[i], reference, answers)
                validate = sp.multi_validator(len(present))
            requests.append(JudgeRequest(system=system, user=user, validate=validate, **common))
            slots.append((i, present))

        if mode == "single":
            scores, rationales = [None] * n, [None] * n
        else:
            scores = [{name: None for name in names} for _ in range(n)]
            rationales = [{name: None for name in names} for _ in range(n)]
        for (i, present), result in zip(slots, judge_obj.run(requests)):
            if not result.ok:
                reason = result.error or "the judge gave no usable answer"
                failed.extend([(i, None, reason)] if present is None else [(i, names[k], reason) for k in present])
            elif present is None:
                scores[i], rationales[i] = result.value["score"], result.value["rationale"]
            else:
                for k, entry in zip(present, result.value):
                    scores[i][names[k]], rationales[i][names[k]] = entry["score"], entry["rationale"]

        failed.sort(key=lambda entry: entry[0])
        out = {"scores": scores, "rationales": rationales}
        if mode == "single":
            out["sh"], out["sh_std"], out["n"] = sp.summarize(scores)
            out["failed"] = [{"id": ids[i], "reason": reason} for i, _, reason in failed]
        else:
            summary = {name: sp.summarize([s[name] for s in scores]) for name in names}
            out["sh"] = {name: v[0] for name, v in summary.items()}
            out["sh_std"] = {name: v[1] for name, v in summary.items()}
            out["n"] = {name: v[2] for name, v in summary.items()}
            out["failed"] = [{"id": ids[i], "model": model, "reason": reason} for i, model, reason in failed]
            out["models"] = names
        usage = {key: value - usage_before.get(key, 0) for key, value in judge_obj.usage().items()}
        out.update(n_failed=len(out["failed"]), usage=usage, judge=judge_obj.describe(),
                   prompt_version=sp.UPSTREAM_PROMPT_VERSION if upstream else sp.PROMPT_VERSION, mode=mode,
                   prompt_style=prompt_style)
        return out

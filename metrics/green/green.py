# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""GREEN: matched findings / (matched findings + clinically significant errors), from a judge's error counts."""

import datasets
import evaluate
import medheval.scoring.green
import medheval.scoring.metric_inputs


_CITATION = """\
@inproceedings{ostmeier2024green,
  title     = {{GREEN}: Generative Radiology Report Evaluation and Error Notation},
  author    = {Ostmeier, Sophie and Xu, Justin and Chen, Zhihong and Varma, Maya and Blankemeier, Louis and
               Bluethgen, Christian and Michalson, Arne Edward and Moseley, Michael and Langlotz, Curtis and
               Chaudhari, Akshay S and Delbrouck, Jean-Benoit},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2024},
  year      = {2024}
}
"""

_DESCRIPTION = """\
GREEN (Ostmeier et al., 2024) asks a judge to compare a generated report with its reference and count
clinically significant and insignificant errors in six categories ((a) false finding, (b) missed
finding, (c) wrong location, (d) wrong severity, (e) comparison not in the reference, (f) omitted
comparison with a prior study) and the matched findings. Per report

    GREEN = matched / (matched + sum of significant errors (a)-(f)),   0 when nothing matched,

in [0, 1], higher is better; the metric is the mean over the reports whose reply could be read. The
prompt is GREEN's own, read at run time from the pinned, sha256-verified `green_score/utils.py`
(`medheval.scoring.green`). The judge is any backend of `medheval.judges` (`judge=`) or a GREEN model
folder run locally through transformers (`green_model=`). A reply that cannot be read (no matched
count, no significant-errors section, a category without a count) is counted in `n_unparseable` and
`failed`, never scored.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated reports.
    references (`list` of `str`): reference reports.
    ids (`list` of `str`, *optional*): item ids used in `failed` (default: the index).
    credentialed (`list` of `bool`/`None`, or one `bool`, *optional*): items from credentialed data
        (unknown is treated as credentialed: only a local judge gets them).
    judge (`str`, `dict` or `medheval.judges.Judge`, *optional*): "backend:model[@base_url]".
    green_model (`str`, *optional*): a local GREEN model folder (e.g. a download of
        StanfordAIMI/GREEN-radllama2-7b), loaded with AutoModelForCausalLM; GREEN's chat layout is set
        on its tokenizer. When given, it is used and `judge` is not (a run's --judge may be meant for
        other metrics); `judge_note` then says so.
    max_tokens (`int`, *optional*, defaults to 1024): new tokens per reply.
    batch_size (`int`, *optional*, defaults to 8), device (`str`, *optional*): for `green_model`.
    cache_dir, concurrency (defaults to 16), allow_remote_credentialed: passed to the judge.
    upstream_dir (`str`, *optional*): a local copy of the GREEN repository root holding
        `green_score/utils.py` (default: the pinned download / cache).

Returns:
    green (`float`): mean GREEN over the parsed replies (`None` if none); green_std (population).
    green_per_item (`list` of `float`/`None`): per report, input order (None: unparseable or failed).
    matched_per_item (`list` of `int`/`None`), significant_errors_per_item (`list` of `int`/`None`).
    significant_by_category, insignificant_by_category (`dict` category -> total count over parsed replies).
    n (`int`): parsed replies; n_unparseable (`int`): replies received but not readable;
    n_failed (`int`) and failed (`list` of `{"id", "reason"}`): every item without a score.
    usage, judge (`dict`), prompt_version (`str`).

Examples:
    >>> import evaluate
    >>> green = evaluate.load("metrics/green")  # doctest: +SKIP
    >>> out = green.compute(predictions=["Small left effusion."], references=["Left pleural effusion."],
    ...                     judge="openai:qwen2.5-7b-instruct@http://127.0.0.1:8000/v1")  # doctest: +SKIP
    >>> out["green"], out["n_unparseable"]  # doctest: +SKIP
    (1.0, 0)
"""

OPTION_TYPES = {"judge": str | dict | object | None, "green_model": str | None, "cache_dir": str | bool | None,
                "allow_remote_credentialed": str | list[str] | None, "upstream_dir": str | None,
                "device": str | None}
_UNPARSEABLE = "unparseable GREEN reply"


def _green_tokenizer(path):
    """The model folder's tokenizer, left-padded, with GREEN's chat layout (as the green_score package sets it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.chat_template = medheval.scoring.green.CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _validate(text):
    """The parsed counts; a ValueError names what is missing (the judge layer then counts the reply as failed)."""
    try:
        return medheval.scoring.green.parse_reply(text)
    except ValueError as err:
        raise ValueError(f"{_UNPARSEABLE}: {err}") from None


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Green(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """GREEN score from an LLM judge or a local GREEN model (higher is better)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
            homepage="https://github.com/Stanford-AIMI/GREEN",
            codebase_urls=["https://github.com/Stanford-AIMI/GREEN"],
            reference_urls=["https://arxiv.org/abs/2405.03595"],
        )

    def compute(self, *, predictions=None, references=None, **kwargs):
        """evaluate's compute; the judges' cache connections are closed when it ends."""
        try:
            return super().compute(predictions=predictions, references=references, **kwargs)
        finally:  # the SQLite cache connections of the judges this metric made
            from medheval.judges import close_judges

            close_judges(self)

    def _judge(self, judge, green_model, **options):
        from medheval.judges import judge_for

        if judge is None and green_model is None:
            raise ValueError("green needs judge= (a spec 'backend:model[@base_url]', e.g. "
                             "'openai:gpt-4o@http://127.0.0.1:8000/v1', or a dict) or green_model= (a local GREEN "
                             "model folder)")
        batch = {key: options.pop(key) for key in ("batch_size", "device")}
        if green_model is None:
            return judge_for(self, judge, **options)
        # a fine-tuned GREEN model answers in its format at once: a corrective follow-up would not help
        return judge_for(self, {"backend": "transformers", "model": str(green_model)},
                         tokenizer=_green_tokenizer(green_model), max_invalid_retries=0,
                         **{k: v for k, v in batch.items() if v is not None}, **options)

    def _compute(self, predictions, references, ids=None, credentialed=None, judge=None, green_model=None,
                 max_tokens=1024, batch_size=8, device=None, cache_dir=None, concurrency=16,
                 allow_remote_credentialed=None, upstream_dir=None):
        from medheval.judges import JudgeRequest

        n = len(predictions)
        ids = [str(i) for i in range(n)] if ids is None else [
            str(i) for i in medheval.scoring.metric_inputs.per_item_column("ids", ids, n)]
        credentialed = medheval.scoring.metric_inputs.credentialed_column(credentialed, n)
        judge_obj = self._judge(judge, green_model, cache_dir=cache_dir, concurrency=int(concurrency),
                                allow_remote_credentialed=allow_remote_credentialed, max_tokens=int(max_tokens),
                                batch_size=int(batch_size), device=device)
        usage_before = judge_obj.usage()
        failed, requests, slots = [], [], []
        for i in range(n):
            if not str(references[i] or "").strip():
                failed.append((i, "no reference report to compare with"))
                continue
            prompt = medheval.scoring.green.render(references[i], predictions[i], upstream_dir)
            messages = [{"role": "user", "content": prompt}]
            if green_model is not None:  # the green_score package's layout: an empty assistant turn, then the reply
                messages.append({"role": "assistant", "content": ""})
            requests.append(JudgeRequest(id=ids[i], messages=messages, credentialed=credentialed[i],
                                         validate=_validate, reply_format="text"))
            slots.append(i)
        green, matched, significant = [None] * n, [None] * n, [None] * n
        by_category = {"significant": dict.fromkeys(medheval.scoring.green.CATEGORIES, 0),
                       "insignificant": dict.fromkeys(medheval.scoring.green.CATEGORIES, 0)}
        n_unparseable = 0
        for i, result in zip(slots, judge_obj.run(requests)):
            if not result.ok:
                reason = result.error or "the judge gave no usable answer"
                n_unparseable += _UNPARSEABLE in reason
                failed.append((i, reason))
                continue
            counts = result.value
            matched[i], significant[i] = counts["matched"], sum(counts["significant"])
            green[i] = medheval.scoring.green.green_score(counts["matched"], counts["significant"])
            for kind in ("significant", "insignificant"):
                for name, count in zip(medheval.scoring.green.CATEGORIES, counts[kind] or []):
                    by_category[kind][name] += count
        failed.sort(key=lambda entry: entry[0])
        scored = [g for g in green if g is not None]
        mean = sum(scored) / len(scored) if scored else None
        std = (sum((g - mean) ** 2 for g in scored) / len(scored)) ** 0.5 if scored else None
        usage = {key: value - usage_before.get(key, 0) for key, value in judge_obj.usage().items()}
        return {"green": mean, "green_std": std, "green_per_item": green, "matched_per_item": matched,
                "significant_errors_per_item": significant,
                "significant_by_category": by_category["significant"],
                "insignificant_by_category": by_category["insignificant"],
                "n": len(scored), "n_unparseable": n_unparseable, "n_failed": len(failed),
                "failed": [{"id": ids[i], "reason": reason} for i, reason in failed],
                "usage": usage, "judge": judge_obj.describe(), "prompt_version": medheval.scoring.green.PROMPT_VERSION,
                **({"judge_note": "green_model was used; judge= was not"} if judge is not None
                   and green_model is not None else {})}

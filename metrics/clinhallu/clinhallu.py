# Copyright 2026 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""ClinHallu stage-wise metrics: accuracy per setting, Δ of stage replacement, stage hallucination
rates H^V/H^K/H^R, and Fix/Break rates per setting, overall and per source."""

import datasets
import evaluate

import medheval.scoring.metric_inputs


_CITATION = """\
@misc{clinhallu,
  title        = {ClinHallu},
  author       = {{Alibaba DAMO Academy}},
  howpublished = {https://github.com/alibaba-damo-academy/ClinHallu}
}
"""

_DESCRIPTION = """\
ClinHallu asks a model for a three-stage reasoning trace (Visual Recognition, Knowledge Recall,
Reasoning + answer) in four settings: ORG (the model writes all of it), Rep-V (gold VR given),
Rep-K (the model's own VR + gold KR given) and Rep-VK (gold VR + gold KR given). Per item this
module takes the judged answer of each setting (1 correct, 0 wrong, None = no valid judged
answer: invalid or missing trace, failed judge) and three stage judgements (1 hallucinated,
0 not, None = not judged):

    acc_s     = #[correct_s = 1] / D_s
    delta_s   = acc_s - acc                                 (s = rep_v, rep_k, rep_vk)
    h_v       = #[h_v != 0] / n    (VR of the Rep-K trace: the model's own ORG VR it is given)
    h_k       = #[h_k != 0] / n    (KR written in the Rep-V run)
    h_r       = #[h_r != 0] / n    (reasoning written in the Rep-VK run)  (Eq. 12-13)
    fix_s     = #[ORG wrong and s right] / #[ORG wrong]
    break_s   = #[ORG right and s wrong] / #[ORG right]

Answer denominators. Default: D_s = all items (None counts as not correct, so an invalid trace
costs the model the item) and Fix/Break are taken over all items with None as wrong, which gives
delta_s = (n_fix_s - n_break_s) / n. With `upstream_compat=True` (ClinHallu's
`02_judge_answers.py` and `05_make_result_tables.py`): D_s = items whose answer is not None
(upstream scores valid traces only), accuracies rounded to 4 places and delta_s taken from the
rounded values; Fix/Break (which upstream does not compute) over the items valid in both ORG and s.

Stage denominators (`stage_denominator`). Default "all_items", the paper's Eq. 12-13:
H^s = (1/|D|) sum_i h_i^s over every item, and a stage that is empty, comes from an invalid
trace or has no judgement counts as hallucinated (as ClinHallu's released judge does; the paper
ties high H^R to failed or incomplete reasoning). "judged": #[h = 1] / #[h judged] (None left
out), which reads lower for exactly the models whose traces fail. `upstream_compat`
does not change the stage denominator. Settings left out of `settings` were not run: their rates
(the Δ, Fix/Break and stage rate needing them) are None. A rate with an empty denominator is None,
never 0.
"""

_KWARGS_DESCRIPTION = """
Args:
    correct (`list` of `int` or `None`): ORG answer judged correct (1) or not (0), per item; a float
        NaN (pandas' missing value) is read as `None`.
    correct_rep_v, correct_rep_k, correct_rep_vk (`list` of `int` or `None`): the same for Rep-V,
        Rep-K and Rep-VK.
    h_v, h_k, h_r (`list` of `int` or `None`): stage hallucination judgements (1 hallucinated).
    sources (`list` of `str`, *optional*): source dataset per item (vqa_rad, pathvqa, ...): gives
        `per_source`; a `None` entry (or NaN) is scored overall but left out of it.
    settings (`list` of `str`, *optional*): the settings that were run, from "org", "rep_v",
        "rep_k", "rep_vk" (default: all four); pass all-None columns for the others.
    upstream_compat (`bool`, *optional*, defaults to `False`): answer denominators as ClinHallu's
        scripts (see the description).
    stage_denominator (`str`, *optional*, defaults to `"all_items"`): H^V/H^K/H^R over all items with an
        unjudged stage counted as hallucinated (Eq. 13), or `"judged"`: over the judged stages only.

Returns:
    acc, acc_rep_v, acc_rep_k, acc_rep_vk (`float` or `None`): accuracy per setting.
    delta_v, delta_k, delta_vk (`float` or `None`): setting accuracy minus ORG accuracy.
    h_v, h_k, h_r (`float` or `None`): stage hallucination rates.
    fix_rate, break_rate (`dict`): rep_v / rep_k / rep_vk -> rate.
    counts (`dict`): n, and per setting n_valid, n_correct; per Rep setting n_fix, n_org_wrong,
        n_break, n_org_right; per stage n_judged, n_hallucinated.
    per_source (`dict`): source -> the same keys (without per_source).
    denominator (`str`): the answer denominator, "all_items" or "valid_only".
    stage_denominator (`str`): the stage denominator used, "all_items" (Eq. 13) or "judged".

Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/clinhallu")  # doctest: +SKIP
    >>> r = metric.compute(correct=[1, 0, 0, None], correct_rep_v=[1, 1, 0, 1],
    ...                    correct_rep_k=[0, 0, 1, None], correct_rep_vk=[1, 1, 1, 0],
    ...                    h_v=[0, 1, 1, None], h_k=[0, 0, 1, 0], h_r=[0, 0, 0, 1])  # doctest: +SKIP
    >>> r["acc"], r["acc_rep_v"], r["delta_v"], r["fix_rate"]["rep_v"], r["h_v"]  # doctest: +SKIP
    (0.25, 0.75, 0.5, 0.6666666666666666, 0.75)
"""

SETTINGS = ("org", "rep_v", "rep_k", "rep_vk")
REPLACEMENTS = ("rep_v", "rep_k", "rep_vk")
STAGE_RATES = ("h_v", "h_k", "h_r")
# the setting whose trace each stage rate judges (Eq. 12, read as ClinHallu's 05_make_result_tables.py reads it:
# VR of Rep-K, KR of Rep-V, reasoning of Rep-VK)
STAGE_SETTING = {"h_v": "rep_k", "h_k": "rep_v", "h_r": "rep_vk"}
STAGE_DENOMINATORS = ("all_items", "judged")
_ACC_KEY = {"org": "acc", "rep_v": "acc_rep_v", "rep_k": "acc_rep_k", "rep_vk": "acc_rep_vk"}
_DELTA_KEY = {"rep_v": "delta_v", "rep_k": "delta_k", "rep_vk": "delta_vk"}


def _ratio(hits, total):
    return hits / total if total else None


def _check_binary(name, values):
    for index, value in enumerate(values):
        if value is not None and value not in (0, 1):
            raise ValueError(f"item {index}: {name}={value!r}; expected 1, 0 or None (None = no valid judged "
                             "value, e.g. an invalid trace or a failed judge call; ClinHallu's -1 is None here)")
    return [None if value is None else int(value) for value in values]


def stage_metrics(columns, upstream_compat=False, settings=SETTINGS, stage_denominator="all_items"):
    """The metrics of one group of items; ``columns`` maps ``org``/``rep_*``/``h_*`` to per-item lists,
    ``settings`` names the settings that were run and ``stage_denominator`` is "all_items" (Eq. 13) or
    "judged"."""
    n = len(columns["org"])
    counts = {"n": n}
    result = {}
    org = columns["org"]
    for setting in SETTINGS:
        values = columns[setting]
        valid = [value for value in values if value is not None]
        ran = setting in settings
        n_correct = sum(valid)
        counts[setting] = {"n_valid": len(valid), "n_correct": n_correct}
        acc = _ratio(n_correct, len(valid) if upstream_compat else n) if ran else None
        if upstream_compat and acc is not None:
            acc = round(acc, 4)
        result[_ACC_KEY[setting]] = acc
    for setting in REPLACEMENTS:
        values = columns[setting]
        ran = setting in settings and "org" in settings
        before, after = [], []
        for base, swapped in zip(org, values) if ran else ():
            if upstream_compat and (base is None or swapped is None):
                continue
            before.append(base == 1)
            after.append(swapped == 1)
        n_org_wrong = sum(not b for b in before)
        n_org_right = sum(before)
        n_fix = sum(not b and a for b, a in zip(before, after))
        n_break = sum(b and not a for b, a in zip(before, after))
        counts[setting].update(n_fix=n_fix, n_org_wrong=n_org_wrong, n_break=n_break, n_org_right=n_org_right)
        result.setdefault("fix_rate", {})[setting] = _ratio(n_fix, n_org_wrong) if ran else None
        result.setdefault("break_rate", {})[setting] = _ratio(n_break, n_org_right) if ran else None
        acc, base_acc = result[_ACC_KEY[setting]], result["acc"]
        delta = None if acc is None or base_acc is None else acc - base_acc
        result[_DELTA_KEY[setting]] = round(delta, 4) if upstream_compat and delta is not None else delta
    for stage in STAGE_RATES:
        judged = [value for value in columns[stage] if value is not None]
        n_hallucinated = sum(judged)
        counts[stage] = {"n_judged": len(judged), "n_hallucinated": n_hallucinated}
        if STAGE_SETTING[stage] not in settings:
            result[stage] = None
        elif stage_denominator == "all_items":  # Eq. 13: 1/|D|, an unjudged stage counts as hallucinated
            result[stage] = _ratio(n_hallucinated + n - len(judged), n)
        else:
            result[stage] = _ratio(n_hallucinated, len(judged))
    result["counts"] = counts
    return result


def clinhallu_metrics(correct, correct_rep_v, correct_rep_k, correct_rep_vk, h_v, h_k, h_r, sources=None,
                      upstream_compat=False, settings=None, stage_denominator="all_items"):
    """All metrics, overall and per source (see the module description for the formulas)."""
    if stage_denominator not in STAGE_DENOMINATORS:
        raise ValueError(f"stage_denominator={stage_denominator!r}: expected one of {list(STAGE_DENOMINATORS)} "
                         "(\"all_items\": the paper's Eq. 13, an unjudged stage counts as hallucinated; \"judged\": "
                         "judged stages only)")
    named = {"org": ("correct", correct), "rep_v": ("correct_rep_v", correct_rep_v),
             "rep_k": ("correct_rep_k", correct_rep_k), "rep_vk": ("correct_rep_vk", correct_rep_vk),
             "h_v": ("h_v", h_v), "h_k": ("h_k", h_k), "h_r": ("h_r", h_r)}
    if not isinstance(upstream_compat, bool):  # "no" and "false" are truthy: they would switch the denominators
        raise ValueError(f"upstream_compat={upstream_compat!r}: expected True or False")
    if isinstance(settings, str):  # iterated, "org" would be the settings 'o', 'r', 'g'
        raise ValueError(f"settings={settings!r} is one string; pass a list of setting names, e.g. [{settings!r}]")
    settings = tuple(SETTINGS if settings is None else settings)
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; expected names from {SETTINGS}")
    n = len(correct)
    columns = {}
    for key, (name, values) in named.items():
        values = list(values)
        if len(values) != n:
            raise ValueError(f"Mismatch in the number of items: correct has {n}, {name} has {len(values)}")
        columns[key] = _check_binary(name, values)
    result = stage_metrics(columns, upstream_compat, settings, stage_denominator)
    result["per_source"] = {}
    if sources is not None:
        sources = medheval.scoring.metric_inputs.as_list(sources)
        if not isinstance(sources, (str, bytes, dict)) and len(sources) != n:
            raise ValueError(f"Mismatch in the number of items: correct has {n}, sources has {len(sources)}")
        sources = medheval.scoring.metric_inputs.per_item_column("sources", sources, n, kind="label")
        for source in sorted({s for s in sources if s is not None}):  # labels as text; a missing one left out
            rows = [i for i, s in enumerate(sources) if s == source]
            group = {key: [values[i] for i in rows] for key, values in columns.items()}
            result["per_source"][source] = stage_metrics(group, upstream_compat, settings, stage_denominator)
    result["denominator"] = "valid_only" if upstream_compat else "all_items"
    result["stage_denominator"] = stage_denominator
    return result


# per-item columns (lists, one value per item) and options, for medheval.scoring.metric_options
OPTION_TYPES = {"correct": list, "correct_rep_v": list, "correct_rep_k": list, "correct_rep_vk": list,
                "h_v": list, "h_k": list, "h_r": list, "sources": list | None, "settings": list | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ClinHallu(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """ClinHallu's Acc, Δ^V/Δ^K/Δ^VK, H^V/H^K/H^R and Fix/Break per setting."""
    # a missing judgement (None, or pandas' NaN) is None: unjudged
    MISSING_AS = dict.fromkeys(("correct", "correct_rep_v", "correct_rep_k", "correct_rep_vk", "h_v", "h_k", "h_r"))

    def _info(self):
        features = datasets.Features({name: datasets.Value("int8") for name in (
            "correct", "correct_rep_v", "correct_rep_k", "correct_rep_vk", "h_v", "h_k", "h_r")})
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=features,
            homepage="https://github.com/alibaba-damo-academy/ClinHallu",
            codebase_urls=["https://github.com/alibaba-damo-academy/ClinHallu"],
        )

    def _compute(self, correct, correct_rep_v, correct_rep_k, correct_rep_vk, h_v, h_k, h_r, sources=None,
                 upstream_compat=False, settings=None, stage_denominator="all_items"):
        return clinhallu_metrics(correct, correct_rep_v, correct_rep_k, correct_rep_vk, h_v, h_k, h_r,
                                 sources=sources, upstream_compat=upstream_compat, settings=settings,
                                 stage_denominator=stage_denominator)

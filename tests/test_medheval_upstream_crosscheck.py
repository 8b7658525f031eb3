"""``close_ended_accuracy`` with ``upstream_compat=True`` next to MedHEval's own close-ended scorer.

The upstream scorer files (``../shared/data/upstream/medheval-code/code/evaluation/close_ended_evaluation``:
``utils/eval_yesno.py``, ``utils/eval_multichoice.py``, ``eval_type23_close.py``) are imported and run
as released on every record of the six released close-ended files, each with a deterministic, varied
answer (yes/no words, negations, hedges, empty and white-space answers, leading ".", commas, letters,
option text, misspelt option text, junk). Per-item results must be identical. Skipped without ../shared.

Per-item results from upstream: ``evaluate_yes_no`` returns one accuracy per call (a group), so the
result of item i of a group whose last answer is L comes from the call on [i, L], which leaves
upstream's stale variable exactly as the whole group does, minus L's own result (the call on [L]).
``eval_mc`` writes one CSV row per scored item: a call on one item gives its result, or no row when
upstream skips it. The released ``type1_utils.py`` (the visual per-type aggregation) is not in the
shared copy, so the options of a multiple-choice item are built here the way it builds them (the
pieces between the letter markers, keyed by their first letter) and its weighted per-type mean is
checked against the formula (see ``medheval.scoring.parsing.upstream_group_accuracy``).
"""

from __future__ import annotations

import ast
import contextlib
import csv
import importlib.util
import io
import json
import random
import re
import sys
import types
from pathlib import Path

import pytest
from conftest import SHARED_UPSTREAM, load_metric_offline

from medheval.data.schema import HALLUCINATION_TYPE_TO_CATEGORY

REPO = Path(__file__).resolve().parents[1]
SHARED = SHARED_UPSTREAM  # ../shared/data/upstream, or under $MEDHEVAL_SHARED
CODE = SHARED / "medheval-code" / "code" / "evaluation" / "close_ended_evaluation"
DATA = SHARED / "medheval"
VISUAL = DATA / "Visual_Misinterpretation_Hallucination" / "close-ended" / "fine-grained"
FILES = {
    "slake": VISUAL / "slake_qa_pairs.json",
    "vqa_rad": VISUAL / "rad_vqa_pairs.json",
    "iu_xray": VISUAL / "xray_closed_pairs.json",
    "mimic_cxr": VISUAL / "mimic_cxr_closed_pairs.json",
    "knowledge": DATA / "Knowledge_Deficiency_Hallucination" / "close-ended" / "MIMIC-CXR_sampled.json",
    "context": DATA / "Context_Misalignment_Hallucination" / "MIMIC-CXR_pairs.json",
}
METRIC_DIR = REPO / "metrics" / "close_ended_accuracy"

pytestmark = pytest.mark.skipif(
    not (CODE / "utils" / "eval_yesno.py").is_file() or not all(p.is_file() for p in FILES.values()),
    reason="../shared/data/upstream (MedHEval scorer and data) is absent",
)


# --- the upstream scorer, imported as released ----------------------------------------------------


@pytest.fixture(scope="module")
def upstream():
    """``evaluate_yes_no``, ``eval_mc`` and eval_type23_close's ``eval_closed_single`` (its module
    body reads hard-coded paths, so only its functions are taken, through ``ast``)."""
    saved = {name: sys.modules.get(name) for name in ("utils", "utils.eval_utils", "utils.eval_yesno",
                                                       "utils.eval_multichoice")}
    package = types.ModuleType("utils")
    package.__path__ = [str(CODE / "utils")]
    sys.modules["utils"] = package
    try:
        loaded = {}
        for name in ("eval_utils", "eval_yesno", "eval_multichoice"):
            spec = importlib.util.spec_from_file_location(f"utils.{name}", CODE / "utils" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[f"utils.{name}"] = module
            spec.loader.exec_module(module)
            loaded[name] = module
        tree = ast.parse((CODE / "eval_type23_close.py").read_text())
        functions = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef)], type_ignores=[])
        namespace = {"evaluate_yes_no": loaded["eval_yesno"].evaluate_yes_no}
        exec(compile(functions, str(CODE / "eval_type23_close.py"), "exec"), namespace)  # noqa: S102 - test cross-check
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return types.SimpleNamespace(
        evaluate_yes_no=loaded["eval_yesno"].evaluate_yes_no,
        eval_mc=loaded["eval_multichoice"].eval_mc,
        eval_closed_single=namespace["eval_closed_single"],
    )


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def _quiet(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


# --- deterministic varied answers -----------------------------------------------------------------

_YES_NO = [
    "Yes", "No", "yes", "no", "Yes.", "No.", "YES", "no.", "Yes, there is.", "No, there is none.",
    "No\nthere is none", "Yes. There is no effusion.", "There is no evidence of it.", "The image does not show it.",
    "Not sure.", "I am not sure.", "Unclear", "It is unclear.", "Cannot be determined.", "Possibly.", "Maybe not",
    "Abnormal", "Normal", "not", "Not", "none", "The lungs are clear.", "It is a CT scan.", "organ is contours is",
    "There is a small pleural effusion.", "No effusion is seen.", "Nope", "no,", "No , it is not",
]
_BLANK = ["", " ", "   ", "\n", "\t ", ".", ". Yes", ".5 cm", "...", ",", ",,,", ", .", ", no", " . no"]


def _typo(rng: random.Random, text: str) -> str:
    if len(text) < 3:
        return text
    chars = list(text)
    for _ in range(rng.randint(1, 2)):
        i = rng.randrange(len(chars))
        op = rng.randrange(3)
        if op == 0:
            del chars[i]
        elif op == 1:
            chars.insert(i, rng.choice("aeiourstn"))
        else:
            chars[i] = rng.choice("aeiourstn")
    return "".join(chars)


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice("abcXYZ .,;:!?()-ABCDEF0123") for _ in range(rng.randint(1, 20)))


def _options(raw: str) -> list[str]:
    """The letter-prefixed option texts of a choices string (pieces between letter markers)."""
    starts = [m.start() for m in re.finditer(r"(?<!\w)([A-Z][:.])|([A-Z]\))", raw)]
    cuts = sorted(set([0] + starts))
    return [raw[a:b].strip(", ") for a, b in zip(cuts, cuts[1:] + [len(raw)])]


def _answer(rng: random.Random, record: dict, question: str, is_mc: bool) -> str:
    roll = rng.random()
    if roll < 0.12:
        return rng.choice(_BLANK)
    if roll < 0.17:
        return _junk(rng)
    if roll < 0.22:
        return record["answer"]
    if not is_mc:
        if roll < 0.25:
            return question
        return rng.choice(_YES_NO)
    options = _options(record["choices"])
    option = rng.choice(options) if options else ""
    text = re.sub(r"^\(?[A-Z][.:),]\s*", "", option)
    pick = rng.randrange(9)
    if pick == 0:
        return rng.choice("ABCDEF")
    if pick == 1:
        return rng.choice(["B.", "(C)", "Option D", "The answer is A.", "a", "E)"])
    if pick == 2:
        return option
    if pick == 3:
        return text
    if pick == 4:
        return _typo(rng, text)
    if pick == 5:
        return text.lower() + "."
    if pick == 6:
        return f"I think it is {text}, not {re.sub(r'^.. ', '', rng.choice(options) if options else '')}"
    if pick == 7:
        return rng.choice(_YES_NO)
    return "None of the above"


def _items(seed: int = 20251123) -> dict[str, list[dict]]:
    """Every record of the six files with its answer; some groups end on a blank answer on purpose."""
    rng = random.Random(seed)
    out = {}
    for name, path in FILES.items():
        records = json.loads(path.read_text())
        items = []
        for rec in records:
            kind = rec.get("question_type") or rec.get("ground_truth_type")
            is_mc = kind == "multi-choice"
            category = HALLUCINATION_TYPE_TO_CATEGORY.get(rec.get("hallucination_type"), name)
            items.append({"qid": rec["qid"], "answer": rec["answer"], "choices": rec.get("choices") or "",
                          "question_type": kind, "hallucination_type": rec.get("hallucination_type"),
                          "category": category, "is_mc": is_mc,
                          "text": _answer(rng, rec, rec["question"], is_mc)})
        out[name] = items
    # Force the stale-variable bug on some groups and keep others intact: the last yes/no answer of
    # SLAKE's anatomy and of the context file starts with "."; VQA-RAD's symptom group ends empty.
    for name, category, text in (("slake", "anatomy", ". yes"), ("context", "context", ".5"),
                                 ("vqa_rad", "symptom", ""), ("mimic_cxr", "symptom", "Yes")):
        last = [it for it in out[name] if not it["is_mc"] and it["category"] == category][-1]
        last["text"] = text
    return out


# --- upstream per-item results ----------------------------------------------------------------------


def _upstream_yes_no_items(upstream, group: list[dict]) -> list[bool]:
    def acc(members):
        return _quiet(upstream.evaluate_yes_no, [{"text": m["text"]} for m in members], [m["answer"] for m in members])

    last = group[-1]
    last_ok = acc([last])
    out = []
    for item in group[:-1]:
        pair = acc([item, last])
        out.append(round(2 * pair - last_ok) == 1)
    out.append(last_ok == 1)
    return out


def _upstream_mc_item(upstream, item: dict, tmp: Path) -> bool | None:
    sample = {"text": item["text"], "gt_ans": item["answer"]}
    for piece in _options(item["choices"]):
        if piece and piece[0] in "ABCDEF":
            sample["option_" + piece[0]] = piece
    out = tmp / "row.csv"
    upstream.eval_mc([sample], out_file=str(out))
    with open(out, newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    return None if not rows else rows[0][2] == "1"


def _ours(metric, items: list[dict], source: str) -> dict:
    return metric.compute(
        predictions=[it["text"] for it in items], references=[it["answer"] for it in items],
        answer_types=["multiple_choice" if it["is_mc"] else "yes_no" for it in items],
        raw_choices=[it["choices"] for it in items], choices=[it["choices"] for it in items],
        categories=[it["category"] for it in items], sources=[source] * len(items), upstream_compat=True,
    )


def test_per_item_results_identical_to_the_upstream_scorer(upstream, metric, tmp_path):
    data = _items()
    n_compared = n_identical = 0
    mismatches = []
    broken_groups = 0
    for name, items in data.items():
        ours = _ours(metric, items, name)["correct"]
        theirs: list[bool | None] = [None] * len(items)
        for category in sorted({it["category"] for it in items}):
            idx = [i for i, it in enumerate(items) if not it["is_mc"] and it["category"] == category]
            if idx:
                results = _upstream_yes_no_items(upstream, [items[i] for i in idx])
                broken_groups += not any(results) and len(results) > 1
                for i, ok in zip(idx, results):
                    theirs[i] = ok
        for i, it in enumerate(items):
            if it["is_mc"]:
                theirs[i] = _upstream_mc_item(upstream, it, tmp_path)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            n_compared += 1
            n_identical += a is b
            if a is not b and len(mismatches) < 10:
                mismatches.append((name, items[i]["qid"], items[i]["text"], items[i]["answer"], a, b))
    print(f"upstream close-ended cross-check: {n_identical} of {n_compared} items identical")
    assert n_compared == sum(len(v) for v in data.values()) == 13197
    assert broken_groups >= 2  # the forced blank endings did break their groups
    assert not mismatches, mismatches


def test_group_accuracies_match_upstream(upstream, metric, tmp_path):
    """Knowledge/context: eval_type23_close's ``eval_closed_single`` as released. Visual: per source and
    hallucination type, upstream's yes/no and multiple-choice accuracies weighted by their item
    counts (skipped multiple-choice items included), and the category means across sources."""
    data = _items()
    for name in ("knowledge", "context"):
        items = data[name]
        ori = [{"qid": it["qid"], "ground_truth_type": it["question_type"]} for it in items]
        results = [{"question_id": it["qid"], "text": it["text"], "gt_ans": it["answer"]} for it in items]
        expected = _quiet(upstream.eval_closed_single, ori, {o["qid"]: o for o in ori}, results)
        assert _ours(metric, items, name)["accuracy"] == pytest.approx(expected), name
    for sources in (("slake", "vqa_rad"), ("iu_xray", "mimic_cxr")):
        weighted: dict[str, list[float]] = {}
        for name in sources:
            items = data[name]
            for category in sorted({it["category"] for it in items}):
                yn = [it for it in items if not it["is_mc"] and it["category"] == category]
                mc = [it for it in items if it["is_mc"] and it["category"] == category]
                acc_yn = _quiet(upstream.evaluate_yes_no, [{"text": it["text"]} for it in yn],
                                [it["answer"] for it in yn]) if yn else 0
                acc_mc = upstream.eval_mc(
                    [dict({"text": it["text"], "gt_ans": it["answer"]},
                          **{"option_" + p[0]: p for p in _options(it["choices"]) if p and p[0] in "ABCDEF"})
                     for it in mc], out_file=str(tmp_path / "mc.csv")) if mc else 0
                expected = (acc_yn * len(yn) + acc_mc * len(mc)) / (len(yn) + len(mc))
                ours = _ours(metric, yn + mc, name)["accuracy"]
                assert ours == pytest.approx(expected), (name, category)
                total = weighted.setdefault(category, [0.0, 0])
                total[0] += expected * (len(yn) + len(mc))
                total[1] += len(yn) + len(mc)
        both = [it for name in sources for it in data[name]]
        ours = metric.compute(
            predictions=[it["text"] for it in both], references=[it["answer"] for it in both],
            answer_types=["multiple_choice" if it["is_mc"] else "yes_no" for it in both],
            raw_choices=[it["choices"] for it in both], categories=[it["category"] for it in both],
            sources=[name for name in sources for _ in data[name]], upstream_compat=True,
        )
        for category, (hits, n) in weighted.items():
            assert ours["accuracy_by_category"][category] == pytest.approx(hits / n), (sources, category)
        hits = sum(h for h, _ in weighted.values())
        assert ours["accuracy"] == pytest.approx(hits / sum(n for _, n in weighted.values()))

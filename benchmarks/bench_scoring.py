"""Time close-ended scoring: ``medheval.scoring.parsing.score_item`` and the evaluate module.

    python benchmarks/bench_scoring.py [--data-dir ../shared/data/upstream/medheval] [--repeat 3]

Uses the four released fine-grained visual close-ended files (9,197 items) when they are
present, otherwise 9,197 synthetic items in the same formats. Predictions are model-like
text generated from the references ("Yes, the image shows ...", "The answer is B.",
option text, misspellings, hedges), about a third of them wrong. Prints items/s for
``score_item`` with cold caches (the number that matters), with warm caches, for the
upstream-compatible rule, and for ``evaluate``'s ``compute`` end to end. Target: >= 50,000
items/s for cold ``score_item`` on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from pathlib import Path

from medheval.scoring import parsing

REPO = Path(__file__).resolve().parents[1]
DEFAULT_UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream" / "medheval"
FINE_GRAINED = "Visual_Misinterpretation_Hallucination/close-ended/fine-grained"
N_ITEMS = 9197
CATEGORIES = {"type_1": "anatomy", "type_2": "measurement", "type_3": "symptom", "type_4": "radiology"}

_SYN_FINDINGS = ["pleural effusion", "pneumothorax", "cardiomegaly", "consolidation", "a nodule", "the spleen",
                 "the liver", "a fracture", "pulmonary edema", "atelectasis", "a mass", "the kidneys"]
_SYN_OPTIONS = [["Pleural effusion", "Pneumonia", "Cardiomegaly", "Pulmonary edema"],
                ["X-ray", "Ultrasound", "CT Scan", "MRI"], ["Left lung", "Right lung", "Both lungs"],
                ["3.2 cm", "4.2 cm", "5.2 cm"], ["Axial", "Coronal", "Sagittal"],
                ["Liver", "Spleen", "Kidney", "Heart"]]
_SYN_FORMATS = ["{l}. {t}", "{l}: {t}", "{l}) {t}"]


def synthetic_records(n: int, seed: int = 0) -> list[dict]:
    """Records shaped like the fine-grained files (binary 70%, multi-choice 30%)."""
    rng = random.Random(seed)
    out = []
    for qid in range(n):
        htype = rng.choice(list(CATEGORIES))
        if rng.random() < 0.7:
            finding = rng.choice(_SYN_FINDINGS)
            out.append({"question": f"Is there {finding} in the image?", "answer": rng.choice(["Yes", "No"]),
                        "question_type": "binary", "choices": "", "hallucination_type": htype, "qid": qid})
        else:
            opts = rng.choice(_SYN_OPTIONS)
            fmt = rng.choice(_SYN_FORMATS)
            raw = ", ".join(fmt.format(l="ABCD"[i], t=t) for i, t in enumerate(opts))
            k = rng.randrange(len(opts))
            answer = rng.choice([fmt.format(l="ABCD"[k], t=opts[k]), opts[k], "ABCD"[k]])
            out.append({"question": "Which of the following is shown?", "answer": answer,
                        "question_type": "multi-choice", "choices": raw, "hallucination_type": htype, "qid": qid})
    return out


def load_records(data_dir: Path | None) -> tuple[list[dict], str]:
    if data_dir is not None:
        files = sorted((data_dir / FINE_GRAINED).glob("*.json"))
        if files:
            records = [rec for f in files for rec in json.loads(f.read_text())]
            return records, f"{len(files)} released fine-grained files under {data_dir}"
    return synthetic_records(N_ITEMS), "synthetic items"


_Q_LEAD = re.compile(r"^(?:is|are|does|do|can|was|were|has|have)\s+", re.I)


def _subject(question: str) -> str:
    return _Q_LEAD.sub("", question.strip().rstrip("?")).strip() or "the finding"


def make_prediction(rec: dict, choices: list[str], rng: random.Random) -> str:
    """A model-like answer, correct about two times in three."""
    subject = _subject(rec.get("question", ""))
    if rec["question_type"] == "binary":
        truth = parsing.parse_yes_no(rec["answer"]) or "yes"
        said = truth if rng.random() < 0.67 else ("no" if truth == "yes" else "yes")
        roll = rng.random()
        if roll < 0.05:
            return rng.choice(["Cannot be determined from the image.", "It is unclear.", "I'm not sure."])
        if said == "yes":
            return rng.choice([
                "Yes.", "Yes", f"Yes, the image shows that {subject}.", f"Yes, {subject}.",
                f"There is evidence that {subject}.", f"The image demonstrates that {subject} (q{rec.get('qid')}).",
            ])
        return rng.choice([
            "No.", "No", f"No, there is no evidence that {subject}.", f"There is no sign that {subject}.",
            f"The image does not show that {subject}.", f"No evidence of this finding (q{rec.get('qid')}).",
        ])
    n = max(len(choices), 1)
    ref = parsing.normalize_reference(rec["answer"], "multiple_choice", choices)
    k = ref if isinstance(ref, int) and rng.random() < 0.67 else rng.randrange(n)
    letter = "ABCDEFGH"[k]
    text = choices[k] if k < len(choices) else letter
    typo = text[:-2] + text[-1:] + text[-2:-1] if len(text) > 4 else text
    return rng.choice([
        f"The answer is {letter}.", letter, f"({letter}) {text}", f"{letter}. {text}", text,
        f"The image most likely shows {text.lower()}.", f"I think it is {typo}", f"Option {letter}",
    ])


def build_items(records: list[dict], seed: int = 0) -> dict[str, list]:
    rng = random.Random(seed)
    cols = {k: [] for k in ("predictions", "references", "answer_types", "choices", "categories", "raw_choices",
                            "questions")}
    for rec in records:
        raw = rec.get("choices") or ""
        choices = parsing.split_choices(raw) if rec["question_type"] != "binary" else []
        cols["predictions"].append(make_prediction(rec, choices, rng))
        cols["references"].append(rec["answer"])
        cols["answer_types"].append("yes_no" if rec["question_type"] == "binary" else "multiple_choice")
        cols["choices"].append(choices)
        cols["categories"].append(CATEGORIES.get(rec.get("hallucination_type"), "other"))
        cols["raw_choices"].append(raw)
        cols["questions"].append(rec.get("question") or "")
    return cols


def time_score_item(items: dict[str, list], warm: bool) -> tuple[float, float]:
    if not warm:
        parsing.clear_caches()
    rows = list(zip(items["predictions"], items["references"], items["answer_types"], items["choices"],
                    items["questions"]))
    began = time.perf_counter()
    correct = sum(parsing.score_item(p, r, t, c, question=q).correct for p, r, t, c, q in rows)
    elapsed = time.perf_counter() - began
    return elapsed, correct / len(rows)


def time_upstream(items: dict[str, list]) -> tuple[float, float]:
    parsing.clear_caches()
    began = time.perf_counter()
    hits = total = 0
    for p, r, t, raw in zip(items["predictions"], items["references"], items["answer_types"], items["raw_choices"]):
        ok = parsing.upstream_yes_no_correct(p, r) if t == "yes_no" else parsing.upstream_multiple_choice_correct(p, r, raw)
        if ok is not None:
            hits += ok
            total += 1
    return time.perf_counter() - began, hits / max(total, 1)


def time_metric(items: dict[str, list]) -> tuple[float, dict]:
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    metric = evaluate.load(str(REPO / "metrics" / "close_ended_accuracy"), keep_in_memory=True)
    parsing.clear_caches()
    began = time.perf_counter()
    result = metric.compute(
        predictions=items["predictions"], references=items["references"], answer_types=items["answer_types"],
        choices=items["choices"], categories=items["categories"], questions=items["questions"],
    )
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_UPSTREAM if DEFAULT_UPSTREAM.is_dir() else None)
    parser.add_argument("--repeat", type=int, default=3, help="cold runs of score_item; the best is reported")
    parser.add_argument("--no-metric", action="store_true", help="skip the evaluate module timing")
    args = parser.parse_args()

    records, source = load_records(args.data_dir)
    items = build_items(records)
    n = len(records)
    print(f"items: {n} ({source})")

    cold = min(time_score_item(items, warm=False)[0] for _ in range(max(args.repeat, 1)))
    warm, acc = time_score_item(items, warm=True)
    print(f"score_item, cold caches : {n / cold:12,.0f} items/s  ({cold * 1e3:.1f} ms)  accuracy {acc:.3f}")
    print(f"score_item, warm caches : {n / warm:12,.0f} items/s  ({warm * 1e3:.1f} ms)")
    up, up_acc = time_upstream(items)
    print(f"upstream-compatible rule: {n / up:12,.0f} items/s  ({up * 1e3:.1f} ms)  accuracy {up_acc:.3f}")
    if not args.no_metric:
        elapsed, result = time_metric(items)
        print(f"evaluate compute (all)  : {n / elapsed:12,.0f} items/s  ({elapsed * 1e3:.1f} ms)  "
              f"accuracy {result['accuracy']:.3f}, unparsed {result['n_unparsed']}, "
              f"bad references {result['n_bad_reference']}")
        print("accuracy by category    :", {k: round(v, 3) for k, v in result["accuracy_by_category"].items()})
    target = 50_000
    print(f"target {target:,} items/s (cold score_item): {'met' if n / cold >= target else 'NOT met'}")


if __name__ == "__main__":
    main()

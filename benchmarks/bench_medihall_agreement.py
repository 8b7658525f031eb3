"""Agreement of the MediHall ``rule`` classifier with Med-HallMark's human hallucination levels.

    python benchmarks/bench_medihall_agreement.py [--data-dir ../shared/data/upstream/med-hallmark] [--json out.json]

Med-HallMark's ``Conventional..json`` holds 499 LLaVA-Med answers to VQA-RAD questions with a
human level each (``classification_label`` 0 = catastrophic … 5 = correct). 364 carry the
ground truth (the rule classifier needs it); 135 use the no-ground-truth prompt. Reported:

1. the 364 with ground truth: the full rule classifier vs the humans (Cohen's κ, quadratic-
   weighted κ, exact agreement, confusion matrix) and the MediHall Score from either;
2. the 135 without ground truth: the question-aspect half of the rule alone (it assumes the
   answer is wrong, as 496 of the 499 human labels say) — a check on answers whose questions
   were not used while writing the keyword lists (they are paraphrases of the same VQA-RAD
   questions, so not independent);
3. all 499 (1 + 2) against the human MediHall Score (119.4 / 499 = 0.2393);
4. ``Counterfactual..json`` (111 answers, all labelled prompt-induced): with the
   ``counterfactual`` question type and from the text alone;
5. ``Irg.json`` (359 reports, no released labels): the rule's level distribution and score;
6. the rule classifier's speed.

The keyword lists were written from Med-HallMark's level definitions and then adjusted while
reading part 1's disagreements, so part 1 is an in-sample figure; part 2 is the more honest one.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from medheval.families import med_hallmark as mh
from medheval.families.med_hallmark.source import judged_records
from medheval.judges import agreement

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream" / "med-hallmark"


def _read(path: Path) -> list[dict]:
    """Records of a judged Med-HallMark file in the fields this script uses."""
    return [{"question": r["question"], "prediction": r["meta"]["released_response"],
             "reference": r["answer"] if r["meta"]["has_ground_truth"] else None, "level": r["meta"]["human_level"]}
            for r in judged_records(path, "conventional")]


def _labels(levels):
    return [mh.LEVEL_TO_LABEL[level] for level in levels]


def _score(levels):
    return mh.medihall_score([mh.WEIGHTS[level] for level in levels])


def _compare(human: list[str], predicted: list[str]) -> dict:
    stats = agreement(_labels(human), _labels(predicted))
    return {
        "n": stats["n"],
        "cohen_kappa": stats["cohen_kappa"],
        "quadratic_weighted_kappa": stats["quadratic_weighted_kappa"],
        "exact_agreement": stats["exact_agreement"],
        "medihall_score_human": _score(human),
        "medihall_score_rule": _score(predicted),
        "distribution_human": mh.level_distribution(human),
        "distribution_rule": mh.level_distribution(predicted),
        "confusion": {h: dict(Counter(p for hh, p in zip(human, predicted) if hh == h)) for h in mh.LEVELS},
    }


def _print_section(title: str, stats: dict) -> None:
    print(f"\n## {title}  (n = {stats['n']})")
    print(f"Cohen's kappa {stats['cohen_kappa']:.3f}   quadratic-weighted kappa {stats['quadratic_weighted_kappa']:.3f}"
          f"   exact agreement {stats['exact_agreement']:.3f}")
    print(f"MediHall Score: human {stats['medihall_score_human']:.4f}   rule {stats['medihall_score_rule']:.4f}")
    width = max(len(level) for level in mh.LEVELS)
    print(f"{'human/rule':>{width}}  " + "  ".join(f"{level[:6]:>6}" for level in mh.LEVELS))
    for human in mh.LEVELS:
        row = stats["confusion"][human]
        print(f"{human:>{width}}  " + "  ".join(f"{row.get(level, 0):>6}" for level in mh.LEVELS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR, help="folder holding Med-HallMark's JSON files")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    conventional = args.data_dir / "Conventional..json"
    if not conventional.is_file():
        raise SystemExit(f"{conventional} not found: pass --data-dir pointing at a copy of "
                         "github.com/ydk122024/Med-HallMark (commit 1eb83d8)")
    report: dict = {}
    records = _read(conventional)
    with_ref = [r for r in records if r["reference"] is not None]
    without_ref = [r for r in records if r["reference"] is None]

    start = time.perf_counter()
    rule_with = [mh.classify_vqa_rule(r["prediction"], r["reference"], r["question"]).level for r in with_ref]
    elapsed = time.perf_counter() - start
    report["with_ground_truth"] = _compare([r["level"] for r in with_ref], rule_with)
    _print_section("Conventional, with ground truth: rule classifier", report["with_ground_truth"])

    rule_without = [mh.ASPECT_LEVEL[mh.question_aspect(r["question"]) or "presence"] for r in without_ref]
    report["without_ground_truth_aspect_only"] = _compare([r["level"] for r in without_ref], rule_without)
    _print_section("Conventional, no ground truth: question aspect only (answer assumed wrong)",
                   report["without_ground_truth_aspect_only"])

    report["all_499"] = _compare([r["level"] for r in with_ref + without_ref], rule_with + rule_without)
    _print_section("Conventional, all answers (1 + 2)", report["all_499"])

    counterfactual = args.data_dir / "Counterfactual..json"
    if counterfactual.is_file():
        cf = _read(counterfactual)
        typed = [mh.classify_vqa_rule(r["prediction"], r["reference"], r["question"],
                                      question_type="counterfactual").level for r in cf]
        text_only = [mh.classify_vqa_rule(r["prediction"], r["reference"], r["question"]).level for r in cf]
        report["counterfactual"] = {
            "n": len(cf),
            "prompt_induced_with_question_type": sum(level == "prompt_induced" for level in typed) / len(cf),
            "prompt_induced_text_only": sum(level == "prompt_induced" for level in text_only) / len(cf),
            "distribution_text_only": mh.level_distribution(text_only),
        }
        c = report["counterfactual"]
        print(f"\n## Counterfactual (n = {c['n']}, all human-labelled prompt-induced)")
        print(f"prompt-induced: {c['prompt_induced_with_question_type']:.3f} with question_type='counterfactual', "
              f"{c['prompt_induced_text_only']:.3f} from the text alone")

    irg = args.data_dir / "Irg.json"
    if irg.is_file():
        reports = json.loads(irg.read_text(encoding="utf-8"))
        start_irg = time.perf_counter()
        classified = [mh.classify_irg_rule(r["Med-VLM answer"], r["ground-truth"]) for r in reports]
        irg_elapsed = time.perf_counter() - start_irg
        levels = [[c.level for _, c in item] for item in classified]
        report["irg_rule"] = {
            "n_reports": len(reports),
            "n_sentences": sum(len(item) for item in levels),
            "medihall_score_rule": mh.medihall_score([mh.report_score(item) for item in levels if item]),
            "distribution_rule": mh.level_distribution([x for item in levels for x in item], mh.IRG_LEVELS),
            "reports_per_second": len(reports) / irg_elapsed,
        }
        i = report["irg_rule"]
        print(f"\n## Irg.json (no released labels): {i['n_reports']} reports, {i['n_sentences']} sentences")
        print(f"rule MediHall Score {i['medihall_score_rule']:.4f}   distribution {i['distribution_rule']}")

    report["speed"] = {"vqa_items_per_second": len(with_ref) / elapsed}
    print(f"\nrule classifier: {report['speed']['vqa_items_per_second']:,.0f} VQA answers/s"
          + (f", {report['irg_rule']['reports_per_second']:,.0f} reports/s" if "irg_rule" in report else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

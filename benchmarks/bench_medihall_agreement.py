"""Agreement of the MediHall ``rule`` classifier with Med-HallMark's human hallucination levels.

    python benchmarks/bench_medihall_agreement.py [--data-dir ../shared/data/upstream/med-hallmark]
                                                  [--folds 5] [--json out.json]

Med-HallMark releases real Med-VLM (LLaVA-Med) answers with a human level each in
``Conventional..json`` (499 VQA-RAD answers; 364 with the ground truth in the prompt, 135 without)
and ``Counterfactual..json`` (111 SLAKE answers, all prompt-induced). ``Confidence_weakening.json``
and ``Irg.json`` carry no human levels. The levels are computed exactly as
``run_eval --task detection --detector rule`` does (the ``medihall_score`` metric with the runner's
inputs: category = split name, answer types; counterfactual rule off; items without ground truth get
the level a wrong answer to their question would get) and scored by ``medihall_detection``
(accuracy, Cohen's κ, quadratic-weighted κ over the six levels in order, confusion matrix).

Printed and written to ``--json``:

1. identity: each split's ground truth given as the prediction; MediHall Score 1.0 expected on every
   item with a ground truth (Med-HallMark Sec. 6.2);
2. agreement per split and subset, and overall over the splits whose κ is computable; counterfactual's
   111 human levels are one class (prompt-induced), so its κ is not computable (0/0 or 0 whatever the
   rule says) and it is left out of the overall; also counterfactual without its category (the premise
   read from the reference text alone);
3. conventional's κ out of sample: the rule's two settings (``overlap`` of open answers,
   ``default_aspect`` of unrecognised questions) tuned on K-1 folds, scored on the held-out fold, folds
   grouped by image so that paraphrases of one question never straddle train and test; the held-out
   predictions of all folds are pooled and scored once;
4. ``Irg.json``: the rule's levels of the released LLaVA-Med reports (no human levels to compare);
5. speed of the rule classifier.

The keyword lists of the rules were written from the level definitions and adjusted by hand while
reading the disagreements on conventional's 364 answers with ground truth (before this script had
a cross-validation), so those figures are in-sample; the 135 without ground truth were not read.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from medheval.families import med_hallmark as mh
from medheval.families.med_hallmark.source import FILES, READERS
from medheval.run.protocol import load_metric, metric_kwargs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path(os.environ.get("MEDHEVAL_SHARED") or REPO.parent / "shared") / "data" / "upstream" / "med-hallmark"
LABELLED = ("conventional", "counterfactual")
# what run_eval --task detection --detector rule passes (medheval.families.med_hallmark.detection)
DETECTION_OPTIONS = {"classifier": "rule", "premise_rule": False, "rule_without_reference": True}
OVERLAPS = (0.5, 0.75, 1.0)
ASPECTS = tuple(mh.ASPECT_LEVEL)


def _records(data_dir: Path, config: str) -> list[dict]:
    return list(READERS[config](data_dir / FILES[config].relpath, config=config))


def identity(data_dir: Path) -> dict[str, Any]:
    """MediHall Score of each split's ground truth given as the prediction (the runner's inputs)."""
    scorer = load_metric("medihall_score")
    out = {}
    for config in READERS:
        rows = _records(data_dir, config)
        answers = [row["answer"] for row in rows]
        got = scorer.compute(predictions=answers, references=answers, **metric_kwargs(scorer, rows, {}))
        scores = [s for s in got["item_scores"] if s is not None]
        out[config] = {"n": got["n"], "n_failed": got["n_failed"], "medihall_score": got["medihall_score"],
                       "items_below_1": sum(s < 1.0 for s in scores)}
    return out


def rule_levels(rows: list[dict]) -> list[str | None]:
    """Levels of the released answers, as the detection task computes them (through the metric)."""
    scorer = load_metric("medihall_score")
    got = scorer.compute(predictions=[row["meta"]["released_response"] for row in rows],
                         references=[row["answer"] for row in rows],
                         **metric_kwargs(scorer, rows, DETECTION_OPTIONS))
    return got["levels"]


def direct_levels(rows: list[dict], overlap: float, default_aspect: str) -> list[str]:
    """The same levels from the rule functions, with the two settings the cross-validation tunes."""
    out = []
    for row in rows:
        if row["meta"]["has_ground_truth"]:
            got = mh.classify_vqa_rule(row["meta"]["released_response"], row["answer"], row["question"],
                                       row["category"], row["answer_type"], row["choices"], overlap=overlap,
                                       default_aspect=default_aspect)
        else:
            got = mh.classify_vqa_aspect(row["question"], row["category"], default_aspect=default_aspect)
        out.append(None if got is None else got.level)  # None: an unreadable answer (failed)
    return out


def agreement(human: list[str], predicted: list[str | None]) -> dict[str, Any]:
    """``medihall_detection``'s statistics plus the MediHall Score from either set of levels."""
    detector = load_metric("medihall_detection")
    got = detector.compute(predictions=[p or "" for p in predicted], references=human)
    scored = [i for i, p in enumerate(predicted) if p is not None]
    keys = ("n", "n_failed", "accuracy", "macro_f1", "cohen_kappa", "quadratic_kappa", "kappa_note", "confusion")
    out = {key: got[key] for key in keys}
    out["medihall_score_human"] = mh.medihall_score([mh.WEIGHTS[human[i]] for i in scored])
    out["medihall_score_rule"] = mh.medihall_score([mh.WEIGHTS[predicted[i]] for i in scored])
    return out


def folds_by_image(rows: list[dict], k: int) -> list[int]:
    """Fold of each row: images sorted by name and dealt round-robin into ``k`` folds (deterministic)."""
    images = sorted({row["meta"]["upstream_image"] for row in rows})
    fold_of = {image: i % k for i, image in enumerate(images)}
    return [fold_of[row["meta"]["upstream_image"]] for row in rows]


def cross_validate(rows: list[dict], human: list[str], k: int) -> dict[str, Any]:
    """Grouped K-fold over (overlap, default_aspect): pick the setting with the best quadratic κ on the
    training folds, predict the held-out fold with it; the pooled held-out predictions are scored once."""
    grid = {(o, a): direct_levels(rows, o, a) for o in OVERLAPS for a in ASPECTS}
    folds = folds_by_image(rows, k)
    held_out: list[str | None] = [None] * len(rows)
    chosen = []
    for fold in range(k):
        train = [i for i, f in enumerate(folds) if f != fold]

        def train_kappa(setting: tuple[float, str]) -> float:
            got = agreement([human[i] for i in train], [grid[setting][i] for i in train])["quadratic_kappa"]
            return -1.0 if got is None else got

        # ties go to the shipped defaults (overlap 1.0, presence), then to the grid order
        best = max(grid, key=lambda s: (train_kappa(s), s == (1.0, "presence")))
        chosen.append({"fold": fold, "overlap": best[0], "default_aspect": best[1],
                       "n_test": sum(f == fold for f in folds)})
        for i, f in enumerate(folds):
            if f == fold:
                held_out[i] = grid[best][i]
    out = agreement(human, held_out)
    out.update(folds=k, chosen=chosen)
    return out


def irg(data_dir: Path) -> dict[str, Any]:
    reports = _records(data_dir, "irg")
    start = time.perf_counter()
    classified = [mh.classify_irg_rule(r["meta"]["released_response"], r["answer"]) for r in reports]
    elapsed = time.perf_counter() - start
    levels = [[c.level for _, c in item] for item in classified]
    return {"n_reports": len(reports), "n_sentences": sum(map(len, levels)),
            "medihall_score_rule": mh.medihall_score([mh.report_score(item) for item in levels]),
            "distribution_rule": mh.level_distribution([x for item in levels for x in item], mh.IRG_LEVELS),
            "reports_per_second": len(reports) / elapsed}


def _fmt(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.3f}"


def _print_agreement(title: str, stats: dict) -> None:
    print(f"\n## {title}  (n = {stats['n']}, failed {stats['n_failed']})")
    if stats.get("kappa_note"):
        print(f"κ {stats['kappa_note']}")
    print(f"Cohen's κ {_fmt(stats['cohen_kappa'])}   quadratic-weighted κ {_fmt(stats['quadratic_kappa'])}   "
          f"accuracy {_fmt(stats['accuracy'])}   MediHall Score: human {_fmt(stats['medihall_score_human'])}, "
          f"rule {_fmt(stats['medihall_score_rule'])}")
    levels = stats["confusion"]["levels"]
    width = max(map(len, levels))
    corner = "human / rule"
    width = max(width, len(corner))
    print(f"{corner:>{width}}  " + "  ".join(f"{level[:6]:>6}" for level in levels))
    for level, row in zip(levels, stats["confusion"]["rows"]):
        print(f"{level:>{width}}  " + "  ".join(f"{count:>6}" for count in row))


def run(data_dir: Path, folds: int = 5) -> dict[str, Any]:
    """Every figure of the module docstring, as one JSON-ready dict."""
    report: dict[str, Any] = {"identity": identity(data_dir)}
    rows = {config: _records(data_dir, config) for config in LABELLED}
    levels = {config: rule_levels(rows[config]) for config in LABELLED}
    start = time.perf_counter()
    for config in LABELLED:  # the metric and the functions the cross-validation calls agree
        if levels[config] != direct_levels(rows[config], 1.0, "presence"):
            raise AssertionError(f"{config}: the metric's levels differ from classify_vqa_rule's")
    elapsed = time.perf_counter() - start
    human = {config: [row["meta"]["human_level"] for row in rows[config]] for config in LABELLED}
    parts: dict[str, tuple[list[str], list[str | None]]] = {}
    for config in LABELLED:
        parts[config] = (human[config], levels[config])
        for subset, with_gt in (("with ground truth", True), ("without ground truth", False)):
            keep = [i for i, row in enumerate(rows[config]) if row["meta"]["has_ground_truth"] == with_gt]
            if keep and len(keep) < len(rows[config]):
                parts[f"{config}, {subset}"] = ([human[config][i] for i in keep], [levels[config][i] for i in keep])
    # the counterfactual split without its category: the premise read from the reference text alone
    plain = [dict(row, category="") for row in rows["counterfactual"]]
    parts["counterfactual, text only (no category)"] = (human["counterfactual"], rule_levels(plain))
    report["agreement"] = {name: agreement(*pair) for name, pair in parts.items()}
    # the overall pools the splits whose kappa is computable (counterfactual's human levels are one class)
    pooled = [c for c in LABELLED if report["agreement"][c]["cohen_kappa"] is not None]
    report["overall_splits"] = pooled
    report["left_out_of_overall"] = {c: report["agreement"][c]["kappa_note"] for c in LABELLED if c not in pooled}
    report["agreement"]["overall"] = agreement(sum((human[c] for c in pooled), []),
                                               sum((levels[c] for c in pooled), []))
    # out of sample: conventional, the rule's settings chosen on the training folds only
    report["cross_validation"] = cross_validate(rows["conventional"], human["conventional"], folds)
    report["irg_rule"] = irg(data_dir)
    report["speed"] = {"vqa_answers_per_second": sum(map(len, rows.values())) / elapsed,
                       "irg_reports_per_second": report["irg_rule"]["reports_per_second"]}
    return report


def print_report(report: dict[str, Any]) -> None:
    print("## Ground truth given as the prediction (rule classifier, run_eval's inputs)")
    for config, got in report["identity"].items():
        print(f"{config:>22}: MediHall Score {_fmt(got['medihall_score'])} over {got['n']} items "
              f"({got['items_below_1']} below 1.0; {got['n_failed']} without ground truth, not scored)")
    for name, stats in report["agreement"].items():
        title = f"{name} ({' + '.join(report['overall_splits'])})" if name == "overall" else name
        _print_agreement(title, stats)
    for split, note in report["left_out_of_overall"].items():
        print(f"\n{split}: left out of the overall, κ {note}")
    cv = report["cross_validation"]
    _print_agreement(f"conventional, {cv['folds']}-fold cross-validated over (overlap, default_aspect), grouped by "
                     f"image (out of sample)", cv)
    print("settings chosen on the training folds: "
          + "; ".join(f"fold {c['fold']}: overlap {c['overlap']}, {c['default_aspect']}" for c in cv["chosen"]))
    i = report["irg_rule"]
    print(f"\n## Irg.json (no human levels): {i['n_reports']} reports, {i['n_sentences']} sentences")
    print(f"rule MediHall Score {_fmt(i['medihall_score_rule'])}   distribution {i['distribution_rule']}")
    speed = report["speed"]
    print(f"\nrule classifier: {speed['vqa_answers_per_second']:,.0f} VQA answers/s, "
          f"{speed['irg_reports_per_second']:,.0f} reports/s (one process)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR, help="folder holding Med-HallMark's JSON files")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds (grouped by image)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    missing = [FILES[c].relpath for c in READERS if not (args.data_dir / FILES[c].relpath).is_file()]
    if missing:
        raise SystemExit(f"{args.data_dir}: {', '.join(missing)} not found; pass --data-dir pointing at a copy of "
                         "github.com/ydk122024/Med-HallMark (commit 1eb83d8), or set MEDHEVAL_SHARED")
    if args.folds < 2:
        raise SystemExit(f"--folds must be at least 2, got {args.folds}")
    report = run(args.data_dir, args.folds)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""Speed and upstream agreement of the CheXpert-14 rule labeler; CHAIR over 490 report pairs.

    python benchmarks/bench_labeler.py [--data-dir ../shared/data/upstream] [--repeat 5]

1. Reports/s of ``medheval.labelers.chexpert_rules.RuleLabeler`` on the 490 references of
   MedHEval's visual open-ended split (``MIMIC-CXR_pairs.json``, field ``answer``) when the
   upstream files are present, otherwise on the fixture report records repeated to 490.
   Target: >= 1,000 reports/s on one core.
2. CHAIR (``metrics/chair``, rule labeler) over 490 pairs — each reference paired with the next
   reference as its "prediction" — end to end through ``evaluate`` (load excluded), both
   variants. Target: < 1 s.
3. Agreement with what the upstream CheXpert labeler's rules would give, on ~120 report
   sentences written for this benchmark (and, for information, on the 490 references). The
   upstream mention/unmention phrase files are read from ``../shared/data/upstream/chexpert-labeler``
   (for cross-checking only; nothing is copied into the package) and matched exactly as upstream
   does (plain substring regexes, overlap-based unmentions, generated positional unmentions).
   Upstream's negation/uncertainty rules are dependency-graph patterns (NegBio) that cannot run
   without its parser, so they are *approximated*: the patterns' commented templates
   ("no evidence of XXX", "XXX has resolved") and single-word lemma triggers become phrase
   triggers within a small word window around the mention, in upstream's order (pre-negation
   uncertainty, negation, post-negation uncertainty), plus its always-uncertain congestion terms,
   "X or Y" and its aggregation rules. Agreement is per condition: share of items with equal
   labels, and the same restricted to items where either labeler gives a non-blank label.
   Skipped when ../shared is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

from medheval.labelers import CONDITIONS
from medheval.labelers.chexpert_rules import RuleLabeler

REPO = Path(__file__).resolve().parents[1]
SHARED_UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream"
REPORT_FILE = "medheval/Visual_Misinterpretation_Hallucination/open-ended/MIMIC-CXR_pairs.json"
CHEXPERT_DIR = "chexpert-labeler"
N_PAIRS = 490

# Report sentences written for this benchmark (not taken from any dataset).
SENTENCES = [
    "No acute cardiopulmonary abnormality.",
    "The lungs are clear without focal consolidation.",
    "There is no pleural effusion or pneumothorax.",
    "Heart size is normal.",
    "The cardiac silhouette is enlarged.",
    "Moderate cardiomegaly is again seen.",
    "Mild enlargement of the cardiac silhouette is unchanged.",
    "The mediastinal contours are within normal limits.",
    "The cardiomediastinal silhouette is unchanged.",
    "Widening of the superior mediastinum is noted.",
    "Small bilateral pleural effusions.",
    "A moderate right pleural effusion has increased in size.",
    "The left pleural effusion has resolved.",
    "Trace left pleural effusion cannot be excluded.",
    "Blunting of the left costophrenic angle may reflect a small effusion.",
    "No pneumothorax is seen.",
    "There is a small right apical pneumothorax.",
    "The right pneumothorax is no longer visualized.",
    "Possible tiny left apical pneumothorax.",
    "Right lower lobe consolidation is concerning for pneumonia.",
    "Patchy opacity in the left lower lobe may represent atelectasis or pneumonia.",
    "Bibasilar atelectasis.",
    "Linear atelectasis at the right base.",
    "Left lower lobe collapse.",
    "There is no focal consolidation to suggest pneumonia.",
    "Findings are consistent with multifocal pneumonia.",
    "Pneumonia is not excluded.",
    "Mild pulmonary edema.",
    "Moderate interstitial edema has improved.",
    "There is no pulmonary edema.",
    "Mild pulmonary vascular congestion.",
    "Findings suggest congestive heart failure.",
    "There is no evidence of CHF.",
    "Cephalization of the pulmonary vasculature.",
    "A 1.5 cm nodule is seen in the right upper lobe.",
    "Large left hilar mass.",
    "Calcified granuloma in the right upper lobe.",
    "No suspicious pulmonary nodules.",
    "Multiple pulmonary nodules consistent with metastatic disease.",
    "Diffuse interstitial opacities.",
    "Reticular opacities at the lung bases.",
    "Hazy opacity in the right mid lung.",
    "Streaky opacities likely represent atelectasis.",
    "Apical pleural thickening.",
    "Biapical pleural scarring.",
    "Pleural plaques are noted bilaterally.",
    "There is no pleural thickening.",
    "Acute fracture of the left seventh rib.",
    "Old healed right rib fractures.",
    "No displaced rib fracture is identified.",
    "Compression fracture of a thoracic vertebral body is unchanged.",
    "The endotracheal tube terminates 3 cm above the carina.",
    "The nasogastric tube courses below the diaphragm.",
    "Right internal jugular central venous catheter terminates in the SVC.",
    "Left PICC line tip in the mid SVC.",
    "Dual-chamber pacemaker with leads in the right atrium and right ventricle.",
    "The endotracheal tube has been removed.",
    "Median sternotomy wires are intact.",
    "Surgical clips project over the right upper quadrant.",
    "A right chest tube is in place.",
    "Lines and tubes are in standard position.",
    "Emphysema with hyperinflated lungs.",
    "Small hiatal hernia.",
    "Degenerative changes of the thoracic spine.",
    "Elevation of the right hemidiaphragm.",
    "No new consolidation.",
    "No new focal opacity.",
    "No new pleural effusion or pneumothorax.",
    "Stable mild cardiomegaly.",
    "Heart size is stable.",
    "Heart size is at the upper limits of normal.",
    "Borderline heart size.",
    "The heart is not enlarged.",
    "Normal cardiac silhouette.",
    "Unremarkable cardiomediastinal silhouette.",
    "Left basilar opacity, atelectasis versus pneumonia.",
    "Right middle lobe pneumonia has resolved.",
    "Interval resolution of the left lower lobe consolidation.",
    "Questionable small left effusion.",
    "Atelectasis is likely.",
    "Probable right lower lobe pneumonia.",
    "Suspected early pulmonary edema.",
    "Cannot exclude aspiration pneumonia.",
    "Infection cannot be ruled out.",
    "Findings may be due to atelectasis.",
    "Opacity could represent infection or atelectasis.",
    "There is mild interstitial prominence.",
    "Increased density at the left base.",
    "Airspace disease in the right upper lobe.",
    "Mild bibasilar airspace opacities.",
    "Ground-glass opacity in both lower lobes.",
    "There is no evidence of airspace disease.",
    "The lungs are free of consolidation.",
    "Clear lungs without effusion.",
    "Small left effusion and adjacent atelectasis.",
    "Moderate cardiomegaly with pulmonary edema.",
    "Cardiomegaly and small bilateral effusions.",
    "No pneumothorax or pleural effusion.",
    "No evidence of pneumonia or edema.",
    "Pleural effusions are absent.",
    "The heart and mediastinum are normal.",
    "Enlarged cardiac silhouette with pulmonary vascular congestion.",
    "Mild cardiomegaly without edema.",
    "Lung volumes are low.",
    "Low lung volumes with bibasilar atelectasis.",
    "Right apical lung mass is again noted.",
    "Nodular opacity in the left lower lobe.",
    "Consolidation in the right lower lobe has worsened.",
    "Persistent left retrocardiac opacity.",
    "The aorta is tortuous.",
    "Pericardial effusion is suspected.",
    "Subcutaneous emphysema along the right chest wall.",
    "Pneumomediastinum is unchanged.",
    "Impression: no acute process.",
    "Findings: no focal consolidation, effusion, or pneumothorax.",
    "Tracheostomy tube in place.",
    "Feeding tube tip in the stomach.",
    "Swan-Ganz catheter tip in the right pulmonary artery.",
    "Right-sided port-a-cath with tip at the cavoatrial junction.",
    "Mild atelectasis or scarring at the lung bases.",
]


# ------------------------------------------------------------------------------------------------
# An approximation of the upstream CheXpert labeler, driven by its phrase and pattern files.


def _read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _inflections(lemma: str) -> str:
    """A regex for the word forms of one lemma ("exclude" -> exclude, excludes, excluded, excluding)."""
    if lemma.endswith(".*"):
        return re.escape(lemma[:-2]) + r"\w*"
    forms = re.escape(lemma) + "(?:s|es|d|ed|ing|ly)?"
    if lemma.endswith("e"):
        forms += "|" + re.escape(lemma[:-1]) + "(?:ing|ed)"
    return forms


class UpstreamApprox:
    """Upstream mention extraction (faithful) + window-based stand-ins for its dependency rules."""

    POSITIONAL = [f"{a}{b}" for a in ("over the", "overly the", "in the") for b in ("", " superior", " left", " right")]
    ALWAYS_UNCERTAIN = ("vascular congestion", "pulmonary congestion", "indistinctness", "vascular prominence")
    NEG_CHILD = r"\b(?:no|not|never|without|n't)\b"  # a bare dependency "neg" child

    def __init__(self, root: Path) -> None:
        mention_phrases: dict[str, list[str]] = {}
        for path in sorted((root / "phrases" / "mention").glob("*.txt")):
            name = path.stem.replace("_", " ").title()
            mention_phrases[name] = [p.replace("_", " ") for p in _read_lines(path)]
        self.unmentions: dict[str, list[re.Pattern]] = {}
        for path in sorted((root / "phrases" / "unmention").glob("*.txt")):
            name = path.stem.replace("_", " ").title()
            self.unmentions.setdefault(name, []).extend(re.compile(re.escape(p.replace("_", " ")))
                                                        for p in _read_lines(path))
        for name in ("Cardiomegaly", "Enlarged Cardiomediastinum"):
            phrases = [p for p in mention_phrases.get(name, []) if p not in ("cardiomegaly", "cardiac enlargement")]
            for prefix in self.POSITIONAL:
                for phrase in phrases:
                    self.unmentions.setdefault(name, []).append(
                        re.compile(re.escape(f"{prefix} {phrase.replace('the ', '')}")))
        self.mentions = {name: [re.compile(re.escape(p)) for p in phrases] for name, phrases in mention_phrases.items()}
        patterns = root / "patterns"
        self.triggers = {kind: self._triggers(patterns / f"{kind}.txt")
                         for kind in ("pre_negation_uncertainty", "negation", "post_negation_uncertainty")}
        # edge-label-only rules (no lemma to read): conj:negcc ("rather than"), conj:versus, conj:or / and/or
        self.triggers["negation"].append([re.compile(r"\brather than\b")])
        self.triggers["post_negation_uncertainty"].append([re.compile(r"\b(?:versus|vs)\b")])

    def _triggers(self, path: Path) -> list[list[re.Pattern]]:
        """Each pattern line -> the bag of its lemma sets (as word prefixes); all must occur in the window."""
        bags = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            bag = []
            for lemma in re.findall(r"lemma:/([^/]+)/", line):
                forms = "|".join(_inflections(alt) for alt in lemma.split("|") if alt)
                bag.append(re.compile(r"\b(?:" + forms + r")\b"))
            if "dependency:/neg/} {}" in line:
                bag.append(re.compile(self.NEG_CHILD))
            for word in ("without", "within", "out"):  # prepositions that live only in the edge label
                if f"nmod:{word}" in line:
                    bag.append(re.compile(rf"\b{word}\b"))
            if bag:
                bags.append(bag)
        return bags

    def _hit(self, kind: str, window: str) -> bool:
        return any(all(rx.search(window) for rx in bag) for bag in self.triggers[kind])

    @staticmethod
    def clean(text: str) -> str:
        text = text.lower().replace("and/or", "or")
        text = re.sub(r"(?<=[a-zA-Z])/(?=[a-zA-Z])", " or ", text)
        text = text.replace("..", ".")
        text = re.sub(r"([,.])", r"\1 ", text)
        return " ".join(text.split())

    def label(self, report: str, before: int = 6, after: int = 4) -> list:
        text = self.clean(report)
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip(" .")]
        found: dict[str, list[int]] = {}
        no_finding = True
        for sentence in sentences:
            spans = []
            for name, rxs in self.mentions.items():
                blocked = [m.span() for rx in self.unmentions.get(name, []) for m in rx.finditer(sentence)]
                for rx in rxs:
                    for m in rx.finditer(sentence):
                        if any(m.start() < e and s < m.end() for s, e in blocked):
                            continue
                        spans.append((m.start(), m.end(), name, m.group()))
            header_no = re.match(r"(findings|impression): no ", sentence) is not None
            starts = sorted(s for s, _, _, _ in spans)
            for start, end, name, phrase in spans:
                left = " ".join(sentence[:start].split()[-before:])
                later = [s for s in starts if s >= end]
                right_text = sentence[end:later[0]] if later else sentence[end:]
                right_words = right_text.split()
                if later and len(right_words) <= after + 1:
                    right_words = right_words[:-1]  # the word just before the next mention belongs to it
                window = " ".join([left, phrase, " ".join(right_words[:after])])
                if header_no:
                    value = 0
                elif self._hit("pre_negation_uncertainty", window):
                    value = -1
                elif self._hit("negation", window):
                    value = 0
                elif (self._hit("post_negation_uncertainty", window) or phrase in self.ALWAYS_UNCERTAIN
                      or self._or_linked(sentence, start, end, spans)):
                    value = -1
                else:
                    value = 1
                if value != 0 and name != "Support Devices":
                    no_finding = False
                if name == "No Finding":
                    continue
                found.setdefault(name, []).append(value)
                if phrase in ("chf", "heart failure") and value != 0:
                    found.setdefault("Cardiomegaly", []).append(-1)
        out = []
        for name in CONDITIONS:
            if name == "No Finding":
                out.append(1 if no_finding else None)
                continue
            values = found.get(name)
            out.append(None if not values else (1 if 1 in values else (-1 if -1 in values else 0)))
        return out

    @staticmethod
    def _or_linked(sentence: str, start: int, end: int, spans: list) -> bool:
        for s, e, _, _ in spans:
            gap = sentence[end:s] if s >= end else sentence[e:start] if e <= start else None
            if gap is not None and len(gap.split()) <= 4 and re.search(r"\bor\b", gap):
                return True
        return False


def agreement(ours: list[list], theirs: list[list]) -> dict[str, dict]:
    table = {}
    for j, name in enumerate(CONDITIONS):
        pairs = [(a[j], b[j]) for a, b in zip(ours, theirs)]
        either = [(a, b) for a, b in pairs if a is not None or b is not None]
        table[name] = {
            "all": sum(a == b for a, b in pairs) / len(pairs),
            "mentioned": (sum(a == b for a, b in either) / len(either)) if either else None,
            "n_mentioned": len(either),
        }
    return table


def print_agreement(title: str, table: dict[str, dict]) -> None:
    print(f"\n{title}")
    print(f"  {'condition':28s} {'all items':>9s} {'mentioned':>10s} {'n':>5s}")
    for name, row in table.items():
        mentioned = "-" if row["mentioned"] is None else f"{100 * row['mentioned']:.1f}%"
        print(f"  {name:28s} {100 * row['all']:8.1f}% {mentioned:>10s} {row['n_mentioned']:5d}")
    macro = [row["mentioned"] for row in table.values() if row["mentioned"] is not None]
    total_all = sum(row["all"] for row in table.values()) / len(table)
    print(f"  {'mean':28s} {100 * total_all:8.1f}% {100 * sum(macro) / len(macro):9.1f}%")


# ------------------------------------------------------------------------------------------------


def load_references(data_dir: Path) -> tuple[list[str], str]:
    path = data_dir / REPORT_FILE
    if path.is_file():
        return [item["answer"] for item in json.loads(path.read_text())], str(path)
    from medheval.families.medheval.fixtures import REPORT_FILE as FIXTURE_FILE
    from medheval.families.medheval.fixtures import build_records

    records = [item["answer"] for item in build_records()[FIXTURE_FILE]]
    return [records[i % len(records)] for i in range(N_PAIRS)], "fixture reports (repeated)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=SHARED_UPSTREAM)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    references, source = load_references(args.data_dir)
    references = references[:N_PAIRS]
    labeler = RuleLabeler()
    labeler.label(references[:5])  # warm-up
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        labeler.label(references)
        best = min(best, time.perf_counter() - start)
    print(f"rule labeler: {len(references)} reports from {source}")
    print(f"  {len(references) / best:,.0f} reports/s (best of {args.repeat}; target >= 1,000/s)")

    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    metric = evaluate.load(str(REPO / "metrics" / "chair"))
    predictions = references[1:] + references[:1]
    for variant in ("paper", "medheval_code"):
        metric.compute(predictions=predictions[:2], references=references[:2], variant=variant)  # warm-up
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = metric.compute(predictions=predictions, references=references, variant=variant)
            times.append(time.perf_counter() - start)
        print(f"CHAIR ({variant}) over {len(references)} pairs: {min(times):.3f} s best, {max(times):.3f} s worst "
              f"(target < 1 s); chair={out['chair']:.4f} recall={out['recall']:.4f}")

    chexpert = args.data_dir / CHEXPERT_DIR
    if not (chexpert / "phrases" / "mention").is_dir():
        print(f"\nagreement: skipped ({chexpert} is absent)")
        return 0
    upstream = UpstreamApprox(chexpert)
    ours = labeler.label(SENTENCES)
    theirs = [upstream.label(s) for s in SENTENCES]
    print_agreement(f"agreement with the approximated upstream rules on {len(SENTENCES)} written sentences",
                    agreement(ours, theirs))
    if os.environ.get("BENCH_SHOW_DIFFS"):
        for text, a, b in zip(SENTENCES, ours, theirs):
            if a != b:
                diff = {CONDITIONS[j]: (a[j], b[j]) for j in range(len(CONDITIONS)) if a[j] != b[j]}
                print(f"    {text!r}: (ours, upstream≈) {diff}")
    if source != "fixture reports (repeated)":
        theirs_refs = [upstream.label(r) for r in references]
        print_agreement(f"agreement on the {len(references)} MedHEval references (information only)",
                        agreement(labeler.label(references), theirs_refs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

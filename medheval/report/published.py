"""The papers' published numbers as data, and the reproduction check (``medheval report --compare-published``,
``medheval published``).

``published.jsonl`` (package data, beside this module) holds one cell of a paper's results table per line:
``paper``, ``table``, ``model`` and ``split`` as the paper prints them, ``metric`` (its column), ``setting``
(MedHEval: the mitigation, ``Original`` = none; Med-StepBench: ``w/o``/``w`` knowledge; else empty),
``value`` and ``decimals`` (``f"{value:.{decimals}f}"`` is the printed text), ``std`` (MedHEval's S_h is
printed as mean ± std), ``unit`` (``0-1``, ``0-100`` or ``0-5``, as printed) and an optional ``note``.

``table`` is the location: a table number, or where a number stands outside a table (``Figure 4``,
``text §6.1``). Transcribed: MedHEval Tables 3–11 (close-ended accuracy per category, report metrics,
generation metrics and S_h, with every mitigation row); Med-HallMark Tables 1–7 (Table 3: the metrics of the
Figure 2(b) examples; Table 4: the detector ablation; Tables 5–7: recall, precision and F1 per question type,
Table 6 its only counterfactual numbers) and the numbers its text quotes beyond them; Med-StepBench Tables 3–6
(Table 4: rationales; Table 5: knowledge per step; Table 6: PET + CT against fused PET/CT). ClinHallu: the
text copy of the paper has no table bodies; the numbers its text quotes are stored (Tables 2, 4 and 6,
Figure 4; :data:`TABLE_NOTES`).

Matching (:func:`reproduction`): a run's model matches a published model when its id (an API prefix such as
``openai:`` and an ``@endpoint`` suffix dropped; a local folder by its last path part) equals one of the
:data:`ALIASES` of that model, or the printed name itself. A report cell matches a published cell through
:data:`COLUMNS` (which report table and column is which paper column), :data:`SPLITS` (which paper split is
which of our benchmark splits) and :data:`SPLIT_OPTIONS` (the run options a paper split needs); the paper's
value is converted to the report's units (a 0–1 figure × 100 where the report shows %) and shown at the
paper's precision. A matched row is *comparable* only when the run's conditions are the paper's
(:class:`RunConditions`: the protocol that produced the cell, :func:`paper_protocol`; real weights; the real
annotation files; no ``--limit``; one pass): then the difference is run − paper, and a paper value outside the
run's 95% interval is flagged; otherwise the row says why and shows no difference.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # imported when a report is compared, so `medheval --help` stays fast
    from medheval.report.paper import Table

PUBLISHED_FILE = Path(__file__).with_name("published.jsonl")
UNITS = ("0-1", "0-100", "0-5")
PAPERS = {"medheval": "MedHEval (arXiv 2503.02157)", "med_hallmark": "Med-HallMark (arXiv 2406.10185)",
          "clinhallu": "ClinHallu (arXiv 2606.14697)", "med_stepbench": "Med-StepBench (arXiv 2605.10002)"}
TABLE_NOTES = {
    ("medheval", "7"): "Table 7's LLaVA-Med-1.5 row differs from Table 8's Original row of the same model; both "
                       "are stored as printed.",
    ("med_hallmark", "1"): "The Med-VQA task pools question types: it matches the report's Table 1 Med-VQA row "
                           "(conventional + confidence-weakening pooled); IRG its Table 1 IRG row. Empty IRG "
                           "MediHall cells (no computable score) are absent.",
    ("med_hallmark", "2"): "♣ = Q_Conv^true' (the conventional questions the confidence-weakening ones were built "
                           "from: our confidence_weakening split with question=plain), ♠ = the same behind a "
                           "confidence-weakening prefix.",
    ("med_stepbench", "3"): "Read by hand from a flattened table; '–' cells (no Vietnamese result, or Step 1 with "
                            "knowledge) are absent. 'w' is matched to runs with knowledge=both.",
    ("clinhallu", "2"): "Table body absent from the text copy; the three model-averaged rates the text quotes "
                        "(Finding 1) are stored ('average rates exceeding 40%' is a bound, not stored).",
    ("clinhallu", "3"): "Not transcribed: the table body is absent from the paper's text copy.",
    ("clinhallu", "6"): "Table body absent from the text copy; the agreements and kappas the text quotes (Section "
                        "5.3) are stored, the stage-wise ones as the ends of the quoted ranges.",
    ("clinhallu", "Figure 4"): "Fix and Break rates quoted in the text (Finding 2); the figure's other bars are "
                               "not in the text.",
    ("med_hallmark", "3"): "The metrics of the four example answers of Figure 2(b) (Accuracy 0/1, MediHall Score "
                           "0-1, the others 0-100).",
    ("med_hallmark", "4"): "MediHallDetector ablation (methods a-f as the text defines them, 'ours' the released "
                           "detector), ACC and recall (%) per level against the human labels.",
    ("med_hallmark", "5"): "Recall, precision and F1 per metric over the VQA questions; its F1 columns repeat "
                           "Table 1's Med-VQA cells.",
    ("med_hallmark", "6"): "The paper's only counterfactual numbers; matched to med_hallmark:counterfactual.",
    ("med_hallmark", "7"): "IRG; its F1 columns repeat Table 1's IRG cells (matched there, once).",
    ("med_hallmark", "text §6.1"): "Numbers the text quotes beyond the tables (averages of Table 1 cells). 'Around "
                                   "47%' (BertScore of the BLIP and LLaVA1.5 families) is approximate, not stored.",
    ("med_stepbench", "4"): "Precision, recall and F1 with no, an LLM-written or a clinician-written rationale; the "
                            "text names no language.",
    ("med_stepbench", "5"): "Rows per model: no knowledge, Prior, Ext, +Both (the text copy drops the check marks; "
                            "rows 1 and 4 equal Table 3's w/o and w cells).",
    ("med_stepbench", "6"): "F1 per step and language, separate PET + CT against fused PET/CT; Med-Flamingo has one "
                            "value per step (English).",
    ("clinhallu", "4"): "Table body absent from the text copy; the four gains the text quotes (Finding 1) are "
                        "stored. Model averages: never matched to a run's model.",
}

# (paper, printed model name) -> Hub ids (or API model names) that are that model. Only models the paper (or
# MedHEval's code release, for LLaVA-NeXT's vicuna variants) identifies; BLIP2, LLaVA-Med(SF/RF/PF),
# Med-StepBench's "LLaVA-Med", and models without a checkpoint on the Hub have no alias. Med-StepBench's
# "LLaVA-7B" cites LLaVA (Liu et al. 2023) without a version: LLaVA-1.5 7B is assumed, as its shipped config
# (configs/med_stepbench_table3.yaml) runs it.
ALIASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("medheval", "GPT-4o"): ("gpt-4o",),
    ("medheval", "LLaVA-NeXT 7B"): ("llava-hf/llava-v1.6-vicuna-7b-hf", "liuhaotian/llava-v1.6-vicuna-7b"),
    ("medheval", "LLaVA-NeXT 13B"): ("llava-hf/llava-v1.6-vicuna-13b-hf", "liuhaotian/llava-v1.6-vicuna-13b"),
    ("medheval", "LLaVA-Med"): ("microsoft/llava-med-7b-delta",),
    ("medheval", "LLaVA-Med-1.5"): ("microsoft/llava-med-v1.5-mistral-7b", "llava-med-v1.5-hf"),
    ("medheval", "CheXagent"): ("StanfordAIMI/CheXagent-8b",),
    ("med_hallmark", "LLaVA1.5-7b"): ("llava-hf/llava-1.5-7b-hf", "liuhaotian/llava-v1.5-7b"),
    ("med_hallmark", "LLaVA1.5-13b"): ("llava-hf/llava-1.5-13b-hf", "liuhaotian/llava-v1.5-13b"),
    ("med_hallmark", "InstructBLIP-7b"): ("Salesforce/instructblip-vicuna-7b",),
    ("med_hallmark", "InstructBLIP-13b"): ("Salesforce/instructblip-vicuna-13b",),
    ("med_hallmark", "mPLUG-Owl2"): ("MAGAer13/mplug-owl2-llama2-7b",),
    ("med_stepbench", "GPT 4o"): ("gpt-4o",),
    ("med_stepbench", "Gemini 2.5 flash"): ("gemini-2.5-flash",),
    ("med_stepbench", "Gemini 2.5 pro"): ("gemini-2.5-pro",),
    ("med_stepbench", "Qwen3-VL-8B"): ("Qwen/Qwen3-VL-8B-Instruct",),  # the Instruct variant is assumed
    ("med_stepbench", "Qwen3-VL-4B"): ("Qwen/Qwen3-VL-4B-Instruct",),
    ("med_stepbench", "LLaVA-7B"): ("llava-hf/llava-1.5-7b-hf", "liuhaotian/llava-v1.5-7b"),  # version assumed
}
# (paper, printed split) -> our benchmark split (``name:config``, as results.json keys it). Med-HallMark's IRG
# is matched by the report's Table 1 only (its IRG row), so it is listed once.
SPLITS: dict[tuple[str, str], str] = {
    ("medheval", "MM-VisHal"): "mm_vishal:all", ("medheval", "CXR-VisHal"): "cxr_vishal:all",
    ("medheval", "Report generation"): "vishal_report:default", ("medheval", "Knowledge open-ended"): "knowledge:open",
    ("med_hallmark", "Conventional (true')"): "med_hallmark:confidence_weakening",
    ("med_hallmark", "Confidence-weakening"): "med_hallmark:confidence_weakening",
    ("med_hallmark", "Counterfactual"): "med_hallmark:counterfactual",
}
# (paper, printed split) -> the run options (results.json ``benchmarks[split].run_options``) a run of that split
# needs to be that split; other splits of the paper need none. Med-HallMark Table 2's ♣ column is Q_Conv^true',
# the conventional questions the confidence-weakening ones were built from (same ground truths): the
# confidence_weakening split asked without its prefix (run option question=plain), not the conventional split
# (whose items are mostly answers labelled as hallucinations).
# our split -> (the split published cells name, why a run of it is not comparable with them): an earlier revision
# of an annotation file. MedHEval's report cells describe the released 490-item file (paper Table 1 and appendix
# C.2), so a run on the file as it stood at upstream ba4586e is matched to them and flagged.
OTHER_REVISIONS: dict[str, tuple[str, str]] = {
    "vishal_report:ba4586e": ("vishal_report:default",
                              "annotation revision differs (run: upstream ba4586e, 500 items, earlier instruction; "
                              "paper: the released 490-item file, vishal_report:default)"),
}
SPLIT_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("med_hallmark", "Conventional (true')"): {"question": "plain"},
}
# report table key -> (paper, its tables, {report column label: (paper metric, unit the report shows)})
_ACC = {label: (label, "0-100") for label in ("Acc-A", "Acc-M", "Acc-S", "Acc-R", "Acc")}
_HALLMARK_TEXT = {"BERTScore": "BERTScore", "BS": "BERTScore", "METEOR": "METEOR", "MR": "METEOR",
                  "ROUGE-1": "ROUGE-1", "R-1": "ROUGE-1", "ROUGE-2": "ROUGE-2", "R-2": "ROUGE-2",
                  "ROUGE-L": "ROUGE-L", "R-L": "ROUGE-L", "BLEU": "BLEU"}  # report label -> paper metric
_HALLMARK = {**{label: (metric, "0-100") for label, metric in _HALLMARK_TEXT.items()},
             "MediHall Score": ("MediHall Score", "0-1"), "MediHall": ("MediHall Score", "0-1")}
COLUMNS: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, str]]]] = {
    "medheval_close_ended": ("medheval", ("3", "4", "9"), _ACC),
    "medheval_report": ("medheval", ("5", "6", "10"), {
        "CheXbert": ("CheXbert", "0-100"), "RadGraph": ("RadGraph", "0-100"), "RaTEScore": ("RaTEScore", "0-100"),
        "Recall": ("Recall", "0-100"), "CHAIR ↓": ("CHAIR", "0-100")}),
    "medheval_generation": ("medheval", ("7", "8", "11"), {
        **{label: (label, "0-100") for label in ("BERTScore", "BLEU", "METEOR", "ROUGE-1", "ROUGE-2", "ROUGE-L")},
        "S_h ↓": ("S_h", "0-5")}),
    # per question type: Table 2 (true' and confidence-weakening) and Table 6 (counterfactual); Table 1's IRG is
    # the report's Table 1 IRG row (Tables 5 and 7 repeat Table 1's F1 cells, so they are not matched again)
    "med_hallmark": ("med_hallmark", ("2", "6"), _HALLMARK),
    # Table 1 in the paper's shape (medheval.report.paper: a Med-VQA row pooling its question types, an IRG row)
    "med_hallmark_table1": ("med_hallmark", ("1",), {**_HALLMARK, "ACC": ("Acc", "0-1")}),
}
MITIGATIONS = {"none": "Original", "vcd": "VCD", "dola": "DoLa", "opera": "OPERA", "avisc": "AVISC", "m3id": "M3ID",
               "damro": "DAMRO", "pai": "PAI"}
STEPBENCH_KNOWLEDGE = {"none": "w/o", "both": "w"}
# The protocol each paper's published cells were produced under (medheval run --protocol; a run that records
# none ran our clean default). MedHEval: Tables 3, 5 and 7 are its baselines, Tables 4, 6 and 8–11 its
# mitigation runs (another script: other decoding for its "Original" row).
CLEAN_PROTOCOL = "clean"
PAPER_PROTOCOLS = {"medheval": "medheval-mitigation", "med_hallmark": "med-hallmark", "clinhallu": "clinhallu",
                   "med_stepbench": "med-stepbench"}
MEDHEVAL_BASELINE_TABLES = ("3", "5", "7")
# protocol -> the printed models whose inputs the protocol reproduces from MedHEval's released code (Med-LVLMs/
# scripts for LLaVA-Med-1.5 and LLaVA-NeXT; Mitigation/ for LLaVA-Med-1.5, with LLaVA-NeXT's template from
# Med-LVLMs/, an inference its card states). The repository at 7f7d980 also holds baseline scripts for LLaVA-Med
# v1, CheXagent, RadFM, Med-Flamingo, MiniGPT-4, XrayGPT and LLM-CXR, each with its own prompt format and
# decoding; the protocols do not reproduce those, so those models' cells are never comparable. GPT-4o has no
# inference code in the repository at all (NO_INFERENCE_CODE_MODELS).
RELEASED_CODE_MODELS: dict[str, tuple[str, ...]] = {
    "medheval-baseline": ("LLaVA-Med-1.5", "LLaVA-NeXT 7B", "LLaVA-NeXT 13B"),
    "medheval-mitigation": ("LLaVA-Med-1.5", "LLaVA-NeXT 7B", "LLaVA-NeXT 13B"),
}
NO_INFERENCE_CODE_MODELS: tuple[str, ...] = ("GPT-4o",)
# protocol -> the printed models whose released process_images pads a grayscale image with grey
# (medheval.backends.grey_padding): their run must record settings.backend.grey_padding
GREY_CANVAS_MODELS: dict[str, tuple[str, ...]] = {"medheval-baseline": ("LLaVA-Med-1.5",),
                                                  "medheval-mitigation": ("LLaVA-Med-1.5",)}
# protocol -> the printed models whose prompt ids the released code built piece by piece around the image
# (LLaVA's tokenizer_image_token; medheval.backends.llava_tokens): their run must record
# settings.backend.tokenization = "upstream_chunked"
CHUNKED_TOKEN_MODELS: dict[str, tuple[str, ...]] = {
    "medheval-baseline": ("LLaVA-Med-1.5", "LLaVA-NeXT 7B", "LLaVA-NeXT 13B"),
    "medheval-mitigation": ("LLaVA-Med-1.5", "LLaVA-NeXT 7B", "LLaVA-NeXT 13B"),
}
# MedHEval's CHAIR and Recall cells: what its released scorer (run_chair.py -> CXRMetric calculate_metrics) used,
# as the chair metric records it in results.json (its labeler's name, its variant); Recall is the same formula
# under both variants unless variant "paper" counts uncertain labels as positive
CHAIR_METRICS = ("CHAIR", "Recall")
PAPER_CHAIR_LABELER = "chexbert"
PAPER_CHAIR_VARIANT = "medheval_code"


def _upstream_scored(protocol: str) -> bool:
    """Whether a protocol's published numbers were scored with the released scorer (its ``upstream_compat``;
    the run's is results.json ``scoring.upstream_compat``)."""
    from medheval.run.paper_protocols import get_protocol

    return get_protocol(protocol).upstream_compat


PAPER_SEEDS = 1  # every stored cell is one pass (MedHEval's scripts: set_seed(0)); the papers report no spread
STEPBENCH_COLUMN = re.compile(r"^(EN|VI) S([1-4]) (R|F1)$")
REPRODUCTION_NOTE = ("Reproduction: each report cell whose model, split, mitigation and column match a published "
                     "cell (medheval/report/published.py: ALIASES, SPLITS, COLUMNS), with the paper's value in "
                     "the report's units at the paper's precision. Comparable: the run used the protocol that "
                     "produced the paper's cell (medheval run --protocol), real weights, the real data, no "
                     "--limit and the paper's one pass; only then Δ = run − paper, and flag ⚠ when the paper's "
                     "value lies outside the run's 95% interval (every value that rounds to the printed one: 49.4 is "
                     "49.35–49.45). That interval is the run's item-resampling "
                     "uncertainty (items or clusters redrawn), while the paper scored the same items: the flag is an "
                     "informal scale for the gap, not a test of the reproduction.")
INTERVAL_COLUMN = "Paper outside run's 95% item-resampling CI (informal)"  # its data key: outside_interval


@dataclass(frozen=True)
class Published:
    """One published table cell (see the module docstring for the fields)."""

    paper: str
    table: str
    model: str
    split: str
    metric: str
    setting: str
    value: float
    decimals: int
    unit: str
    std: float | None = None
    note: str | None = None

    @property
    def printed(self) -> str:
        """The value as the paper prints it (with ``± std`` where it prints one)."""
        text = f"{self.value:.{self.decimals}f}"
        return text + (f" ± {self.std:.{self.decimals}f}" if self.std is not None else "")

    @property
    def location(self) -> str:
        """``Table 3``, or the location as stored where it is no table (``Figure 4``, ``text §6.1``)."""
        return f"Table {self.table}" if self.table[:1].isdigit() else self.table

    def where(self) -> str:
        """``MedHEval Table 3: LLaVA-Med · Original · MM-VisHal · Acc-A``."""
        parts = [self.model, self.setting, self.split, self.metric]
        return f"{PAPERS[self.paper].split(' (')[0]} {self.location}: " + " · ".join(p for p in parts if p)


def load_published(path: str | Path | None = None) -> list[Published]:
    """The records of ``published.jsonl`` (or ``path``), checked: a bad line raises ``ValueError`` naming
    the file, line and field."""
    path = Path(path or PUBLISHED_FILE)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error}); each line is one published cell") from None
        for key in ("paper", "table", "model", "split", "metric", "setting", "unit"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"{where}: field {key!r} must be a string, got {data.get(key)!r}")
        if data["paper"] not in PAPERS:
            raise ValueError(f"{where}: unknown paper {data['paper']!r} (one of {', '.join(PAPERS)})")
        if data["unit"] not in UNITS:
            raise ValueError(f"{where}: unit {data['unit']!r} is not one of {', '.join(UNITS)}")
        for key in ("value", "std"):
            if key in data and not (isinstance(data[key], (int, float)) and not isinstance(data[key], bool)):
                raise ValueError(f"{where}: field {key!r} must be a number, got {data[key]!r}")
        if "value" not in data or not isinstance(data.get("decimals"), int):
            raise ValueError(f"{where}: fields 'value' (number) and 'decimals' (int) are required")
        unknown = set(data) - {f for f in Published.__dataclass_fields__}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        records.append(Published(**{**data, "value": float(data["value"])}))
    return records


def _normal(model: str) -> str:
    """A model id compared case-insensitively, without an API prefix or ``@endpoint``."""
    model = re.sub(r"^(openai|azure|anthropic):", "", model.strip()).split("@")[0]
    return model.rstrip("/").lower()


def paper_models(run_model: str, paper: str) -> list[str]:
    """The paper's printed model names that ``run_model`` is: a Hub id or API name in :data:`ALIASES`, a
    local folder whose last part is an alias' last part, or the printed name itself."""
    mine = _normal(run_model)
    base = mine.rsplit("/", 1)[-1]
    found = []
    for (name_paper, name), ids in ALIASES.items():
        if name_paper != paper:
            continue
        for alias in (_normal(i) for i in ids):
            if mine == alias or (mine.startswith(("/", ".", "~")) and base == alias.rsplit("/", 1)[-1]):
                found.append(name)
                break
    found += [name for name in _printed_models(paper) if _normal(name) == mine and name not in found]
    return found


@functools.lru_cache(maxsize=None)
def _printed_models(paper: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.model for r in load_published() if r.paper == paper))


def _factor(published: str, shown: str) -> float:
    if published == shown:
        return 1.0
    if (published, shown) == ("0-1", "0-100"):
        return 100.0
    raise ValueError(f"no conversion from a published {published} value to a report column in {shown}")


def matches(table: Table, labels: Sequence[str], column: str, records: Iterable[Published],
            options: dict[str, Any] | None = None) -> list[tuple[Published, float]]:
    """Published cells (and each one's value in the report's units) for one report cell: ``table``'s row
    ``labels`` (model, mitigation, split; Med-StepBench: model, mitigation, knowledge) and ``column``;
    ``options``: the run options of that row's split (a published split that needs others, or none, is a
    different split: :data:`SPLIT_OPTIONS`)."""
    records = list(records)
    options = dict(options or {})
    if table.key == "med_stepbench":
        hit = STEPBENCH_COLUMN.match(column)
        model, mitigation, knowledge = labels[:3]
        if not hit or mitigation != "none" or knowledge not in STEPBENCH_KNOWLEDGE:
            return []
        names = paper_models(model, "med_stepbench")
        metric = f"Step {hit.group(2)} {hit.group(3)}"
        return [(r, _factor(r.unit, "0-100") * r.value) for r in records
                if (r.paper, r.table, r.split, r.metric, r.setting) == ("med_stepbench", "3", hit.group(1), metric,
                                                                        STEPBENCH_KNOWLEDGE[knowledge])
                and r.model in names]
    if table.key not in COLUMNS or column not in COLUMNS[table.key][2]:
        return []
    paper, tables, columns = COLUMNS[table.key]
    metric, shown = columns[column]
    model, mitigation, split = labels[:3]
    mitigation = mitigation.split(" (")[0]  # the report appends " (folder)" to twin runs
    setting = MITIGATIONS.get(mitigation) if paper == "medheval" else ("" if mitigation == "none" else None)
    names = paper_models(model, paper)
    if table.key == "med_hallmark_table1":  # its rows name the paper's task (Med-VQA, IRG), not one split
        return [(r, _factor(r.unit, shown) * r.value) for r in records
                if r.paper == paper and r.table in tables and r.metric == metric and r.setting == setting
                and r.split == split and r.model in names and not options]
    return [(r, _factor(r.unit, shown) * r.value) for r in records
            if r.paper == paper and r.table in tables and r.metric == metric and r.setting == setting
            and SPLITS.get((paper, r.split)) == OTHER_REVISIONS.get(split, (split,))[0] and r.model in names
            and (paper != "med_hallmark" or SPLIT_OPTIONS.get((paper, r.split), {}) == options)]


def paper_protocol(record: Published) -> str:
    """The protocol a published cell was produced under (:data:`PAPER_PROTOCOLS`; MedHEval: its baseline
    tables 3, 5 and 7, else its mitigation tables)."""
    if record.paper == "medheval":
        return "medheval-baseline" if record.table in MEDHEVAL_BASELINE_TABLES else "medheval-mitigation"
    return PAPER_PROTOCOLS[record.paper]


@dataclass(frozen=True)
class RunConditions:
    """What of a run decides whether its figure may stand beside a paper's: its protocol (``clean`` when
    results.json records none; under the paper's protocol, also whether the protocol reproduces the paper's
    inference code for the model and whether the run used the paper's scorer), random weights, fixture data, ``--limit`` and the
    number of seeds; for LLaVA-Med-1.5 under MedHEval's protocols, whether its images went on the released
    code's square canvas; for MedHEval's CHAIR and Recall, the chair metric's labeler, variant and prediction
    cleaning."""

    protocol: str = CLEAN_PROTOCOL
    random_weights: bool = False
    fixture: bool = False
    limit: int | None = None
    seeds: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    upstream_compat: bool = False
    grey_padding: bool = False
    chunked_tokens: bool = False
    revisions: tuple[str, ...] = ()  # OTHER_REVISIONS reasons of the splits read
    chair: dict[str, Any] = field(default_factory=dict)  # the chair metric's output of the splits read (no lists)
    clinhallu: dict[str, Any] = field(default_factory=dict)  # procedure, prompt_version of the ClinHallu splits read

    @classmethod
    def of(cls, results: dict[str, Any], splits: Sequence[str]) -> "RunConditions":
        """Read from ``results.json``: the protocol, random weights and ``--limit`` of its provenance
        (:func:`medheval.run.provenance.of_run`, so a re-score keeps those of the answers it read), ``fixture``
        on an annotation file of ``splits`` or carried by the provenance, ``seeds`` (a list; absent: one pass),
        the splits' ``run_options`` together, ``scoring.upstream_compat``, ``settings.backend.grey_padding``
        and ``tokenization`` (a re-score: the answering run's, :func:`medheval.run.provenance.input_settings`),
        :data:`OTHER_REVISIONS` of ``splits`` and the chair metric's scalar outputs there."""
        from medheval.run.provenance import input_settings, of_run

        found = of_run(results)
        settings = results.get("settings") or {}
        backend = input_settings(results)  # a re-score: those of the run that generated its answers
        entries = [results.get("benchmarks", {}).get(split) or {} for split in splits]
        seeds = results.get("seeds")
        carried = results.get("provenance") if isinstance(results.get("provenance"), dict) else {}
        return cls(protocol=str(found["protocol"] or CLEAN_PROTOCOL),
                   random_weights=bool(found["random_weights"]),
                   fixture=bool(carried.get("fixture")) or any(
                       f.get("fixture") for entry in entries for f in entry.get("annotation_files") or []
                       if isinstance(f, dict)),
                   limit=found["limit"] if isinstance(found["limit"], int) else None,
                   seeds=len(seeds) if isinstance(seeds, list) and seeds else 1,
                   options={k: v for entry in entries for k, v in (entry.get("run_options") or {}).items()},
                   upstream_compat=bool((results.get("scoring") or {}).get("upstream_compat")),
                   grey_padding=bool(backend.get("grey_padding")),
                   chunked_tokens=backend.get("tokenization") == "upstream_chunked",
                   revisions=tuple(OTHER_REVISIONS[split][1] for split in splits if split in OTHER_REVISIONS),
                   chair=_chair_output(entries), clinhallu=_clinhallu_procedure(entries))

    def reasons(self, record: Published) -> list[str]:
        """Why the run's figure is not comparable with ``record`` (empty: comparable)."""
        out = []
        wanted = paper_protocol(record)
        if self.protocol != wanted:
            out.append(f"protocol differs (run: {self.protocol}, paper: {wanted})")
        else:  # the same protocol: the same inputs, if the paper's code for this model is known, and the same scorer
            if wanted in RELEASED_CODE_MODELS and record.model not in RELEASED_CODE_MODELS[wanted]:
                out.append(f"no inference code released for {record.model} (the protocol's text for it is inferred)"
                           if record.model in NO_INFERENCE_CODE_MODELS else
                           f"the paper ran {record.model} through its own released script (its own prompt format "
                           f"and decoding), which {wanted} does not reproduce")
            if _upstream_scored(wanted) and not self.upstream_compat:
                out.append("scored with this project's rules (paper: its released scorer; --upstream-compat)")
            if record.model in GREY_CANVAS_MODELS.get(wanted, ()) and not self.grey_padding:
                out.append("images not padded as the released code pads them (a grayscale image on a grey square: "
                           "the run predates it, or its processor does not pad to a square)")
            if record.model in CHUNKED_TOKEN_MODELS.get(wanted, ()) and not self.chunked_tokens:
                out.append("prompt tokenized whole, not piece by piece around the image as the released code does "
                           "(the run predates it)")
            if _upstream_scored(wanted) and record.metric in CHAIR_METRICS:
                out.extend(self._chair_reasons(record))
            if record.paper == "clinhallu":
                out.extend(self._clinhallu_reasons())
        out.extend(self.revisions)
        if self.random_weights:
            out.append("random weights")
        if self.fixture:
            out.append("fixture data")
        if self.limit is not None:
            out.append(f"--limit {self.limit}")
        if self.seeds != PAPER_SEEDS:
            out.append(f"{self.seeds} seeds (paper: {PAPER_SEEDS})")
        return out

    def _chair_reasons(self, record: Published) -> list[str]:
        """Why a MedHEval CHAIR or Recall cell was not scored as the released scorer scores it: another labeler
        than CheXbert, another CHAIR formula (Recall: only uncertain-as-positive changes it), or predictions not
        cleaned as its report CSV holds them (under upstream_compat; a run from before chair recorded it)."""
        out = []
        labeler = self.chair.get("labeler")
        if labeler != PAPER_CHAIR_LABELER:
            out.append(f"CHAIR and Recall labelled by {labeler or 'a labeler the run does not record'} (paper: "
                       f"CheXbert; --metric-option chair.labeler=chexbert)")
        variant = self.chair.get("variant")
        if record.metric == "CHAIR" and variant != PAPER_CHAIR_VARIANT:
            out.append(f"CHAIR formula differs (run: chair.variant={variant or 'not recorded'}; paper: its released "
                       f"code, Σ(FP + FN) / #(labelled 0 or 1), chair.variant={PAPER_CHAIR_VARIANT})")
        elif record.metric == "Recall" and variant == "paper" and self.chair.get("uncertain_as_positive"):
            out.append("Recall counts uncertain labels as positive (chair.uncertain_as_positive; paper: its released "
                       "code drops a reference's uncertain cells)")
        if self.upstream_compat and self.chair.get("upstream_compat") is not True:
            out.append("report predictions not cleaned before labelling as the released scorer cleans them "
                       "('Assistant:' character strip, reports under 10 characters replaced; the run predates it, "
                       "or chair.upstream_compat=false)")
        return out


    def _clinhallu_reasons(self) -> list[str]:
        """Why a ClinHallu cell under its protocol was not made as the paper's are: another procedure than the
        current one (procedure 1 generated each Rep setting once and judged H^V on the ORG trace) or other
        prompts than ClinHallu's at the current version (``prompts=upstream``; earlier versions differ in what
        the judges see); a run that records neither predates them."""
        from medheval.run.paper_protocols.others import CLINHALLU_PROCEDURE as PROCEDURE
        from medheval.run.paper_protocols.others import CLINHALLU_PROMPTS_VERSION as UPSTREAM_VERSION

        if not self.clinhallu:
            return ["the run records no ClinHallu procedure or prompts (no clinhallu_run in results.json for the "
                    "split)"]
        out = []
        procedure = self.clinhallu["procedure"]
        if procedure != PROCEDURE:
            out.append(f"ClinHallu procedure {procedure} (the run predates procedure {PROCEDURE}: every setting "
                       f"regenerated up to max_attempts, H^V judged on the Rep-K trace)")
        version = self.clinhallu.get("prompt_version")
        if version != UPSTREAM_VERSION:
            out.append(f"ClinHallu prompts {version or 'not recorded'} (paper: {UPSTREAM_VERSION}, "
                       f"--benchmark-option clinhallu.prompts=upstream; an earlier version: the run predates it)")
        return out


def _clinhallu_procedure(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``procedure`` (absent from ``clinhallu_run.json`` before procedure 2: 1) and ``prompt_version`` of the
    first ClinHallu split among ``entries`` (its ``clinhallu_run``); empty when none is ClinHallu's."""
    for entry in entries:
        info = entry.get("clinhallu_run")
        if isinstance(info, dict):
            prompts = info.get("prompts") if isinstance(info.get("prompts"), dict) else {}
            return {"procedure": info.get("procedure", 1), "prompt_version": prompts.get("version")}
    return {}


def _chair_output(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The scalar fields (labeler, variant, upstream_compat …) of the first chair output among ``entries``."""
    for entry in entries:
        out = (entry.get("metrics") or {}).get("chair")
        if isinstance(out, dict):
            return {key: value for key, value in out.items() if isinstance(value, (str, int, float, bool))}
    return {}


def _row_run(table: Table, labels: Sequence[str], runs: Sequence[Any]) -> tuple[Any, list[str]]:
    """The run behind one report row and the splits that row reads (``(None, [])`` when no one run is)."""
    from medheval.report.paper import _run_labels

    if table.key == "med_stepbench":
        found = [(run, split) for run in runs for split, entry in run.results.get("benchmarks", {}).items()
                 if "stepbench" in (entry.get("metrics") or {}) and (run.model, run.variant) == tuple(labels[:2])
                 and str((entry.get("run_options") or {}).get("knowledge", "none")) == labels[2]]
        return (found[0][0], [found[0][1]]) if len(found) == 1 else (None, [])
    names = _run_labels(list(runs))
    if table.key == "med_hallmark_table1":
        splits = [f"med_hallmark:{config}" for config in labels[3].split(" + ")] if len(labels) > 3 else []
    else:
        splits = [labels[2]]
    found = [run for run in runs if names[id(run)] == tuple(labels[:2])
             and all(split in run.results.get("benchmarks", {}) for split in splits)]
    return (found[0], splits) if len(found) == 1 else (None, [])


def reproduction(tables: Sequence[Table], records: Sequence[Published] | None = None,
                 runs: Sequence[Any] | None = None) -> tuple[Table, list[dict[str, Any]]]:
    """The "Reproduction" table: one row per (report cell, matching published cell) with the run's value
    (and interval), the paper's, and whether the two are comparable (:class:`RunConditions`: same protocol,
    real weights, real data, no ``--limit``, the paper's number of seeds); only a comparable row has
    Δ = run − paper and the flag (the paper's value outside the run's item-resampling interval: an informal
    scale, with a footer line on how many flags chance alone would give, :func:`chance_flags`). ``runs``: the report's runs (:class:`medheval.report.collect.Run`), read for
    each row's conditions; a row whose run is not among them counts as a clean run. The same as JSON records."""
    from medheval.report.paper import Cell, Column, Table

    records = load_published() if records is None else records
    runs = list(runs or [])
    table = Table("reproduction", "Reproduction: this run against the published tables",
                  ["Model", "Mitigation", "Split", "Published cell"],
                  [Column("Run", ranked=False), Column("Paper", ranked=False), Column("Δ", ranked=False),
                   Column(INTERVAL_COLUMN, ranked=False), Column("Comparable", ranked=False)],
                  footer=[REPRODUCTION_NOTE])
    found: list[dict[str, Any]] = []
    for source in tables:
        for labels, cells in source.rows:
            run, splits = _row_run(source, labels, runs)
            conditions = RunConditions.of(run.results, splits) if run is not None else RunConditions()
            for column, cell in zip(source.columns, cells):
                if cell.value is None:
                    continue
                for record, paper in matches(source, labels, column.label, records, conditions.options):
                    reasons = conditions.reasons(record)
                    digits = shown_digits(record, source.key, column.label)
                    half = printed_half_unit(record, source.key, column.label)  # the paper's rounding
                    outside = None if reasons or cell.low is None else (
                        cell.high < paper - half or cell.low > paper + half)
                    flag = ("–" if reasons else "no interval" if outside is None else "⚠ yes" if outside else "no")
                    table.rows.append(([*labels[:3], f"{record.where()} ({record.printed})"], [
                        Cell(value=cell.value, low=cell.low, high=cell.high, std=cell.std, digits=digits),
                        Cell(value=paper, digits=digits),
                        Cell() if reasons else Cell(value=cell.value - paper, signed=True, digits=digits),
                        Cell(text=flag), Cell(text="no: " + "; ".join(reasons) if reasons else "yes")]))
                    found.append({**asdict(record), "run_model": labels[0], "run_mitigation": labels[1],
                                  "run_split": labels[2], "report_table": source.key, "report_column": column.label,
                                  "run_value": cell.value, "run_low": cell.low, "run_high": cell.high,
                                  "paper_value": paper, "paper_protocol": paper_protocol(record),
                                  "run_protocol": conditions.protocol, "comparable": not reasons, "reasons": reasons,
                                  "difference": None if reasons else cell.value - paper, "outside_interval": outside})
    flagged = [row for row, cells in table.rows if cells[3].text == "⚠ yes"]
    if flagged:
        table.footer.append(f"Outside the run's 95% item-resampling interval ({len(flagged)}): "
                            + "; ".join(f"{row[0]} · {row[1]} · {row[3]}" for row in flagged) + ".")
    table.footer += chance_flags(sum(record["outside_interval"] is not None for record in found), len(flagged))
    apart = sum(not record["comparable"] for record in found)
    if apart:
        table.footer.append(f"Not comparable ({apart} of {len(found)}): shown without Δ; the last column says why.")
    if not table.rows:
        table.footer.append("No run matched a published model, split and column (see `medheval published` for the "
                            "papers' models, and ALIASES in medheval/report/published.py for their Hub ids).")
    return table, found


def chance_flags(checked: int, flagged: int) -> list[str]:
    """The footer line on multiplicity: of ``checked`` comparable cells with an interval, ``flagged`` lie outside
    it, and about 1 − LEVEL of them would by chance alone; ``[]`` when none was checked."""
    from medheval.report.stats import LEVEL

    if not checked:
        return []
    rate = 1 - LEVEL
    return [f"By chance: {flagged} of the {checked} comparable cell(s) with an interval are flagged; about "
            f"{rate:.0%} of them (≈ {rate * checked:.1f}) would be even if every run matched its paper up to "
            f"item-sampling noise, so read a flag as a pointer to look, not a finding."]


def printed_half_unit(record: Published, table_key: str, column: str) -> float:
    """Half a unit of the paper's last printed digit, in the units ``table_key``'s ``column`` shows: the printed
    value v stands for any value in [v − h, v + h], h = 0.5·10^(−decimals)·factor (0.494 → 49.4 ± 0.05), so the
    paper's value is outside the run's interval [L, U] only when U < v − h or L > v + h."""
    shown = "0-100" if table_key == "med_stepbench" else COLUMNS[table_key][2][column][1]
    return 0.5 * 10.0 ** -record.decimals * _factor(record.unit, shown)


def shown_digits(record: Published, table_key: str, column: str) -> int:
    """Decimals that give ``record`` its printed precision in the units ``table_key``'s ``column`` shows
    (0.494 → 49.4; 0.23 → 0.23; 6.88 → 6.88): the paper's decimals less the digits a ×100 conversion moves."""
    shown = "0-100" if table_key == "med_stepbench" else COLUMNS[table_key][2][column][1]
    return max(record.decimals - (2 if _factor(record.unit, shown) == 100.0 else 0), 0)


def format_tables(records: Sequence[Published]) -> str:
    """The records as plain-text tables, one per paper table and split: a row per model × setting, a column
    per metric, values as printed (``*``: the cell has a note, listed below); the table's note last."""
    groups: dict[tuple[str, str], list[Published]] = {}
    for record in records:
        groups.setdefault((record.paper, record.table), []).append(record)
    blocks = []
    for (paper, number), group in groups.items():
        lines = []
        for split in dict.fromkeys(r.split for r in group):
            part = [r for r in group if r.split == split]
            metrics = list(dict.fromkeys(r.metric for r in part))
            rows = list(dict.fromkeys((r.model, r.setting) for r in part))
            cells = {(r.model, r.setting, r.metric): r.printed + ("*" if r.note else "") for r in part}
            units = ", ".join(f"{u}" for u in dict.fromkeys(r.unit for r in part))
            header = ["Model", "Setting", *metrics]
            body = [[model, setting or "–", *(cells.get((model, setting, m), "–") for m in metrics)]
                    for model, setting in rows]
            widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
            lines += [f"{PAPERS[paper]}, {group[0].location}{f' — {split}' if split else ''} (as printed; scale "
                      f"{units})"]
            lines += ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
                      for line in [header, *body]]
            noted: dict[str, list[str]] = {}
            for r in part:
                if r.note:
                    noted.setdefault(r.note, []).append(" ".join(x for x in (r.model, r.setting, r.metric) if x))
            lines += [f"  * {', '.join(where)}: {note}" for note, where in noted.items()] + [""]
        lines += [f"note: {TABLE_NOTES[(paper, number)]}"] if (paper, number) in TABLE_NOTES else []
        blocks.append("\n".join(lines).rstrip())
    return "\n\n".join(blocks)


def select(records: Sequence[Published], paper: str | None = None, model: str | None = None,
           table: str | None = None) -> list[Published]:
    """Records of ``paper`` and ``table``; ``model``: a printed name (case-insensitive substring) or a Hub id
    (:func:`paper_models`)."""
    if paper is not None and paper not in PAPERS:
        raise ValueError(f"--paper {paper!r}: one of {', '.join(PAPERS)}")
    out = [r for r in records if (paper is None or r.paper == paper) and (table is None or r.table == table)]
    if model is not None:
        by_id = {(p, name) for p in PAPERS for name in paper_models(model, p)}
        out = [r for r in out if model.lower() in r.model.lower() or (r.paper, r.model) in by_id]
    return out


def cmd_published(args: argparse.Namespace) -> int:
    """``medheval published [--paper P] [--table T] [--model M] [--json]``."""
    records = select(load_published(), args.paper, args.model, args.table)
    if not records:
        raise ValueError("no published value matches " + " ".join(
            f"--{key} {value}" for key, value in (("paper", args.paper), ("table", args.table),
                                                  ("model", args.model)) if value)
                         + " (try `medheval published` for everything)")
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(r).items() if v is not None} for r in records], indent=1,
                         ensure_ascii=False))
    else:
        print(format_tables(records))
    return 0


def add_published_command(commands: argparse._SubParsersAction) -> None:
    """``medheval published``."""
    parser = commands.add_parser("published", help="the papers' published tables, as stored in the package")
    parser.add_argument("--paper", choices=sorted(PAPERS), help="one paper")
    parser.add_argument("--table", help="one table number (with --paper)")
    parser.add_argument("--model", help="a printed model name (substring) or a Hub id, e.g. llava-hf/llava-1.5-7b-hf")
    parser.add_argument("--json", action="store_true", help="one JSON object per cell")
    parser.set_defaults(handler=cmd_published)

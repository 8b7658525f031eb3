"""MedHEval's two inference code paths (commit ``7f7d980e``, ``code/baselines/``) as paper protocols.

``medheval-baseline`` (Tables 3, 5, 7) follows ``Med-LVLMs/llava-med-1.5`` (LLaVA-Med-1.5) and
``Med-LVLMs/llava_1.6/LLaVA`` (LLaVA-NeXT): ``model_vqa.py`` for close-ended items, ``model_open_vqa.py``
for open-ended ones, both launched by ``eval_batch.py`` from ``inference_scripts/*.sh`` with no decoding
flag, so the argparse defaults hold: ``conv_mode`` ``vicuna_v1`` (LLaVA-Med) / ``llava_v1`` (LLaVA-NeXT;
``eval_batch.py``'s own ``--conv-mode simple`` is never passed on), temperature 0.2 (so ``do_sample``),
``top_p=None``, one beam, ``max_new_tokens=1024``, ``set_seed(0)`` (LLaVA-Med only).

``medheval-mitigation`` (Tables 4, 6, 8–11) follows ``Mitigation/llava-med-1.5``: one ``model_vqa.py``
whose ``--baseline`` branch sets each method's decoding (``scripts/medHEval/*/*.sh`` pass only
``--baseline``): "original" samples at the argparse temperature 0.7; VCD, M3ID, AvisC and DAMRO sample at
T = 1; PAI and DoLa are greedy; OPERA runs 5 beams, scale factor 25, threshold 25, 128 new tokens.

Instruction text (``record`` fields as released: ``meta.question_type``, ``meta.raw_choices``):

====================  ====================================================  ==============================
script                close-ended                                           open-ended (knowledge, report)
====================  ====================================================  ==============================
baseline LLaVA-Med    multi-choice: Q + :data:`MC_BASELINE` + raw choices;   Q (``<image>`` removed, stripped)
                      else Q + :data:`YES_NO`; ``<image>`` removed, stripped
baseline LLaVA-NeXT   as LLaVA-Med with :data:`YES_NO_NEXT`, not stripped   Q + :data:`OPEN_NEXT`
mitigation            Q [+ :data:`MC_MITIGATION` + raw choices when the      Q (no suffix)
                      choices string is longer than 10 characters]
                      [+ :data:`YES_NO` when ``question_type`` is binary];
                      knowledge:closed and context files carry
                      ``ground_truth_type``, so they get no suffix
====================  ====================================================  ==============================

These suffixes are short instruction fragments, kept here as constants; ``tests/test_paper_protocols_crosscheck.py``
reads them out of the upstream scripts with :mod:`ast` and checks every rendered input against them.
"""

from __future__ import annotations

from typing import Any

from medheval.run.paper_protocols.base import Conflict, PaperProtocol

COMMIT = "7f7d980e676890ed99513f4629fd4d5af19bc8b9"
CODE_URL = f"https://github.com/Aofei-Chang/MedHEval/tree/{COMMIT}/code/baselines"
LLAVA_MED, LLAVA_NEXT = "llava-med-1.5", "llava-1.6"
BENCHMARKS = ("mm_vishal", "cxr_vishal", "knowledge", "context", "vishal_report")
TEXT_FILES = ("knowledge", "context")  # their close-ended files name the type ``ground_truth_type``

MC_BASELINE = " Please select from the following choices: "
MC_MITIGATION = " Please choose from the following options: "
YES_NO = " Please answer Yes or No."
YES_NO_NEXT = " Please answer Yes or No in a short answer."
OPEN_NEXT = "Generate a short but precise answer:"  # appended without a space, as released
IMAGE_TOKEN = "<image>"


def _meta(record: dict) -> dict:
    meta = record.get("meta")
    return meta if isinstance(meta, dict) else {}


def _raw_choices(record: dict) -> str | None:
    """The choices string as released (``meta.raw_choices``), else our lettered list (records not from the files)."""
    raw = _meta(record).get("raw_choices")
    if raw is not None:
        return str(raw)
    choices = record.get("choices") or []
    return ", ".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices)) if choices else None


def _question_type(record: dict) -> str | None:
    declared = _meta(record).get("question_type")
    if declared is None:
        return {"multiple_choice": "multi-choice", "yes_no": "binary"}.get(record.get("answer_type", ""))
    return str(declared)


def baseline_instruction(record: dict, script: str) -> str:
    """The text ``Med-LVLMs/*/model_vqa.py`` (close-ended) or ``model_open_vqa.py`` (open) builds for a record."""
    question = str(record["question"])
    if record.get("answer_type") in ("open", "report"):
        return question + OPEN_NEXT if script == LLAVA_NEXT else question.replace(IMAGE_TOKEN, "").strip()
    if _question_type(record) == "multi-choice":
        text = f"{question}{MC_BASELINE}{_raw_choices(record)}"
    else:  # binary; the knowledge/context files' ground_truth_type is read as the question_type (inferred)
        text = question + (YES_NO_NEXT if script == LLAVA_NEXT else YES_NO)
    return text if script == LLAVA_NEXT else text.replace(IMAGE_TOKEN, "").strip()


def mitigation_instruction(record: dict, script: str) -> str:
    """The text ``Mitigation/llava-med-1.5/llava/eval/model_vqa.py`` builds for a record (every script variant)."""
    text = str(record["question"])
    raw = _meta(record).get("raw_choices") if "raw_choices" in _meta(record) else _raw_choices(record)
    if raw is not None and len(str(raw)) > 10:
        text += MC_MITIGATION + str(raw)
    has_type = record.get("benchmark") not in TEXT_FILES or record.get("answer_type") == "open"
    if has_type and _question_type(record) == "binary":
        text += YES_NO
    return text.replace(IMAGE_TOKEN, "").strip()


_BASE = {"do_sample": True, "top_p": 1.0, "top_k": 50, "num_beams": 1, "max_new_tokens": 1024}
_T1_NO_TOP_K = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 1024}
_GREEDY = {"do_sample": False, "num_beams": 1, "max_new_tokens": 1024}

_COMMON_INFERRED = (
    "vishal_report runs its released file (config default, 490 items at 7f7d980), not vishal_report:ba4586e "
    "(the 500-item file before upstream commit 42e36fc, 2025-04-23, which also changed the instruction and 60 "
    "references). Inferred from the paper text this project transcribes: its dataset table and appendix C.2 "
    "give 490 image-report pairs (500 sampled, 10 dropped at human validation), and in its report case study "
    "(qid 22, whose reference both revisions share) the M3ID answer echoes the later instruction's words "
    "(relevant measurements, size, volume). The earlier instruction appears in an earlier appendix draft, "
    "whose report evaluation (GPT-4 judged) is not the published CheXbert-based CHAIR. The rewritten file "
    "reached GitHub on 2025-04-23, after arXiv v1: that dates the upload, not the runs. Which of the 60 "
    "edited references the published runs scored against cannot be told from the paper. --compare-published "
    "flags report rows run on vishal_report:ba4586e",
    "top_k 50 while sampling: the scripts pass no top_k, so transformers' GenerationConfig default (50 in the "
    "4.x releases LLaVA pins) applied, assuming the checkpoints' generation_config sets none; top_p=None is "
    "written top_p 1.0 (no nucleus filter)",
    "image preprocessing: LLaVA-Med-1.5 pads to a square with the CLIP mean colour and resizes to 336 "
    "(image_aspect_ratio pad; the converter's LlavaImageProcessor do_pad=True); LLaVA-NeXT uses anyres tiles "
    "(the HF LlavaNextProcessor); one image per item, placed before the text. The released mm_utils.py pads a "
    "grayscale (mode L) image, as MIMIC-CXR-JPG's are, with grey 114 rather than the RGB mean (122, 116, 104): "
    "reproduced (grey_padding). Not reproduced: it pastes the image at a random, unseeded offset of 0 or 1 pixel "
    "from the centre; here it is centred",
    "text identity is checked character for character; the prompt ids of LLaVA-Med-1.5 and LLaVA-NeXT are then "
    "built as the released tokenizer_image_token builds them (each piece around <image> tokenized alone, so the "
    "piece after the image starts with its own word-start marker, e.g. a lone '▁' before '\\n'; BOS from the "
    "first piece only), each image expanded to the processor's count of image tokens for it. Each piece goes "
    "through the model's HF tokenizer where the released builder.py loaded the slow sentencepiece one "
    "(use_fast=False); the two are assumed to give the same ids for these pieces, which hold no special token",
)
# model types whose prompt ids follow LLaVA's tokenizer_image_token (medheval.backends.llava_tokens)
_CHUNKED = ("llava", "llava_next")

# how MedHEval's published numbers were scored and loaded: its released scorers (first-sentence yes/no, closest
# option, "Assistant:" strip, the report CSV's short-report sentence; medheval.scoring upstream_compat), its
# CHAIR code (code/evaluation/report_eval/run_chair.py -> CXRMetric/run_extraction.py calculate_metrics: chair
# variant medheval_code), its S_h judge prompt, and the float16 weights every llava/model/builder.py loads (images
# cast with .half()); and LLaVA-Med-1.5's grey canvas for grayscale images (process_images in its llava/mm_utils.py)
_SCORING: dict[str, Any] = {
    "upstream_compat": True,
    "metric_options": {"sh_judge": {"prompt_style": "upstream"}, "chair": {"variant": "medheval_code"}},
    "scoring_notes": (
        "Report predictions (vishal_report) are cleaned as the released report CSV conversion (run_chair.py, "
        "run_eval.py) writes them before CHAIR/Recall, CheXbert, RadGraph and the generation metrics score them: "
        "text.strip(\"Assistant:\") (a character set, so a trailing 'n' of '... effusion' goes too), the raw text "
        "where that leaves nothing, and \"No report generated.\" for a text under 10 characters "
        "(medheval.scoring.parsing.clean_generated_text); the references are scored as released.",
        "CHAIR/Recall labeler: the released code labels reports with CheXbert. Its weights are not redistributed, "
        "so chair keeps its offline rule labeler unless --metric-option chair.labeler=chexbert (with "
        "chair.chexbert_path or $MEDHEVAL_CHEXBERT_PATH) is given; results.md and the report name the labeler, "
        "and the Reproduction table calls a CHAIR or Recall cell labelled otherwise not comparable.",
    ),
    "gpu_dtype": "float16", "grey_padding": True}
# the paper's CHAIR formula against the released scorer's (the protocol scores with the scorer's)
CHAIR_CONFLICT = Conflict(
    "metric chair.variant", "medheval_code", "paper", "--metric-option chair.variant=paper",
    "code: report_eval/run_chair.py -> CXRMetric/run_extraction.py calculate_metrics, CHAIR = Σ(FP + FN) / "
    "#(prediction labelled 0 or 1), cells whose reference is uncertain dropped, so a finding blank in the reference "
    "is never a hallucination; paper: §3.2 Evaluation Metric, CHAIR = |G − S| / |G| (findings of the generated "
    "report not in the reference's). Recall is the same under both")

BASELINE = PaperProtocol(
    name="medheval-baseline",
    title="MedHEval Tables 3, 5, 7: the released baseline scripts (vicuna_v1 / llava_v1, T 0.2 sampled, "
          "1024 tokens)",
    reproduces="MedHEval Tables 3, 5 and 7 (baselines)",
    source=f"{CODE_URL}/Med-LVLMs",
    benchmarks=BENCHMARKS,
    instruction=baseline_instruction,
    prompt_version=f"medheval-baseline@{COMMIT[:8]}",
    scripts={"llava_next": LLAVA_NEXT, "*": LLAVA_MED},
    templates={"llava": "vicuna_v1", "llava_next": "llava_v1", "*": "model"},
    generation={"none": {"defaults": {**_BASE, "temperature": 0.2}}},
    **_SCORING,
    upstream_tokens=_CHUNKED,
    seeds=(0,),
    conflicts=(CHAIR_CONFLICT,),
    inferred=(
        "knowledge:closed: no released script runs it (Med-LVLMs' inference_scripts are Mixed_H, Single_H, "
        "Type1_open, Type2_open and Type3, the context split) and no table publishes it; model_vqa.py's rules "
        "are applied as for context",
        "knowledge:closed and context: model_vqa.py reads line['question_type'], which these released files "
        "lack (they name it ground_truth_type, always binary); the yes/no suffix is applied as for binary items, "
        "which is what the script does with the question_type the building notebooks saved ('type4_Diagnosis' in "
        "Type2_Close-ended.ipynb, 'type3_contextual' in Type3.ipynb: not multi-choice, so the yes/no branch)",
        "vishal_report: Type1_open.sh runs model_open_vqa.py, whose filter reads line['question_type'], a key "
        "the released report file lacks (a KeyError before the first item; with the key it would keep only "
        "type4_Knowledge items), so the released script answers no report item; its open-ended text rule is "
        "applied to the report questions",
        "multiple-choice items whose choices string is shorter than 4 characters are skipped by model_vqa.py; "
        "the released files have none",
        "seed: LLaVA-Med's scripts call set_seed(0) once per process (items then share one RNG stream); "
        "LLaVA-NeXT's call none; seed 0 is used for both",
        "other models (not LLaVA / LLaVA-NeXT) get the LLaVA-Med script's text and their own chat template. "
        "The upstream repository at 7f7d980 does hold baseline code for the other published Med-LVLMs "
        "(Med-LVLMs/ folders for LLaVA-Med v1, CheXagent, RadFM, Med-Flamingo, MiniGPT-4, XrayGPT and LLM-CXR: "
        "eval / eval_open scripts and inference_scripts), each with its own prompt format and decoding (e.g. "
        "CheXagent's eval.py wraps the question in its own USER/ASSISTANT text and decodes with the model's "
        "generation config; LLaVA-Med v1's model_vqa_med.py decodes greedily); this protocol does not "
        "reproduce those scripts, so the Reproduction table never calls a run comparable with the CheXagent or "
        "LLaVA-Med (v1) cells. GPT-4o: no inference code for it is in the repository",
        *_COMMON_INFERRED,
    ),
)

MITIGATION = PaperProtocol(
    name="medheval-mitigation",
    title="MedHEval Tables 4, 6, 8-11: the released mitigation script (vicuna_v1, per-method decoding, "
          "OPERA 25/25 and AvisC mean+1·std as in code)",
    reproduces="MedHEval Tables 4, 6, 8, 9, 10 and 11 (mitigations)",
    source=f"{CODE_URL}/Mitigation/llava-med-1.5",
    benchmarks=BENCHMARKS,
    instruction=mitigation_instruction,
    prompt_version=f"medheval-mitigation@{COMMIT[:8]}",
    scripts={"*": LLAVA_MED},
    templates={"llava": "vicuna_v1", "llava_next": "llava_v1", "*": "model"},
    generation={
        "none": {"defaults": {**_BASE, "temperature": 0.7}},  # the "original" row: argparse temperature 0.7
        "vcd": {"defaults": {**_BASE, "temperature": 1.0}},
        "avisc": {"defaults": dict(_T1_NO_TOP_K)},
        "m3id": {"defaults": dict(_T1_NO_TOP_K)},
        "damro": {"defaults": dict(_T1_NO_TOP_K)},
        "pai": {"defaults": dict(_GREEDY)},
        "dola": {"defaults": dict(_GREEDY)},
        "opera": {"defaults": {"do_sample": False, "max_new_tokens": 128}},
    },
    mitigation_options={"opera": {"scale_factor": 25.0, "threshold": 25}, "avisc": {"top_k": None},
                        "pai": {"cfg_stream": "raw_question"}},
    **_SCORING,
    upstream_tokens=_CHUNKED,
    seeds=(0,),
    conflicts=(
        Conflict("mitigation opera.scale_factor", 25.0, 50.0, "--mitigation opera:scale_factor=50,threshold=15",
                 "code: model_vqa.py opera branch; paper: appendix A.4 (25 only for LLaVA-Med-1.5 reports)"),
        Conflict("mitigation opera.threshold", 25, 15, "--mitigation opera:scale_factor=50,threshold=15",
                 "code: model_vqa.py opera branch; paper: appendix A.4 (25 only for LLaVA-Med-1.5 reports)"),
        Conflict("mitigation avisc.top_k", None, 10, "--mitigation avisc:top_k=10",
                 "code: avisc_sample.py thresholds attention at mean + 1·std (lamb=1.0); paper: appendix A.4 "
                 "top-10 outlier tokens"),
        CHAIR_CONFLICT,
    ),
    inferred=(
        "LLaVA-NeXT (Tables 9-11): no mitigation script for it was released; the LLaVA-Med mitigation "
        "script's text is used with LLaVA-NeXT's llava_v1 template from Med-LVLMs/llava_1.6",
        "knowledge:closed and context items get no suffix: the script adds the yes/no suffix only when "
        "line['question_type'] == 'binary'. The released files carry no question_type, but that is not why: "
        "the notebooks that built them (code/data_generation/Type2_Close-ended.ipynb and Type3.ipynb) save "
        "question_type 'type4_Diagnosis' and 'type3_contextual' (the binary label goes to ground_truth_type), "
        "so the files the script read (the mitigation shell scripts name them by working paths) would not "
        "have matched 'binary' either",
        "DoLa: the script passes temperature 0.9, top_p 0.95, top_k 0 without do_sample, so decoding is greedy",
        "the OPERA branch and its 128 new tokens apply to every split (the paper's 25/25 note concerns reports)",
        "OPERA: the released branch sets response_start to the prompt's input_ids length + 576, which counts the "
        "<image> placeholder itself, so the local window starts one position past the first answer token and is "
        "empty at the first step, where the released opera_beam_search (Med-LVLMs/llava-med-1.5/transformers-4.37.2/"
        "src/transformers/generation/utils.py) then takes a max over an empty dimension and raises; the "
        "published numbers cannot have come from that code as released. Here the window starts at "
        "the first answer token, as in OPERA's own code",
        "OPERA's image bonus (answers of up to 10 tokens): the released opera_beam_search sums the last row's "
        "attention over columns image_start to image_end inclusive, with model_vqa.py's key_position "
        "image_start 34 and image_end 34 + 576: 577 columns, the 576 image positions and the one position after "
        "them. Here the sum covers the image tokens only (found from the input ids, medheval/mitigations/"
        "opera.py), so the bonus leaves out that one column; not reproduced",
        "VCD, not reproduced on purpose: the released LLaVA-Med glue builds the input embeddings from the clean "
        "image, and the contrast branch reuses them, so the noised image is never encoded and the published VCD "
        "rows are sampling at T 1, top_k 50 with the β 0.1 cutoff (ℓ + α(ℓ − ℓ) = ℓ). Here the noised image "
        "reaches the model (the method as defined); --mitigation vcd:alpha=0 gives the released script's "
        "effective scores (the contrast is ℓ, the β cutoff still applies), though it still runs the unused "
        "noised stream",
        "PAI's text-only (CFG) stream, reproduced: as in the released script it is the BOS token followed by "
        "the tokens of the instruction text alone (cur_prompt: the question with the script's suffixes, <image> "
        "removed, stripped; no conversation template, no other special token): pai:cfg_stream=raw_question "
        "(--mitigation pai:cfg_stream=templated gives PAI's own LLaVA form, the templated prompt without its "
        "image tokens). Not reproduced: the released script skipped the attention boost at the prefill of the "
        "first item of each process only (its use_cfg flag was still set from setup); here every item's "
        "prefill is boosted, as the released script did for every later item",
        *_COMMON_INFERRED,
    ),
)

PROTOCOLS: tuple[PaperProtocol, ...] = (BASELINE, MITIGATION)

__all__ = ["BASELINE", "BENCHMARKS", "LLAVA_MED", "LLAVA_NEXT", "MC_BASELINE", "MC_MITIGATION", "MITIGATION",
           "OPEN_NEXT", "PROTOCOLS", "YES_NO", "YES_NO_NEXT", "baseline_instruction", "mitigation_instruction"]

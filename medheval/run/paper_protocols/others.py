"""Paper protocols of Med-HallMark, ClinHallu and Med-StepBench.

* ``clinhallu`` follows ClinHallu's released ``src/common.py``, ``configs/config.yaml`` and judge and table
  scripts (commit ``560e3ff5``): its own prompts (``--benchmark-option clinhallu.prompts=upstream``), a system
  message and one user message with the text first and the images after it, temperature 0.7, top-p 0.9,
  4,096 tokens, ``chat_template_kwargs: {enable_thinking: False}``, up to 1 + ``retry_attempts`` (50)
  generations of every trace (ORG and the three replace runs), its judge request
  (``clinhallu.judge_settings=upstream``) and its scorer (``upstream_compat``: Acc over valid traces with a
  judged answer, rounded to 4 places, Δ from the rounded values). The settings are the family's run options
  (:mod:`medheval.families.clinhallu.task`).
* ``med-hallmark`` and ``med-stepbench``: no inference code was released; every setting is inferred and
  says from what (:attr:`PaperProtocol.inferred`).
"""

from __future__ import annotations

from medheval.run.generation import BUILTIN_BY_ANSWER_TYPE
from medheval.run.paper_protocols.base import PaperProtocol
from medheval.run.prompts import build_prompt

CLINHALLU_COMMIT = "560e3ff5203180dab70a0783ef9d313c7401b8ce"
# what the paper's ClinHallu numbers need (medheval.families.clinhallu reads these; the report checks a run's):
# procedure 2 = every setting regenerated up to max_attempts, H^V judged on the Rep-K trace (1: Rep settings
# generated once, H^V judged on the ORG trace); the upstream prompt set's version (v2: the answer judge sees the
# bare question, the support-context fallback is the step-judge script's)
CLINHALLU_PROCEDURE = 2
CLINHALLU_PROMPTS_VERSION = f"clinhallu-upstream-{CLINHALLU_COMMIT[:8]}-v2"
_LENGTHS = {name: dict(values) for name, values in BUILTIN_BY_ANSWER_TYPE.items()}


def med_hallmark_instruction(record: dict, script: str) -> str:
    """Confidence-weakening items: the released question (its doubt prefix included) and nothing after it
    (their references are full sentences); every other item: this project's clean text."""
    if record.get("config") == "confidence_weakening":
        return str(record["question"]).strip()
    return build_prompt(record)


MED_HALLMARK = PaperProtocol(
    name="med-hallmark",
    title="Med-HallMark Table 1 (no inference code released): confidence-weakening items without a yes/no "
          "suffix and with open-ended lengths",
    reproduces="Med-HallMark Table 1",
    source="no inference code released (github.com/ydk122024/Med-HallMark holds data and judge prompts)",
    benchmarks=("med_hallmark",),
    instruction=med_hallmark_instruction,
    prompt_version="med-hallmark-inferred-v1",
    scripts={"*": "med-hallmark"},
    templates={"*": "model"},
    generation={"*": {"defaults": {"do_sample": False}, "answer_types": _LENGTHS,
                      "benchmarks": {"med_hallmark:confidence_weakening": {"max_new_tokens": 256}}}},
    inferred=(
        "confidence_weakening: all 84 yes/no items have full-sentence references, so the released question "
        "is sent as it is (no yes/no suffix) and answers get 256 tokens like open-ended items, not 16",
        "the paper states no decoding settings: greedy decoding and the clean lengths elsewhere",
        "the other configs keep the clean instruction text and the model's own chat template",
    ),
)

MED_STEPBENCH = PaperProtocol(
    name="med-stepbench",
    title="Med-StepBench Table 3 (no inference code released): sampling at T 0.2, top-p 0.9 per the paper",
    reproduces="Med-StepBench Table 3",
    source="no inference code released; paper, Implementation Details",
    benchmarks=("med_stepbench",),
    instruction=None,
    prompt_version="",
    templates={"*": "model"},
    generation={"*": {"defaults": {"do_sample": True, "temperature": 0.2, "top_p": 0.9}, "answer_types": _LENGTHS}},
    inferred=(
        "temperature 0.2: the paper gives a range 0.2-0.3 for all models; its lower end is used "
        "(--temperature 0.3 for the upper)",
        "top-p 0.9 from the paper; lengths are not stated: the clean lengths (16 tokens per true/false "
        "verdict) are kept",
        "statement prompts are the family's own (medheval/families/stepbench), as the paper's prompt text "
        "was not released",
    ),
)

CLINHALLU = PaperProtocol(
    name="clinhallu",
    title="ClinHallu Tables 2-3: released prompts and judge requests, system + text-first user turn, T 0.7, "
          "top-p 0.9, 4096 tokens, no thinking, up to 1+50 generations of every trace, Acc over valid traces",
    reproduces="ClinHallu Tables 2 and 3",
    source=f"https://github.com/alibaba-damo-academy/ClinHallu/tree/{CLINHALLU_COMMIT} (src/common.py, "
           f"configs/config.yaml, src/model_evaluation/01_generate_cot.py, 02_judge_answers.py, "
           f"04_judge_step_hallucination.py, src/result_analysis/05_make_result_tables.py)",
    benchmarks=("clinhallu",),
    instruction=None,
    # v2: every setting regenerated, H^V judged on Rep-K, ClinHallu's judge request, bare question for the answer judge
    prompt_version=f"clinhallu-upstream@{CLINHALLU_COMMIT[:8]}-v2",
    templates={"*": "model"},
    generation={"*": {"benchmarks": {"clinhallu": {"max_new_tokens": 4096}}}},
    benchmark_options={"clinhallu": {"prompts": "upstream", "temperature": 0.7, "top_p": 0.9, "max_attempts": 51,
                                     "order": "text_first", "enable_thinking": False, "judge_settings": "upstream"}},
    upstream_compat=True,
    inferred=(
        "retry_attempts 50 is read as 1 + 50 generations of every trace (ORG, Rep-V, Rep-K, Rep-VK) until it "
        "parses (max_attempts 51)",
        "a local HF model receives the same message order through its chat template (text part, then image "
        "parts); enable_thinking=False goes to templates that take it (Qwen3) and to API servers as "
        "chat_template_kwargs",
        "a judge call that fails (HTTP 429/5xx, a timeout, a dropped connection) counts as one of the record's "
        "1 + 5 tries, as an unusable reply does (judge option max_tries=6)",
        "not reproduced: a judge HTTP 4xx other than 408/409/425/429 is not retried (401/403/404 stop the run, any "
        "other fails the record at once), where ClinHallu retries every exception within its 6 tries; the backoff "
        "between tries is this project's (exponential with jitter), not ClinHallu's min(2^try + U(0, 1), 30) s",
        "not reproduced: a model under test served over an API is re-asked after a failed call (HTTP 429/5xx, a "
        "timeout; --api-option max_retries), and a record still without a reply stops the batch and is asked again "
        "when the command is re-run; ClinHallu sends each call once and, when the first call of a trace fails, keeps "
        "the trace as invalid (api_failed), later failures counting among its 51 generations",
        "not reproduced: a judge reply is read leniently (a JSON object inside prose or fences, single quotes; "
        "ClinHallu: the whole reply as JSON once fences are removed), and an answer_correct other than 0 or 1 is "
        "asked again (ClinHallu reads it as 0)",
    ),
)

PROTOCOLS: tuple[PaperProtocol, ...] = (MED_HALLMARK, CLINHALLU, MED_STEPBENCH)

__all__ = ["CLINHALLU", "MED_HALLMARK", "MED_STEPBENCH", "PROTOCOLS", "med_hallmark_instruction"]

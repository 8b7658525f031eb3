"""ClinHallu prompts: the trace request (ORG), the continuations (Rep-V, Rep-K, Rep-VK), the answer
judge and the three step judges, in two styles.

* ``style="own"`` (default): this project's wording. The given stages of a Rep setting are an
  *assistant prefix* ending with the next marker, so the model continues its own answer.
* ``style="upstream"``: ClinHallu's constants, read at run time from its ``prompts/*.py`` pinned
  at commit :data:`UPSTREAM_COMMIT` (sha256-checked through :mod:`medheval.data.fetch`, parsed with
  :mod:`ast`, never executed), and the support-context fallback sentence from its step-judge script.
  As upstream does, the given stages go into the *user* prompt and are put back in front of the
  continuation before parsing, and the answer judge sees the bare question (no options). The files
  are read from ``$MEDHEVAL_CLINHALLU_CODE`` (a copy of the repository at that commit) when set, else
  from the run's data folder when it holds them, else from the cache, else downloaded once
  (:func:`upstream_file`).

Both styles fill the same placeholders, so one renderer serves both: ``{question}``,
``{options_text}`` (``"Options:\\nA. x\\nB. y\\n\\n"`` or ``""``), ``{visual_recognition}``,
``{knowledge_recall}``, ``{ground_truth}``, ``{predicted_answer}``, ``{reference_text}``,
``{candidate_text}``, ``{support_context}``. Judges reply with JSON: ``{"answer_correct": 0|1,
"answer_reasoning": str}`` and ``{"hallucinated": 0|1, "reason": str}`` (the upstream keys, kept
in both styles so replies are read one way).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from medheval.families.clinhallu.trace import STAGES, render_stages
from medheval.data.fetch import FetchedFile, PinnedFile, fetch
from medheval.run.paper_protocols.others import CLINHALLU_COMMIT, CLINHALLU_PROMPTS_VERSION
from medheval.run.prompts import OPTION_LETTERS

STYLES = ("own", "upstream")
SETTINGS = ("org", "rep_v", "rep_k", "rep_vk")
OWN_VERSION = "clinhallu-own-v1"

UPSTREAM_COMMIT = CLINHALLU_COMMIT
UPSTREAM_VERSION = CLINHALLU_PROMPTS_VERSION  # its history: medheval.run.paper_protocols.others
UPSTREAM_REPO = "https://github.com/alibaba-damo-academy/ClinHallu"
UPSTREAM_BASE = f"https://raw.githubusercontent.com/alibaba-damo-academy/ClinHallu/{UPSTREAM_COMMIT}"
CODE_DIR_ENV = "MEDHEVAL_CLINHALLU_CODE"  # a local copy of the ClinHallu repository at UPSTREAM_COMMIT
# name -> pinned file (path relative to the repository root)
UPSTREAM_FILES: dict[str, PinnedFile] = {
    name: PinnedFile(relpath=relpath, url=f"{UPSTREAM_BASE}/{relpath}", sha256=sha)
    for name, relpath, sha in (
        ("cot_generation", "prompts/cot_generation.py",
         "5afe880daf8b0e0e7f2c5ad31b6fe7d01ab6b125b9f584d216bc3a524c698113"),
        ("judge", "prompts/judge.py", "521ab0cc8a84815e9bd35e23df799b2e2011c5c5057053a08c5f4ea6c09af48b"),
        ("step_hallucination_judge", "prompts/step_hallucination_judge.py",
         "dcb8e67c5c0e6e037151e41065fd15674225ef4345476e42184c3c2148c92386"),
        ("step_judge_script", "src/model_evaluation/step_hallucination_judge.py",
         "9c1a4f9921bdf052fd787c37033b61b0465dc7f52bb98ec20fc41953791b7d56"),
    )
}
# the support context the KR and reasoning judges see when neither trace has a VR or KR line: the text this
# function of the step-judge script returns after its ``or``
SUPPORT_FALLBACK = ("step_judge_script", "_build_support_context")
# PromptSet field -> (upstream file, constant)
UPSTREAM_NAMES: dict[str, tuple[str, str]] = {
    "trace_system": ("cot_generation", "COT_SYSTEM_PROMPT"),
    "org_user_image": ("cot_generation", "COT_USER_PROMPT_WITH_IMAGE"),
    "org_user_text": ("cot_generation", "COT_USER_PROMPT_TEXT_ONLY"),
    "continue_rep_v": ("cot_generation", "CONTINUE_FROM_VR_PROMPT"),
    "continue_rep_k": ("cot_generation", "CONTINUE_FROM_KR_PROMPT"),
    "continue_rep_vk": ("cot_generation", "CONTINUE_FROM_VR_KR_PROMPT"),
    "answer_judge_system": ("judge", "ANSWER_JUDGE_SYSTEM_PROMPT"),
    "answer_judge_user": ("judge", "ANSWER_JUDGE_USER_PROMPT_TEMPLATE"),
    "step_judge_system": ("step_hallucination_judge", "STEP_HALLUCINATION_JUDGE_SYSTEM_PROMPT"),
    "step_judge_visual_recognition": ("step_hallucination_judge", "VR_HALLUCINATION_JUDGE_USER_PROMPT_TEMPLATE"),
    "step_judge_knowledge_recall": ("step_hallucination_judge", "KR_HALLUCINATION_JUDGE_USER_PROMPT_TEMPLATE"),
    "step_judge_reasoning": ("step_hallucination_judge", "REASONING_HALLUCINATION_JUDGE_USER_PROMPT_TEMPLATE"),
}

# ------------------------------------------------------------------------------------ own wording

_OWN_SYSTEM = """\
You are a clinician working through a medical image question step by step. Write your answer in \
exactly three sections, each starting with its marker on its own line, in this order:

[Visual Recognition]
Only what can be seen: modality, view, anatomy, findings and where they are. No diagnosis, and \
do not discuss the question yet.

[Knowledge Recall]
The medical facts this question depends on (definitions, typical appearances, criteria), stated \
in general terms without referring to this image.

[Reasoning]
Bring the findings and the facts together and explain how they lead to the answer. Finish this \
section with one line:
[Answer] <final answer>

Rules for the [Answer] line: with lettered options, give the letter and the option text \
(e.g. "B. Pneumonia"); for a yes/no question without options, write only yes or no; otherwise a \
short phrase. Never make up options that were not offered. Each section needs at least a full \
sentence."""

_OWN_ORG_IMAGE = """\
Look at the image(s) and answer the question below in the three-section format.

Question: {question}

{options_text}Start with [Visual Recognition]."""

_OWN_ORG_TEXT = """\
No image is attached. Answer the question below in the three-section format; under \
[Visual Recognition], describe what an image for this question would be expected to show.

Question: {question}

{options_text}Start with [Visual Recognition]."""

_OWN_CONTINUE_V = """\
Answer the question below in the three-section format.

Question: {question}

{options_text}The [Visual Recognition] section is already written at the start of your reply. \
Go on from there: write [Knowledge Recall], then [Reasoning] ending with the [Answer] line."""

_OWN_CONTINUE_K = """\
Answer the question below in the three-section format.

Question: {question}

{options_text}The [Visual Recognition] and [Knowledge Recall] sections are already written at the \
start of your reply. Go on from there: write [Reasoning] ending with the [Answer] line."""

_OWN_JUDGE_SYSTEM = """\
You grade answers to medical visual questions. Decide whether the model's final answer means the \
same as the reference answer: wording may differ, medical content may not. Reply with one JSON \
object and nothing else."""

_OWN_JUDGE_USER = """\
Question: {question}
Reference answer: {ground_truth}
Model's answer: {predicted_answer}

Reply as {{"answer_correct": <1 if the model's answer is correct, else 0>, \
"answer_reasoning": "<one short sentence>"}}."""

_OWN_STEP_SYSTEM = """\
You check one section of a model's step-by-step answer to a medical visual question for \
hallucination: statements that are false, not supported by the evidence available, or \
medically wrong. You are given the question, the reference answer and a reference version of the \
same section written by an expert; where images are attached, they are the primary evidence. \
Decide 1 (hallucinated) or 0 (not). Reply with one JSON object and nothing else."""

_OWN_STEP_REPLY = """\
Reply as {{"hallucinated": <1 or 0>, "reason": "<one short sentence>"}}."""

_OWN_STEP_COMMON = """\
Section checked: {title}
Question: {{question}}
Reference answer: {{ground_truth}}

Reference {title}:
{{reference_text}}

Model's {title}:
{{candidate_text}}
"""

_OWN_STEP_TASK = {
    "visual_recognition": """
Mark 1 if the model describes findings that are not in the image(s), misreads what is there, or \
states observations the evidence does not support; a shorter description that is correct is fine.

""",
    "knowledge_recall": """
Other context:
{support_context}

Mark 1 if any recalled fact is medically wrong, invented, or unrelated to this case.

""",
    "reasoning": """
Other context:
{support_context}

Mark 1 if the reasoning asserts something unsupported, skips to a conclusion the findings and \
facts do not justify, or draws a medically wrong inference.

""",
}


def _own_step_template(stage: str) -> str:
    title = {"visual_recognition": "Visual Recognition", "knowledge_recall": "Knowledge Recall",
             "reasoning": "Reasoning"}[stage]
    return _OWN_STEP_COMMON.format(title=title) + _OWN_STEP_TASK[stage] + _OWN_STEP_REPLY


# ------------------------------------------------------------------------------------ prompt sets


@dataclass(frozen=True)
class PromptSet:
    """Every template of one style, plus where it came from (recorded with the results)."""

    style: str
    version: str
    trace_system: str
    org_user_image: str
    org_user_text: str
    continue_rep_v: str
    continue_rep_k: str
    continue_rep_vk: str
    answer_judge_system: str
    answer_judge_user: str
    step_judge_system: str
    step_judge_visual_recognition: str
    step_judge_knowledge_recall: str
    step_judge_reasoning: str
    given_stages_in: str  # "assistant" (prefix) | "user" (inside the continuation prompt)
    judge_sees_options: bool  # the answer judge's {question}: with the lettered options, or the bare question
    support_fallback: str  # {support_context} when neither trace has a VR or KR line
    files: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """What results.json records: style, version, source files, and the literal templates."""
        return {name: value for name, value in self.__dict__.items()}


def own_prompts() -> PromptSet:
    """This project's wording."""
    return PromptSet(
        style="own", version=OWN_VERSION, trace_system=_OWN_SYSTEM, org_user_image=_OWN_ORG_IMAGE,
        org_user_text=_OWN_ORG_TEXT, continue_rep_v=_OWN_CONTINUE_V, continue_rep_k=_OWN_CONTINUE_K,
        continue_rep_vk=_OWN_CONTINUE_K, answer_judge_system=_OWN_JUDGE_SYSTEM, answer_judge_user=_OWN_JUDGE_USER,
        step_judge_system=_OWN_STEP_SYSTEM,
        step_judge_visual_recognition=_own_step_template("visual_recognition"),
        step_judge_knowledge_recall=_own_step_template("knowledge_recall"),
        step_judge_reasoning=_own_step_template("reasoning"), given_stages_in="assistant", judge_sees_options=True,
        support_fallback="(no visual or knowledge lines to compare against)",
    )


class UnsupportedConstant(ValueError):
    """A module-level assignment in an upstream prompt file is not a plain string expression."""


def _string_value(node: ast.AST, known: Mapping[str, str], where: str) -> str:
    """The value of a string expression made of literals, ``+`` and names defined earlier."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _string_value(node.left, known, where) + _string_value(node.right, known, where)
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    raise UnsupportedConstant(f"{where}: line {getattr(node, 'lineno', '?')} is not a plain string expression")


def read_string_constants(path: str | Path) -> dict[str, str]:
    """Module-level ``NAME = <string expression>`` of a Python file, read with :mod:`ast`
    (the file is never executed); other statements are ignored."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = _string_value(node.value, constants, str(path))
            except UnsupportedConstant:
                continue
    return constants


def returned_fallback(path: str | Path, function: str) -> str:
    """The string literal a module-level ``function`` of a Python file returns after ``or``
    (``return <expression> or "<text>"``), read with :mod:`ast` (the file is never executed)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for inner in ast.walk(node):
                value = inner.value if isinstance(inner, ast.Return) else None
                if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
                    last = value.values[-1]
                    if isinstance(last, ast.Constant) and isinstance(last.value, str):
                        return last.value
    raise UnsupportedConstant(f"{path}: no function {function} returning `... or \"<text>\"`")


def _how_to_provide(pinned: PinnedFile) -> str:
    return (f"set {CODE_DIR_ENV}=<folder>, a copy of the ClinHallu repository at commit {UPSTREAM_COMMIT[:8]} "
            f"(git clone {UPSTREAM_REPO} <folder> && git -C <folder> checkout {UPSTREAM_COMMIT[:8]}), so that "
            f"<folder>/{pinned.relpath} exists; or allow network access once (it is then kept in the cache); or "
            f"run with this project's prompts (--benchmark-option clinhallu.prompts=own: not the paper's)")


WHY_NEEDED = "ClinHallu file (read by clinhallu.prompts=upstream, which --protocol clinhallu sets)"


def upstream_file(pinned: PinnedFile, data_dir: str | Path | None = None,
                  cache_dir: str | Path | None = None) -> FetchedFile:
    """One pinned ClinHallu file, by :func:`medheval.data.fetch.fetch`: from ``$MEDHEVAL_CLINHALLU_CODE`` when set,
    and only there; else from ``data_dir`` when it holds it; else the cache; else a download. Not found: an
    :class:`~medheval.data.fetch.AnnotationUnavailable` naming the file, where it was looked for and how to
    provide it."""
    return fetch(pinned, data_dir=data_dir, cache_dir=cache_dir, what=WHY_NEEDED, fix=_how_to_provide(pinned),
                 folder_env=CODE_DIR_ENV, data_dir_optional=True)


def upstream_prompts(data_dir: str | Path | None = None, cache_dir: str | Path | None = None) -> PromptSet:
    """ClinHallu's own constants from the pinned files (:func:`upstream_file` says where they are looked for:
    ``$MEDHEVAL_CLINHALLU_CODE``, ``data_dir``, the cache, a download). A file whose sha256 differs from the pin
    is refused: these prompts are only worth using verbatim. The files are located on every call, and parsed
    once per location (:func:`_upstream_texts`)."""
    fetched: dict[str, FetchedFile] = {}
    for name, pinned in UPSTREAM_FILES.items():
        item = upstream_file(pinned, data_dir=data_dir, cache_dir=cache_dir)
        if not item.verified:
            raise ValueError(
                f"{item.path}: sha256 {item.sha256} differs from the pin {pinned.sha256} (ClinHallu commit "
                f"{UPSTREAM_COMMIT[:8]}); use the file from that commit ({pinned.url}) or style='own'"
            )
        fetched[name] = item
    texts = _upstream_texts(tuple((name, item.path, item.sha256) for name, item in fetched.items()))
    files = [{"relpath": UPSTREAM_FILES[name].relpath, "sha256": item.sha256, "origin": item.origin,
              "url": UPSTREAM_FILES[name].url} for name, item in fetched.items()]
    return PromptSet(style="upstream", version=UPSTREAM_VERSION, given_stages_in="user", judge_sees_options=False,
                     files=files, **dict(texts))


@functools.lru_cache(maxsize=8)
def _upstream_texts(located: tuple[tuple[str, Path, str], ...]) -> tuple[tuple[str, str], ...]:
    """``(PromptSet field, text)`` pairs read from the files ``(name, path, sha256)``: memoised on the paths and
    their contents, so a run that asks for the upstream prompts several times parses the files once."""
    paths = {name: path for name, path, _ in located}
    constants = {name: read_string_constants(path) for name, path in paths.items()}
    texts = []
    for slot, (name, constant) in UPSTREAM_NAMES.items():
        if constant not in constants[name]:
            raise ValueError(f"{paths[name]}: no string constant {constant}")
        texts.append((slot, constants[name][constant]))
    script, function = SUPPORT_FALLBACK
    return (*texts, ("support_fallback", returned_fallback(paths[script], function)))


def prompt_set(style: str = "own", data_dir: str | Path | None = None) -> PromptSet:
    """The prompts of one style (``own`` | ``upstream``; ``data_dir``: a folder searched for ClinHallu's files,
    :func:`upstream_file`)."""
    if style == "own":
        return own_prompts()
    if style == "upstream":
        return upstream_prompts(data_dir)
    raise ValueError(f"unknown prompt style {style!r}; expected one of {STYLES}")


# ------------------------------------------------------------------------------------ rendering


def options_lines(record: Mapping[str, Any]) -> list[str]:
    """The lettered options of a record: ``meta.options`` as released, else ``choices`` lettered A, B, ..."""
    meta = record.get("meta") or {}
    released = meta.get("options") if isinstance(meta, Mapping) else None
    if released:
        return [str(option) for option in released]
    return [f"{letter}. {text}" for letter, text in zip(OPTION_LETTERS, record.get("choices") or [])]


def options_text(record: Mapping[str, Any]) -> str:
    """``"Options:\\nA. x\\nB. y\\n\\n"``, or ``""`` without options."""
    lines = options_lines(record)
    return "Options:\n" + "\n".join(lines) + "\n\n" if lines else ""


def question_with_options(record: Mapping[str, Any]) -> str:
    """The question followed by its options (what the continuation prompts and judges see)."""
    lines = options_lines(record)
    question = str(record["question"])
    return f"{question}\n\nOptions:\n" + "\n".join(lines) if lines else question


def given_stages(setting: str, gold: Mapping[str, str], own_vr: str = "") -> dict[str, str]:
    """The stages a setting starts from: Rep-V gold VR; Rep-K the model's ORG VR + gold KR;
    Rep-VK gold VR + gold KR; ORG nothing."""
    if setting == "org":
        return {}
    if setting == "rep_v":
        return {"visual_recognition": gold["visual_recognition"]}
    if setting == "rep_k":
        return {"visual_recognition": own_vr, "knowledge_recall": gold["knowledge_recall"]}
    if setting == "rep_vk":
        return {"visual_recognition": gold["visual_recognition"], "knowledge_recall": gold["knowledge_recall"]}
    raise ValueError(f"unknown setting {setting!r}; expected one of {SETTINGS}")


@dataclass(frozen=True)
class TraceRequest:
    """One generation: messages, the assistant prefix the model continues (``""`` for none), and
    the text put in front of the reply before parsing."""

    system: str
    user: str
    assistant_prefix: str
    parse_prefix: str

    def full_trace(self, reply: str) -> str:
        """The trace to parse: the given stages, then the model's reply."""
        reply = reply.strip()
        if not self.parse_prefix:
            return reply
        if self.assistant_prefix:  # the reply continues the prefix, which ends with the next marker
            return self.parse_prefix + reply
        return f"{self.parse_prefix}\n\n{reply}" if reply else self.parse_prefix


def trace_request(prompts: PromptSet, record: Mapping[str, Any], setting: str, gold: Mapping[str, str],
                  own_vr: str = "", has_images: bool = True) -> TraceRequest:
    """The request of one item in one setting."""
    given = given_stages(setting, gold, own_vr)
    if setting == "org":
        template = prompts.org_user_image if has_images else prompts.org_user_text
        user = template.format(question=str(record["question"]), options_text=options_text(record))
        return TraceRequest(prompts.trace_system, user, "", "")
    template = getattr(prompts, f"continue_{setting}")
    if prompts.given_stages_in == "user":
        user = template.format(question=question_with_options(record), **given)
        prefix = "\n\n".join(render_stages(**{name: text}) for name, text in given.items() if text.strip())
        return TraceRequest(prompts.trace_system, user, "", prefix)
    user = template.format(question=str(record["question"]), options_text=options_text(record))
    next_stage = STAGES[len(given)]
    prefix = render_stages(**given) + "\n\n" + render_stages(**{next_stage: ""}).rstrip() + "\n"
    return TraceRequest(prompts.trace_system, user, prefix, prefix)


def answer_judge_messages(prompts: PromptSet, record: Mapping[str, Any], predicted: str) -> tuple[str, str]:
    """``(system, user)`` for the answer judge (the question with its options unless the style says bare)."""
    question = question_with_options(record) if prompts.judge_sees_options else str(record["question"])
    return prompts.answer_judge_system, prompts.answer_judge_user.format(
        question=question, ground_truth=str(record["answer"]), predicted_answer=predicted)


def support_context(gold: Mapping[str, str], candidate: Mapping[str, str], fallback: str) -> str:
    """The reference and candidate VR/KR lines the KR and reasoning judges see (``fallback`` without any)."""
    lines = [f"{label} {title}: {source[key]}"
             for label, source in (("Reference", gold), ("Candidate", candidate))
             for key, title in (("visual_recognition", "Visual Recognition"), ("knowledge_recall", "Knowledge Recall"))
             if str(source.get(key) or "").strip()]
    return "\n".join(lines).strip() or fallback


def step_judge_messages(prompts: PromptSet, record: Mapping[str, Any], stage: str, candidate: Mapping[str, str],
                        gold: Mapping[str, str]) -> tuple[str, str]:
    """``(system, user)`` for judging one stage of a candidate trace against the gold stage."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    template = getattr(prompts, f"step_judge_{stage}")
    return prompts.step_judge_system, template.format(
        question=str(record["question"]), ground_truth=str(record["answer"]),
        reference_text=str(gold.get(stage) or "") or "(empty)", candidate_text=str(candidate.get(stage) or ""),
        support_context=support_context(gold, candidate, prompts.support_fallback))

"""The ClinHallu protocol: four generations per item (ORG, Rep-V, Rep-K, Rep-VK), then an answer
judge and three step judges, resumable per (item, setting).

1. **Generate**, phase by phase over chunks of items (``chunk_size`` items; default four backend
   batches): ORG for every item of the chunk in one ``generate_chat`` call; Rep-V and Rep-VK together;
   then Rep-K, which starts from the model's own ORG VR. In every setting an invalid trace
   (:func:`medheval.families.clinhallu.trace.parse_trace`) is asked again, attempt after attempt, up to
   ``max_attempts`` generations, then kept as invalid and counted (as ClinHallu's ``01_generate_cot.py``
   runs ORG and the replace experiments through one generator: every setting gets the same budget, so
   a Δ compares settings on equal terms). Each attempt samples with its own seed, derived
   from (seed, item id, setting, attempt) (:func:`attempt_seed`). A backend that takes a seed per
   request (``per_request_seed = True``: :class:`~medheval.backends.api.APIBackend`, and
   ``HFBackend``, whose rows draw from generators seeded by their request's seed) gets whole chunks
   at once, since a reply then does not depend on the rest of the call; any other backend gets one
   call per (item, setting, attempt) while sampling, and whole chunks when greedy. Either way a
   resumed run repeats an uninterrupted one. Under greedy decoding a
   regenerated trace would repeat the first, so each setting gets one attempt. One line per (item,
   setting) goes to ``clinhallu_generations.jsonl`` (append-only, flushed:
   :mod:`medheval.run.predictions_log`) as soon as its call returns.
2. **Judge** through the judge layer (cache, retries, concurrency, credentialed guard): the
   answer of every valid trace (1/0), and the three stages the paper's rates read, each in the trace
   whose earlier stages are given (ClinHallu's ``05_make_result_tables.py``): VR of the Rep-K trace
   (H^V; images attached: the model's ORG VR it was given, unless its reply wrote the section again,
   the last non-empty one winning), KR written in Rep-V (H^K), reasoning written in Rep-VK (H^R).
   A stage with no text, or a judge call that failed, is ``None`` and counted. One line per
   (item, setting) goes to ``clinhallu_judgments.jsonl``, with the judge that made it (``judge_settings``,
   backend, model): a resume with another is refused, so no log mixes judgments of two judges.
3. :func:`metric_inputs` turns both logs into the per-item columns of ``metrics/clinhallu``.

Defaults from ClinHallu's ``configs/config.yaml`` (generation: temperature 0.7, top-p 0.9,
``max_tokens`` 4096; judges: temperature 0.01, :func:`clinhallu_judge`, with ClinHallu's whole judge
request under ``judge_settings="upstream"``); all settings, the procedure version (:data:`PROCEDURE`), and the
backend's decoding-time mitigation if any, and the image control (``--control``, :mod:`medheval.run.control`:
``{"kind": "none"}`` when the model saw the images) go to ``clinhallu_run.json``.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from medheval.backends.base import BackendError
from medheval.families.clinhallu.prompts import (
    SETTINGS,
    PromptSet,
    answer_judge_messages,
    step_judge_messages,
    trace_request,
)
from medheval.families.clinhallu.trace import STAGES, parse_trace
from medheval.judges import JudgeRequest, make_judge
from medheval.run.control import Control
from medheval.run.outputs import atomic_write_text
from medheval.run.paper_protocols.others import CLINHALLU_PROCEDURE
from medheval.run.predictions_log import LogWriter, read_log
from medheval.run.runner import SkippedRecord, decode_records

GENERATIONS = "clinhallu_generations.jsonl"
JUDGMENTS = "clinhallu_judgments.jsonl"
LOG_FIELDS = ("id", "setting")  # each line of both logs: one (item, setting)
RUN_INFO = "clinhallu_run.json"
# which stage of which setting's trace each rate judges (ClinHallu's Table 2, read from the replace runs)
JUDGED_STAGE = {"rep_k": "visual_recognition", "rep_v": "knowledge_recall", "rep_vk": "reasoning"}
RATE_OF_SETTING = {"rep_k": "h_v", "rep_v": "h_k", "rep_vk": "h_r"}
# what a folder's logs were made by (clinhallu_run.json; absent before it was recorded: 1): see
# medheval.run.paper_protocols.others.CLINHALLU_PROCEDURE
PROCEDURE = CLINHALLU_PROCEDURE
# generation phases of a chunk: Rep-K needs the ORG VR; Rep-V and Rep-VK need only the gold stages
PHASES = (("org",), ("rep_v", "rep_vk"), ("rep_k",))
CHUNK_BATCHES = 4  # default chunk: this many backend batches of items
# ProtocolConfig fields the traces depend on: a folder's logs are resumed only with the same values
TRACE_SETTINGS = ("temperature", "top_p", "max_new_tokens", "seed", "max_attempts", "lenient_markers", "text_first",
                  "enable_thinking")


@dataclass(frozen=True)
class ProtocolConfig:
    """Settings of one ClinHallu run (recorded in ``clinhallu_run.json``)."""

    settings: tuple[str, ...] = SETTINGS
    max_attempts: int = 3  # generations per (item, setting) while sampling: 1 + regenerations of invalid traces
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.9
    max_new_tokens: int = 4096  # ClinHallu's generation max_tokens
    seed: int = 0
    lenient_markers: bool = False
    text_first: bool = False  # the user turn's text before its images (ClinHallu's common.py)
    enable_thinking: bool | None = None  # chat_template_kwargs (ClinHallu's common.py: False); None = not sent

    def __post_init__(self) -> None:
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or "org" not in self.settings and "rep_k" in self.settings:
            raise ValueError(f"settings {list(self.settings)}: each must be one of {SETTINGS}, and rep_k needs org")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_new_tokens < 1 or self.temperature < 0:
            raise ValueError(f"max_new_tokens must be >= 1 and temperature >= 0, got {self.max_new_tokens} "
                             f"and {self.temperature}")

    @property
    def samples(self) -> bool:
        """Whether traces are sampled (temperature > 0) rather than greedy."""
        return self.temperature > 0

    def generation_overrides(self) -> dict[str, Any]:
        """``generate`` settings of every trace (sampling when temperature > 0)."""
        if self.samples:
            return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p,
                    "max_new_tokens": self.max_new_tokens}
        return {"do_sample": False, "max_new_tokens": self.max_new_tokens}


JUDGE_SETTINGS = ("own", "upstream")
# ClinHallu's judge request (configs/config.yaml ``judge``; src/common.py CoTAPIWrapper.generate: top_p, max_tokens
# and chat_template_kwargs on every call, no response_format; 02_judge_answers.py / 04_judge_step_hallucination.py:
# an unusable reply is re-sent as it was, 1 + retry_attempts (5) tries with backoff, a failed call counting as
# one of those tries, the OpenAI client itself not retrying (max_retries=0): max_tries, the one budget of both)
UPSTREAM_JUDGE: dict[str, Any] = {"temperature": 0.01, "top_p": 0.9, "max_tokens": 4096, "timeout": 60.0,
                                  "json_mode": False, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
                                  "max_invalid_retries": 5, "invalid_reply": "resend", "max_tries": 6}
UPSTREAM_JUDGE_BACKENDS = ("openai", "azure")  # ClinHallu calls its judge through the OpenAI client


def check_judge_settings(spec: Any, settings: str = "own") -> None:
    """Refuse ``settings="upstream"`` for a judge that cannot take ClinHallu's OpenAI-compatible request."""
    from medheval.judges import backend_of

    if settings not in JUDGE_SETTINGS:
        raise ValueError(f"clinhallu.judge_settings={settings!r}: expected one of {JUDGE_SETTINGS}")
    if settings == "upstream" and backend_of(spec) not in UPSTREAM_JUDGE_BACKENDS:
        raise ValueError(f"clinhallu.judge_settings=upstream (set by --protocol clinhallu) sends ClinHallu's "
                         f"OpenAI-compatible judge request (top_p, chat_template_kwargs); judge backend "
                         f"{backend_of(spec)!r} cannot take it: use an openai:/vllm: judge (e.g. "
                         f"openai:<model>@http://127.0.0.1:8000/v1), or --benchmark-option clinhallu.judge_settings=own")


def clinhallu_judge(spec: Any, settings: str = "own", **options: Any):
    """The run's judge (:func:`make_judge`): ``settings="own"``: at the paper's temperature (0.01), this project's
    request otherwise; ``"upstream"``: ClinHallu's whole request (:data:`UPSTREAM_JUDGE`). ``options`` win; a
    ready :class:`~medheval.judges.Judge` is used as it was built."""
    check_judge_settings(spec, settings)
    base = dict(UPSTREAM_JUDGE) if settings == "upstream" else {"temperature": 0.01}
    return make_judge(spec, **{**base, **options})


def attempt_seed(seed: int, record_id: str, setting: str, attempt: int) -> int:
    """The sampling seed of one attempt: stable across runs and processes."""
    return (seed * 1_000_003 + zlib.crc32(f"{record_id}\x00{setting}\x00{attempt}".encode())) % (2**31 - 1)


def mitigation_of(backend: Any) -> Any:
    """The decoding-time mitigation a backend runs (``generate_kwargs["custom_generate"]``), else ``None``."""
    return (getattr(backend, "generate_kwargs", None) or {}).get("custom_generate")


def mitigation_spec(backend: Any) -> str:
    """The backend's mitigation as recorded (``"vcd:alpha=0.0,..."``), ``"none"`` without one."""
    method = mitigation_of(backend)
    if method is None:
        return "none"
    return method.spec() if callable(getattr(method, "spec", None)) else str(method)


def check_backend(backend: Any, config: ProtocolConfig) -> None:
    """Refuse, before any generation, a backend without ``generate_chat``, or a mitigation that cannot
    sample (``supports_sampling = False``, e.g. OPERA's beam search) when the traces are sampled."""
    if not callable(getattr(backend, "generate_chat", None)):
        raise BackendError(f"backend {getattr(backend, 'name', backend)!r} has no generate_chat(); "
                           "ClinHallu needs a backend that takes system/user messages and an assistant prefix")
    method = mitigation_of(backend)
    if config.samples and method is not None and not getattr(method, "supports_sampling", True):
        raise BackendError(f"mitigation {mitigation_spec(backend)} cannot sample, and ClinHallu samples its traces "
                           f"at temperature {config.temperature}: pass --benchmark-option clinhallu.temperature=0 "
                           "(greedy traces; ProtocolConfig(temperature=0)), or another mitigation")


def _gold(record: Mapping[str, Any]) -> dict[str, str]:
    meta = record.get("meta") or {}
    gold = meta.get("gold_trace") if isinstance(meta, Mapping) else None
    if not isinstance(gold, Mapping):
        raise ValueError(f"record {record.get('id')!r}: meta.gold_trace is missing; load ClinHallu with "
                         "medheval.load_benchmark('clinhallu', ...)")
    return {name: str(gold.get(name) or "") for name in (*STAGES, "answer")}


def _index(entries: Iterable[dict]) -> dict[tuple[str, str], dict]:
    return {(entry["id"], entry["setting"]): entry for entry in entries}


@dataclass
class ClinHalluRun:
    """One model through the protocol, writing to ``output_dir``.

    ``backend`` needs ``generate_chat(requests, images, seed=, overrides=)`` (``HFBackend`` and
    ``APIBackend`` have it); with ``per_request_seed = True`` it samples each request with the
    request's own ``"seed"`` key (see the module docstring). ``images_for(record)`` returns the
    record's PIL images (e.g. ``ImageResolver.load_record_images``), or is ``None`` for text-only
    prompts. ``judge`` is a :class:`medheval.judges.Judge`. ``chunk_size``: items generated phase by
    phase together (default ``4 * backend.batch_size``). An item whose image does not decode (a file cut
    short after a valid header) is an error naming it (``skip_undecodable=False``, ``--on-missing error``),
    or, with ``skip_undecodable``, left out of the generations, judgments and metric inputs and listed in
    :attr:`skipped` (:func:`medheval.run.runner.decode_records`, the runner's own mechanism). Every judgment
    line records the judge that made it (:meth:`_judge_identity`); a resume with another one is refused.
    """

    backend: Any
    judge: Any
    prompts: PromptSet
    output_dir: str | Path
    config: ProtocolConfig = field(default_factory=ProtocolConfig)
    images_for: Callable[[Mapping[str, Any]], list] | None = None
    progress: bool = True
    chunk_size: int | None = None
    control: Control = field(default_factory=Control)  # --control: the images the model sees instead
    skip_undecodable: bool = False  # --on-missing skip: an item whose image does not decode is left out
    judge_settings: str = "own"  # clinhallu.judge_settings the judge was built with (clinhallu_judge)
    skipped: list[SkippedRecord] = field(default_factory=list, init=False)  # the items left out, in order
    skipped_judging: set[str] = field(default_factory=set, init=False)  # of those, the ids left out while judging

    def __post_init__(self) -> None:
        check_backend(self.backend, self.config)
        if self.control.blind:  # one place: every trace request gets the controlled images
            self.images_for = self.control.loader(self.images_for) or (lambda record: [])
        if self.chunk_size is None:
            self.chunk_size = CHUNK_BATCHES * max(1, int(getattr(self.backend, "batch_size", 1) or 1))
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        self.output_dir = Path(self.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------------------- generation
    def generate(self, records: Sequence[Mapping[str, Any]]) -> list[dict]:
        """Generate every missing (item, setting), ``chunk_size`` items at a time, phase by phase
        (module docstring); returns all generation entries of ``records``."""
        path = self.output_dir / GENERATIONS
        done = _index(read_log(path, required=LOG_FIELDS))
        self._check_resumable(bool(done))
        todo = [r for r in records if any((str(r["id"]), s) not in done for s in self.config.settings)]
        bar = None
        if self.progress and todo:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), desc="ClinHallu traces", unit="item")
        with LogWriter(path) as log:
            for start in range(0, len(todo), self.chunk_size):
                chunk, decoded = self._decoded(todo[start:start + self.chunk_size])
                images = {str(record["id"]): record_images for record, record_images in zip(chunk, decoded)}
                for phase in PHASES:
                    jobs = [_Job(self, record, setting, images[str(record["id"])], done)
                            for record in chunk for setting in phase
                            if setting in self.config.settings and (str(record["id"]), setting) not in done]
                    for entry in self._run_jobs(jobs):
                        log.write(entry)
                        done[(entry["id"], entry["setting"])] = entry
                if bar is not None:
                    bar.update(min(self.chunk_size, len(todo) - start))
        if bar is not None:
            bar.close()
        ids = {str(r["id"]) for r in records} - self._skipped_ids()
        return [entry for key, entry in done.items() if key[0] in ids]

    def _decoded(self, records: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[list]]:
        """(the records whose images decode, their images): the others are skipped (:attr:`skipped`) with
        ``skip_undecodable``, else the first is an error naming it (:func:`~medheval.run.runner.decode_records`)."""
        if self.images_for is None:
            return list(records), [[] for _ in records]
        batch = decode_records(list(records), lambda record: list(self.images_for(record)), self.skip_undecodable)
        self.skipped.extend(batch.skipped)
        return batch.records, batch.images

    def _skipped_ids(self) -> set[str]:
        return {record.record_id for record in self.skipped}

    def _trace_settings(self) -> dict[str, Any]:
        return {**{key: getattr(self.config, key) for key in TRACE_SETTINGS},
                "prompt_version": self.prompts.version, "mitigation": mitigation_spec(self.backend),
                "control": self._control()}

    def _control(self) -> dict[str, Any]:
        """The image control as ``clinhallu_run.json`` records it (``{"kind": "none"}`` for the images)."""
        return self.control.describe() or {"kind": "none"}

    def _check_resumable(self, has_entries: bool) -> None:
        """Refuse to add traces made with other settings to a folder's logs (``clinhallu_run.json``
        names those of its traces); a folder without one, or without traces (a file left by an earlier version
        names no traces), gets it now with the current settings, so a killed run is checked too."""
        info_path = self.output_dir / RUN_INFO
        now = self._trace_settings()
        if has_entries and info_path.exists():
            info = json.loads(info_path.read_text())
            if info.get("procedure", 1) != PROCEDURE:
                raise ValueError(f"{self.output_dir} holds ClinHallu logs made by procedure {info.get('procedure', 1)} "
                                 f"of the protocol (Rep settings generated once, H^V judged on the ORG trace); this "
                                 f"version is procedure {PROCEDURE} (every setting regenerated up to max_attempts, "
                                 f"H^V judged on the Rep-K trace), so they cannot be resumed: choose another --output "
                                 f"folder")
            before = {**{k: v for k, v in (info.get("protocol") or {}).items() if k in TRACE_SETTINGS},
                      "prompt_version": (info.get("prompts") or {}).get("version"),
                      "mitigation": info.get("mitigation"),
                      "control": info.get("control")}  # (absent before it was recorded: not compared)
            changed = [f"{key}={before[key]!r} (now {now[key]!r})" for key in now
                       if key in before and before[key] is not None and before[key] != now[key]]
            if changed:
                raise ValueError(f"{self.output_dir} holds ClinHallu traces made with {', '.join(changed)}; resume "
                                 f"with the same settings (e.g. --max-new-tokens N / --benchmark-option "
                                 f"clinhallu.temperature=T, the same --seed, --mitigation, --control and prompts), or choose "
                                 f"another --output folder")
        elif not has_entries or not info_path.exists():
            atomic_write_text(info_path, json.dumps({"protocol": asdict(self.config), "prompts": {
                "version": self.prompts.version}, "mitigation": now["mitigation"], "control": now["control"],
                "procedure": PROCEDURE}, indent=2, sort_keys=True))

    def _run_jobs(self, jobs: list["_Job"]) -> Iterable[dict]:
        """Yield each job's entry as soon as it is finished (valid, or out of attempts). Batched: one
        ``generate_chat`` call per attempt for all pending jobs, when a reply does not depend on the
        others of its call (greedy, or a per-request-seed backend); else one call per attempt."""
        overrides = self.config.generation_overrides()
        if not self.config.samples or getattr(self.backend, "per_request_seed", False):
            pending = jobs
            while pending:
                requests = [job.request() for job in pending]
                replies = self.backend.generate_chat(requests, [job.images for job in pending],
                                                     seed=self.config.seed, overrides=overrides)
                if len(replies) != len(requests):
                    raise BackendError(f"backend {getattr(self.backend, 'name', '')!r} returned {len(replies)} "
                                       f"replies for {len(requests)} requests")
                finished = [job.add(reply) for job, reply in zip(pending, replies)]
                yield from (job.entry() for job, done in zip(pending, finished) if done)
                pending = [job for job, done in zip(pending, finished) if not done]
            return
        for job in jobs:
            while True:
                request = job.request()
                if job.add(self.backend.generate_chat([request], [job.images], seed=request["seed"],
                                                      overrides=overrides)[0]):
                    yield job.entry()
                    break

    # ---------------------------------------------------------------------------- judging
    def _requests(self, record: Mapping[str, Any], entry: dict, images: list) -> list[JudgeRequest]:
        gold = _gold(record)
        credentialed = bool((record.get("meta") or {}).get("credentialed"))
        key = f"{entry['id']}|{entry['setting']}"
        out = []
        if entry["valid"]:
            system, user = answer_judge_messages(self.prompts, record, entry["stages"]["answer"])
            out.append(JudgeRequest(f"{key}|answer", system=system, user=user, credentialed=credentialed,
                                    validate=validate_answer_reply, metadata={"kind": "answer"}))
        stage = JUDGED_STAGE.get(entry["setting"])
        if stage and entry["stages"][stage].strip():
            system, user = step_judge_messages(self.prompts, record, stage, entry["stages"], gold)
            out.append(JudgeRequest(f"{key}|{stage}", system=system, user=user, credentialed=credentialed,
                                    images=list(images) if stage == "visual_recognition" else [],
                                    validate=validate_step_reply, metadata={"kind": "step", "stage": stage}))
        return out

    def judge_all(self, records: Sequence[Mapping[str, Any]], generations: Sequence[dict],
                  chunk_size: int = 256) -> list[dict]:
        """Judge every generation without a judgment yet, ``chunk_size`` generations per judge batch
        (each chunk is logged before the next starts); returns all judgment entries of ``records``."""
        path = self.output_dir / JUDGMENTS
        done = _index(read_log(path, required=LOG_FIELDS))
        self._check_same_judge(done.values())
        by_id = {str(r["id"]): r for r in records}
        pending = [e for e in generations if (e["id"], e["setting"]) not in done]
        with LogWriter(path) as log:
            for start in range(0, len(pending), chunk_size):
                skipped = self._skipped_ids()  # an item skipped in an earlier chunk is not judged further
                chunk = [entry for entry in pending[start:start + chunk_size] if entry["id"] not in skipped]
                for judged in self._judge_chunk(chunk, by_id):
                    log.write(judged)
                    done[(judged["id"], judged["setting"])] = judged
        kept = set(by_id) - self._skipped_ids()
        return [entry for key, entry in done.items() if key[0] in kept]

    def _judge_identity(self) -> dict[str, Any]:
        """What decides a judgment besides its prompt: ``judge_settings`` (own | upstream request), the judge's
        backend and model, and its ``max_tries`` when set (the calls a record may use before it is logged as a
        failed judgment, never judged again on resume); not its endpoint, concurrency or timeouts."""
        described = self.judge.describe() if callable(getattr(self.judge, "describe", None)) else {}
        tries = described.get("max_tries")
        return {"judge_settings": self.judge_settings, "backend": described.get("backend"),
                "model": described.get("model"), **({"max_tries": tries} if tries is not None else {})}

    def _check_same_judge(self, judged: Iterable[dict]) -> None:
        """Refuse to add judgments to a log holding some made by another judge or judge settings (lines
        written before the judge was recorded have none: not compared)."""
        now = self._judge_identity()
        before = {json.dumps(entry["judge"], sort_keys=True) for entry in judged if isinstance(entry.get("judge"), dict)}
        other = sorted(text for text in before if json.loads(text) != now)
        if other and "max_tries" in now and all(
                "max_tries" not in json.loads(text) and {**json.loads(text), "max_tries": now["max_tries"]} == now
                for text in other):
            raise ValueError(f"{self.output_dir} holds ClinHallu judgments made before the judge recorded its "
                             f"max_tries (an earlier medheval, whose judge retried a failed call apart from its "
                             f"tries): they cannot be mixed with judgments under max_tries={now.get('max_tries')}. "
                             f"Choose a new --output folder")
        if other:
            raise ValueError(f"{self.output_dir} holds ClinHallu judgments made by {', '.join(other)}, not "
                             f"{json.dumps(now, sort_keys=True)}: judgments made under other judge settings cannot "
                             f"be mixed. Resume with the same --judge and --benchmark-option "
                             f"clinhallu.judge_settings={json.loads(other[0])['judge_settings']}, or choose a new "
                             f"--output folder for this judge")

    def _judge_chunk(self, entries: Sequence[dict], by_id: Mapping[str, Mapping[str, Any]]) -> list[dict]:
        """Judge ``entries`` (the Visual Recognition judge, on Rep-K, sees the item's images, decoded here: an item
        whose image does not decode is skipped with all its entries, or an error: :meth:`_decoded`)."""
        looking = list(dict.fromkeys(entry["id"] for entry in entries
                                     if JUDGED_STAGE.get(entry["setting"]) == "visual_recognition"))
        kept, decoded = self._decoded([by_id[rid] for rid in looking])
        images = {str(record["id"]): record_images for record, record_images in zip(kept, decoded)}
        gone = set(looking) - set(images)
        self.skipped_judging |= gone
        entries = [entry for entry in entries if entry["id"] not in gone]
        requests: dict[tuple[str, str], list[JudgeRequest]] = {}
        for entry in entries:
            record = by_id[entry["id"]]
            record_images = images.get(entry["id"], [])
            requests[(entry["id"], entry["setting"])] = self._requests(record, entry, record_images)
        flat = [request for group in requests.values() for request in group]
        results = {result.id: result for result in self.judge.run(flat)} if flat else {}
        out = []
        identity = self._judge_identity()
        for entry in entries:
            judged = {"id": entry["id"], "setting": entry["setting"], "answer_correct": None, "steps": {},
                      "judge": identity}
            for request in requests[(entry["id"], entry["setting"])]:
                result = results[request.id]
                if request.metadata["kind"] == "answer":
                    judged["answer_correct"] = result.value["answer_correct"] if result.ok else None
                    judged["answer_judge"] = _judge_note(result)
                else:
                    judged["steps"][request.metadata["stage"]] = {
                        "hallucinated": result.value["hallucinated"] if result.ok else None, **_judge_note(result)}
            out.append(judged)
        return out

    # ---------------------------------------------------------------------------- whole run
    def run(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Generate, judge, write ``clinhallu_run.json``; returns the metric inputs and the counts."""
        generations = self.generate(records)
        judgments = self.judge_all(records, generations)
        skipped = self._skipped_ids()  # (an item skipped while judging still has its generations)
        records = [record for record in records if str(record["id"]) not in skipped]
        generations = [entry for entry in generations if entry["id"] not in skipped]
        inputs = metric_inputs(records, judgments, self.config.settings)
        info = {
            "protocol": asdict(self.config),
            "procedure": PROCEDURE,
            "mitigation": mitigation_spec(self.backend),
            "control": self._control(),
            "prompts": self.prompts.describe(),
            "backend": self.backend.settings() if callable(getattr(self.backend, "settings", None)) else {},
            "judge": self.judge.describe() if callable(getattr(self.judge, "describe", None)) else {},
            "judge_settings": self.judge_settings,
            "counts": run_counts(generations, judgments),
        }
        atomic_write_text(self.output_dir / RUN_INFO, json.dumps(info, indent=2, sort_keys=True, default=str))
        return {"metric_inputs": inputs, "counts": info["counts"], "skipped": list(self.skipped),
                "skipped_judging": sorted(self.skipped_judging)}


class _Job:
    """One (item, setting) being generated: its request, attempts so far and the last reply."""

    def __init__(self, run: ClinHalluRun, record: Mapping[str, Any], setting: str, images: list,
                 done: Mapping[tuple[str, str], dict]):
        self.run, self.record, self.setting, self.images = run, record, setting, images
        self.id = str(record["id"])
        own_vr = done[(self.id, "org")]["stages"]["visual_recognition"] if setting == "rep_k" else ""
        self.trace_request = trace_request(run.prompts, record, setting, _gold(record), own_vr=own_vr,
                                           has_images=bool(images))
        config = run.config
        self.max_attempts = config.max_attempts if config.samples else 1  # greedy: a regeneration repeats itself
        self.reasons: list[str] = []
        self.reply, self.trace = "", None

    @property
    def seed(self) -> int:
        """The seed of the next attempt."""
        return attempt_seed(self.run.config.seed, self.id, self.setting, len(self.reasons))

    def request(self) -> dict[str, Any]:
        request, config = self.trace_request, self.run.config
        order = {"text_first": True} if config.text_first else {}
        thinking = {} if config.enable_thinking is None else {"enable_thinking": config.enable_thinking}
        return {"id": self.id, "system": request.system, "user": request.user, **order, **thinking,
                "assistant_prefix": request.assistant_prefix, "seed": self.seed,
                "credentialed": bool((self.record.get("meta") or {}).get("credentialed"))}

    def add(self, reply: str) -> bool:
        """Record one attempt's reply; whether the job is finished (valid, or out of attempts)."""
        self.reply = reply
        self.trace = parse_trace(self.trace_request.full_trace(reply), lenient_markers=self.run.config.lenient_markers)
        self.reasons.append(self.trace.reason)
        return self.trace.valid or len(self.reasons) >= self.max_attempts

    def entry(self) -> dict[str, Any]:
        """The log line (the seed is the last attempt's)."""
        return {
            "id": self.id, "setting": self.setting, "model": getattr(self.run.backend, "name", ""),
            "reply": self.reply, "trace": self.trace_request.full_trace(self.reply), "stages": self.trace.as_dict(),
            "valid": self.trace.valid, "reason": self.trace.reason, "attempts": len(self.reasons),
            "attempt_reasons": list(self.reasons),
            "seed": attempt_seed(self.run.config.seed, self.id, self.setting, len(self.reasons) - 1),
            "given_stages": _given_names(self.setting), "prompt_version": self.run.prompts.version,
        }


def _given_names(setting: str) -> list[str]:
    return {"org": [], "rep_v": ["visual_recognition"], "rep_k": ["visual_recognition", "knowledge_recall"],
            "rep_vk": ["visual_recognition", "knowledge_recall"]}[setting]


def _judge_note(result: Any) -> dict[str, Any]:
    value = result.value if result.ok and isinstance(result.value, Mapping) else {}
    return {"reason": value.get("reason"), "error": result.error, "cached": result.cached}


def _binary(value: Any, key: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value.strip())
    raise ValueError(f'"{key}" must be 0 or 1, got {value!r}')


def validate_answer_reply(reply: Mapping[str, Any]) -> dict[str, Any]:
    """``{"answer_correct": 0|1, "answer_reasoning": str}`` -> ``{"answer_correct", "reason"}``."""
    if "answer_correct" not in reply:
        raise ValueError('the reply has no "answer_correct" key; reply {"answer_correct": 0 or 1, ...}')
    reason = reply.get("answer_reasoning", reply.get("reasoning", ""))
    return {"answer_correct": _binary(reply["answer_correct"], "answer_correct"), "reason": str(reason or "")}


def validate_step_reply(reply: Mapping[str, Any]) -> dict[str, Any]:
    """``{"hallucinated": 0|1, "reason": non-empty str}`` (ClinHallu retries an empty reason too)."""
    if "hallucinated" not in reply:
        raise ValueError('the reply has no "hallucinated" key; reply {"hallucinated": 0 or 1, "reason": "..."}')
    reason = str(reply.get("reason") or "").strip()
    if not reason:
        raise ValueError('"reason" must be a non-empty sentence')
    return {"hallucinated": _binary(reply["hallucinated"], "hallucinated"), "reason": reason}


def metric_inputs(records: Sequence[Mapping[str, Any]], judgments: Iterable[dict],
                  settings: Sequence[str] = SETTINGS) -> dict[str, list]:
    """Keyword arguments for ``metrics/clinhallu``: per-item ``correct``, ``correct_rep_*``, ``h_v``,
    ``h_k``, ``h_r``, ``sources`` (``None`` where a setting is missing, invalid or unjudged), and
    ``settings`` (the settings that were run)."""
    judged = _index(judgments)
    columns: dict[str, list] = {name: [] for name in (
        "correct", "correct_rep_v", "correct_rep_k", "correct_rep_vk", "h_v", "h_k", "h_r", "sources")}
    for record in records:
        rid = str(record["id"])
        for setting, column in (("org", "correct"), ("rep_v", "correct_rep_v"), ("rep_k", "correct_rep_k"),
                                ("rep_vk", "correct_rep_vk")):
            columns[column].append((judged.get((rid, setting)) or {}).get("answer_correct"))
        for setting, rate in RATE_OF_SETTING.items():
            steps = (judged.get((rid, setting)) or {}).get("steps") or {}
            if rate == "h_v" and JUDGED_STAGE[setting] not in steps:  # logs of procedure 1 judged VR on ORG
                steps = (judged.get((rid, "org")) or {}).get("steps") or {}
            columns[rate].append((steps.get(JUDGED_STAGE[setting]) or {}).get("hallucinated"))
        columns["sources"].append(str(record.get("config") or ""))
    columns["settings"] = list(settings)
    return columns


def run_counts(generations: Iterable[dict], judgments: Iterable[dict]) -> dict[str, Any]:
    """What was skipped or failed: invalid traces (by reason), attempts, judge failures, per setting."""
    counts: dict[str, Any] = {}
    for entry in generations:
        c = counts.setdefault(entry["setting"], {"n": 0, "n_invalid": 0, "invalid_reasons": Counter(),
                                                 "attempts": Counter(), "n_answer_judge_failed": 0,
                                                 "n_step_judge_failed": 0, "n_step_not_judged": 0})
        c["n"] += 1
        c["attempts"][str(entry["attempts"])] += 1
        if not entry["valid"]:
            c["n_invalid"] += 1
            c["invalid_reasons"][entry["reason"]] += 1
    for entry in judgments:
        c = counts.get(entry["setting"])
        if c is None:
            continue
        if entry.get("answer_judge") and entry["answer_correct"] is None:
            c["n_answer_judge_failed"] += 1
        stage = JUDGED_STAGE.get(entry["setting"])
        if stage:
            step = entry["steps"].get(stage)
            if step is None:
                c["n_step_not_judged"] += 1
            elif step["hallucinated"] is None:
                c["n_step_judge_failed"] += 1
    return {setting: {k: dict(v) if isinstance(v, Counter) else v for k, v in c.items()}
            for setting, c in sorted(counts.items())}

"""The judge layer's core: requests, results, and the run loop every backend shares.

A :class:`Judge` turns :class:`JudgeRequest` s into :class:`JudgeResult` s, in order. It

1. refuses, before sending anything, credentialed records bound for a non-local endpoint
   (:mod:`medheval.judges.endpoints`);
2. answers what it can from the on-disk cache (:mod:`medheval.judges.cache`);
3. sends the rest (backend-specific: threads over HTTP, or batches through a local model);
4. reads each reply as a JSON object (:func:`parse_json_object`), runs the request's
   ``validate`` on it, and on an unusable reply asks again, at most ``max_invalid_retries`` times:
   with a short corrective follow-up (``invalid_reply="follow_up"``, the default), or by sending the
   same conversation again (``"resend"``, after a backoff on HTTP backends; how ClinHallu's released
   judge scripts retry); a record that still fails is returned with ``ok=False``, the reason and the
   raw text, never a made-up score;
5. caches the reply that validated, under a key that never includes the API key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from medheval.judges.cache import JudgeCache
from medheval.judges.endpoints import (
    credentialed_refusal,
    endpoint_allowed,
    endpoint_host,
    is_local_url,
    normalise_allow_list,
    safe_base_url,
    user_approved,
)
from medheval.net.secrets import redact, register_secrets, register_url
from medheval.judges.media import JudgeImage, to_judge_image
from medheval.judges.structured import parse_json_object

logger = logging.getLogger("medheval.judges")

CACHE_KEY_VERSION = 1
_ROLES = ("system", "user", "assistant")
# what a validate() raises for a reply that is readable JSON but wrong (bad range, missing field)
INVALID_OUTPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, IndexError)

CORRECTION_PROMPT = (
    "Your previous reply could not be used: {reason}\n"
    "Reply again with only the JSON object requested above (valid JSON, all required fields, values in "
    "the allowed ranges), with no code fences and no other text."
)
TEXT_CORRECTION_PROMPT = (
    "Your previous reply could not be used: {reason}\n"
    "Reply again with only the answer in the format requested above, with no other text."
)
REPLY_FORMATS = ("json", "text", "raw")
# per-request generation settings (JudgeRequest.params) the HTTP backends map to their API's fields
# images_first: where an OpenAI-style request puts its images (a model's protocol, e.g. ClinHallu's text first)
REQUEST_PARAMS = frozenset({"temperature", "top_p", "max_tokens", "seed", "images_first"})
# what a judge does with an unusable reply: a corrective follow-up turn, or the same conversation sent again
INVALID_REPLY_MODES = ("follow_up", "resend")


class JudgeError(RuntimeError):
    """The judge cannot run at all (bad spec, missing key, authentication refused, model not found)."""


@dataclass
class JudgeRequest:
    """One thing to judge.

    Give either ``messages`` (``[{"role": "system"|"user"|"assistant", "content": str}, ...]``)
    or ``user`` (with an optional ``system``). ``images`` (PIL images, encoded bytes or file
    paths) are attached to the last user message of the initial conversation and sent as
    base64 data. ``credentialed=True`` marks PhysioNet-derived content (see the guard);
    ``credentialed=None`` means the status is unknown, which the guard treats as credentialed.
    ``validate(parsed_json)`` returns the value to report and raises ``ValueError`` for a reply
    that is not acceptable (its message is shown to the judge in the corrective follow-up).
    ``metadata`` is carried to the result untouched. ``reply_format="text"`` is for judges
    that answer in plain text (e.g. a detector checkpoint that replies with a bare label):
    ``validate`` then gets the stripped reply text instead of a parsed JSON object, and no JSON
    mode is requested from the API. ``reply_format="raw"`` (a model under test,
    :class:`medheval.backends.api.APIBackend`) hands back the reply text exactly as received,
    empty included, with no corrective follow-up. ``params`` overrides the judge's generation
    settings for this request (keys ``temperature``, ``top_p``, ``max_tokens``, ``seed``; Anthropic
    has no seed: it is only part of the cache key there) and ``extra_body`` adds fields to the
    request body verbatim (e.g. vLLM's ``continue_final_message``); both are part of the cache key
    and apply to the HTTP backends.
    """

    id: str
    messages: list[dict] | None = None
    system: str | None = None
    user: str | None = None
    images: list = field(default_factory=list)
    credentialed: bool | None = False
    validate: Callable[[dict], Any] | None = None
    metadata: dict = field(default_factory=dict)
    reply_format: str = "json"
    params: dict = field(default_factory=dict)
    extra_body: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = str(self.id)
        if self.reply_format not in REPLY_FORMATS:
            raise ValueError(f"JudgeRequest {self.id!r}: reply_format must be one of {REPLY_FORMATS}")
        unknown = sorted(set(self.params) - REQUEST_PARAMS)
        if unknown:
            raise ValueError(f"JudgeRequest {self.id!r}: unknown params {unknown}; allowed: {sorted(REQUEST_PARAMS)}")
        if self.messages is not None and (self.user is not None or self.system is not None):
            raise ValueError(f"JudgeRequest {self.id!r}: give either messages= or system=/user=, not both")
        if self.messages is None and self.user is None:
            raise ValueError(f"JudgeRequest {self.id!r}: give messages= or user= (the prompt to judge)")
        if self.validate is not None and not callable(self.validate):
            raise ValueError(f"JudgeRequest {self.id!r}: validate must be callable")
        for message in self.conversation():
            if not isinstance(message, dict) or message.get("role") not in _ROLES:
                raise ValueError(
                    f"JudgeRequest {self.id!r}: each message must be a dict with role in {_ROLES}, got {message!r:.120}"
                )
            if not isinstance(message.get("content"), str):
                raise ValueError(
                    f"JudgeRequest {self.id!r}: message content must be a string (pass images via images=)"
                )
        if not any(m["role"] == "user" for m in self.conversation()):
            raise ValueError(f"JudgeRequest {self.id!r}: the conversation has no user message")

    def conversation(self) -> list[dict]:
        """The initial messages as ``[{"role", "content"}]``."""
        if self.messages is not None:
            return [
                {"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m for m in self.messages
            ]
        out = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        out.append({"role": "user", "content": self.user})
        return out


@dataclass
class JudgeResult:
    """The outcome of one request.

    ``value`` is what ``validate`` returned (the parsed JSON object when there is no
    validate), or ``None`` when ``ok`` is false; ``error`` then says why. ``raw_text`` is the
    judge's last reply (kept for failures too). ``attempts`` counts the calls sent for this
    record in this run (fault retries and corrective follow-ups included; 0 when ``cached``).
    """

    id: str
    ok: bool
    value: Any = None
    raw_text: str | None = None
    error: str | None = None
    attempts: int = 0
    cached: bool = False
    metadata: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "ok": self.ok,
            "value": self.value,
            "raw_text": self.raw_text,
            "error": self.error,
            "attempts": self.attempts,
            "cached": self.cached,
        }


MAX_USAGE_TOKENS = 10_000_000  # a reply's token count above this is not a count


@dataclass
class Completion:
    """One reply from a backend: its text, token usage, and a note (e.g. cut off at max_tokens)."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    note: str | None = None
    usage_valid: bool = True  # False: the reply's usage numbers were not counts (see from_usage)

    @classmethod
    def from_usage(cls, text: str, usage: Any, input_key: str, output_key: str, note: str | None = None
                   ) -> "Completion":
        """A completion whose token counts come from a reply's ``usage`` object. Each count must be an integer
        from 0 to :data:`MAX_USAGE_TOKENS` (absent: 0); anything else (``"12"``, ``-1e308``, ``1.5``, ``true``,
        a usage that is not an object) is summed as 0 and the reply counted in ``usage["invalid_usage"]``."""
        if usage is None:
            usage = {}
        counts = [usage.get(key) if isinstance(usage, dict) else None for key in (input_key, output_key)]
        valid = isinstance(usage, dict) and all(
            value is None or (type(value) is int and 0 <= value <= MAX_USAGE_TOKENS) for value in counts)
        if not valid:
            return cls(text=text, note=note, usage_valid=False)
        return cls(text=text, input_tokens=counts[0] or 0, output_tokens=counts[1] or 0, note=note)


@dataclass
class _Item:
    """A request in flight: its conversation grows with each corrective follow-up."""

    index: int
    request: JudgeRequest
    messages: list[dict]
    images: list[JudgeImage]
    image_index: int
    key: str
    attempts: int = 0
    replies: int = 0
    raw_text: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    endpoint_failed: bool = False  # failed for good because the call failed (not an unusable reply)


class Judge:
    """Base class of the judge backends; use :func:`medheval.judges.make_judge` to build one.

    Subclasses implement :meth:`_execute` (send the pending items, call ``deliver(item,
    result)`` for each) and usually extend :meth:`describe` and :meth:`_identity`.
    """

    backend = "base"
    role = "judge"  # what the logs call a record's caller: "model" when it serves the model under test

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        cache_dir: Any = None,
        concurrency: int = 16,
        requests_per_minute: float | None = None,
        max_retries: int = 5,
        timeout: float = 60.0,
        max_invalid_retries: int = 2,
        allow_remote_credentialed: Any = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        progress: bool = True,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        secrets: Iterable[str] = (),
        max_consecutive_failures: int | None = 8,
        top_p: float | None = None,
        invalid_reply: str = "follow_up",
        max_tries: int | None = None,
    ):
        self._secrets = tuple(s for s in secrets if s)
        # redacted from every output of the run (errors below included); API keys and header values from 8
        # characters, as a short one is a placeholder (OPENAI_API_KEY=EMPTY) whose word must stay in predictions;
        # passwords (4+ characters, whole words) are registered where they are known to be passwords
        register_secrets(*self._secrets, source="the API key (or base-URL password) of this judge or model endpoint")
        register_url(base_url)  # a password or ?key= in the base URL, too
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0 or max_invalid_retries < 0:
            raise ValueError("max_retries and max_invalid_retries must be >= 0")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_consecutive_failures is not None and max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be >= 1 or None, got {max_consecutive_failures}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
        if invalid_reply not in INVALID_REPLY_MODES:
            raise ValueError(f"invalid_reply must be one of {INVALID_REPLY_MODES}, got {invalid_reply!r}")
        if max_tries is not None and (isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1):
            raise ValueError(f"max_tries must be an integer >= 1 or None, got {max_tries!r}")
        self.model = model
        self.base_url = base_url
        self.concurrency = int(concurrency)
        self.requests_per_minute = requests_per_minute
        self.max_retries = int(max_retries)
        self.timeout = float(timeout)
        self.max_invalid_retries = int(max_invalid_retries)
        self.allow_remote_credentialed = normalise_allow_list(allow_remote_credentialed)
        self.temperature = float(temperature)
        self.top_p = None if top_p is None else float(top_p)  # None: not sent (the API's default)
        self.max_tokens = int(max_tokens)
        self.invalid_reply = invalid_reply
        # when set, the record's one budget: at most this many calls, failed calls and unusable replies alike
        # (ClinHallu's judge loop), max_retries and max_invalid_retries not applying; None: those two budgets
        self.max_tries = max_tries
        self.progress = progress
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        # HTTP backends: stop the run (JudgeError) once this many records in a row failed for good because
        # the endpoint call failed (retries exhausted, a 4xx); an unusable reply shows the endpoint works
        self.max_consecutive_failures = max_consecutive_failures
        self.cache: JudgeCache | None = None if cache_dir is False else JudgeCache(cache_dir)
        self._lock = threading.Lock()
        self.reported_models: set[str] = set()  # the model names the replies gave (HTTP backends)
        self._usage = {"requests": 0, "cached": 0, "failures": 0, "retries": 0, "invalid_retries": 0,
                       "input_tokens": 0, "output_tokens": 0, "invalid_usage": 0}

    # -- description ------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        """Whether requests stay local (loopback / private-range endpoint, or an in-process model)."""
        return is_local_url(self.base_url)

    @property
    def credentialed_allowed(self) -> bool:
        """Whether credentialed records may be sent to this judge's endpoint."""
        return self.is_local or self.remote_credentialed_approved

    @property
    def remote_credentialed_approved(self) -> bool:
        """Whether this endpoint is approved for credentialed records: named by the caller
        (``allow_remote_credentialed``) or by the user (``--allow-remote-credentialed``,
        ``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED``; :func:`medheval.judges.endpoints.user_approved`)."""
        return endpoint_allowed(self.base_url, self.allow_remote_credentialed) or user_approved(self.base_url)

    def describe(self) -> dict:
        """Settings to store with results: backend, model, endpoint host, parameters. No credentials. With
        ``max_tries`` set, the record's one budget, ``max_retries`` and ``max_invalid_retries`` (which then do
        not apply) are left out."""
        budgets = ({"max_tries": self.max_tries} if self.max_tries is not None
                   else {"max_invalid_retries": self.max_invalid_retries, "max_retries": self.max_retries})
        return {
            "backend": self.backend,
            "model": self.model,
            "endpoint": endpoint_host(self.base_url),
            "base_url": safe_base_url(self.base_url),
            "local": self.is_local,
            "temperature": self.temperature,
            **({"top_p": self.top_p} if self.top_p is not None else {}),
            "max_tokens": self.max_tokens,
            "structured_output": "json_object",
            "invalid_reply": self.invalid_reply,
            **budgets,
            "timeout": self.timeout,
            "concurrency": self.concurrency,
            "requests_per_minute": self.requests_per_minute,
            "cache_key_version": CACHE_KEY_VERSION,
        }

    def usage(self) -> dict:
        """Counts over every :meth:`run` of this judge: HTTP calls (or local generate calls), cache
        hits, failed records, fault retries, corrective follow-ups, tokens."""
        with self._lock:
            return dict(self._usage)

    def close(self) -> None:
        """Close the cache's SQLite connection; a later run of this judge opens it again."""
        if self.cache is not None:
            self.cache.close()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, endpoint={endpoint_host(self.base_url)!r})"

    # -- internals shared by the backends ---------------------------------------------------------
    def _bump(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                self._usage[name] += value

    def _redact(self, text: str | None) -> str | None:
        return redact(text, self._secrets)

    def _identity(self) -> dict:
        """What names the model in the cache key (subclasses add e.g. a local model fingerprint)."""
        return {"backend": self.backend, "model": self.model, "endpoint": safe_base_url(self.base_url)}

    def _params(self) -> dict:
        """Generation parameters in the cache key (``top_p`` only when set: older keys stay valid)."""
        params = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.top_p is not None:
            params["top_p"] = self.top_p
        return params

    def _sampling(self) -> dict:
        """The judge's own sampling fields of a request body (a request's ``params`` override them)."""
        fields: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        return fields

    def cache_key(self, messages: list[dict], image_digests: list[str], image_index: int,
                  reply_format: str = "json", request_params: dict | None = None,
                  extra_body: dict | None = None) -> str:
        material = {
            "v": CACHE_KEY_VERSION,
            **self._identity(),
            "params": self._params(),
            "messages": messages,
            "images": image_digests,
            "image_index": image_index,
        }
        if reply_format != "json":
            material["reply_format"] = reply_format
        if request_params:
            material["request_params"] = request_params
        if extra_body:
            material["extra_body"] = extra_body
        blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def check_credentialed(self, requests: Iterable[JudgeRequest]) -> None:
        """Raise :class:`CredentialedDataError` if credentialed requests, or requests whose status is
        unknown (``credentialed=None``), may not go to this endpoint."""
        requests = list(requests)
        flagged = [r.id for r in requests if r.credentialed]
        unknown = [r.id for r in requests if r.credentialed is None]
        if (flagged or unknown) and not self.credentialed_allowed:
            raise credentialed_refusal(flagged, self.base_url or "", self.backend, unknown=unknown)

    def _prepare(self, index: int, request: JudgeRequest) -> _Item:
        messages = request.conversation()
        try:
            images = [to_judge_image(img) for img in (request.images or [])]
        except (ValueError, OSError) as err:  # a verdict needs its images: the request cannot be skipped here
            raise ValueError(f"JudgeRequest {request.id!r}: {err}. To fix: re-download or replace the file, or leave "
                             f"this request out (a judge cannot give a verdict without its image; `medheval run` "
                             f"decodes images before judging and skips such records under --on-missing skip)") from err
        image_index = max(i for i, m in enumerate(messages) if m["role"] == "user")
        key = self.cache_key(messages, [img.digest for img in images], image_index if images else -1,
                             request.reply_format, request.params, request.extra_body)
        return _Item(index, request, messages, images, image_index, key)

    def _validated(self, request: JudgeRequest, text: str) -> Any:
        if request.reply_format == "raw":
            return request.validate(text) if request.validate is not None else text
        if request.reply_format == "text":
            if not text or not text.strip():
                raise ValueError("the judge's reply is empty")
            return request.validate(text.strip()) if request.validate is not None else text.strip()
        parsed = parse_json_object(text)
        return request.validate(parsed) if request.validate is not None else parsed

    def _result(self, item: _Item, *, ok: bool, value: Any = None, error: str | None = None,
                cached: bool = False) -> JudgeResult:
        return JudgeResult(
            id=item.request.id, ok=ok, value=value, raw_text=self._redact(item.raw_text),
            error=self._redact(error), attempts=item.attempts, cached=cached, metadata=item.request.metadata,
        )

    def _out_of_tries(self, item: _Item) -> bool:
        """Whether ``item`` has used the ``max_tries`` calls it may make (never, without ``max_tries``)."""
        return self.max_tries is not None and item.attempts >= self.max_tries

    def _out_of_replies(self, item: _Item) -> bool:
        """Whether ``item``'s unusable replies end it: its ``max_tries`` calls used when set (the one budget), else
        more than ``max_invalid_retries`` re-asks."""
        return self._out_of_tries(item) if self.max_tries is not None else item.replies > self.max_invalid_retries

    def _fail(self, item: _Item, reason: str) -> JudgeResult:
        self._bump(failures=1)
        reason = self._redact(reason)
        logger.info("%s record %r failed: %s", self.role, item.request.id, reason)
        return self._result(item, ok=False, error=reason)

    def _handle_reply(self, item: _Item, completion: Completion) -> JudgeResult | None:
        """Check one reply. Returns the final result, or ``None`` when the item must be sent again (with a
        corrective follow-up appended to ``item.messages``, or as it was under ``invalid_reply="resend"``)."""
        item.replies += 1
        text = self._redact(completion.text) or ""  # a server may echo a key: never kept, cached or returned
        item.raw_text = text
        item.input_tokens += completion.input_tokens
        item.output_tokens += completion.output_tokens
        try:
            value = self._validated(item.request, text)
        except INVALID_OUTPUT_ERRORS as err:
            reason = str(err) or type(err).__name__
            if completion.note:
                reason = f"{reason} ({completion.note})"
            if self._out_of_replies(item):
                replies = f"{item.replies} repl{'y' if item.replies == 1 else 'ies'}"
                calls = f" in {item.attempts} calls (max_tries={self.max_tries})" if self._out_of_tries(item) else ""
                return self._fail(item, f"invalid output after {replies}{calls}: {reason}")
            logger.info("%s record %r: invalid output (%s); asking again", self.role, item.request.id,
                        self._redact(reason))
            self._bump(invalid_retries=1)
            if self.invalid_reply == "resend":  # the same conversation again, nothing added
                return None
            item.messages = item.messages + [
                {"role": "assistant", "content": text},
                {"role": "user", "content": (TEXT_CORRECTION_PROMPT if item.request.reply_format == "text"
                                             else CORRECTION_PROMPT).format(reason=reason)},
            ]
            return None
        except Exception as err:  # noqa: BLE001 - a bug in validate(): report it, do not re-ask
            return self._fail(item, f"validate() raised {type(err).__name__}: {err}")
        if self.cache is not None:
            self.cache.put(item.key, {
                "raw_text": text,
                "replies": item.replies,
                "input_tokens": item.input_tokens,
                "output_tokens": item.output_tokens,
                "model": self.model,
                "backend": self.backend,
            })
        return self._result(item, ok=True, value=value)

    # -- the run loop -------------------------------------------------------------------------
    def run(self, requests: Iterable[JudgeRequest]) -> list[JudgeResult]:
        """Judge every request; results come back in the same order.

        Never raises for a failed record (it comes back with ``ok=False`` and ``error``).
        Raises :class:`CredentialedDataError` (before sending anything) when credentialed
        requests would leave for a non-local endpoint without opt-in, ``ValueError`` for a
        malformed request, and :class:`JudgeError` when the judge cannot work at all
        (authentication refused, model not found); records finished before that are cached.
        """
        requests = list(requests)
        for request in requests:
            if not isinstance(request, JudgeRequest):
                raise TypeError(f"Judge.run() takes JudgeRequest objects, got {type(request).__name__}")
        self.check_credentialed(requests)
        items = [self._prepare(i, r) for i, r in enumerate(requests)]
        results: list[JudgeResult | None] = [None] * len(items)
        entries = self.cache.get_many(item.key for item in items) if self.cache is not None and items else {}
        pending: list[_Item] = []
        hits = 0
        for item in items:
            entry = entries.get(item.key)
            if entry is not None:
                try:
                    value = self._validated(item.request, entry["raw_text"])
                except Exception:  # noqa: BLE001 - e.g. a stricter validate() than when cached: ask again
                    pending.append(item)
                    continue
                item.raw_text = entry["raw_text"]
                results[item.index] = self._result(item, ok=True, value=value, cached=True)
                hits += 1
            else:
                pending.append(item)
        self._bump(cached=hits)
        if pending:
            bar = None
            if self.progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(items), initial=hits, desc=f"{self.role} ({self.model})", unit="item", leave=False)

            def deliver(item: _Item, result: JudgeResult) -> None:
                results[item.index] = result
                if bar is not None:
                    bar.update(1)

            try:
                self._execute(pending, deliver)
            finally:
                if bar is not None:
                    bar.close()
        failed = [r for r in results if r is not None and not r.ok]
        if failed:
            logger.warning("%d of %d %s record(s) failed (reported with ok=False and the reason), e.g. %r: %s",
                           len(failed), len(results), self.role, failed[0].id, failed[0].error)
        missing = [items[i].request.id for i, r in enumerate(results) if r is None]
        if missing:  # pragma: no cover - a backend bug; never hand back holes
            raise JudgeError(f"internal error: no result for {len(missing)} record(s), e.g. {missing[:3]}")
        return results  # type: ignore[return-value]

    def _execute(self, pending: list[_Item], deliver: Callable[[_Item, JudgeResult], None]) -> None:
        raise NotImplementedError


__all__ = ["Completion", "INVALID_OUTPUT_ERRORS", "Judge", "JudgeError", "JudgeRequest", "JudgeResult"]

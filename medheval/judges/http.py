"""HTTP judges: bounded thread concurrency, a shared rate limit, retries with backoff.

Every call goes through :mod:`medheval.net.transport`: no redirect leaves the endpoint's origin
(a cross-host 3xx stops the run, naming both hosts), ``deadline`` bounds the whole exchange
(default 300 s for judges; the API backend's model calls: 900 s) while ``timeout`` bounds each read,
and a reply body larger than the request's ``max_tokens`` allows is refused.

Each record runs in a worker thread (at most ``concurrency`` at once) with its own
``requests.Session`` per thread (connections are reused). Sessions to a local endpoint ignore
proxy settings from the environment, so loopback/private traffic never leaves through a proxy, and so
do sessions to an endpoint named in ``allow_remote_credentialed`` unless ``--proxy-for`` names it too. A call is re-sent on 408/409/425/429,
any 5xx, a timeout or a dropped/refused connection, up to ``max_retries`` times (with ``max_tries`` set
instead: while the record has calls left of that one budget, which its unusable replies and re-sent 400s
share), after an exponential backoff with jitter or the server's ``Retry-After`` (a 429's ``Retry-After`` pauses
every thread). 401/403/404 stop the whole run (:class:`JudgeError`: a wrong key or model
name fails every record alike); other 4xx fail just that record. ``max_consecutive_failures``
(default 8; ``None``: never) records whose calls failed for good one after another (in completion
order) stop the run too: a dead or misconfigured server fails fast instead of retrying every
remaining record. Records the judge answered unusably do not count (the endpoint works).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from medheval.net import transport
from medheval.net.hosts import check_host_entry
from medheval.net.keys import carries_secret_header, check_plain_http
from medheval.net.secrets import PLAIN_HEADERS, is_secret_query_name, register_basic_auth, register_headers
from medheval.net.untrusted import printable
from medheval.judges.base import Completion, Judge, JudgeError, JudgeResult, _Item
from medheval.judges.endpoints import endpoint_host, split_userinfo
from medheval.judges.ratelimit import RateLimiter, backoff_delay, parse_retry_after

logger = logging.getLogger("medheval.judges")

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
FATAL_STATUS = frozenset({401, 403, 404})
DEFAULT_DEADLINE = 300.0  # seconds for one whole request (connect, headers, body), redirects included
# a reply body may hold this much, plus REPLY_BYTES_PER_TOKEN per requested token: generous for JSON
# escaping and usage fields, yet far below what a hostile server could stream into memory
REPLY_BYTES_BASE = 256 * 1024
REPLY_BYTES_PER_TOKEN = 128
# a reply's text may hold this many characters per requested token (plus a margin): far above any tokenizer
REPLY_CHARS_BASE = 1024
REPLY_CHARS_PER_TOKEN = 64


def reply_text(content: Any, where: str) -> str:
    """The text of a reply's content, in the shapes the chat APIs define: a string, or a list of parts in
    which ``{"type": "text", "text": str}`` parts are joined (other part types, e.g. reasoning or tool
    calls, are skipped). Anything else (``null``, a number, an object, a part whose text is not a string,
    a list without text) raises ``ValueError`` naming ``where`` and what came: the record fails and is
    retried, never stored as a prediction."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        shown = "null" if content is None else f"a {type(content).__name__}"
        raise ValueError(f"{where} is {shown}, not text")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict):
            raise ValueError(f"{where}[{index}] is a {type(part).__name__}, not a content part")
        if part.get("type", "text") != "text":
            continue
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{index}] is a text part whose text is not a string")
        texts.append(part["text"])
    if not texts:
        raise ValueError(f"{where} has no text part")
    return "".join(texts)


class _CallFailed(Exception):
    """This record's call failed for good (retries exhausted or a non-retryable 4xx)."""


class _Fatal(Exception):
    """The judge cannot work at all; stop the run."""


class _Stopped(Exception):
    """The run is being stopped (fatal error elsewhere or interrupt)."""


def _error_excerpt(response: transport.Reply, limit: int = 300) -> str:
    """The server's error message: ``error.message`` of a JSON body, else the start of the text."""
    text = response.text or ""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif isinstance(error, str):
            text = error
        elif body.get("message"):
            text = str(body["message"])
    text = printable(" ".join(text.split())) or ""  # a server's ESC/OSC sequences never reach a terminal
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HTTPJudge(Judge):
    """Base of the API backends. Subclasses build the request and read the response.

    A key, a password in the base URL, a credential header (``Authorization``, ``X-Api-Key`` …) or a secret-named
    query parameter is never sent over plain ``http://`` to a host other than loopback: :class:`JudgeError`."""

    key_withheld: str | None = None  # why a key set in the environment was not sent (make_judge), for 401 hints

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str, headers: dict | None = None,
                 deadline: float | None = None, **options: Any):
        deadline = DEFAULT_DEADLINE if deadline is None else float(deadline)
        if deadline <= 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        self.deadline = deadline
        try:  # a URL naming no host, a port that is not a number: refused here, not by every call
            check_host_entry(base_url, f"the {self.backend} endpoint's base_url")
        except ValueError as error:
            raise JudgeError(str(error)) from None
        url, user, password = split_userinfo(base_url)
        query_secret = any(is_secret_query_name(item.partition("=")[0]) for item in urlsplit(url).query.split("&") if item)
        # only credentials written into the spec reach this check: make_judge withholds a key from the
        # environment from such a URL (medheval.judges.spec._env_key)
        origins = [what for what, present in (
            ("the API key written into the spec (api_key=)", bool(api_key)),
            ("the password in the base URL (user:password@)", bool(password)),
            ("a secret query parameter of the base URL", query_secret),
            ("a credential header in the spec (headers=)", carries_secret_header(headers))) if present]
        if origins:
            try:
                check_plain_http(url, " and ".join(origins))
            except ValueError as error:
                raise JudgeError(str(error)) from None
        secrets = [s for s in (api_key, password) if s]
        # the URL's user:password (if any) is used as basic auth, never kept in base_url
        super().__init__(model, base_url=url, secrets=secrets + list(options.pop("secrets", ())), **options)
        parts = urlsplit(url)  # the path is joined before the base URL's own query (a gateway's ?key=)
        self._url_root = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._url_query = parts.query
        self._api_key = api_key
        self._basic_auth = (user or "", password or "") if (user or password) and not api_key else None
        register_basic_auth(user, password)
        self._extra_headers = dict(headers or {})
        # every header value the user adds is a secret (an X-Password as much as an Authorization), except
        # the standard headers that never carry one
        self._secrets = self._secrets + tuple(
            value for name, value in self._extra_headers.items()
            if isinstance(value, str) and name.strip().lower() not in PLAIN_HEADERS)
        register_headers(self._extra_headers)
        self._limiter = RateLimiter(self.requests_per_minute)
        self._local = threading.local()

    def _endpoint(self, path: str, query: str = "") -> str:
        """The URL of ``path`` under the base URL, its own query after it, then ``query``:
        ``https://h/v1?key=K`` + ``/chat/completions`` → ``https://h/v1/chat/completions?key=K`` (the path was
        appended after the query, ``…/v1?key=K/chat/completions``, so a key given there never reached the server)."""
        queries = "&".join(q for q in (self._url_query, query) if q)
        return self._url_root + path + (f"?{queries}" if queries else "")

    # -- subclass hooks -------------------------------------------------------------------------
    def _request(self, item: _Item) -> tuple[str, dict, dict]:
        """``(url, headers, json payload)`` for the item's current conversation."""
        raise NotImplementedError

    def _parse(self, body: Any) -> Completion:
        """The reply text and usage from a 200 response body (raise KeyError/TypeError/ValueError if malformed)."""
        raise NotImplementedError

    def _adapt(self, status: int, message: str, payload: dict) -> dict | None:
        """A changed payload to re-send after a 400 the backend knows how to work around, else None."""
        return None

    def _note_reported_model(self, body: Any) -> None:
        """Keep the model name a reply reports (``model`` of an OpenAI-compatible or Anthropic body, often a dated
        version of the one asked for) in :attr:`reported_models`: the model revision a run records."""
        name = body.get("model") if isinstance(body, dict) else None
        if isinstance(name, str) and name and len(name) <= 200:
            with self._lock:
                self.reported_models.add(self._redact(name) or name)

    # -- sending ------------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            # the one proxy rule (medheval.net.transport): never an environment proxy for a local endpoint, nor
            # for one allowed to receive credentialed records, unless the user named its host (--proxy-for)
            remote_credentialed = self.remote_credentialed_approved
            session = transport.session_for(self.base_url or "", credentialed=remote_credentialed)
            if self._basic_auth is not None:
                session.auth = self._basic_auth
            self._local.session = session
        return session

    def _call(self, item: _Item, stop: threading.Event) -> Completion:
        url, headers, payload = self._request(item)
        headers = {**headers, **self._extra_headers}
        try:
            session = self._session()
        except ValueError as err:  # a host list of the environment that is not one (MEDHEVAL_PROXY_FOR=host/v1)
            raise _Fatal(self._redact(str(err)) or "") from None
        failures = 0
        while True:
            if stop.is_set():
                raise _Stopped
            self._limiter.acquire(stop)
            if stop.is_set():
                raise _Stopped
            item.attempts += 1
            self._bump(requests=1)
            retry_after = None
            try:
                response = transport.post(session, url, json.dumps(payload).encode("utf-8"), headers,
                                          timeout=self.timeout, deadline=self.deadline,
                                          max_bytes=self._reply_bytes(payload))
            except transport.RedirectRefused as err:
                raise _Fatal(f"the {self.backend} endpoint {self._redact(str(err))}") from None
            except (transport.DeadlineExceeded, transport.ReplyTooLarge) as err:
                problem = self._redact(str(err))
            except requests.Timeout:
                problem = f"no response within timeout={self.timeout:g}s"
            except requests.ConnectionError as err:
                problem = f"connection failed ({type(err).__name__}: {self._redact(str(err))[:200]})"
            except requests.RequestException as err:
                problem = f"request failed ({type(err).__name__}: {self._redact(str(err))[:200]})"
            else:
                status = response.status_code
                if status == 200:
                    try:
                        body = response.json()
                        completion = self._parse(body)
                        self._check_length(completion.text, payload)
                        self._note_reported_model(body)
                    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
                        problem = f"unreadable 200 response ({type(err).__name__}: {self._redact(str(err))[:160]})"
                    else:
                        self._bump(input_tokens=completion.input_tokens, output_tokens=completion.output_tokens,
                                   invalid_usage=0 if completion.usage_valid else 1)
                        return completion
                elif status in RETRYABLE_STATUS or status >= 500:
                    problem = f"HTTP {status}: {self._redact(_error_excerpt(response))}"
                    retry_after = parse_retry_after(response.headers)
                    if status == 429 and retry_after:
                        self._limiter.pause(min(retry_after, self.backoff_max))
                else:
                    message = self._redact(_error_excerpt(response)) or ""
                    adapted = self._adapt(status, message, payload) if status == 400 else None
                    if adapted is not None:
                        if self._out_of_tries(item):
                            raise _CallFailed(self._tries_spent(item, f"HTTP {status}: {message}"))
                        payload = adapted
                        continue
                    host = endpoint_host(self.base_url)
                    if status in (401, 403):
                        raise _Fatal(
                            f"the {self.backend} endpoint {host!r} refused the credentials (HTTP {status}: {message}); "
                            f"check the API key ({self.key_withheld or self._key_hint()})"
                        )
                    if status == 404:
                        raise _Fatal(
                            f"the {self.backend} endpoint {host!r} answered 404 for model {self.model!r} "
                            f"({message}); check the model name and base_url ({self._redact(url)})"
                        )
                    raise _CallFailed(f"HTTP {status} (not retried): {message}")
            failures += 1
            if self.max_tries is not None:  # the record's one budget, which its unusable replies share
                if self._out_of_tries(item):
                    raise _CallFailed(self._tries_spent(item, problem))
            elif failures > self.max_retries:
                raise _CallFailed(f"gave up after {failures} attempt(s); last error: {problem}")
            self._bump(retries=1)
            delay = backoff_delay(failures, self.backoff_base, self.backoff_max, retry_after)
            logger.info("%s record %r: %s; retry %d/%d in %.2fs", self.role, item.request.id, problem,
                        *((item.attempts, self.max_tries - 1) if self.max_tries is not None
                          else (failures, self.max_retries)), delay)
            if stop.wait(delay):
                raise _Stopped

    def _tries_spent(self, item: _Item, problem: str) -> str:
        """Why a record that used its ``max_tries`` calls ends on a failed call."""
        return f"gave up after {item.attempts} call(s) (max_tries={self.max_tries}); last error: {problem}"

    def _key_hint(self) -> str:
        return "a key was sent" if self._api_key else "no key is configured"

    def _requested_tokens(self, payload: dict) -> int:
        return int(payload.get("max_tokens") or payload.get("max_completion_tokens") or self.max_tokens)

    def _reply_bytes(self, payload: dict) -> int:
        """The largest reply body accepted for ``payload`` (its ``max_tokens``, else the judge's)."""
        return REPLY_BYTES_BASE + REPLY_BYTES_PER_TOKEN * self._requested_tokens(payload)

    def _check_length(self, text: str, payload: dict) -> None:
        """Refuse a reply text far longer than ``max_tokens`` tokens can be (``ValueError``)."""
        tokens = self._requested_tokens(payload)
        if len(text) > REPLY_CHARS_BASE + REPLY_CHARS_PER_TOKEN * tokens:
            raise ValueError(f"a reply of {len(text)} characters is far longer than max_tokens={tokens} allows")

    def describe(self) -> dict:
        return {**super().describe(), "deadline": self.deadline}

    def _judge_one(self, item: _Item, stop: threading.Event) -> JudgeResult:
        while True:
            try:
                completion = self._call(item, stop)
            except _CallFailed as err:
                item.endpoint_failed = True
                return self._fail(item, str(err))
            result = self._handle_reply(item, completion)
            if result is not None:
                return result
            if self.invalid_reply == "resend" and stop.wait(backoff_delay(item.replies, self.backoff_base,
                                                                          self.backoff_max)):
                raise _Stopped

    def _execute(self, pending: list[_Item], deliver: Callable[[_Item, JudgeResult], None]) -> None:
        stop = threading.Event()
        fatal: list[str] = []
        tripped: list[str] = []  # max_consecutive_failures reached
        in_a_row = [0]  # records failed for good one after another, in completion order
        counter = threading.Lock()

        def work(item: _Item) -> JudgeResult:
            result = self._judge_one(item, stop)
            limit = self.max_consecutive_failures
            if limit:
                with counter:
                    in_a_row[0] = in_a_row[0] + 1 if item.endpoint_failed else 0
                    if in_a_row[0] >= limit and not tripped:
                        tripped.append(f"{limit} records in a row failed for good against the {self.backend} endpoint "
                                       f"{endpoint_host(self.base_url)!r}; the last ({item.request.id!r}): "
                                       f"{result.error}")
                        stop.set()
            return result

        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(pending)), thread_name_prefix="medheval-judge")
        try:
            futures = {pool.submit(work, item): item for item in pending}
            remaining = set(futures)
            while remaining:
                done, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                for future in done:
                    item = futures[future]
                    try:
                        result = future.result()
                    except _Stopped:
                        continue
                    except _Fatal as err:
                        if not fatal:
                            fatal.append(str(err))
                        stop.set()
                        continue
                    except Exception as err:  # noqa: BLE001 - a bug must not lose the other records
                        logger.exception("%s record %r: internal error", self.role, item.request.id)
                        result = self._fail(item, f"internal error: {type(err).__name__}: {self._redact(str(err))}")
                    deliver(item, result)
        except BaseException:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        if fatal or tripped:
            raise JudgeError((fatal or tripped)[0] + " (records finished before this are cached; re-run after fixing it)")


__all__ = ["FATAL_STATUS", "HTTPJudge", "RETRYABLE_STATUS"]

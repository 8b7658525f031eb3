"""Loopback fake judge servers (OpenAI-compatible and Anthropic-compatible) that tests script.

Usage (``tests/`` is on ``sys.path`` under pytest, so ``from judge_servers import ...``)::

    from judge_servers import JudgeServer, Reply, Drop, Hang, user_text

    def reply(request_json):                     # called for each request not taken from the script
        return '{"score": 1}'                    # str: the assistant text, wrapped in a 200 body

    with JudgeServer("openai", reply=reply, latency=0.0) as server:
        server.script(Reply(429, headers={"Retry-After": "0"}), Drop())  # the next two requests
        judge = make_judge(f"openai:m@{server.base_url}", ...)
        ...
        server.request_count, server.max_in_flight, server.requests[-1].json

What ``reply(request_json)`` (or a scripted entry) may return:

- ``str``: the assistant's text, wrapped in a chat-completions / Messages 200 body;
- ``dict``: a full JSON body sent with status 200;
- ``(status, headers, body)``: body a dict (JSON), str or bytes;
- ``Reply(status, body, headers, delay)``; ``Drop()`` (close the socket without answering);
  ``Drip(interval, part)`` (a reply trickling one byte at a time: headers or body);
  ``Hang(seconds)`` (answer only after ``seconds``, or never once the server stops: a long hang, which no
  client timeout can lose the race to on a slow machine, costs nothing past the test).

``server.requests`` holds every received request (``path``, ``headers``, ``json``, ``time``);
``request_count``, ``max_in_flight`` (requests being answered at the same time) are counted
server-side. With ``api_key=`` set the server answers 401 to requests without that key.
Both kinds check the path (``/v1/chat/completions`` or ``/v1/messages``) and answer 404 otherwise.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "azure": None}


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, str -> assistant text when status 200 else raw text, bytes -> raw
    headers: dict = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Drip:
    """A 200 reply sent one byte every ``interval`` seconds: from its status line (``part="headers"``) or
    after complete headers (``part="body"``); at most ``limit`` bytes, then the connection is closed (or once
    the server stops)."""

    interval: float = 0.2
    part: str = "body"
    limit: int = 400


@dataclass
class Drop:
    """Close the connection without sending anything."""

    delay: float = 0.0


@dataclass
class Hang:
    """Wait ``seconds`` before answering (past the client's timeout), then answer ``then``; nothing if the
    server stops first."""

    seconds: float = 1.0
    then: Any = None


@dataclass
class Recorded:
    path: str
    headers: dict
    json: Any
    time: float


def openai_body(text: str, prompt_tokens: int = 11, completion_tokens: int = 7, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def anthropic_body(text: str, input_tokens: int = 11, output_tokens: int = 7, stop_reason: str = "end_turn") -> dict:
    return {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": [{"type": "text", "text": text}], "stop_reason": stop_reason,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def user_texts(request_json: dict) -> list[str]:
    """The text of every user message of a chat-completions or Messages request, in order."""
    return [_text_of(m.get("content")) for m in request_json.get("messages", []) if m.get("role") == "user"]


def user_text(request_json: dict) -> str:
    """The first user message's text (the original prompt, not a corrective follow-up)."""
    texts = user_texts(request_json)
    return texts[0] if texts else ""


def is_followup(request_json: dict) -> bool:
    """Whether this request carries a corrective follow-up (more than one user turn)."""
    return len(user_texts(request_json)) > 1


def image_parts(request_json: dict) -> list[dict]:
    """Image parts (OpenAI ``image_url`` or Anthropic ``image`` blocks) of all messages."""
    out = []
    for message in request_json.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            out.extend(p for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "image"))
    return out


class JudgeServer:
    """A scripted OpenAI- or Anthropic-compatible HTTP server on 127.0.0.1 (a context manager).

    Args:
        kind: ``"openai"`` (``base_url`` ends in ``/v1``), ``"anthropic"`` (``base_url`` is the root)
            or ``"azure"`` (accepts any path; ``base_url`` is the root).
        reply: ``reply(request_json)`` for requests not served from :meth:`script`; default
            answers ``{"score": 0}``.
        latency: seconds every answer waits (e.g. 0.2 for the benchmark).
        api_key: when set, requests without it (``Authorization: Bearer``, ``x-api-key`` or
            ``api-key``) get a 401.
    """

    def __init__(self, kind: str = "openai", reply: Callable[[dict], Any] | None = None, *, latency: float = 0.0,
                 api_key: str | None = None, host: str = "127.0.0.1"):
        if kind not in PATHS:
            raise ValueError(f"kind must be one of {sorted(PATHS)}")
        self.kind = kind
        self.reply = reply or (lambda request_json: '{"score": 0}')
        self.latency = latency
        self.api_key = api_key
        self.host = host
        self.requests: list[Recorded] = []
        self.request_count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._script: deque = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # cuts every Hang and Drip short

    # -- control -----------------------------------------------------------------------
    def script(self, *behaviours: Any) -> "JudgeServer":
        """Queue behaviours for the next requests (FIFO), before ``reply`` is used again."""
        with self._lock:
            self._script.extend(behaviours)
        return self

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.request_count = 0
            self.max_in_flight = 0

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What a judge spec takes after ``@``."""
        return self.root_url + ("/v1" if self.kind == "openai" else "")

    def start(self) -> "JudgeServer":
        server = self
        self._stopping.clear()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once (no 40 ms delayed-ACK stalls)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                server._handle(self)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 256
            allow_reuse_address = True

        self._httpd = Server((self.host, 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "JudgeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- serving ----------------------------------------------------------------------
    def _authorised(self, headers: dict) -> bool:
        if not self.api_key:
            return True
        lowered = {k.lower(): v for k, v in headers.items()}
        return self.api_key in (lowered.get("authorization", "").removeprefix("Bearer ").strip(),
                                lowered.get("x-api-key"), lowered.get("api-key"))

    def _wrap_text(self, text: str) -> dict:
        return anthropic_body(text) if self.kind == "anthropic" else openai_body(text)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            payload = json.loads(raw or b"null")
        except json.JSONDecodeError:
            payload = None
        headers = dict(handler.headers.items())
        with self._lock:
            self.request_count += 1
            self.requests.append(Recorded(handler.path, headers, payload, time.monotonic()))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            behaviour = self._script.popleft() if self._script else None
        left = []

        def leave() -> None:
            if not left:
                left.append(True)
                with self._lock:
                    self.in_flight -= 1
        try:
            expected = PATHS[self.kind]
            if expected is not None and handler.path.split("?", 1)[0] != expected:
                behaviour = Reply(404, {"error": {"message": f"no route {handler.path}"}})
            elif not self._authorised(headers):
                behaviour = Reply(401, {"error": {"message": "invalid api key"}})
            elif behaviour is None:
                behaviour = self.reply(payload)
            if self.latency:
                time.sleep(self.latency)
            self._respond(handler, behaviour, leave)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            leave()

    def _respond(self, handler: BaseHTTPRequestHandler, behaviour: Any, leave: Any = lambda: None) -> None:
        """Send ``behaviour``; ``leave()`` runs just before the first byte goes out: a client that got its
        answer and sends the next request at once is never counted in flight twice."""
        if isinstance(behaviour, Drop):
            if behaviour.delay:
                time.sleep(behaviour.delay)
            leave()
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if isinstance(behaviour, Drip):
            leave()
            body = json.dumps(self._wrap_text("x" * 2000)).encode()
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    ).encode()
            handler.close_connection = True
            if behaviour.part == "body":
                handler.wfile.write(head)
                handler.wfile.flush()
                data = body
            else:
                data = head + body
            for byte in data[: behaviour.limit]:
                if self._stopping.wait(behaviour.interval):  # a long drip ends with the server
                    return
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            return
        if isinstance(behaviour, Hang):
            if self._stopping.wait(behaviour.seconds):
                handler.close_connection = True  # stopped: no answer
                return
            behaviour = behaviour.then if behaviour.then is not None else '{"score": 0}'
        if isinstance(behaviour, tuple):
            status, headers, body = behaviour
            behaviour = Reply(status, body, dict(headers or {}))
        elif isinstance(behaviour, (str, dict)):
            behaviour = Reply(200, behaviour)
        if not isinstance(behaviour, Reply):
            raise TypeError(f"unsupported reply {behaviour!r}")
        if behaviour.delay:
            time.sleep(behaviour.delay)
        body = behaviour.body
        content_type = "application/json"
        if isinstance(body, str) and behaviour.status == 200:
            body = self._wrap_text(body)
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data, content_type = body.encode(), "text/plain"
        elif body is None:
            data = b"{}"
        else:
            data = bytes(body)
        leave()
        handler.send_response(behaviour.status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for name, value in behaviour.headers.items():
            handler.send_header(name, str(value))
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()


@pytest.fixture
def judge_server_factory():
    """``start(kind="openai", reply=None, **kw) -> JudgeServer``; every server is stopped at teardown."""
    started: list[JudgeServer] = []

    def start(kind: str = "openai", reply: Callable[[dict], Any] | None = None, **kwargs: Any) -> JudgeServer:
        server = JudgeServer(kind, reply, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


class RecordingProxy:
    """A forward HTTP proxy on 127.0.0.1 that records the target of every request it gets and answers
    each like an OpenAI-compatible judge replying ``{"score": 4}`` (so a proxied request succeeds)."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hits.append(self.path)
                data = json.dumps(openai_body('{"score": 4}')).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_CONNECT = do_POST  # noqa: N815 - an https target is recorded too

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def recording_proxy(monkeypatch):
    """A :class:`RecordingProxy` named in HTTP(S)_PROXY / ALL_PROXY (both cases), NO_PROXY unset."""
    proxy = RecordingProxy()
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    yield proxy
    proxy.close()


def open_files_under(folder: Path) -> list[str]:
    """Files under ``folder`` this process holds open (Linux /proc/self/fd)."""
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        pytest.skip("needs /proc/self/fd (Linux) to count open files")
    found = []
    for fd in fd_dir.iterdir():
        try:
            target = str(Path(fd).resolve())
        except OSError:
            continue
        if target.startswith(str(folder.resolve())):
            found.append(target)
    return sorted(found)


__all__ = [
    "Drop", "Hang", "JudgeServer", "Recorded", "RecordingProxy", "Reply", "anthropic_body", "image_parts", "is_followup",
    "judge_server_factory", "open_files_under", "openai_body", "recording_proxy", "user_text", "user_texts",
]

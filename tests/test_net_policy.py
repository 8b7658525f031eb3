"""One outbound policy for every request (issue 31, class 1), tried from the attacker's side on 127.0.0.1.

Image downloads (URL-template roots) go through :mod:`medheval.net.transport`, like model and judge calls:

- a proxy from the environment never carries credentialed data (a MIMIC root, an image root with PhysioNet
  credentials, a model endpoint allowed credentialed records) unless the user names the host; a loopback
  "proxy" records whether it was hit;
- a redirect to another origin (another port, another host name for the same address) is refused: the foreign
  server receives nothing and the run stops (exit 2, naming the record) instead of scoring its image;
- a server dripping one byte at a time hits the image deadline; an endless body hits the size cap with bounded
  memory, and the error names the record.
"""

from __future__ import annotations

import http.server
import io
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from judge_servers import JudgeServer
from medheval.data.images import DEADLINE_ENV, MAX_MB_ENV, ImageError, ImageFetchError, ImageResolver, URLTemplateSource

KEY = "sk-policy-canary-5d2f7a"
PNG = (lambda buffer: (Image.new("RGB", (4, 4), (200, 10, 10)).save(buffer, format="PNG"), buffer.getvalue())[1])(
    io.BytesIO())
FOREIGN = (lambda buffer: (Image.new("RGB", (4, 4), (0, 0, 255)).save(buffer, format="PNG"), buffer.getvalue())[1])(
    io.BytesIO())
MIMIC_REF = "p10/p10000032/s50414267/02aa804e-bde0afdd-112c0b34-7bc16630-4e384014.jpg"
NOWHERE = "198.51.100.7"  # TEST-NET-2: not local, routes nowhere; only a proxy could "reach" it


class Server:
    """A loopback HTTP server: ``handle(handler)`` answers each request; ``hits`` records (method, path)."""

    def __init__(self, handle: Callable[[http.server.BaseHTTPRequestHandler], None],
                 protocol: str = "HTTP/1.1") -> None:
        self.hits: list[tuple[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def _any(self) -> None:
                outer.hits.append((self.command, self.path))
                try:
                    handle(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(handler, status: int, body: bytes = b"", headers: dict | None = None) -> None:
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), "Content-Type": "image/png", **(headers or {})}.items():
        handler.send_header(name, value)
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _image(handler) -> None:
    _send(handler, 200, PNG)


@pytest.fixture
def proxy_env(monkeypatch):
    """Every proxy variable points at a loopback "proxy" that serves an image and records each request."""
    with Server(_image) as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy", "MEDHEVAL_PROXY_FOR"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(DEADLINE_ENV, "3")
        yield proxy


# -- proxies ---------------------------------------------------------------------------------------------
def test_credentialed_images_never_go_through_an_environment_proxy(proxy_env, monkeypatch):
    monkeypatch.setenv("PHYSIONET_USERNAME", "reader")
    monkeypatch.setenv("PHYSIONET_PASSWORD", "physio-canary-pass-771")
    # a MIMIC root (patient and study ids in the URL), the default root "*" (may serve MIMIC records), and any
    # root holding basic-auth credentials: each fails to connect rather than going through the proxy
    resolver = ImageResolver({"mimic_cxr": f"http://{NOWHERE}/files/{{path}}", "*": f"http://{NOWHERE}/any/{{path}}"})
    credentialed = URLTemplateSource(f"https://{NOWHERE}/public/{{path}}", credentialed=False,
                                     auth=("reader", "physio-canary-pass-771"), retries=0)
    for fetch in (lambda: resolver.open_bytes("mimic_cxr", MIMIC_REF), lambda: resolver.open_bytes("vqa_rad", "synpic1.jpg"),
                  lambda: credentialed.open_bytes("synpic1.jpg")):
        with pytest.raises(ImageError):  # no route there without the proxy (or whatever answers that address)
            fetch()
    assert proxy_env.hits == []


def test_a_loopback_root_never_uses_the_proxy_and_a_public_remote_root_may(proxy_env):
    with Server(_image) as images:
        loopback = ImageResolver({"slake": f"{images.url}/{{path}}", "mimic_cxr": f"{images.url}/{{path}}"})
        assert loopback.open_bytes("slake", "xmlab1/source.jpg") == PNG
        assert loopback.open_bytes("mimic_cxr", MIMIC_REF) == PNG
    assert proxy_env.hits == []
    public = ImageResolver({"slake": f"http://{NOWHERE}/slake/{{path}}"})  # no credentials, no credentialed data
    assert public.open_bytes("slake", "xmlab1/source.jpg") == PNG
    assert proxy_env.hits == [("GET", f"http://{NOWHERE}/slake/xmlab1/source.jpg")]


def test_naming_the_host_opts_credentialed_images_into_the_proxy(proxy_env, monkeypatch):
    monkeypatch.setenv("MEDHEVAL_PROXY_FOR", f"other.example, {NOWHERE}")
    resolver = ImageResolver({"mimic_cxr": f"http://{NOWHERE}/files/{{path}}"})
    assert resolver.open_bytes("mimic_cxr", MIMIC_REF) == PNG
    assert proxy_env.hits == [("GET", f"http://{NOWHERE}/files/{MIMIC_REF}")]


def test_a_model_endpoint_allowed_credentialed_records_never_uses_the_proxy(proxy_env):
    from medheval.backends.api import APIBackend
    from medheval.backends.base import BackendError

    backend = APIBackend(f"openai:m@http://{NOWHERE}:9/v1", cache_dir=False, max_retries=0,  # keyless: plain http
                         timeout=2, deadline=3, allow_remote_credentialed=NOWHERE)
    record = {"id": "mimic/1", "question": "Is there an effusion?", "answer_type": "yes_no", "choices": [],
              "source": "mimic_cxr", "meta": {"credentialed": True}}
    with pytest.raises(BackendError):
        backend.generate([record], [[]])
    assert proxy_env.hits == []


# -- redirects -------------------------------------------------------------------------------------------
def _serving(folder: str, redirect: Callable[[str], str | None]) -> Callable:
    def handle(handler) -> None:
        target = redirect(handler.path)
        if target is not None:
            _send(handler, 302, headers={"Location": target})
            return
        path = Path(folder) / handler.path.lstrip("/")
        _send(handler, 200, path.read_bytes()) if path.is_file() else _send(handler, 404)
    return handle


@pytest.mark.parametrize("where", ["other port", "other host name", "other scheme"])
def test_a_run_never_scores_an_image_from_another_origin(where, fixture_benchmark, monkeypatch, tmp_path, capsys):
    from medheval.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    slake = fixture_benchmark["image_roots"]["slake"]
    with Server(lambda handler: _send(handler, 200, FOREIGN)) as foreign, \
            JudgeServer("openai", reply=lambda body: "Yes", api_key=KEY) as model:
        holder: dict = {}
        elsewhere = {"other port": foreign.url, "other host name": f"http://localhost:{{port}}",
                     "other scheme": "https://127.0.0.1:{port}"}[where]
        redirect = (lambda path: elsewhere.format(port=holder["port"]) + "/evil.png" if "xmlab9002" in path else None)
        with Server(_serving(slake, redirect)) as images:
            holder["port"] = images.port
            code = main(["run", "--benchmark", "mm_vishal:slake", "--model", f"openai:m@{model.base_url}",
                         "--output", str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"],
                         "--image-root", f"slake={images.url}/{{path}}", "--max-new-tokens", "8"])
    error = capsys.readouterr().err
    assert code == 2
    assert "another host" in error and "xmlab9002" in error and "record " in error
    assert foreign.hits == [] and not (tmp_path / "run" / "results.json").exists()
    assert not any("evil" in hit[1] for hit in images.hits[1:])


def test_a_same_origin_redirect_of_an_image_is_followed():
    from medheval.data.images import ImageNotFound

    with Server(_serving("/nonexistent", lambda path: "/moved/x.png" if path.startswith("/old/") else None)) as images:
        with pytest.raises(ImageNotFound):  # followed to /moved/x.png, which answers 404
            URLTemplateSource(f"{images.url}/old/{{path}}").open_bytes("a.png")
    assert [hit[1] for hit in images.hits] == ["/old/a.png", "/moved/x.png"]


def test_a_same_origin_redirect_whose_path_or_query_holds_an_at_is_followed():
    """An '@' in a redirect's path or query names no host: only user-written text is refused for one (a password
    holding '/'); a server's Location is followed when its origin is the endpoint's, as before."""
    from medheval.net import transport

    moved = "/files/me@example.org/x.png?next=/b@c"
    with Server(lambda handler: _send(handler, 302, headers={"Location": moved}) if handler.path.startswith("/old/")
                else _image(handler)) as images:
        session = transport.session_for(images.url, credentialed=False)
        reply = transport.request(session, "GET", f"{images.url}/old/a.png", timeout=5, deadline=10, max_bytes=2**20)
    assert (reply.status_code, reply.content, reply.url) == (200, PNG, f"{images.url}{moved}")
    assert [hit[1] for hit in images.hits] == ["/old/a.png", moved]


@pytest.mark.parametrize("second", ["http://198.51.100.7:9/x.png", "/files/me@example.org/x.png"])
def test_a_refusal_after_a_redirect_whose_path_holds_an_at_names_the_endpoint(second):
    """Reproduction: after a same-origin redirect to /files/me@example.org/... on a host with a port, the next
    refusal (a redirect to another host, or one redirect too many) named the endpoint '<unparseable URL>': _host
    read the whole URL, which parse_address refuses for the '@' after its host:port (AtAfterPort), where the
    origin check reads its scheme://authority alone."""
    from medheval.net import transport

    moved = "/files/me@example.org/x.png"
    with Server(lambda handler: _send(handler, 302, headers={"Location": moved if handler.path.startswith("/old/")
                                                                     else second})) as images:
        session = transport.session_for(images.url, credentialed=False)
        with pytest.raises(transport.RedirectRefused) as info:
            transport.request(session, "GET", f"{images.url}/old/a.png", timeout=5, deadline=10, max_bytes=2**20)
    assert f"'127.0.0.1:{images.port}'" in str(info.value) and "unparseable" not in str(info.value)


@pytest.mark.parametrize("location, followed", [
    ("/@scope/b?mail=a@b.org", True),  # an "@" in a path or query names no host
    ("https://example.org/files/me@example.org/b", True),
    ("https://EXAMPLE.org:443/b", True),  # the same origin, spelled otherwise
    ("/b?x=1", True),
    ("https://example.org./b", False),  # a trailing dot is another origin (as before the one host parser)
    ("https://example.org:8443/b", False),
    ("http://example.org/b", False),
    ("https://example.org:abc/b", False),  # unparseable: refused, not a ValueError from the parser
    ("mailto:someone@example.org", False),
    ("http://[", False),  # not even urljoin reads it: refused, not a ValueError
    ("https://evil.example\\@example.org/b", False),  # example.org to urlsplit, evil.example to requests
    ("https://evil.example:443\\x@example.org:443/b", False),
    ("/b\\@evil.example", True),  # in the path: example.org to both
])
def test_a_redirect_is_followed_only_within_the_origin(location, followed):
    from medheval.net.transport import RedirectRefused, _redirect_target

    class Answer:
        status_code = 302
        headers = {"Location": location}

    if followed:
        assert _redirect_target("https://example.org/a", Answer(), "GET").startswith("https://")
    else:
        with pytest.raises(RedirectRefused, match="redirecting to another host"):
            _redirect_target("https://example.org/a", Answer(), "GET")


def test_a_redirect_requests_would_send_to_another_origin_is_refused_and_the_credentials_stay():
    """A Location with a backslash before its '@' names the endpoint to Python's urlsplit and another host to
    requests (urllib3 ends the authority at a backslash): comparing urlsplit's reading alone followed it, and the
    image server's basic-auth credentials went to the other port."""
    with Server(lambda handler: _send(handler, 200, FOREIGN)) as foreign:
        holder: dict = {}
        location = (lambda path: f"http://127.0.0.1:{foreign.port}\\@127.0.0.1:{holder['port']}/x.png"
                    if path.startswith("/old/") else None)
        with Server(_serving("/nonexistent", location)) as images:
            holder["port"] = images.port
            source = URLTemplateSource(f"{images.url}/old/{{path}}", auth=("reader", "physio-canary-pass-913"),
                                       retries=0)
            with pytest.raises(ImageFetchError, match=f"another host, '127.0.0.1:{foreign.port}'"):
                source.open_bytes("a.png")
    assert foreign.hits == []


def _redirect_dripping_its_body(handler) -> None:
    """``/old/...``: a 302 to ``/new.png`` whose announced body drips a byte every 0.1 s; anything else: the image."""
    if not handler.path.startswith("/old/"):
        _image(handler)
        return
    handler.send_response(302)
    handler.send_header("Location", "/new.png")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(100):
        handler.wfile.write(b"x")
        handler.wfile.flush()
        time.sleep(0.1)


def test_a_redirect_body_is_never_read():
    """requests prepares the next request of a 3xx even under allow_redirects=False, reading the whole 3xx body
    first (no max_bytes cap: a 200 MB body took 400 MB) and asking ~/.netrc for the target's credentials; the
    transport follows redirects itself, so neither happens: the redirect is followed at once."""
    from medheval.net import transport

    with Server(_redirect_dripping_its_body) as images:
        session = transport.session_for(images.url, credentialed=False)
        start = time.monotonic()
        reply = transport.request(session, "GET", f"{images.url}/old/a.png", timeout=5, deadline=4, max_bytes=2**20)
        assert (reply.status_code, reply.content) == (200, PNG)
        assert time.monotonic() - start < 2  # not the 10 s of the dripping body, nor the 4 s deadline


def test_requests_never_asks_the_netrc_even_for_a_redirect(monkeypatch, tmp_path):
    import requests
    import requests.sessions

    from medheval.net import transport

    netrc = tmp_path / ".netrc"
    netrc.write_text("default login reader password netrc-canary-pass-5521\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NETRC", raising=False)
    asked: list[str] = []
    real = requests.sessions.get_netrc_auth
    monkeypatch.setattr(requests.sessions, "get_netrc_auth", lambda url, *a: asked.append(url) or real(url, *a))
    seen: list = []

    def handle(handler) -> None:
        seen.append(handler.headers.get("Authorization"))
        _send(handler, 302, headers={"Location": "/new.png"}) if handler.path.startswith("/old/") else _image(handler)

    with Server(handle) as images:
        session = transport.mount(requests.Session())  # one that uses the environment (trust_env)
        reply = transport.request(session, "GET", f"{images.url}/old/a.png", timeout=5, deadline=5, max_bytes=2**20)
    assert (reply.status_code, seen, asked) == (200, [None, None], [])


# -- deadlines and size caps ----------------------------------------------------------------------------
def test_a_dripping_image_server_hits_the_deadline_and_the_error_names_the_record(monkeypatch):
    def drip(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        for _ in range(100):  # one byte every 0.2 s: each read is quick, the whole image would take 20 s
            handler.wfile.write(b"x")
            handler.wfile.flush()
            time.sleep(0.2)

    monkeypatch.setenv(DEADLINE_ENV, "1.5")
    with Server(drip) as images:
        resolver = ImageResolver({"slake": f"{images.url}/{{path}}"})
        began = time.monotonic()
        with pytest.raises(ImageFetchError, match=r"record 'slake/7'.*deadline of 1.5 s.*MEDHEVAL_IMAGE_DEADLINE"):
            resolver.load_record_images({"id": "slake/7", "source": "slake", "images": ["xmlab1/source.jpg"]})
        assert time.monotonic() - began < 8  # 1.5 s, not the 20 s the drip would take


def _dripping(close: bool) -> Callable:
    """A reply that announces 100000 bytes and sends one every 0.25 s (25 s in all), optionally with
    ``Connection: close``."""
    def drip(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Content-Length", "100000")
        if close:
            handler.send_header("Connection", "close")
        handler.end_headers()
        for _ in range(100):
            handler.wfile.write(b"x")
            handler.wfile.flush()
            time.sleep(0.25)
    return drip


@pytest.mark.parametrize("protocol, close", [("HTTP/1.0", False), ("HTTP/1.1", True), ("HTTP/1.1", False)],
                         ids=["http-1.0", "connection-close", "keep-alive"])
def test_the_deadline_fires_whether_or_not_the_server_keeps_the_connection(protocol, close):
    """http.client hands a closing connection's socket to the response (``connection.sock`` becomes None): the
    watchdog must still reach it."""
    from medheval.net import transport

    with Server(_dripping(close), protocol) as server:
        session = transport.session_for(server.url, credentialed=False)
        began = time.monotonic()
        with pytest.raises(transport.DeadlineExceeded, match="deadline=1.5s"):
            transport.request(session, "GET", f"{server.url}/x.png", timeout=30, deadline=1.5, max_bytes=10**7)
        assert time.monotonic() - began < 10  # about 1.5 s, never the 25 s of the drip nor the 30 s read timeout


@pytest.mark.parametrize("protocol, close", [("HTTP/1.0", False), ("HTTP/1.1", True), ("HTTP/1.1", False)],
                         ids=["http-1.0", "connection-close", "keep-alive"])
def test_a_prompt_reply_is_read_whole_whether_or_not_the_connection_is_kept(protocol, close):
    from medheval.net import transport

    headers = {"Connection": "close"} if close else {}
    with Server(lambda handler: _send(handler, 200, PNG, headers), protocol) as server:
        session = transport.session_for(server.url, credentialed=False)
        for _ in range(2):  # the second request reuses the kept connection, or opens a new one
            reply = transport.request(session, "GET", f"{server.url}/x.png", timeout=5, deadline=5, max_bytes=10**6)
            assert (reply.status_code, reply.content) == (200, PNG)


def test_the_deadline_is_checked_between_chunks_of_a_body_that_keeps_flowing(monkeypatch):
    """A body arriving faster than any read timeout but past the deadline is refused between chunks, even if
    the watchdog's shutdown never lands (here: switched off)."""
    from medheval.net import transport

    chunk = b"\0" * 65536

    def steady(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Content-Length", str(len(chunk) * 100))
        handler.end_headers()
        for _ in range(100):  # 64 KiB every 0.1 s: 10 s in all
            handler.wfile.write(chunk)
            handler.wfile.flush()
            time.sleep(0.1)

    monkeypatch.setattr(transport._Slot, "expire", lambda self: None)
    with Server(steady) as server:
        session = transport.session_for(server.url, credentialed=False)
        began = time.monotonic()
        with pytest.raises(transport.DeadlineExceeded):
            transport.request(session, "GET", f"{server.url}/x.png", timeout=30, deadline=1, max_bytes=10**8)
        assert time.monotonic() - began < 6


def test_an_endless_image_body_hits_the_size_cap_with_bounded_memory(monkeypatch):
    chunk = b"\x89PNG" + b"\0" * (64 * 1024 - 4)

    def endless(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for _ in range(2048):  # 128 MiB, then stop (so that code without a cap returns and fails the asserts)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        handler.wfile.write(b"0\r\n\r\n")

    monkeypatch.setenv(MAX_MB_ENV, "2")
    with Server(endless) as images:
        resolver = ImageResolver({"slake": f"{images.url}/{{path}}"})
        tracemalloc.start()
        try:
            with pytest.raises(ImageFetchError, match=r"record 'slake/9'.*larger than the cap of 2097152 bytes"):
                resolver.load_record_images({"id": "slake/9", "source": "slake", "images": ["xmlab1/source.jpg"]})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 * 2**20


def test_the_image_limits_are_documented_and_checked(monkeypatch):
    from medheval.data import images

    assert images.DEFAULT_DEADLINE <= 60 and images.DEFAULT_MAX_BYTES == 64 * 2**20
    source = URLTemplateSource("http://127.0.0.1:1/{path}")
    assert (source.deadline, source.max_bytes) == (60.0, 64 * 2**20)
    monkeypatch.setenv(DEADLINE_ENV, "nan")
    with pytest.raises(ValueError, match="MEDHEVAL_IMAGE_DEADLINE"):
        URLTemplateSource("http://127.0.0.1:1/{path}")


def test_a_pinned_annotation_download_follows_the_same_policy(tmp_path, monkeypatch):
    """The other outbound request a run makes: a pinned upstream file is never taken from another origin."""
    import hashlib

    from medheval.data.fetch import AnnotationUnavailable, PinnedFile, fetch

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "MEDHEVAL_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    with Server(lambda handler: _send(handler, 200, b"[]")) as foreign, \
            Server(lambda handler: _send(handler, 302, headers={"Location": f"{foreign.url}/data.json"})) as upstream:
        pin = PinnedFile("sub/data.json", f"{upstream.url}/data.json", hashlib.sha256(b"[]").hexdigest())
        with pytest.raises(AnnotationUnavailable, match="another host"):
            fetch(pin, cache_dir=tmp_path)
    assert foreign.hits == [] and not any(p.is_file() for p in tmp_path.rglob("*"))

"""Every outbound HTTP request (model and judge calls, image downloads), on terms a hostile or broken server
cannot stretch. One policy:

- **Proxies.** A proxy from the environment (``HTTP(S)_PROXY``/``ALL_PROXY``) is never used for a local
  endpoint (:func:`medheval.net.hosts.is_local_host`), nor for a request that carries credentialed data or
  credentials (image downloads with PhysioNet credentials or of MIMIC records, an endpoint allowed to receive
  credentialed records) unless the user opts in by naming the destination host: ``proxy_for=("physionet.org",)``,
  ``medheval run --proxy-for HOST`` or ``MEDHEVAL_PROXY_FOR=host1,host2`` (:func:`session_for`); each a host,
  ``host:port`` or URL, matched exactly (:meth:`medheval.net.named.UserNamedHosts.covers`).
- **No redirect leaves the endpoint's origin.** A 3xx to another scheme, host or port is refused
  (:class:`RedirectRefused`, naming both hosts): following it would re-send the request (the question, the
  record's images, key headers, basic-auth credentials) to a host nobody configured, or fetch an image nobody
  chose. A same-origin redirect of a GET/HEAD is followed; of a POST, only a 307/308 (method and body kept),
  since a 301/302/303 would turn it into a GET without its body. At most :data:`MAX_REDIRECTS`.
- **A total deadline per request.** ``timeout`` bounds each socket read, so a server sending one byte a
  second never trips it. ``deadline`` bounds the whole exchange, connect, headers and body, redirects
  included: a watchdog shuts down every socket the request used when it passes, also one that http.client
  moved to the response (HTTP/1.0, ``Connection: close``), and the clock is checked between body chunks
  (:class:`DeadlineExceeded`).
- **A capped body.** At most ``max_bytes`` are read (:class:`ReplyTooLarge`), in 64 KiB chunks, so an
  endless body is refused before it fills memory.
- **No credentials from** ``~/.netrc`` **by requests itself.** A session that uses the environment would have
  requests add the netrc's entry for the host, or its ``default`` entry for any host, over a judge's own key;
  :func:`request` stops that (the session's own auth, or none). :mod:`medheval.data.images` reads an image
  host's own ``machine`` entry.

:func:`request` works through a :class:`requests.Session` made by :func:`session_for` (or any session on which
:func:`mount` installed :class:`DeadlineAdapter`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any, Mapping
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
import requests.auth
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict

from medheval.net.hosts import check_host_entry, is_local_host, parse_address
from medheval.net.named import UserNamedHosts

REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
KEEPS_METHOD_AND_BODY = frozenset({307, 308})
MAX_REDIRECTS = 5
PROXY_OPT_IN_ENV = "MEDHEVAL_PROXY_FOR"  # comma-separated hosts whose credentialed traffic may use an env proxy
_proxy_for = UserNamedHosts(PROXY_OPT_IN_ENV)  # hosts named by --proxy-for, from Python, or in the variable


class TransportError(Exception):
    """The exchange with the endpoint broke one of this module's rules; the message says which."""


class RedirectRefused(TransportError):
    """A redirect that is not followed: to another origin, or one that would drop the request body."""


class DeadlineExceeded(TransportError):
    """No complete reply within the request's deadline."""


class ReplyTooLarge(TransportError):
    """The reply body is larger than the request allows."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """A complete HTTP reply (status, headers, body) from the URL that answered."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _NoAuth(requests.auth.AuthBase):
    """A request's auth that adds nothing: given one, requests never reads ``~/.netrc`` itself (whose ``default``
    entry would go to any host, over a judge's own key)."""

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        return request


NO_AUTH = _NoAuth()  # what a request made outside :func:`request` passes too (publish.hub_access)


class _Slot:
    """The sockets one request has used, so that the watchdog can shut them down.

    The socket objects themselves are kept, not just the connection: when a reply says ``Connection: close``
    (or comes over HTTP/1.0), http.client hands the socket to the response and sets ``connection.sock`` to
    None, and a shutdown through the connection would reach nothing while the body drips on.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.expired = False

    def track(self, connection: Any) -> None:
        """Remember ``connection``'s current socket; shut it down at once if the deadline already passed."""
        sock = getattr(connection, "sock", None)
        if sock is None:
            return
        with self.lock:
            if not any(known is sock for known in self.sockets):
                self.sockets.append(sock)
            expired = self.expired
        if expired:
            _shutdown(sock)

    def expire(self) -> None:
        """The deadline passed: shut down every socket the request used."""
        with self.lock:
            self.expired = True
            sockets = list(self.sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    """Shut ``sock`` down both ways, so that a read blocked on it returns; an already closed one is left be."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_active = threading.local()  # .slot: the _Slot of the request this thread is making


class _Tracked:
    """Connection mixin: register with the calling thread's slot when connecting and before each request."""

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        slot = getattr(_active, "slot", None)
        if slot is not None:
            slot.track(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        slot = getattr(_active, "slot", None)
        if slot is not None:
            slot.track(self)
        super().request(*args, **kwargs)  # type: ignore[misc]


class _HTTPConnection(_Tracked, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_Tracked, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections the deadline watchdog of :func:`post` can shut down."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def _no_redirect_target(response: requests.Response) -> None:
    """What :func:`mount` makes a session's ``get_redirect_target``: none, whatever the reply (see there)."""
    return None


def mount(session: requests.Session) -> requests.Session:
    """Install :class:`DeadlineAdapter` for http and https on ``session``; returns it.

    The session is also told that no reply redirects (``get_redirect_target``): :func:`request` follows a redirect
    itself, and with ``allow_redirects=False`` requests would still prepare the next request, reading the whole
    3xx body without the ``max_bytes`` cap and asking ``~/.netrc`` for the target's credentials."""
    adapter = DeadlineAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.get_redirect_target = _no_redirect_target  # type: ignore[method-assign]
    return session


def set_proxy_for(hosts: tuple[str, ...]) -> tuple[str, ...]:
    """Opt in, by name, to an environment proxy for credentialed traffic to ``hosts`` (``--proxy-for``: a host,
    ``host:port`` or URL each), in place of any earlier opt-in of this process; returns the earlier one (to
    restore it)."""
    return _proxy_for.set(hosts)


def proxy_allowed(url: str, *, credentialed: bool, proxy_for: tuple[str, ...] = ()) -> bool:
    """Whether a request to ``url`` may go through a proxy from the environment (the module's proxy rule; the
    hosts named are matched by :meth:`~medheval.net.named.UserNamedHosts.covers`). ``ValueError`` for an entry of
    ``proxy_for`` that :func:`~medheval.net.hosts.check_host_entry` refuses (``example.org/v1``), used or not."""
    proxy_for = tuple(check_host_entry(entry, "proxy_for") for entry in proxy_for)
    try:
        host = parse_address(url).host
    except ValueError:  # requests refuses such a URL anyway
        return False
    if is_local_host(host):
        return False
    return not credentialed or _proxy_for.covers(url, *proxy_for)


def session_for(url: str, *, credentialed: bool, proxy_for: tuple[str, ...] = ()) -> requests.Session:
    """A session for requests to ``url``'s origin, with :class:`DeadlineAdapter` mounted and environment proxies
    used only where :func:`proxy_allowed` says so (a CA bundle the environment names is kept either way)."""
    session = mount(requests.Session())
    if not proxy_allowed(url, credentialed=credentialed, proxy_for=proxy_for):
        session.trust_env = False
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            session.verify = bundle
    return session


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` with the scheme's default port filled in (a trailing dot kept: ``example.org.``
    is another origin); ``ValueError`` for a URL that cannot be parsed."""
    address = parse_address(url)
    return address.scheme, address.host, address.default_port


def _authority(url: str) -> str:
    """``url``'s ``scheme://authority`` alone: the origin of a server's ``Location``, in whose path or query an
    ``@`` names no other host (``/files/me@example.org/a.jpg``, ``?next=``); :func:`origin` refuses a text with one
    there, as in what a user writes it may end a password holding ``/``. ``url`` itself when it cannot be split."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "http://[": origin() refuses it
        return url
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _requests_origin(url: str) -> tuple[str, str, int | None]:
    """:func:`origin` of the host and port requests itself connects to for ``url``: urllib3 ends the authority at
    a backslash as well as at ``/?#``, Python's ``urlsplit`` only at ``/?#``, so
    ``https://evil.example\\@good.example/`` is ``good.example`` to :func:`origin` and ``evil.example`` to
    requests. ``ValueError`` when requests cannot read it."""
    prepared = requests.PreparedRequest()
    try:
        prepared.prepare_url(url, None)
        parsed = urllib3.util.parse_url(prepared.url or "")
    except (requests.RequestException, urllib3.exceptions.HTTPError) as error:
        raise ValueError(str(error)) from None
    if not parsed.scheme or not parsed.host:
        raise ValueError("names no host")
    return origin(f"{parsed.scheme}://{parsed.host}" + (f":{parsed.port}" if parsed.port is not None else ""))


def _host(url: str) -> str:
    """``host:port`` of ``url``, for messages."""
    try:
        _, host, port = origin(url)
    except ValueError:
        return "<unparseable URL>"
    return f"{host}:{port}" if port is not None else host


def _read(response: requests.Response, max_bytes: int, stop_at: float = float("inf"),
          deadline: float = 0.0) -> bytes:
    """The whole body of ``response``, in 64 KiB chunks: at most ``max_bytes`` (:class:`ReplyTooLarge`), and
    :class:`DeadlineExceeded` once the clock passes ``stop_at`` between chunks."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=65536):
        if time.monotonic() > stop_at:
            raise DeadlineExceeded(f"no complete reply within deadline={deadline:g}s")
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(f"the reply body exceeds {max_bytes} bytes (status {response.status_code})")
        chunks.append(chunk)
    return b"".join(chunks)


def post(session: requests.Session, url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
         deadline: float, max_bytes: int) -> Reply:
    """POST ``body`` to ``url`` and read the whole reply (:func:`request`)."""
    return request(session, "POST", url, headers, body=body, timeout=timeout, deadline=deadline,
                   max_bytes=max_bytes)


def request(session: requests.Session, method: str, url: str, headers: Mapping[str, str] | None = None, *,
            body: bytes | None = None, timeout: float, deadline: float, max_bytes: int) -> Reply:
    """Send one request and read the whole reply (none for HEAD), within ``deadline`` seconds in all.

    Raises:
        RedirectRefused: a redirect to another origin, a 301/302/303 of a POST, or more than
            :data:`MAX_REDIRECTS`.
        DeadlineExceeded: the exchange did not finish within ``deadline``.
        ReplyTooLarge: the body exceeds ``max_bytes``.
        requests.RequestException: the connection failed, or a read waited longer than ``timeout``.
    """
    method = method.upper()
    stop_at = time.monotonic() + deadline
    slot = _Slot()
    watchdog = threading.Timer(deadline, slot.expire)
    watchdog.daemon = True
    previous = getattr(_active, "slot", None)
    _active.slot = slot
    watchdog.start()
    endpoint = url  # what the messages name: every redirect followed stays on its origin
    try:
        for _ in range(MAX_REDIRECTS + 1):
            remaining = stop_at - time.monotonic()
            if remaining <= 0 or slot.expired:
                raise DeadlineExceeded(f"no complete reply within deadline={deadline:g}s")
            try:
                response = session.request(method, url, data=body, headers=dict(headers or {}),
                                           auth=session.auth or NO_AUTH, allow_redirects=False, stream=True,
                                           timeout=(min(timeout, remaining), timeout))
                try:
                    if response.status_code in REDIRECT_STATUS:
                        url = _redirect_target(url, response, method, endpoint)
                        continue
                    content = b"" if method == "HEAD" else _read(response, max_bytes, stop_at, deadline)
                finally:
                    response.close()
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
                if slot.expired:
                    raise DeadlineExceeded(f"no complete reply within deadline={deadline:g}s") from None
                raise
            if slot.expired:
                raise DeadlineExceeded(f"no complete reply within deadline={deadline:g}s")
            return Reply(response.status_code, CaseInsensitiveDict(response.headers), content, url)
        raise RedirectRefused(f"more than {MAX_REDIRECTS} redirects from {_host(endpoint)!r}")
    finally:
        watchdog.cancel()
        _active.slot = previous


def _redirect_target(url: str, response: requests.Response, method: str = "POST", endpoint: str | None = None) -> str:
    """The URL a same-origin redirect points at (of a POST: a 307/308 only); :class:`RedirectRefused` for every
    other redirect, naming ``endpoint`` (default ``url``): the URL first requested, as a URL a server redirected to
    may hold an ``@`` in its path after a ``host:port``, which :func:`origin` refuses in a whole URL."""
    status = response.status_code
    named = _host(endpoint if endpoint is not None else url)
    location = response.headers.get("Location")
    if not location:
        raise RedirectRefused(f"{named!r} answered {status} without a Location")
    try:
        target = urljoin(url, location)
    except ValueError:  # "http://[": no host can be read, so not the endpoint's
        target = location
    try:  # the origin as medheval reads it, and the one requests would connect to: both the endpoint's
        same_origin = (origin(_authority(target)) == origin(_authority(url))
                       and _requests_origin(target) == _requests_origin(url))
    except ValueError:  # a Location that names no host and port (or two): another origin, whatever it means
        same_origin = False
    if not same_origin:
        try:  # the host requests would have reached (for http://other\@endpoint/: other)
            _, host, port = _requests_origin(target)
            shown = f"{host}:{port}" if port is not None else host
        except ValueError:
            shown = _host(_authority(target))
        raise RedirectRefused(
            f"{named!r} answered {status} redirecting to another host, {shown!r}: refused, "
            f"so the request (its text, images, key headers and credentials) is not sent there; if you trust that "
            f"host, point the base URL or image root at it")
    if method not in ("GET", "HEAD") and status not in KEEPS_METHOD_AND_BODY:
        raise RedirectRefused(
            f"{named!r} answered {status} (to {urlsplit(target).path!r}), a redirect that turns the POST into "
            f"a GET without its body: set the base URL to the final endpoint")
    return target


__all__ = [
    "DeadlineAdapter",
    "DeadlineExceeded",
    "MAX_REDIRECTS",
    "NO_AUTH",
    "RedirectRefused",
    "Reply",
    "ReplyTooLarge",
    "TransportError",
    "mount",
    "origin",
    "post",
    "proxy_allowed",
    "request",
    "session_for",
    "set_proxy_for",
]

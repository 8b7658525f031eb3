"""Is a host local? Local means the data stays on the user's machine or network.

The host part of a URL is local when it is a loopback address (127.0.0.0/8, ::1), a private-range IP literal
(10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, IPv6 unique-local fc00::/7), or ``localhost`` / ``*.localhost``
**when that name resolves** (system resolver, ``/etc/hosts`` included) **to loopback addresses only**. Other
host *names* are never resolved (DNS can point anywhere), so they count as remote. Link-local (169.254/16,
cloud metadata) and carrier-grade NAT (100.64/10) ranges are not local.

:func:`parse_address` is the one parser of what names a host: a host name, ``host:port``, an IPv6 literal
(``::1``, ``[::1]:8080``) or a URL, into an :class:`Address`. It spells an IP literal one way, so every rule
compares like with like: IPv6 compressed in lower case (``[2001:0DB8::1]`` is ``[2001:db8::1]``), an
IPv4-mapped IPv6 address as the IPv4 address it reaches (``[::ffff:7f00:1]`` is ``127.0.0.1``), an IPvFuture
literal kept in its brackets (``[v1.abc]`` is never the name ``v1.abc``). A zone id (``fe80::1%eth0``, the part
of an IP literal from ``%``) is refused: it names an interface of this machine, and ``%`` / ``%25`` would spell one
host two ways. Legacy IPv4 spellings (``127.1``, ``0x7f.0.0.1``, ``2130706433``) are not IP literals to :mod:`ipaddress`:
they count as host names, so never as local, and match only the same spelling.

:func:`is_local_host` / :func:`is_loopback_host` judge a bare host (a name or an IP literal, an IPv6 one with or
without brackets; anything else is False); :func:`is_local_url` reads a URL's host first.

:func:`mask_userinfo` is how a message shows such a text: nothing of a user-info (``user:password@``), whatever
it holds; :func:`parse_address` refuses a text with an ``@`` after a ``host:port``, where a password holding ``/``
would be read as the port (and the user name as the host).

:func:`check_host_entry` is the rule for an entry of a list of hosts the user names (``--api-key-host``,
``--proxy-for``, ``--allow-remote-credentialed``, ``MEDHEVAL_IMAGE_HOST`` …): a host, ``host:port`` or URL.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Collection
from typing import Callable
from urllib.parse import SplitResult, urlsplit

_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7")
)


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``host`` spells (IPv4-mapped IPv6 as IPv4, zone id dropped), or None for a name."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


_SCHEME = re.compile(r"https?://", re.IGNORECASE)  # the schemes an error message shows


def mask_userinfo(text: str) -> str:
    """``text`` with everything from after its ``http(s)://`` (from its start without one) to its last ``@`` as
    ``***``: a user-info never reaches a message, whatever it holds (``://``, ``@``, ``%40``, ``/``, ``:``). An
    ``@`` in a path masks the host as well: less is shown, never a password."""
    scheme = _SCHEME.match(text)
    start = scheme.end() if scheme else 0
    at = text.rfind("@")
    return text if at < start else f"{text[:start]}***{text[at:]}"


def _parse_error(text: str, error: ValueError) -> str:
    """The URL parser's reason for refusing ``text``; not quoted when ``text`` has an ``@``, as the parser may
    quote a piece of a user-info (a password holding ``/`` ends the host early: ``'pa:'`` is not a port)."""
    return "its host or port cannot be read" if "@" in text else str(error)


_QUERY_VALUE = re.compile(r"([?&;#][^=&;#?]*=)[^&#]*")  # a value runs to the next "&" or "#" (a ";" inside too)


def _masked(text: str) -> str:
    """``text`` with its user-info masked (:func:`mask_userinfo`), then every query or fragment value
    (``?name=value``, ``&name=value``, ``#access_token=value``: a key or signature there is no part of a host) as
    ``***``."""
    return _QUERY_VALUE.sub(r"\1***", mask_userinfo(text))


def _shown(text: str) -> str:
    """``text`` as an error message quotes it: :func:`_masked`, cut to 80 characters."""
    return repr(_masked(text)[:80])


def _canonical_host(host: str, text: str, bracketed: bool = False) -> str:
    """``host`` (lower case, without brackets) as :class:`Address` spells it: an IP literal canonical (IPv6
    compressed in brackets, IPv4-mapped IPv6 as IPv4), a name as it is (an IPvFuture literal, ``bracketed``, in its
    brackets). ``ValueError`` naming ``text`` for an IP literal with a zone id."""
    address = _ip_literal(host)
    if address is None:
        return f"[{host}]" if bracketed else host
    if "%" in host:
        raise ValueError(
            f"{_shown(text)} names an IP address with a zone id (the part from '%'), which names an interface of "
            "this machine and is not accepted: give a global or unique-local address, an IPv4 address or a host "
            "name")
    return f"[{address}]" if address.version == 6 else str(address)


def resolves_to_loopback(name: str) -> bool:
    """True when the system resolver maps ``name`` to at least one address and every one is loopback."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = [_ip_literal(str(info[4][0])) for info in infos]
    return bool(addresses) and all(a is not None and a.is_loopback for a in addresses)


_NAME = re.compile(r"^[a-z0-9_-]+(?:\.[a-z0-9_-]+)*$")  # a DNS name's letters (the trailing dot stripped)


def _classify(host: str | None, accept: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool]) -> bool:
    """For a bare host only (a name or an IP literal, an IPv6 one with or without brackets; not ``host:port``, a
    URL or anything else, which are False): ``localhost`` / ``*.localhost``: whether it resolves to loopback only;
    an IP literal without a zone id: ``accept(address)``; any other name: False."""
    text = (host or "").strip().lower()
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    address = _ip_literal(inner) if "%" not in inner else None
    if address is not None:
        return (inner == text or ":" in inner) and accept(address)  # brackets only around an IPv6 literal
    name = text.rstrip(".")
    if inner != text or not _NAME.match(name):
        return False
    return (name == "localhost" or name.endswith(".localhost")) and resolves_to_loopback(name)


def is_local_host(host: str | None) -> bool:
    """True for a bare host (a name, or an IP literal: an IPv6 one with or without brackets) that is localhost,
    loopback or a private-range IP literal (see the module docstring); False for anything else, ``host:port`` and
    URLs included (:func:`is_local_url` reads a URL)."""
    return _classify(host, lambda address: any(address in net for net in _PRIVATE_NETWORKS))


def is_local_url(url: str | None) -> bool:
    """True for a URL (text with ``://``) whose host is local (:func:`is_local_host`); False for other text and a
    URL :func:`parse_address` refuses."""
    if not url or "://" not in url:
        return False
    try:
        return is_local_host(parse_address(url).host)
    except ValueError:
        return False


def is_loopback_host(host: str | None) -> bool:
    """True for a bare host that is a loopback IP literal (127.0.0.0/8, ::1) or ``localhost`` / ``*.localhost``
    resolving to loopback only: traffic that never leaves the machine (unlike :func:`is_local_host`, which admits private ranges)."""
    return _classify(host, lambda address: address.is_loopback)


DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclasses.dataclass(frozen=True)
class Address:
    """Where a host, ``host:port`` or URL points.

    ``scheme``: lower case, ``''`` for a bare host; ``host``: lower case, an IP literal canonical (IPv6 compressed
    in brackets, IPv4-mapped IPv6 as IPv4), a trailing dot kept, ``''`` when the text names none; ``port``: as
    written, None when not."""

    scheme: str
    host: str
    port: int | None

    @property
    def name(self) -> str:
        """The host without its trailing dot (``example.org.`` and ``example.org`` are one host)."""
        return self.host.rstrip(".")

    @property
    def default_port(self) -> int | None:
        """The port, or the scheme's default (80, 443) when none is written."""
        return self.port if self.port is not None else DEFAULT_PORTS.get(self.scheme)

    @property
    def netloc(self) -> str:
        """``host[:port]`` (the host as :attr:`host` spells it, no user-info)."""
        return f"{self.host}:{self.port}" if self.port is not None else self.host

    @property
    def entry(self) -> str:
        """``name[:port]``: the form a host list compares (:func:`host_entry`)."""
        return f"{self.name}:{self.port}" if self.name and self.port is not None else self.name


#: Why a text with an ``@`` after a ``host:port`` is refused, and how to write it (after the text an error shows).
AT_AFTER_PORT = (
    "holds an '@' after its host and port, so it reads two ways: as a path or query holding an '@' (the host "
    "before the ':'), or as a user name and password holding a '/', '?' or '#' (the host after the '@'; every "
    "URL parser takes the first reading, sending such a password in the path to the user name as a host). "
    "Write the one meant: an '@' in the path or query as %40 (https://host:8443/repo%40main/...), or a '/', "
    "'?' or '#' in a user name or password as %2F, %3F, %23 (https://user:pa%2Fss@host:8443/...)")


class AtAfterPort(ValueError):
    """:func:`parse_address`'s refusal of a text with an ``@`` after a ``host:port`` (:data:`AT_AFTER_PORT`)."""


def _cut_userinfo(parts: SplitResult) -> bool:
    """Whether ``parts`` may be a ``user:password@host`` cut short by a ``/``, ``?`` or ``#`` in the password: an
    ``@`` after an authority that holds a ``:`` outside an IPv6 literal's brackets (``http://alice:80/pw@10.0.0.1``:
    read as host ``alice``, port 80; ``http://u:p@h://x@10.0.0.1``: host ``h``). Without a ``:`` there
    (``https://cdn.jsdelivr.net/gh/org/repo@main/``, ``https://example.org/@scope/x``, ``?mail=a@b.org``) no
    password was cut short, and the ``@`` is the path's or query's."""
    authority = re.sub(r"\[[^\]]*\]", "", parts.netloc)
    return ":" in authority and "@" in parts.path + parts.query + parts.fragment


def parse_address(value: str) -> Address:
    """The :class:`Address` of a host name, ``host:port``, IPv6 literal or URL (text with ``://``); user-info,
    path and query are dropped; an IP literal is spelled canonically (:class:`Address`). ``ValueError`` naming the
    text (its user-info masked) when it cannot be parsed (a port that is not a number from 0 to 65535, an unclosed
    ``[``), names an IPv6 zone id, holds an ``@`` after a ``host:port`` (:class:`AtAfterPort`, :func:`_cut_userinfo`:
    a password with an unencoded ``/`` would otherwise be read as the port) or a backslash before its path (``https://evil.example\\.physionet.org/``:
    ``evil.example\\.physionet.org`` here, ``evil.example`` to requests, which ends the host at a backslash)."""
    text = value.strip()
    if ":" in text and "://" not in text and "[" not in text and _ip_literal(text) is not None:
        return Address("", _canonical_host(text.lower(), text), None)  # a bare IPv6 literal ("::1"), not host:port
    try:
        parts = urlsplit(text if "://" in text else "//" + text)
        host, port = parts.hostname or "", parts.port
    except ValueError as error:
        raise ValueError(f"{_shown(text)} is not a host name, host:port or URL ({_parse_error(text, error)})") from None
    if "\\" in parts.netloc:  # urllib3 (requests) ends the authority there, urlsplit does not: two hosts
        raise ValueError(
            f"{_shown(text)} holds a backslash before its path, where the HTTP library reads the host as ending "
            "while this reading goes on: percent-encode one in a user name or password (%5C)")
    if _cut_userinfo(parts):  # which "@" ends a user-info? the parsers agree, the writer may not have meant it
        raise AtAfterPort(f"{_shown(text)} {AT_AFTER_PORT}")
    bracketed = parts.netloc.rpartition("@")[2].startswith("[")
    return Address(parts.scheme.lower(), _canonical_host(host, text, bracketed), port)


def host_and_port(value: str) -> tuple[str, int | None]:
    """(host without its trailing dot, port or the scheme's default) of a host name, ``host:port`` or URL;
    ``("", None)`` when it names none or cannot be parsed."""
    try:
        address = parse_address(value)
    except ValueError:
        return "", None
    return address.name, address.default_port


def host_named(value: str, named: Collection[str]) -> bool:
    """Whether ``named`` (entries as :func:`host_entry` writes them) names ``value``'s host on any port (``host``)
    or on its port (``host:port``; a URL's port defaulting to its scheme's, a bare host having none)."""
    host, port = host_and_port(value)
    return bool(host) and (host in named or (port is not None and f"{host}:{port}" in named))


def host_entry(value: str) -> str:
    """``host`` or ``host:port`` (lower case, no trailing dot) from a host name, ``host:port`` or URL; ``''`` when
    it names none or cannot be parsed. A URL without a port names its host on any port."""
    try:
        return parse_address(value).entry
    except ValueError:
        return ""


def is_host_form(text: str) -> bool:
    """Whether ``text`` is written as a host or ``host:port`` (a trailing ``/`` allowed): no ``://``, path, query,
    fragment or user-info."""
    return not any(mark in text.strip().rstrip("/") for mark in ("://", "/", "?", "#", "@"))


def check_host_entry(text: str, where: str = "") -> str:
    """``text`` stripped, when it may stand in a list of hosts the user names: a host, ``host:port`` or IPv6 literal
    (:func:`is_host_form`), or a URL with its ``scheme://``. ``ValueError`` beginning with ``where`` otherwise: a
    scheme-less entry with a path, query, fragment or user-info (``example.org/v1`` would name the whole host in
    one list and nothing in another: give ``example.org`` or ``https://example.org/v1``), text
    :func:`parse_address` refuses, or one that names no host."""
    entry = text.strip()
    prefix = f"{where}: " if where else ""
    try:
        address = parse_address(entry)
    except ValueError as error:
        raise ValueError(f"{prefix}{error}") from None
    if not address.name:
        raise ValueError(f"{prefix}{_shown(entry)} names no host: give a host (example.org), host:port or a URL")
    if "://" not in entry and not is_host_form(entry):
        raise ValueError(
            f"{prefix}{_shown(entry)} is neither a host nor a URL: give either the host ({address.netloc}), which "
            f"names every path on it, or a base URL with its scheme (https://{_masked(entry)[:80]})")
    return entry


__all__ = ["AT_AFTER_PORT", "Address", "AtAfterPort", "DEFAULT_PORTS", "check_host_entry", "host_and_port",
           "host_entry", "host_named", "is_host_form", "is_local_host", "is_local_url", "is_loopback_host",
           "mask_userinfo", "parse_address", "resolves_to_loopback"]

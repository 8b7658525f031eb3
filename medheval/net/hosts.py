"""Is a host local? Local means the data stays on the user's machine or network.

The host part of a URL is local when it is a loopback address (127.0.0.0/8, ::1), a private-range IP literal
(10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, IPv6 unique-local fc00::/7), or ``localhost`` / ``*.localhost``
**when that name resolves** (system resolver, ``/etc/hosts`` included) **to loopback addresses only**. Other
host *names* are never resolved (DNS can point anywhere), so they count as remote. Link-local (169.254/16,
cloud metadata) and carrier-grade NAT (100.64/10) ranges are not local.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit
from typing import Callable

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
    if getattr(address, "ipv4_mapped", None) is not None:
        address = address.ipv4_mapped
    return address


def resolves_to_loopback(name: str) -> bool:
    """True when the system resolver maps ``name`` to at least one address and every one is loopback."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = [_ip_literal(str(info[4][0])) for info in infos]
    return bool(addresses) and all(a is not None and a.is_loopback for a in addresses)


def _classify(host: str | None, accept: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool]) -> bool:
    """``localhost`` / ``*.localhost``: whether it resolves to loopback only; an IP literal: ``accept(address)``;
    any other name (or none): False."""
    if not host:
        return False
    host = host.strip().lower().strip("[]").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return resolves_to_loopback(host)
    address = _ip_literal(host)
    return address is not None and accept(address)


def is_local_host(host: str | None) -> bool:
    """True for localhost, loopback and private-range IP literals (see the module docstring)."""
    return _classify(host, lambda address: any(address in net for net in _PRIVATE_NETWORKS))


def is_local_url(url: str | None) -> bool:
    return bool(url) and is_local_host(urlsplit(url).hostname)


def is_loopback_host(host: str | None) -> bool:
    """True for loopback IP literals (127.0.0.0/8, ::1) and ``localhost`` / ``*.localhost`` resolving to loopback
    only: traffic that never leaves the machine (unlike :func:`is_local_host`, which admits private ranges)."""
    return _classify(host, lambda address: address.is_loopback)


__all__ = ["is_local_host", "is_local_url", "is_loopback_host", "resolves_to_loopback"]

"""Endpoints: safe descriptions (no credentials), "is it local?", and the credentialed-data guard.

Local means the data stays on the user's machine or network: the host part of the base URL
is a loopback address (127.0.0.0/8, ::1), a private-range IP literal (10.0.0.0/8, 172.16.0.0/12,
192.168.0.0/16, IPv6 unique-local fc00::/7), or ``localhost`` / ``*.localhost`` **when that name
resolves** (system resolver, ``/etc/hosts`` included) **to loopback addresses only**: a hosts file
or resolver can map ``judge.localhost`` anywhere, and then it is remote. Other host *names* are
never resolved (DNS can point anywhere and needs the network), so ``vllm.internal.example.org``
counts as remote until it is approved. Link-local (169.254/16, cloud metadata) and carrier-grade NAT
(100.64/10) ranges are not local.

Approval of a non-local endpoint for credentialed records comes from the user only: ``--allow-remote-credentialed
HOST`` on the command line (:func:`set_approved_endpoints`, from ``main()`` before any config is read),
``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED=host1,host2``, :func:`approve_endpoints` or ``make_judge(...,
allow_remote_credentialed=...)`` from Python. An ``allow_remote_credentialed`` in a grid YAML (top level, a
``metric_options`` entry or a judge dict in one) is refused unless the user approved everything it
approves (:func:`check_config_approval`, :func:`entry_approved`): a downloaded config cannot approve its own host.

An approval entry is a ``host`` (that host on any port), a ``host:port`` (that port only; a URL's port defaulting
to its scheme's 443/80) or a base URL (only that scheme, host, port and path): hosts are matched as every list of
hosts the user names is (:mod:`medheval.net.named`: exactly, letter case and a trailing dot ignored, IPv6 with or
without brackets, an IP however it is spelled); :func:`endpoint_allowed`. A path without a scheme
(``example.org/v1``) is refused where it is given, as in every such list
(:func:`~medheval.net.hosts.check_host_entry`).

Traffic to an endpoint judged local never goes through a proxy from the environment
(``HTTP(S)_PROXY``/``ALL_PROXY``): :mod:`medheval.judges.http` ignores them for local endpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

from medheval.net.hosts import (check_host_entry, host_entry, host_named, is_host_form, is_local_host, is_local_url,
                                 parse_address, resolves_to_loopback)
from medheval.net.named import UserNamedHosts

APPROVED_ENV = "MEDHEVAL_ALLOW_REMOTE_CREDENTIALED"
APPROVE_FLAG = "--allow-remote-credentialed"
_approved = UserNamedHosts(APPROVED_ENV)  # endpoints the user approved: command line, Python, the variable

class CredentialedDataError(PermissionError):
    """Credentialed (PhysioNet) records were about to be sent to a non-local endpoint without opt-in."""


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user:password@, user, password)``, user and password percent-decoded (``p%40ss`` is ``p@ss``:
    a ``/``, ``?``, ``#`` or ``@`` in them must be encoded), as requests and the image roots read a user-info."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    netloc = parse_address(url).netloc
    user, password = (unquote(value) if value is not None else None for value in (parts.username, parts.password))
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), user, password


def safe_base_url(url: str | None) -> str | None:
    """``scheme://host[:port]/path``: no user/password, no query string or fragment."""
    if not url:
        return url
    bare, _, _ = split_userinfo(url)
    parts = urlsplit(bare)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def endpoint_host(url: str | None) -> str | None:
    """``host[:port]`` of a URL or host entry (what ``describe()`` shows as ``endpoint``)."""
    return parse_address(url).netloc if url else None


def normalise_allow_list(allow: str | Iterable[str] | None) -> tuple[str, ...]:
    """``allow_remote_credentialed`` as a tuple of entries; ``True`` is refused (name the endpoint), and so is an
    entry :func:`~medheval.net.hosts.check_host_entry` refuses (``example.org/v1``: a path without a scheme)."""
    if allow is None or allow is False:
        return ()
    if allow is True:
        raise ValueError(
            "allow_remote_credentialed=True is not accepted: name the endpoint you are allowed to send "
            "credentialed data to, e.g. allow_remote_credentialed='myorg.openai.azure.com'"
        )
    if isinstance(allow, str):
        allow = [allow]
    out = []
    for item in allow:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"allow_remote_credentialed entries must be host names or base URLs, got {item!r}")
        out.append(check_host_entry(item, "allow_remote_credentialed"))
    return tuple(out)


def _base_url_key(text: str) -> tuple[str, str, int | None, str] | None:
    """``(scheme, host, port or the scheme's default, path)`` of a URL (text with ``://``): what a base-URL entry
    must equal (scheme and host in lower case, the host without its trailing dot, the path as written without its
    trailing ``/``); None for other text or a URL that cannot be parsed."""
    if "://" not in text:
        return None
    try:
        address = parse_address(text)
        path = urlsplit(safe_base_url(text.strip()) or "").path
    except ValueError:
        return None
    return (address.scheme, address.name, address.default_port, path) if address.name else None


def endpoint_allowed(base_url: str | None, allow: Iterable[str]) -> bool:
    """Whether ``base_url`` lies within what an entry of ``allow`` approves: a ``host`` entry approves that host on
    any port, ``host:port`` that port only (a URL's port defaulting to its scheme's), a base URL only the same base
    URL (scheme, host, port, path); hosts compared as :func:`~medheval.net.hosts.host_named` does (letter case and
    a trailing dot ignored, IPv6 with or without brackets). ``base_url`` may itself be an entry (``host`` or
    ``host:port``): then it lies within a ``host`` entry or the same ``host:port``, never within a base URL."""
    allow = tuple(allow)
    if not base_url or not ("://" in base_url or is_host_form(base_url)):
        return False
    key = _base_url_key(base_url)
    if key is not None and key in {_base_url_key(entry) for entry in allow}:
        return True
    return host_named(base_url, {host_entry(entry) for entry in allow if is_host_form(entry)})


def set_approved_endpoints(values: Iterable[str]) -> tuple[str, ...]:
    """The endpoints approved on the command line (``--allow-remote-credentialed``), in place of any earlier
    ones; returns the earlier ones."""
    return _approved.set(values)


def approve_endpoints(*values: str) -> None:
    """Approve ``values`` (host names, ``host:port`` or base URLs) for credentialed records in this process."""
    _approved.add(*normalise_allow_list(list(values)))


def approved_endpoints() -> tuple[str, ...]:
    """What the user approved: the command line, :func:`approve_endpoints` and ``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED``."""
    return _approved.entries()


def user_approved(base_url: str | None) -> bool:
    """Whether the user approved ``base_url`` (see :func:`approved_endpoints`)."""
    return endpoint_allowed(base_url, approved_endpoints())


def entry_approved(entry: str, approved: Iterable[str]) -> bool:
    """Whether everything an ``allow_remote_credentialed`` entry (host, ``host:port`` or base URL) approves is
    approved by ``approved`` (:func:`endpoint_allowed` with the entry as the endpoint): a ``host`` entry only by the
    same host, ``host:port`` by its host or the same ``host:port``, a base URL by its host, its ``host:port`` or
    the same base URL."""
    return endpoint_allowed(entry.strip(), approved)


def check_config_approval(value: object, approved: Iterable[str] = ()) -> None:
    """``PermissionError`` naming the first entry of ``value`` (an ``allow_remote_credentialed`` read from a
    config file) that the user did not approve (``approved``: the command line's entries, plus
    :func:`approved_endpoints`); ``ValueError`` for a malformed one. Sends nothing."""
    approved = (*approved, *approved_endpoints())
    for entry in normalise_allow_list(value):  # type: ignore[arg-type]
        if not entry_approved(entry, approved):
            host = endpoint_host(entry) or entry
            raise PermissionError(
                f"approves {entry!r} for credentialed (MIMIC) records, but a config file cannot approve an "
                f"endpoint: only you can. If {host} is an approved deployment under your PhysioNet agreement, give "
                f"{APPROVE_FLAG} {entry} on the command line (or set {APPROVED_ENV}={entry}); otherwise remove it "
                "from the config")


def _shown(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def credentialed_refusal(ids: list[str], base_url: str, backend: str,
                         unknown: list[str] | None = None) -> CredentialedDataError:
    """The refusal for credentialed records (``ids``) and records of unknown status (``unknown``)."""
    host = endpoint_host(base_url)
    if unknown and not ids:
        return CredentialedDataError(
            f"refusing to send {len(unknown)} record(s) ({_shown(unknown)}) to the {backend} endpoint {host!r}, "
            "which is not local: nothing says whether they derive from credentialed data (MIMIC-CXR / MIMIC-IV "
            "on PhysioNet), so they are treated as credentialed. No request was sent.\n"
            "To proceed: pass the records' status, credentialed=[...] with one bool per record (run_eval.py "
            "passes each record's meta['credentialed']), or credentialed=False when none of the data is "
            "credentialed (e.g. VQA-RAD, SLAKE, PMC images); or run the judge locally (a server on localhost "
            "or a private-range IP, or backend 'transformers'); or, for an approved deployment, name it: "
            f"allow_remote_credentialed={host!r}."
        )
    ids = list(ids) + list(unknown or [])
    return CredentialedDataError(
        f"refusing to send {len(ids)} credentialed record(s) ({_shown(ids)}) to the {backend} endpoint {host!r}, "
        "which is not local. These records derive from MIMIC-CXR / MIMIC-IV, released on PhysioNet under a "
        "credentialed data use agreement that forbids sharing the data with third parties; a public LLM API "
        "is a third party unless your agreement covers it (PhysioNet's guidance on online services: use an "
        "approved deployment, e.g. Azure OpenAI or AWS Bedrock with human review/data retention opted out, "
        "or a model you run yourself). No request was sent.\n"
        "To proceed: run the judge locally (a vLLM/Ollama server on localhost or a private-range IP, or "
        "backend 'transformers'), or, if this endpoint is an approved deployment for you, opt in by naming it: "
        f"make_judge(..., allow_remote_credentialed={host!r}) (medheval run / run_eval.py: {APPROVE_FLAG} {host}, "
        f"or {APPROVED_ENV}={host}; a config file cannot approve it)."
    )


__all__ = [
    "APPROVED_ENV",
    "CredentialedDataError",
    "approve_endpoints",
    "approved_endpoints",
    "check_config_approval",
    "entry_approved",
    "set_approved_endpoints",
    "user_approved",
    "endpoint_allowed",
    "endpoint_host",
    "is_local_host",
    "is_local_url",
    "normalise_allow_list",
    "resolves_to_loopback",
    "safe_base_url",
    "split_userinfo",
]

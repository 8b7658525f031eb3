"""Where a secret from the environment may be sent: the one rule for API keys, and the plain-http rule.

An API key read from the environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``AZURE_OPENAI_API_KEY``, or
the variable a judge dict names in ``api_key_env``) goes only to

* its provider's own host (``api.openai.com``, ``api.anthropic.com``, the host of ``AZURE_OPENAI_ENDPOINT``), or
* a host the user named: on the command line (the host of a ``--judge`` / ``--model`` spec or of a URL in a
  ``--metric-option``, or ``--api-key-host HOST``; :func:`set_key_hosts`), in ``MEDHEVAL_API_KEY_HOSTS``
  (comma-separated ``host`` or ``host:port``), or from Python with :func:`allow_key_hosts`.

The generic image-server credentials (``MEDHEVAL_IMAGE_USERNAME`` / ``_PASSWORD``) go only to the server
``MEDHEVAL_IMAGE_HOST`` names (:data:`image_hosts`, used by :mod:`medheval.data.images`).

A grid YAML, a ``metric_options`` judge dict or an annotation file never decides this: what a config file names
is not a host the user named. ``api_key_env`` must name a ``*_API_KEY`` variable (:func:`check_key_env_name`),
so no config can pick ``HF_TOKEN`` or ``PHYSIONET_PASSWORD``. A key written in the spec itself (``api_key``, a
header, a password in the URL) belongs to whoever wrote it and goes where they said, but never over plain
``http://`` to a host other than loopback (:func:`check_plain_http`: an error naming where the key came from).
A key from the environment is simply *withheld* from such a URL, whoever named the host (the request goes
without it, and a warning says so once): a keyless vLLM on the LAN keeps working whatever ``OPENAI_API_KEY``
holds; https or an SSH tunnel to 127.0.0.1 lets the key be sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from medheval.net.hosts import host_entry, is_loopback_host, mask_userinfo, parse_address
from medheval.net.named import UserNamedHosts

KEY_HOSTS_ENV = "MEDHEVAL_API_KEY_HOSTS"
# the variables api_key_env may name: ``<NAME>_API_KEY``, never a Hub token, PhysioNet or image-server secret
API_KEY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*_API_KEY$")
RESERVED_PREFIXES = ("HF_", "HUGGING_FACE", "HUGGINGFACE", "PHYSIONET", "MEDHEVAL_IMAGE")

_named = UserNamedHosts(KEY_HOSTS_ENV)  # hosts named on this process's command line, from Python, or in the variable
# the image servers the generic image credentials (MEDHEVAL_IMAGE_USERNAME/_PASSWORD) go to (medheval.data.images):
# declared here, with the other secrets' hosts, so that main() checks the variable without loading the data stack
IMAGE_HOST_ENV = "MEDHEVAL_IMAGE_HOST"
image_hosts = UserNamedHosts(IMAGE_HOST_ENV)


def set_key_hosts(hosts: Iterable[str]) -> tuple[str, ...]:
    """The hosts the user named on the command line (in place of any earlier ones); returns the earlier ones."""
    return _named.set(hosts)


def allow_key_hosts(*hosts: str) -> None:
    """Let keys from the environment go to ``hosts`` (``host``, ``host:port`` or a URL) in this process."""
    _named.add(*hosts)


def named_key_hosts() -> set[str]:
    """The hosts the user named: :func:`set_key_hosts` / :func:`allow_key_hosts` and ``MEDHEVAL_API_KEY_HOSTS``."""
    return _named.names()


def key_host_named(url: str) -> bool:
    """Whether the user named ``url``'s host (on any port) or its ``host:port``."""
    return _named.covers(url)


def check_key_env_name(name: object, field: str = "api_key_env") -> str:
    """``name`` when it is a ``*_API_KEY`` variable; ``ValueError`` naming ``field`` otherwise."""
    text = str(name)
    if not API_KEY_NAME.match(text) or text.upper().startswith(RESERVED_PREFIXES):
        raise ValueError(
            f"{field} names {text[:60]!r}: it must name an API key variable ending in _API_KEY (e.g. "
            "OPENAI_API_KEY, MY_JUDGE_API_KEY); Hub tokens, PhysioNet and image-server credentials are never "
            "sent to a judge or model endpoint")
    return text


def carries_secret_header(headers: dict | None) -> bool:
    """Whether ``headers`` has one named like a credential (``Authorization``, ``X-Api-Key`` …)."""
    from medheval.net.secrets import SECRET_NAME

    return any(SECRET_NAME.search(str(name)) and value for name, value in (headers or {}).items())


def plain_http_to_network(url: str) -> bool:
    """Whether ``url`` is ``http://`` to a host other than loopback: what it carries crosses the network in clear.
    An ``http://`` URL that :func:`~medheval.net.hosts.parse_address` cannot read (an IPv6 zone id, a bad port)
    counts as crossing it."""
    try:
        address = parse_address(url)
    except ValueError:
        return url.strip().lower().startswith("http://")
    return address.scheme == "http" and not is_loopback_host(address.host)


def check_plain_http(url: str, what: str) -> None:
    """``ValueError`` when ``url`` is ``http://`` to a host other than loopback: ``what`` (a key, a password)
    would cross the network in clear text."""
    if plain_http_to_network(url):
        host = host_entry(url)
        raise ValueError(
            f"refusing to send {what} over plain http to {host or mask_userinfo(url)[:80]!r}: anyone on the "
            f"network path could read it. Use https:// (or an SSH tunnel to 127.0.0.1)")


__all__ = ["API_KEY_NAME", "IMAGE_HOST_ENV", "KEY_HOSTS_ENV", "allow_key_hosts", "carries_secret_header", "check_key_env_name",
           "check_plain_http", "image_hosts", "key_host_named", "named_key_hosts", "plain_http_to_network", "set_key_hosts"]

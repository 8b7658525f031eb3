"""Hosts the user named: the one mechanism behind "a config file never decides where data or keys go".

A :class:`UserNamedHosts` holds, for one purpose, the entries the user gave on this process's command line
(``medheval``'s ``main()`` sets them from the typed flags before any config file is read), those added from
Python (the caller is the user) and those of one environment variable (comma-separated). A grid YAML, a
``metric_options`` judge dict or an annotation file never adds to it. Its instances:

* :mod:`medheval.net.keys`: hosts an API key from the environment may go to (``--api-key-host``, the hosts of
  ``--judge`` / ``--model``; ``MEDHEVAL_API_KEY_HOSTS``);
* :mod:`medheval.net.transport`: hosts whose credentialed traffic may use an environment proxy (``--proxy-for``;
  ``MEDHEVAL_PROXY_FOR``);
* :mod:`medheval.net.keys` too: the one image server the generic image credentials of :mod:`medheval.data.images`
  go to (``MEDHEVAL_IMAGE_HOST``);
* :mod:`medheval.judges.endpoints`: non-local endpoints approved for credentialed (MIMIC) records
  (``--allow-remote-credentialed``; ``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED``): its host entries by the same rule, its
  base-URL entries only that base URL (:func:`medheval.judges.endpoints.endpoint_allowed`).

Every entry is checked where it is given (:func:`~medheval.net.hosts.check_host_entry`): a host, ``host:port`` or
URL with its scheme; ``example.org/v1`` (a path without a scheme), an unparseable entry or an IPv6 zone id is a
``ValueError`` naming the flag, the variable or the Python call, never an entry quietly naming nothing. An
environment variable is read where it is used; :func:`check_environment` reads every list's at once (``main()``
does, before anything runs, so a bad entry is one error rather than a failure deep inside a run).

:meth:`UserNamedHosts.covers` (:func:`~medheval.net.hosts.host_named`) is the matching rule: an entry names one
host exactly (no suffix or wildcard matching; letter case and a trailing dot ignored), on any port, or on the one
port ``host:port`` gives (a URL's port defaulting to its scheme's); an entry that names no host names nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from medheval.net.hosts import check_host_entry, host_entry, host_named


_LISTS: list["UserNamedHosts"] = []  # every list made, for check_environment


def _checked(values: Iterable[object], where: str) -> list[str]:
    """The non-empty ``values``, each checked by :func:`~medheval.net.hosts.check_host_entry`."""
    return [check_host_entry(str(v), where) for v in values if v and str(v).strip()]


class UserNamedHosts:
    """Entries (host names, ``host:port`` or URLs, as given) the user named for one purpose."""

    def __init__(self, env: str):
        self.env = env
        self._given: list[str] = []
        _LISTS.append(self)

    def set(self, values: Iterable[str]) -> tuple[str, ...]:
        """The command line's entries, in place of any earlier ones; returns the earlier ones (to restore).
        ``ValueError`` for an entry :func:`~medheval.net.hosts.check_host_entry` refuses (nothing is changed)."""
        given = _checked(values, "on the command line")
        previous = tuple(self._given)
        self._given = given
        return previous

    def add(self, *values: str) -> None:
        """Add entries (from Python: the caller is the user); ``ValueError`` as :meth:`set`."""
        self._given += _checked(values, f"a host added from Python (for {self.env})")

    def entries(self) -> tuple[str, ...]:
        """The entries given on the command line or from Python, then those of the environment variable;
        ``ValueError`` naming the variable for an entry of it that is not a host, ``host:port`` or URL."""
        return (*self._given, *_checked(os.environ.get(self.env, "").split(","), self.env))

    def names(self, *extra: str) -> set[str]:
        """The entries, and ``extra`` (checked as :meth:`add` checks), as ``host`` or ``host:port``
        (:func:`~medheval.net.hosts.host_entry`); those that name no host are left out."""
        given = (*self.entries(), *_checked(extra, f"a host given from Python (for {self.env})"))
        return {entry for entry in map(host_entry, given) if entry}

    def covers(self, url: str, *extra: str) -> bool:
        """Whether an entry (or one of ``extra``, checked) names ``url``'s host on any port, or its ``host:port``."""
        return host_named(url, self.names(*extra))


def check_environment() -> None:
    """Read the environment variable of every list made so far (:meth:`UserNamedHosts.entries`): ``ValueError``
    naming the variable for the first entry that is not a host, ``host:port`` or URL."""
    for named in _LISTS:
        named.entries()


__all__ = ["UserNamedHosts", "check_environment"]

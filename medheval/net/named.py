"""Hosts the user named: the one mechanism behind "a config file never decides where data or keys go".

A :class:`UserNamedHosts` holds, for one purpose, the entries the user gave on this process's command line
(``medheval``'s ``main()`` sets them from the typed flags before any config file is read), those added from
Python (the caller is the user) and those of one environment variable (comma-separated). A grid YAML, a
``metric_options`` judge dict or an annotation file never adds to it. Its instances:

* :mod:`medheval.net.keys`: hosts an API key from the environment may go to (``--api-key-host``, the hosts of
  ``--judge`` / ``--model``; ``MEDHEVAL_API_KEY_HOSTS``);
* :mod:`medheval.net.transport`: hosts whose credentialed traffic may use an environment proxy (``--proxy-for``;
  ``MEDHEVAL_PROXY_FOR``);
* :mod:`medheval.data.images`: the one image server the generic image credentials go to (``MEDHEVAL_IMAGE_HOST``);
* :mod:`medheval.judges.endpoints`: non-local endpoints approved for credentialed (MIMIC) records
  (``--allow-remote-credentialed``; ``MEDHEVAL_ALLOW_REMOTE_CREDENTIALED``): its host entries by the same rule, its
  base-URL entries only that base URL (:func:`medheval.judges.endpoints.endpoint_allowed`).

:meth:`UserNamedHosts.covers` (:func:`~medheval.net.hosts.host_named`) is the matching rule: an entry names one
host exactly (no suffix or wildcard matching; letter case and a trailing dot ignored), on any port, or on the one
port ``host:port`` gives (a URL's port defaulting to its scheme's); an entry that names no host names nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from medheval.net.hosts import host_entry, host_named


class UserNamedHosts:
    """Entries (host names, ``host:port`` or URLs, as given) the user named for one purpose."""

    def __init__(self, env: str):
        self.env = env
        self._given: list[str] = []

    def set(self, values: Iterable[str]) -> tuple[str, ...]:
        """The command line's entries, in place of any earlier ones; returns the earlier ones (to restore)."""
        previous = tuple(self._given)
        self._given = [str(v).strip() for v in values if v and str(v).strip()]
        return previous

    def add(self, *values: str) -> None:
        """Add entries (from Python: the caller is the user)."""
        self._given += [str(v).strip() for v in values if v and str(v).strip()]

    def entries(self) -> tuple[str, ...]:
        """The entries given on the command line or from Python, then those of the environment variable."""
        from_env = [part.strip() for part in os.environ.get(self.env, "").split(",") if part.strip()]
        return (*self._given, *from_env)

    def names(self, *extra: str) -> set[str]:
        """The entries, and ``extra``, as ``host`` or ``host:port`` (:func:`~medheval.net.hosts.host_entry`);
        those that name no host are left out."""
        return {entry for entry in map(host_entry, (*self.entries(), *extra)) if entry}

    def covers(self, url: str, *extra: str) -> bool:
        """Whether an entry (or one of ``extra``) names ``url``'s host on any port, or its ``host:port``."""
        return host_named(url, self.names(*extra))


__all__ = ["UserNamedHosts"]

"""Pacing for HTTP judges: a requests-per-minute limiter shared by all threads, and backoff delays."""

from __future__ import annotations

import email.utils
import random
import threading
import time


class RateLimiter:
    """Spaces request starts ``60 / requests_per_minute`` seconds apart (a token bucket of size 1)
    and holds every thread back while a server-requested pause (``Retry-After``) is running.

    With ``requests_per_minute=None`` only the pauses apply.
    """

    def __init__(self, requests_per_minute: float | None = None):
        if requests_per_minute is not None and requests_per_minute <= 0:
            raise ValueError(f"requests_per_minute must be positive, got {requests_per_minute}")
        self.interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._next = 0.0
        self._pause_until = 0.0
        self._lock = threading.Lock()

    def acquire(self, stop: threading.Event | None = None) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next, self._pause_until)
            if self.interval:
                self._next = start + self.interval
        delay = start - now
        if delay > 0:
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)

    def pause(self, seconds: float) -> None:
        """No thread starts a request for ``seconds`` from now (a 429's ``Retry-After``)."""
        with self._lock:
            self._pause_until = max(self._pause_until, time.monotonic() + seconds)


def parse_retry_after(headers) -> float | None:
    """Seconds to wait from ``retry-after-ms``, ``Retry-After`` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, base: float, maximum: float, retry_after: float | None = None) -> float:
    """Delay before re-sending after failed attempt number ``attempt`` (1-based).

    ``Retry-After`` is honoured when the server sends it (capped at ``maximum``); otherwise
    exponential backoff ``base * 2**(attempt-1)`` (capped) with "equal jitter": half fixed,
    half uniformly random, so threads that failed together do not retry together.
    """
    if retry_after is not None:
        return min(retry_after, maximum) + random.uniform(0.0, min(base, 0.1 * max(retry_after, base)))
    delay = min(maximum, base * (2 ** (attempt - 1)))
    return delay / 2.0 + random.uniform(0.0, delay / 2.0)


__all__ = ["RateLimiter", "backoff_delay", "parse_retry_after"]

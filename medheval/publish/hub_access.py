# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""Is the Hugging Face Hub reachable? One quick probe per endpoint per process.

Without the offline flags (``HF_HUB_OFFLINE``) and without a route to the Hub, ``from_pretrained``
of a Hub id that is not cached spends about a minute in ``huggingface_hub``'s retries before it
fails. Code that can go on without the model (the BERTScore column of ``metrics/text_generation``)
first tries the local cache, then asks :func:`hub_reachable`: one HTTP ``HEAD`` of the endpoint with
a short timeout (proxies from the environment are honoured, as the Hub client does). Any HTTP
answer counts as reachable; a DNS failure, refused connection or timeout does not. The answer is
kept for the life of the process.
"""

from __future__ import annotations

import functools
import os

#: Seconds for the probe's connect and read (each).
PROBE_TIMEOUT = 3.0


def hub_endpoint() -> str:
    """``$HF_ENDPOINT`` when set, else huggingface_hub's endpoint (``https://huggingface.co``)."""
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        try:
            from huggingface_hub import constants

            endpoint = constants.ENDPOINT
        except ImportError:
            endpoint = "https://huggingface.co"
    return endpoint.rstrip("/")


def register_hub_credentials(token: str | bool | None = None, *, resolve: bool = False) -> None:
    """Register the Hub token huggingface_hub sends (``token`` when it is one, else ``HF_TOKEN`` or the file
    ``hf auth login`` wrote, which :func:`medheval.net.secrets.register_environment` never sees) and a password
    or query value in ``HF_ENDPOINT``, so that :func:`~medheval.net.secrets.redact` removes them from every
    message: a Hub endpoint may echo the ``Authorization`` header into an error or a reply field.

    Without ``resolve`` (every command's start) the token is only read, from the variables and the token file: no
    request is made. ``huggingface_hub.get_token`` may mint an OIDC token (``HF_OIDC_RESOURCE``) or refresh an
    expiring login over the network, which a command that never talks to the Hub (``medheval list``, ``report``)
    must not do. ``resolve=True`` (:func:`medheval.publish.hub.push`, about to talk to the Hub) asks
    ``get_token``, so the token it then sends is the one registered."""
    from medheval.net.secrets import register_secrets, register_url

    register_url(os.environ.get("HF_ENDPOINT"))
    if not isinstance(token, str):
        token = _resolved_token() if resolve else _stored_token()
    register_secrets(token, source="the Hugging Face token (HF_TOKEN or `hf auth login`)")


def _stored_token() -> str | None:
    """``HF_TOKEN`` / ``HUGGING_FACE_HUB_TOKEN``, else the content of huggingface_hub's token file; read, never
    fetched. ``None`` without huggingface_hub or with an unreadable file."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not token:
        try:
            from huggingface_hub import constants

            if not os.path.isfile(constants.HF_TOKEN_PATH):  # (a named pipe would block the command's start)
                return None
            with open(constants.HF_TOKEN_PATH, encoding="utf-8") as file:
                token = file.read(4096)
        except Exception:  # noqa: BLE001 - no huggingface_hub, no or an unreadable token file: nothing to register
            return None
    return token.replace("\r", "").replace("\n", "").strip() or None


def _resolved_token() -> str | None:
    """``huggingface_hub.get_token()``: the token the Hub client sends now (it may make a request)."""
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no huggingface_hub, an unreadable token file, a failed exchange
        return _stored_token()


def hub_offline() -> bool:
    """Whether the Hub client is in offline mode (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except ImportError:
        pass
    return any(os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(endpoint: str | None = None) -> tuple[bool, str | None]:
    """``(True, None)`` when ``endpoint`` (default :func:`hub_endpoint`) answers HTTP, else ``(False, why)``;
    ``(False, ...)`` without a probe in offline mode. Cached per endpoint for the process."""
    if hub_offline():
        return False, "HF_HUB_OFFLINE is set"
    return _probe(endpoint or hub_endpoint())


@functools.lru_cache(maxsize=8)
def _probe(endpoint: str) -> tuple[bool, str | None]:
    import requests

    from medheval.net.transport import NO_AUTH

    try:
        # an auth that adds nothing: without one, requests reads ~/.netrc and sends its entry for the endpoint, or
        # its default entry (a PhysioNet login kept there), as basic auth
        requests.head(endpoint, timeout=(PROBE_TIMEOUT, PROBE_TIMEOUT), allow_redirects=False, auth=NO_AUTH)
    except requests.RequestException as err:
        message = " ".join(str(err).split())[:200]
        return False, f"no answer from {endpoint} (timeout {PROBE_TIMEOUT:g}s; {type(err).__name__}: {message})"
    return True, None


__all__ = ["PROBE_TIMEOUT", "hub_endpoint", "hub_offline", "hub_reachable", "register_hub_credentials"]

"""``make_judge``: a judge from a spec string ``backend:model[@base_url]`` or a dict.

Backends: ``openai`` (any OpenAI-compatible server; ``vllm`` and ``ollama`` are the same with a
localhost default base URL), ``azure`` (Azure OpenAI; ``model`` is the deployment), ``anthropic``,
``transformers`` (a local model path; alias ``hf``).

Keys: the dict's ``api_key``, else the environment variable named by ``api_key_env`` (a ``*_API_KEY``
variable), else ``OPENAI_API_KEY`` / ``AZURE_OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``. They are only ever put in
request headers: never in ``describe()``, results, logs, exceptions or the cache. A key from the environment goes
only to the provider's own host or a host the user named (:mod:`medheval.net.keys`): otherwise it is refused, or,
for a local server and the backend's default variable, not sent.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from medheval.judges.base import Judge, JudgeError
from medheval.net import keys
from medheval.net.hosts import check_host_entry, host_and_port, host_entry, is_local_host

_BACKENDS = {
    "openai": "openai", "openai-compatible": "openai", "openai_compatible": "openai", "vllm": "openai",
    "ollama": "openai", "azure": "azure", "azure-openai": "azure", "azure_openai": "azure",
    "anthropic": "anthropic", "claude": "anthropic", "transformers": "transformers", "hf": "transformers",
}
_DEFAULT_BASE = {"vllm": "http://localhost:8000/v1", "ollama": "http://localhost:11434/v1"}
logger = logging.getLogger(__name__)
_warned: set[str] = set()  # withheld-key warnings already given (once each per process)
_KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# the provider's own host, where its key from the environment may always go (azure: AZURE_OPENAI_ENDPOINT's host)
_PROVIDER_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
_JUDGE_OPTIONS = {
    "cache_dir", "concurrency", "requests_per_minute", "max_retries", "timeout", "max_invalid_retries",
    "allow_remote_credentialed", "temperature", "max_tokens", "progress", "backoff_base", "backoff_max",
    "max_consecutive_failures", "top_p", "invalid_reply", "max_tries",
}
_BACKEND_OPTIONS = {
    "openai": {"json_mode", "extra_body", "headers", "images_first", "deadline"},
    "azure": {"json_mode", "extra_body", "headers", "api_version", "images_first", "deadline"},
    "anthropic": {"headers", "deadline"},
    "transformers": {"tokenizer", "processor", "batch_size", "device", "dtype", "seed"},
}
_SPEC_KEYS = {"backend", "model", "base_url", "api_key", "api_key_env"}


def parse_spec(spec: str) -> dict[str, Any]:
    """``"backend:model[@base_url]"`` → ``{"backend", "model", "base_url"}``.

    The model may itself contain ``:`` or ``@`` (``llama3:8b``, ``claude-3-5-sonnet@20240620``):
    the base URL starts at the first ``@http://`` or ``@https://``.

    >>> parse_spec("openai:llama3:8b@http://127.0.0.1:11434/v1")
    {'backend': 'openai', 'model': 'llama3:8b', 'base_url': 'http://127.0.0.1:11434/v1'}
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise JudgeError(
            f"judge spec {spec!r} is not 'backend:model[@base_url]' (e.g. 'openai:gpt-4o', "
            "'anthropic:claude-3-5-sonnet-20240620', 'openai:qwen2.5-7b@http://127.0.0.1:8000/v1', "
            "'transformers:/models/judge')"
        )
    backend, rest = spec.split(":", 1)
    base_url = None
    cut = min((i for i in (rest.find("@http://"), rest.find("@https://")) if i >= 0), default=-1)
    if cut >= 0:
        rest, base_url = rest[:cut], rest[cut + 1:]
    if not rest:
        raise JudgeError(f"judge spec {spec!r} names no model after '{backend}:'")
    return {"backend": backend.strip().lower(), "model": rest.strip(), "base_url": base_url}


def make_judge(
    spec: str | dict | Judge,
    *,
    cache_dir: Any = None,
    concurrency: int = 16,
    requests_per_minute: float | None = None,
    max_retries: int = 5,
    timeout: float = 60.0,
    max_invalid_retries: int = 2,
    allow_remote_credentialed: Any = None,
    temperature: float = 0.0,
    max_tokens: int = 1024,
    progress: bool = True,
    **options: Any,
) -> Judge:
    """Build a judge.

    Args:
        spec: ``"backend:model[@base_url]"``; or a dict with ``backend``, ``model`` and optionally
            ``base_url``, ``api_key``, ``api_key_env`` and any option below or backend option
            (``json_mode``, ``extra_body``, ``headers``, ``api_version``; for transformers
            ``batch_size``, ``device``, ``dtype``, ``seed``, ``tokenizer``, ``processor``) — the
            dict's values win over the keyword arguments; or a :class:`Judge`, returned as is.
        cache_dir: cache folder (default ``$MEDHEVAL_CACHE/judge`` or ``~/.cache/medheval/judge``);
            ``False`` disables the cache.
        concurrency: requests in flight at once (HTTP backends).
        requests_per_minute: an optional rate limit shared by all threads.
        max_retries: re-sends of one call on 429/5xx/timeouts/dropped connections.
        timeout: seconds to wait for each read of a response (HTTP backends).
        max_invalid_retries: further tries after a reply that is not valid JSON / fails validate.
        allow_remote_credentialed: host name(s) or base URL(s) of non-local endpoints approved for
            credentialed (PhysioNet) data; see :class:`CredentialedDataError`.
        temperature, max_tokens: generation parameters (temperature 0: deterministic as the API allows).
        progress: show a progress bar.
        **options: ``top_p`` (sent when given; the transformers judge uses it when sampling), ``invalid_reply``
            (``"follow_up"``, the default: a corrective turn after an unusable reply; ``"resend"``: the same
            conversation again, after a backoff on HTTP backends), ``max_tries`` (when set, a record's one budget:
            at most this many calls, failed calls and unusable replies alike, ``max_retries`` and
            ``max_invalid_retries`` not applying: ClinHallu's judge loop; default None: those two budgets), ``backoff_base``/``backoff_max`` (seconds), ``max_consecutive_failures`` (records
            whose calls failed for good in a row that stop the run, HTTP backends; default 8, None: never), ``images_first``
            (openai/azure: images before the text), ``deadline`` (HTTP backends: seconds for one whole request,
            connect to the last byte, default 300) and the backend options above.
    """
    if isinstance(spec, Judge):
        return spec
    settings: dict[str, Any] = dict(
        cache_dir=cache_dir, concurrency=concurrency, requests_per_minute=requests_per_minute,
        max_retries=max_retries, timeout=timeout, max_invalid_retries=max_invalid_retries,
        allow_remote_credentialed=allow_remote_credentialed, temperature=temperature, max_tokens=max_tokens,
        progress=progress,
    )
    settings.update(options)
    fields, given, backend = _checked_form(spec, set(settings))
    settings.update(given)
    alias = fields["backend"]
    model = fields["model"]
    base_url = _base_url(alias, backend, fields["base_url"])
    api_key = settings.pop("api_key", None)
    api_key_env = settings.pop("api_key_env", None)

    if backend == "transformers":
        if api_key or base_url:
            raise JudgeError("the transformers judge runs in-process: it takes no api_key or base_url")
        from medheval.judges.transformers_judge import TransformersJudge

        return TransformersJudge(model, **settings)

    withheld = None
    if not api_key:
        api_key, withheld = _env_key(backend, base_url, api_key_env)
    if not api_key and base_url is None and backend in ("openai", "anthropic"):
        raise JudgeError(
            f"no API key for the {backend} judge: set {_KEY_ENV[backend]} (or pass api_key / api_key_env in "
            "a judge dict), or point the judge at a local server with '@http://127.0.0.1:PORT/...'"
        )
    if backend == "openai":
        from medheval.judges.openai import OpenAIJudge as judge_class
    elif backend == "azure":
        from medheval.judges.openai import AzureOpenAIJudge as judge_class
    else:
        from medheval.judges.anthropic import AnthropicJudge as judge_class
    judge = judge_class(model, base_url=base_url, api_key=api_key, **settings)
    judge.key_withheld = withheld
    if withheld and keys.plain_http_to_network(base_url or "") and withheld not in _warned:
        _warned.add(withheld)
        logger.warning(withheld)
    return judge


def _provider_hosts(backend: str) -> set[str]:
    """The hosts a key from the environment may always go to: the provider's own."""
    url = os.environ.get("AZURE_OPENAI_ENDPOINT", "") if backend == "azure" else _PROVIDER_URL.get(backend, "")
    return {host_and_port(url)[0]} - {""} if url else set()


def _env_key(backend: str, base_url: str | None, api_key_env: Any) -> tuple[str | None, str | None]:
    """(the key from the environment to send, or None; why a set key was not sent, or None).

    :class:`JudgeError` when ``api_key_env`` names no ``*_API_KEY`` variable or an unset one, or when the key
    would go to a host that is neither the provider's nor one the user named (:mod:`medheval.net.keys`);
    the backend's default variable is simply not sent to a local server the user did not name, and no key from
    the environment is sent over plain ``http://`` to a host other than loopback, named or not (withheld, with
    the reason as the second value)."""
    if api_key_env:
        try:
            keys.check_key_env_name(api_key_env)
        except ValueError as error:
            raise JudgeError(str(error)) from None
    env_name = str(api_key_env or _KEY_ENV[backend])
    api_key = os.environ.get(env_name) or None
    if api_key_env and not api_key:
        raise JudgeError(f"api_key_env names {env_name!r}, which is not set in the environment")
    url = base_url or _PROVIDER_URL.get(backend, "")
    if not api_key or not url:
        return api_key, None
    try:  # a URL no host can be read from: the judge's own refusal, not "not sent to ''"
        check_host_entry(url, f"the {backend} endpoint's base_url")
    except ValueError as error:
        raise JudgeError(str(error)) from None
    entry = host_entry(url)
    if keys.plain_http_to_network(url):
        # never in clear text across the network, whoever named the host: the request goes without it
        origin = f"{env_name} (named by api_key_env)" if api_key_env else env_name
        return None, (f"{origin} is set but was not sent to {entry}: a key from the environment never goes over "
                      f"plain http to a host other than loopback; to send it, serve the endpoint over https:// "
                      f"or reach it through an SSH tunnel to 127.0.0.1")
    host, _ = host_and_port(url)
    if host in _provider_hosts(backend) or keys.key_host_named(url):
        return api_key, None
    allow = (f"name it on the command line (--judge / --model {backend}:MODEL@{_root(url)}, or "
             f"--api-key-host {entry}) or set {keys.KEY_HOSTS_ENV}={entry}")
    if not api_key_env and is_local_host(host):
        return None, (f"{env_name} is set but was not sent to {entry}, a host you did not name; to send it, {allow}")
    provider = ", ".join(sorted(_provider_hosts(backend))) or "the provider's own host"
    raise JudgeError(
        f"{env_name} from the environment is not sent to {entry!r}: a key from the environment goes only to "
        f"{provider} or to a host you name. A judge or model spec in a config file cannot choose where your keys "
        f"go; if {entry} is yours, {allow}")


def _root(url: str) -> str:
    """``scheme://host[:port]/…`` of ``url`` (no user-info, path or query), for messages."""
    return f"{url.split(':', 1)[0]}://{host_entry(url)}/…"


def _checked_form(spec: Any, options: set[str] = frozenset()) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(fields, the dict's own settings, canonical backend)`` of a spec string or judge dict, with ``options``
    (setting names given besides it) checked against the backend's: :class:`JudgeError` for a malformed string,
    a dict without ``backend`` and ``model``, an unknown backend or option."""
    given: dict[str, Any] = {}
    if isinstance(spec, str):
        fields = parse_spec(spec)
    elif isinstance(spec, dict):
        if "backend" not in spec or "model" not in spec:
            raise JudgeError(f"a judge dict needs 'backend' and 'model' (got keys {sorted(spec)})")
        fields = {"backend": str(spec["backend"]).lower(), "model": spec["model"], "base_url": spec.get("base_url")}
        given = {k: v for k, v in spec.items() if k not in ("backend", "model", "base_url")}
    else:
        raise JudgeError(f"judge must be a spec string, a dict or a Judge, got {type(spec).__name__}")
    backend = _BACKENDS.get(fields["backend"])
    if backend is None:
        raise JudgeError(f"unknown judge backend {fields['backend']!r}; use one of {sorted(set(_BACKENDS))}")
    unknown = (set(options) | set(given)) - _JUDGE_OPTIONS - _BACKEND_OPTIONS[backend] - _SPEC_KEYS
    if unknown:
        raise JudgeError(
            f"unknown option(s) {sorted(unknown)} for the {backend} judge; allowed: "
            f"{sorted(_JUDGE_OPTIONS | _BACKEND_OPTIONS[backend] | _SPEC_KEYS - {'backend', 'model'})}"
        )
    return fields, given, backend


def check_judge_spec(spec: Any) -> None:
    """:class:`JudgeError` when :func:`make_judge` would refuse the form of ``spec`` (a spec string or judge dict:
    malformed, no backend or model, an unknown backend or option); builds nothing and reads no key, so a run
    checks it before its first generation. A :class:`Judge` object or ``None`` passes."""
    if spec is not None and not isinstance(spec, Judge):
        _checked_form(spec)


def check_key_destination(spec: Any) -> None:
    """:class:`JudgeError` when ``spec`` (a spec string or judge dict) would send a key from the environment where
    :func:`make_judge` refuses to (see :func:`_env_key`); sends and builds nothing. For a config's checks."""
    if isinstance(spec, str):
        try:
            fields = parse_spec(spec)
        except JudgeError:
            return
    elif isinstance(spec, dict) and "backend" in spec:
        fields = {"backend": str(spec["backend"]).lower(), "base_url": spec.get("base_url")}
        if spec.get("api_key"):
            return
    else:
        return
    backend = _BACKENDS.get(fields["backend"])
    if backend in (None, "transformers"):
        return
    _env_key(backend, _base_url(fields["backend"], backend, fields["base_url"]),
             spec.get("api_key_env") if isinstance(spec, dict) else None)


def _base_url(alias: str, backend: str, given: str | None) -> str | None:
    """The endpoint a judge of ``alias`` (canonical ``backend``) talks to: the one given, the alias's default
    (a local vLLM or Ollama), or for Azure ``$AZURE_OPENAI_ENDPOINT``; ``None``: the provider's own."""
    base_url = given or _DEFAULT_BASE.get(alias)
    if backend == "azure" and not base_url:
        base_url = os.environ.get("AZURE_OPENAI_ENDPOINT") or None
    return base_url


def backend_of(spec: str | dict | Judge) -> str:
    """The backend a judge spec names, by its canonical name (``openai``, ``azure``, ``anthropic``,
    ``transformers``; ``vllm`` and ``ollama`` are ``openai``); a :class:`JudgeError` for an unknown one."""
    if isinstance(spec, Judge):
        return spec.backend
    alias = parse_spec(spec)["backend"] if isinstance(spec, str) else str((spec or {}).get("backend", "")).lower()
    if alias not in _BACKENDS:
        raise JudgeError(f"unknown judge backend {alias!r}; use one of {sorted(set(_BACKENDS))}")
    return _BACKENDS[alias]


__all__ = ["backend_of", "check_judge_spec", "check_key_destination", "close_judges", "judge_for", "make_judge", "parse_spec"]


def judge_for(owner: object, spec: Any, **options: Any) -> Any:
    """The judge for ``spec`` + ``options``, made once per ``owner`` (e.g. a metric instance) and reused.

    A ready :class:`Judge` is returned as is; spec strings and dicts are keyed by their JSON form.
    """
    if not isinstance(spec, (str, dict)):
        return make_judge(spec)
    key = json.dumps([spec, options], sort_keys=True, default=repr)
    judges = owner.__dict__.setdefault("_judges", {})
    if key not in judges:
        judges[key] = make_judge(spec, **options)
    return judges[key]


def close_judges(owner: object) -> None:
    """Close the SQLite cache connections of the judges :func:`judge_for` made for ``owner`` (they reopen
    on their next run). Metrics call it when a ``compute`` ends; a ready Judge passed in is never closed."""
    for judge in owner.__dict__.get("_judges", {}).values():
        judge.close()

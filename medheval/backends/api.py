"""The model under test behind an HTTP API: an OpenAI-compatible server (vLLM, SGLang, TGI, Ollama,
OpenAI), Azure OpenAI, or Anthropic.

``APIBackend("openai:llava-hf/llava-1.5-7b-hf@http://127.0.0.1:8000/v1")`` sends each record as one
chat request through the judges' HTTP layer (:mod:`medheval.judges`: one client for judges and
models), so it shares their behaviour:

- the prompt is :func:`medheval.run.prompts.build_prompt` (the HF backend's text); the user message is
  the record's images as base64 PNG data URLs, then that text; the server applies the chat template;
- greedy by default (``temperature=0``); ``do_sample=True`` sends ``temperature`` (default 1.0),
  ``top_p`` and ``seed``; ``max_new_tokens`` is ``max_tokens``;
- ``concurrency`` requests in flight, retries on 429/5xx/timeouts honouring ``Retry-After``;
- an on-disk cache (``$MEDHEVAL_CACHE/api`` or ``~/.cache/medheval/api``) keyed by model, endpoint,
  messages, image digests and settings, never the API key: a re-run sends no request;
- the credentialed guard: records whose ``meta.credentialed`` is true or whose source is MIMIC
  (:func:`medheval.data.schema.record_credentialed`) go only to a local endpoint unless
  ``allow_remote_credentialed`` names the host; the runner checks every split before the first
  request (:meth:`APIBackend.check_records`); local endpoints never go through an environment proxy.

Failures. A record whose call failed for good (retries spent, or a 4xx other than 401/403/404)
never becomes a prediction: the batch ends, then :class:`BackendError` names the failed records and
the reason. Records answered before are in the predictions log or the cache, so re-running the same
command resumes and re-asks only the failed ones. ``max_consecutive_failures`` records failing one
after another (a dead or misconfigured server) stop the batch at once; 401/403/404 stop it at the
first reply.

Continuations (:meth:`APIBackend.generate_chat`, ClinHallu's Rep settings). The assistant prefix is
sent as a final assistant message. Anthropic continues it natively (prefill; trailing whitespace is
dropped from the prefix, as the API requires). OpenAI-compatible servers need vLLM's
``continue_final_message: true, add_generation_prompt: false`` in the body (SGLang accepts the same
fields): ``continue_final_message=None`` (default) sends them to every host except api.openai.com
and Azure, whose models start a new message instead of continuing. A reply that repeats the prefix
has it removed.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from medheval.backends.base import BackendError
from medheval.judges import CredentialedDataError, JudgeError, JudgeRequest, make_judge, parse_spec
from medheval.judges.cache import default_cache_dir
from medheval.judges.endpoints import credentialed_refusal, endpoint_host, safe_base_url
from medheval.net.secrets import register_urls_in
from medheval.run.prompts import PROMPT_VERSION, build_prompt

# spec prefixes that name an API model (``transformers:``/``hf:`` are local judges, not models under test)
API_BACKENDS = ("openai", "openai-compatible", "openai_compatible", "vllm", "ollama", "azure", "azure-openai",
                "azure_openai", "anthropic", "claude")
# generate_chat overrides understood (the HF backend's generate() names)
CHAT_OVERRIDES = frozenset({"do_sample", "temperature", "top_p", "max_new_tokens"})
DEFAULT_CONCURRENCY = 16
OPENAI_HOSTS = ("api.openai.com",)


def is_api_model(model: str | None) -> bool:
    """Whether ``--model`` names an API model (``openai:…``, ``azure:…``, ``anthropic:…``) rather than
    a Hub id or a local folder (an existing path always counts as a folder)."""
    if not model or ":" not in model or os.path.exists(model):
        return False
    return model.split(":", 1)[0].strip().lower() in API_BACKENDS


def default_api_cache_dir() -> str:
    """``$MEDHEVAL_CACHE/api`` (beside the judges' cache), else ``~/.cache/medheval/api``."""
    return str(default_cache_dir().parent / "api")


def _record_credentialed(record: dict) -> bool | None:
    """The runner's rule (``meta.credentialed``, else a MIMIC source); ``None`` (unknown, treated as
    credentialed by the guard) for a record carrying neither field."""
    if "meta" not in record and "source" not in record:
        return None
    from medheval.data.schema import record_credentialed

    return record_credentialed({"meta": record.get("meta"), "source": record.get("source")})


def strip_echo(text: str, prefix: str) -> str:
    """``text`` without a leading copy of ``prefix`` (servers that echo the assistant prefill)."""
    if prefix and text.startswith(prefix):
        return text[len(prefix):]
    core = prefix.strip()
    if core and text.lstrip().startswith(core):
        return text.lstrip()[len(core):]
    return text


class APIBackend:
    """A model served over HTTP as the model under test (see the module docstring).

    Args:
        spec: ``openai:<model>@<base_url>``, ``azure:<deployment>@<endpoint>``, ``anthropic:<model>``
            (:func:`medheval.judges.parse_spec`; keys from ``OPENAI_API_KEY`` / ``AZURE_OPENAI_API_KEY``
            / ``ANTHROPIC_API_KEY``, only ever sent in request headers), or a dict as for
            :func:`medheval.judges.make_judge`.
        max_new_tokens, do_sample, temperature, top_p, seed: as :class:`~medheval.backends.hf.HFBackend`.
        concurrency: requests in flight at once.
        batch_size: records the runner hands over per call (and logs together); default
            ``4 * concurrency`` so every thread stays busy.
        cache_dir: the reply cache (default :func:`default_api_cache_dir`); ``False`` disables it.
        allow_remote_credentialed: host name(s) or base URL(s) approved for credentialed records.
        continue_final_message: send vLLM's continuation fields with an assistant prefix
            (``None``: yes, unless the host is api.openai.com or the backend is Azure/Anthropic).
        max_consecutive_failures: records failing in a row that stop a batch at once.
        name: the model id recorded with the predictions (default: the served model name).
        **options: more :func:`make_judge` options: ``timeout``, ``max_retries``,
            ``requests_per_minute``, ``backoff_base``, ``backoff_max``, ``headers``, ``api_version``,
            ``extra_body``.
    """

    needs_images = True
    supports_mitigations = False  # decoding-time mitigations run inside a local model's decoding loop
    per_request_seed = True  # generate_chat samples each request with its own "seed": batch freely
    accepted_overrides = CHAT_OVERRIDES  # the generation settings a call can send (a paper protocol drops the others)
    instruction = staticmethod(build_prompt)  # record -> text; a paper protocol sets its own

    def __init__(self, spec: str | dict, *, max_new_tokens: int = 64, do_sample: bool = False,
                 temperature: float | None = None, top_p: float | None = None, seed: int = 0,
                 concurrency: int = DEFAULT_CONCURRENCY, batch_size: int | None = None, cache_dir: Any = None,
                 allow_remote_credentialed: Any = None, continue_final_message: bool | None = None,
                 max_consecutive_failures: int = 8, name: str | None = None, timeout: float = 300.0,
                 deadline: float = 900.0, **options: Any):
        register_urls_in(spec)  # a ?api-key= or password in the spec: redacted from the errors below too
        if max_new_tokens < 1:
            raise BackendError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        try:
            fields = parse_spec(spec) if isinstance(spec, str) else {"backend": str(spec.get("backend", "")).lower()}
        except JudgeError as err:
            raise BackendError(f"--model {spec!r} is not an API model spec: {err}") from None
        options = {k: v for k, v in options.items() if k not in ("progress", "max_invalid_retries")}
        self.kind = {"azure-openai": "azure", "azure_openai": "azure", "claude": "anthropic"}.get(
            fields["backend"], fields["backend"])
        if self.kind not in ("azure", "anthropic"):
            self.kind = "openai"
        if self.kind != "anthropic":  # (Anthropic's requests put images first already)
            options["images_first"] = True  # images, then the prompt, like the HF backend's chat template
        try:
            self._client = make_judge(
                spec, cache_dir=default_api_cache_dir() if cache_dir is None else cache_dir,
                concurrency=concurrency, max_invalid_retries=0, progress=False, timeout=timeout, deadline=deadline,
                allow_remote_credentialed=allow_remote_credentialed, max_tokens=max_new_tokens,
                temperature=float(temperature if temperature is not None else 1.0) if do_sample else 0.0,
                max_consecutive_failures=max_consecutive_failures, **options)
        except (JudgeError, ValueError) as err:
            raise BackendError(f"--model {spec if isinstance(spec, str) else fields['backend']!r}: {err}") from None
        self._client.role = "model"  # its logs speak of model calls, not judge records
        self.name = name or self._client.model
        self.max_new_tokens = int(max_new_tokens)
        self.do_sample = bool(do_sample)
        self.temperature = temperature
        self.top_p = top_p
        self.seed = int(seed)
        self.concurrency = int(concurrency)
        self.batch_size = int(batch_size or 4 * self.concurrency)
        host = (urlsplit(self._client.base_url or "").hostname or "").lower()
        if continue_final_message is None:
            continue_final_message = self.kind == "openai" and host not in OPENAI_HOSTS
        self.continue_final_message = bool(continue_final_message) and self.kind == "openai"

    # -- the guard ------------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        return endpoint_host(self._client.base_url)

    def check_records(self, records: list[dict]) -> None:
        """Raise :class:`CredentialedDataError` naming the records (and ``--allow-remote-credentialed``)
        when credentialed records would go to a non-local endpoint without opt-in. Sends nothing."""
        if self._client.credentialed_allowed:
            return
        flagged = [str(r.get("id")) for r in records if _record_credentialed(r) is not False]
        if flagged:
            err = credentialed_refusal(flagged, self._client.base_url or "", self.kind)
            raise CredentialedDataError(f"model under test {self.name!r}: {err}")

    # -- generation ---------------------------------------------------------------------------
    def _sampling(self) -> dict:
        """Per-request params of plain generation (the client holds temperature and max_tokens)."""
        if not self.do_sample:
            return {}
        params: dict[str, Any] = {"seed": self.seed}
        if self.top_p is not None:
            params["top_p"] = self.top_p
        return params

    def format_prompt(self, record: dict, num_images: int) -> str:
        """The text sent for a record (the server applies the model's chat template around it, after
        the ``num_images`` images); recorded per prediction."""
        return self.instruction(record)

    def generate(self, records: list[dict], images: list[list] | None = None, *,
                 overrides: dict | None = None) -> list[str]:
        """One reply per record: ``build_prompt(record)`` after the record's images, in one user turn.
        ``overrides`` (HF names: ``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``) replace
        the backend's settings for this call, e.g. a benchmark's generation length."""
        images = images if images is not None else [[] for _ in records]
        if len(images) != len(records):
            raise BackendError(f"got {len(records)} records but {len(images)} image lists; pass one list per record")
        params = self._chat_params(None, overrides) if overrides else self._sampling()
        requests = [JudgeRequest(str(record["id"]), user=self.format_prompt(record, len(imgs)), images=list(imgs),
                                 credentialed=_record_credentialed(record), reply_format="raw",
                                 params=params)
                    for record, imgs in zip(records, images)]
        return self._run(requests, ["" for _ in requests])

    def _chat_params(self, seed: int | None, overrides: dict | None) -> dict:
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - CHAT_OVERRIDES)
        if unknown:
            raise BackendError(f"model {self.name}: generation setting(s) {unknown} cannot be sent to an API; "
                               f"supported: {sorted(CHAT_OVERRIDES)}")
        sample = overrides.get("do_sample", self.do_sample)
        params: dict[str, Any] = {"max_tokens": int(overrides.get("max_new_tokens", self.max_new_tokens))}
        if sample:
            temperature = overrides.get("temperature", self.temperature)
            params["temperature"] = float(temperature if temperature is not None else 1.0)
            top_p = overrides.get("top_p", self.top_p)
            if top_p is not None:
                params["top_p"] = float(top_p)
            params["seed"] = int(self.seed if seed is None else seed)
        else:
            params["temperature"] = 0.0
        return params

    def generate_chat(self, requests: list[dict], images: list[list] | None = None, *, seed: int | None = None,
                      overrides: dict | None = None) -> list[str]:
        """One reply per request (``{"id", "system", "user", "assistant_prefix"}``, optionally
        ``"credentialed"``: unknown counts as credentialed, and ``"seed"``: this request's sampling
        seed, sent in its body, else ``seed``); the reply continues the prefix and excludes it, and
        depends on its own request only, never on the others of the call. ``overrides`` take the HF
        names (``do_sample``, ``temperature``, ``top_p``, ``max_new_tokens``). A request's ``"text_first"``
        puts its text before its images; ``"enable_thinking"`` is sent as ``chat_template_kwargs``."""
        images = images if images is not None else [[] for _ in requests]
        if len(images) != len(requests):
            raise BackendError(f"got {len(requests)} requests but {len(images)} image lists; pass one list per request")
        params = self._chat_params(seed, overrides)
        built, prefixes = [], []
        for request, imgs in zip(requests, images):
            prefix = str(request.get("assistant_prefix") or "")
            if self.kind == "anthropic":
                prefix = prefix.rstrip()  # the Messages API refuses a prefill ending in whitespace
            messages = ([{"role": "system", "content": request["system"]}] if request.get("system") else []) + [
                {"role": "user", "content": request["user"]}]
            extra: dict[str, Any] = {}
            if prefix:
                messages.append({"role": "assistant", "content": prefix})
                if self.continue_final_message:
                    extra = {"continue_final_message": True, "add_generation_prompt": False}
            if request.get("enable_thinking") is not None:  # e.g. ClinHallu's chat_template_kwargs
                extra = {**extra, "chat_template_kwargs": {"enable_thinking": bool(request["enable_thinking"])}}
            credentialed = request.get("credentialed")
            own = dict(params)
            if request.get("text_first") and self.kind != "anthropic":  # the text, then the images (ClinHallu)
                own["images_first"] = False
            if "seed" in params and request.get("seed") is not None:  # sampling: the request's own seed
                own["seed"] = int(request["seed"])
            built.append(JudgeRequest(str(request["id"]), messages=messages, images=list(imgs),
                                      credentialed=credentialed if isinstance(credentialed, bool) else None,
                                      reply_format="raw", params=own, extra_body=extra))
            prefixes.append(prefix)
        replies = self._run(built, prefixes)
        if self.kind == "anthropic":  # the original prefix keeps the whitespace the prefill dropped
            replies = [reply.lstrip() if prefix else reply for reply, prefix in zip(replies, prefixes)]
        return replies

    def _run(self, requests: list[JudgeRequest], prefixes: list[str]) -> list[str]:
        try:
            results = self._client.run(requests)
        except CredentialedDataError as err:
            raise CredentialedDataError(f"model under test {self.name!r}: {err}") from None
        except JudgeError as err:
            raise BackendError(f"model {self.name} ({self.kind} endpoint {self.endpoint!r}): {err}") from None
        failed = [result for result in results if not result.ok]
        if failed:
            shown = ", ".join(repr(r.id) for r in failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
            raise BackendError(
                f"model {self.name} ({self.kind} endpoint {self.endpoint!r}): {len(failed)} of {len(results)} "
                f"record(s) got no reply ({shown}); first error: {failed[0].error}. Nothing was recorded for them; "
                f"the replies received are cached, so re-running the same command asks only for the failed ones.")
        return [strip_echo(result.value, prefix) for result, prefix in zip(results, prefixes)]

    # -- recording ----------------------------------------------------------------------------
    def usage(self) -> dict:
        """HTTP requests sent, cache hits, failed records, retries and tokens since this backend was built;
        ``invalid_usage``: replies whose usage numbers were not counts (not summed into the tokens)."""
        usage = self._client.usage()
        return {key: usage[key] for key in ("requests", "cached", "failures", "retries", "input_tokens",
                                            "output_tokens", "invalid_usage")}

    def model_revision(self) -> dict:
        """The model asked for and the model names the replies reported (:mod:`medheval.backends.revision`)."""
        from medheval.backends.revision import api_revision

        return api_revision(self.name, getattr(self._client, "reported_models", set()))

    def settings(self) -> dict:
        """What the predictions depend on (no credentials; transport options such as concurrency are
        left out so a resumed run may change them)."""
        settings: dict[str, Any] = {
            "backend": "api",
            "api": self.kind,
            "model": self.name,
            "endpoint": self.endpoint,
            "base_url": safe_base_url(self._client.base_url),
            "local": self._client.is_local,
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self._client.temperature,
            "top_p": self.top_p if self.do_sample else None,
            "seed": self.seed if self.do_sample and self.kind != "anthropic" else None,
            "prompt_version": getattr(self.instruction, "version", PROMPT_VERSION),
            "continue_final_message": self.continue_final_message,
        }
        for key in ("api_version", "extra_body"):
            if getattr(self._client, key, None):
                settings[key] = getattr(self._client, key)
        return settings

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"APIBackend({self.kind}:{self.name!r} at {self.endpoint!r})"


__all__ = ["API_BACKENDS", "APIBackend", "default_api_cache_dir", "is_api_model", "strip_echo"]

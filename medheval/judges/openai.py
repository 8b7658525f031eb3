"""OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, LM Studio, ...) and Azure OpenAI.

``POST {base_url}/chat/completions`` with ``Authorization: Bearer <key>`` (no header when no
key is configured, as local servers usually need none), ``temperature`` (0 by default),
``max_tokens``, ``top_p`` when set, and ``response_format={"type": "json_object"}`` (unless ``json_mode=False``); a server that rejects
``response_format`` with a 400 naming it is asked again without it (and not asked with it
again), likewise ``max_tokens`` → ``max_completion_tokens`` for models that want the latter.
Images go as ``image_url`` parts holding base64 data URLs. Azure: ``{endpoint}/openai/deployments/
{deployment}/chat/completions?api-version=...`` with an ``api-key`` header (or the v1 API when
the base URL ends in ``/openai/v1``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote_plus

from medheval.judges.base import Completion, _Item
from medheval.judges.http import HTTPJudge, reply_text
from medheval.net.secrets import redact_data, register_named

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_AZURE_API_VERSION = "2024-10-21"


def openai_messages(item: _Item, images_first: bool = False) -> list[dict]:
    """The conversation in chat-completions form, images as data-URL parts of one user message
    (after its text, or before it with ``images_first``)."""
    out = []
    for index, message in enumerate(item.messages):
        if item.images and index == item.image_index:
            text = [{"type": "text", "text": message["content"]}]
            images = [{"type": "image_url", "image_url": {"url": image.data_url}} for image in item.images]
            content: Any = images + text if images_first else text + images
        else:
            content = message["content"]
        out.append({"role": message["role"], "content": content})
    return out


class OpenAIJudge(HTTPJudge):
    """An OpenAI-compatible chat-completions endpoint as judge.

    Args:
        model: the model name sent in the request (``gpt-4o``, the vLLM served model name...).
        base_url: default ``https://api.openai.com/v1``.
        api_key: sent as ``Authorization: Bearer``; never stored, logged or cached.
        json_mode: ask for ``response_format={"type": "json_object"}`` (falls back when refused).
        extra_body: more fields for the request body (e.g. ``{"seed": 0}``); part of the cache key.
        images_first: put a message's images before its text (how the model under test is asked,
            like the HF backend's chat template); part of the cache key when set.
        **options: the :class:`~medheval.judges.base.Judge` options.
    """

    backend = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 json_mode: bool = True, extra_body: dict | None = None, images_first: bool = False,
                 **options: Any):
        super().__init__(model, base_url=base_url or DEFAULT_OPENAI_BASE_URL, api_key=api_key, **options)
        self.json_mode = bool(json_mode)
        self.extra_body = dict(extra_body or {})
        register_named(self.extra_body)  # extra_body={"api_key": ...}: redacted by value wherever it appears
        self.images_first = bool(images_first)
        self._json_mode_refused = False
        self._max_tokens_field = "max_tokens"

    def _params(self) -> dict:
        params = {**super()._params(), "json_mode": self.json_mode}
        if self.extra_body:
            params["extra_body"] = self.extra_body
        if self.images_first:
            params["images_first"] = True
        return params

    def describe(self) -> dict:
        out = {**super().describe(), "json_mode": self.json_mode and not self._json_mode_refused}
        if self.extra_body:
            out["extra_body"] = redact_data(self.extra_body)
        return out

    def _url(self) -> str:
        return self._endpoint("/chat/completions")

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _request(self, item: _Item) -> tuple[str, dict, dict]:
        params = {**self._sampling(), **item.request.params}
        images_first = bool(params.pop("images_first", self.images_first))  # a request may place its images itself
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": openai_messages(item, images_first),
            "temperature": params.pop("temperature"),
            self._max_tokens_field: params.pop("max_tokens"),
            **params,  # top_p, seed
        }
        if self.json_mode and not self._json_mode_refused and item.request.reply_format == "json":
            payload["response_format"] = {"type": "json_object"}
        payload.update(self.extra_body)
        payload.update(item.request.extra_body)
        return self._url(), self._headers(), payload

    def _adapt(self, status: int, message: str, payload: dict) -> dict | None:
        lowered = message.lower()
        if "response_format" in payload and ("response_format" in lowered or "json_object" in lowered):
            self._json_mode_refused = True
            return {k: v for k, v in payload.items() if k != "response_format"}
        if "max_tokens" in payload and "max_completion_tokens" in lowered:
            self._max_tokens_field = "max_completion_tokens"
            adapted = {k: v for k, v in payload.items() if k != "max_tokens"}
            adapted["max_completion_tokens"] = payload["max_tokens"]
            return adapted
        return None

    def _parse(self, body: Any) -> Completion:
        choice = body["choices"][0]
        message = choice["message"]
        content = message.get("content")
        if content is None and message.get("refusal"):
            raise ValueError(f"the model refused, with no content: {str(message['refusal'])[:200]}")
        text = reply_text(content, "message.content")
        note = f"the reply was cut off at max_tokens={self.max_tokens}" if choice.get("finish_reason") == "length" else None
        return Completion.from_usage(text, body.get("usage"), "prompt_tokens", "completion_tokens", note)

    def _key_hint(self) -> str:
        return "a key was sent" if self._api_key else "none configured: set OPENAI_API_KEY or pass api_key"


class AzureOpenAIJudge(OpenAIJudge):
    """Azure OpenAI: ``model`` is the deployment name; key in the ``api-key`` header."""

    backend = "azure"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 api_version: str | None = None, **options: Any):
        from medheval.judges.base import JudgeError

        if not base_url:
            raise JudgeError(
                "the azure judge needs the resource endpoint: azure:<deployment>@https://<resource>.openai.azure.com "
                "or set AZURE_OPENAI_ENDPOINT"
            )
        super().__init__(model, base_url=base_url, api_key=api_key, **options)
        # an api-version in the endpoint's query (…azure.com/?api-version=…) is the version: sent once, recorded
        # (it was sent beside the default's, api-version=A&api-version=2024-10-21, and the default recorded)
        in_url = [unquote_plus(item.partition("=")[2]) for item in self._url_query.split("&")
                  if unquote_plus(item.partition("=")[0]).strip().lower() == "api-version"]
        if len(set(in_url)) > 1 or (api_version and in_url and str(api_version) != in_url[0]):
            raise JudgeError(f"the azure endpoint's query names api-version {', '.join(sorted(set(in_url)))}"
                             + (f" and api_version is {api_version}" if api_version else "")
                             + ": give the version once")
        self.api_version = str(api_version or (in_url[0] if in_url else DEFAULT_AZURE_API_VERSION))
        self._other_query = "&".join(item for item in self._url_query.split("&") if item and
                                     unquote_plus(item.partition("=")[0]).strip().lower() != "api-version")

    def describe(self) -> dict:
        return {**super().describe(), "api_version": self.api_version}

    def _params(self) -> dict:
        return {**super()._params(), "api_version": self.api_version}

    def _url(self) -> str:
        if self._url_root.endswith("/openai/v1"):
            return self._endpoint("/chat/completions")
        query = "&".join(q for q in (self._other_query, f"api-version={quote(self.api_version, safe='')}") if q)
        return f"{self._url_root}/openai/deployments/{self.model}/chat/completions?{query}"

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["api-key"] = self._api_key
        return headers

    def _key_hint(self) -> str:
        return "a key was sent" if self._api_key else "none configured: set AZURE_OPENAI_API_KEY or pass api_key"


__all__ = ["AzureOpenAIJudge", "DEFAULT_OPENAI_BASE_URL", "OpenAIJudge", "openai_messages"]

"""Anthropic's Messages API (the paper's S_h judge was Claude 3.5 Sonnet).

``POST {base_url}/v1/messages`` with ``x-api-key`` and ``anthropic-version: 2023-06-01``; system
messages go in the top-level ``system`` field; images as base64 ``image`` blocks before the
text; the reply is the text blocks of ``content``; usage from ``input_tokens``/``output_tokens``. A conversation ending
with an assistant message is a prefill: the reply continues that text.
"""

from __future__ import annotations

from typing import Any

from medheval.judges.base import Completion, _Item
from medheval.judges.http import HTTPJudge, reply_text

DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"


class AnthropicJudge(HTTPJudge):
    """A Claude model through the Messages API (or a compatible proxy).

    Args:
        model: e.g. ``claude-3-5-sonnet-20240620``.
        base_url: default ``https://api.anthropic.com`` (a base ending in ``/v1`` is accepted too).
        api_key: sent as ``x-api-key``; never stored, logged or cached.
        **options: the :class:`~medheval.judges.base.Judge` options.
    """

    backend = "anthropic"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any):
        super().__init__(model, base_url=base_url or DEFAULT_ANTHROPIC_BASE_URL, api_key=api_key, **options)

    def describe(self) -> dict:
        return {**super().describe(), "anthropic_version": ANTHROPIC_VERSION}

    def _request(self, item: _Item) -> tuple[str, dict, dict]:
        system_parts = []
        messages = []
        for index, message in enumerate(item.messages):
            if message["role"] == "system":
                system_parts.append(message["content"])
                continue
            if item.images and index == item.image_index:
                content: Any = [
                    {"type": "image", "source": {"type": "base64", "media_type": image.mime, "data": image.base64}}
                    for image in item.images
                ] + [{"type": "text", "text": message["content"]}]
            else:
                content = message["content"]
            messages.append({"role": message["role"], "content": content})
        params = {**self._sampling(), **item.request.params}
        params.pop("seed", None)  # the Messages API has no seed
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.pop("max_tokens"),
            "temperature": params.pop("temperature"),
            "messages": messages,
            **params,  # top_p
            **item.request.extra_body,
        }
        if system_parts:
            payload["system"] = "\n\n".join(system_parts)
        headers = {"Content-Type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return self._url(), headers, payload

    def _url(self) -> str:
        return self._endpoint("/messages" if self._url_root.endswith("/v1") else "/v1/messages")

    def _parse(self, body: Any) -> Completion:
        text = reply_text(body["content"], "content")
        note = None
        if body.get("stop_reason") == "max_tokens":
            note = f"the reply was cut off at max_tokens={self.max_tokens}"
        elif body.get("stop_reason") == "refusal":
            note = "the model refused"
        return Completion.from_usage(text, body.get("usage"), "input_tokens", "output_tokens", note)

    def _key_hint(self) -> str:
        return "a key was sent" if self._api_key else "none configured: set ANTHROPIC_API_KEY or pass api_key"


__all__ = ["ANTHROPIC_VERSION", "AnthropicJudge", "DEFAULT_ANTHROPIC_BASE_URL"]

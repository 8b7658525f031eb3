"""Images attached to judge requests: a content digest (for the cache key) and base64 encoding."""

from __future__ import annotations

import base64
import hashlib
import io
import os
from dataclasses import dataclass, field
from typing import Any

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _sniff(data: bytes) -> str | None:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


@dataclass
class JudgeImage:
    """One image: ``digest`` (sha256, for cache keys), ``mime`` and the encoded ``data`` bytes."""

    digest: str
    mime: str
    data: bytes = field(repr=False)
    source: Any = field(default=None, repr=False, compare=False)  # the PIL image, when given one

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.base64}"

    def to_pil(self):
        if self.source is not None:
            return self.source
        from medheval.data.images import check_pixels, open_image

        image = open_image(io.BytesIO(self.data), f"judge image {self.digest[:12]}")
        check_pixels(image, f"judge image {self.digest[:12]} ({len(self.data)} bytes)")
        image.load()
        return image


def to_judge_image(image: Any) -> JudgeImage:
    """A PIL image, raw bytes (PNG/JPEG/GIF/WebP, anything else is re-encoded as PNG) or a file path."""
    if isinstance(image, JudgeImage):
        return image
    if isinstance(image, (str, os.PathLike)):
        with open(image, "rb") as handle:
            image = handle.read()
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        mime = _sniff(data)
        if mime is None:
            from medheval.data.images import check_pixels, open_image

            try:
                pil = open_image(io.BytesIO(data), "the image")
                check_pixels(pil, "the image")
                pil.load()
            except Exception as err:  # noqa: BLE001 - say what was wrong
                raise ValueError(f"image bytes are not a readable image ({len(data)} bytes): {err}") from err
            return to_judge_image(pil)
        return JudgeImage(hashlib.sha256(data).hexdigest(), mime, data)
    if hasattr(image, "save") and hasattr(image, "mode") and hasattr(image, "size"):  # PIL.Image.Image
        pil = image if image.mode in ("RGB", "RGBA", "L", "LA") else image.convert("RGB")
        digest = hashlib.sha256(f"{pil.mode}|{pil.size}|".encode() + pil.tobytes()).hexdigest()
        buffer = io.BytesIO()
        pil.save(buffer, format="PNG")
        return JudgeImage(digest, "image/png", buffer.getvalue(), source=image)
    raise ValueError(f"unsupported image type {type(image).__name__}: pass a PIL image, bytes or a file path")


__all__ = ["JudgeImage", "to_judge_image"]

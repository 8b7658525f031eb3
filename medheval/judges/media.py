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
        return _decoded(self.data, f"judge image {self.digest[:12]}")


def _decoded(data: bytes, what: str) -> Any:
    """``data`` decoded in full as a PIL image (allowed formats, pixel cap); ``ValueError`` naming ``what`` when
    it does not decode (corrupt, cut short after a valid header, not an image): never sent half-read."""
    from PIL import Image

    from medheval.data.images import ImageDecodeError, check_pixels, open_image

    try:
        image = open_image(io.BytesIO(data), what)
        check_pixels(image, what)
        image.load()
    except (ImageDecodeError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise ValueError(f"{what} is not a readable image ({len(data)} bytes): {err}") from err
    return image


def to_judge_image(image: Any) -> JudgeImage:
    """A PIL image, raw bytes (PNG/JPEG/GIF/WebP, anything else is re-encoded as PNG) or a file path. Bytes
    and files are checked to decode in full first (``ValueError`` naming the file otherwise), so a file cut
    short after a valid header never reaches a judge."""
    if isinstance(image, JudgeImage):
        return image
    what = "the image bytes"
    if isinstance(image, (str, os.PathLike)):
        what = f"image file {os.fspath(image)}"
        with open(image, "rb") as handle:
            image = handle.read()
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        decoded = _decoded(data, what)
        mime = _sniff(data)
        if mime is None:
            return to_judge_image(decoded)
        return JudgeImage(hashlib.sha256(data).hexdigest(), mime, data)
    if hasattr(image, "save") and hasattr(image, "mode") and hasattr(image, "size"):  # PIL.Image.Image
        pil = image if image.mode in ("RGB", "RGBA", "L", "LA") else image.convert("RGB")
        digest = hashlib.sha256(f"{pil.mode}|{pil.size}|".encode() + pil.tobytes()).hexdigest()
        buffer = io.BytesIO()
        pil.save(buffer, format="PNG")
        return JudgeImage(digest, "image/png", buffer.getvalue(), source=image)
    raise ValueError(f"unsupported image type {type(image).__name__}: pass a PIL image, bytes or a file path")


__all__ = ["JudgeImage", "to_judge_image"]

"""LLaVA-Med-1.5's square canvas for grayscale images, for the MedHEval paper protocols.

LLaVA-Med-1.5's released ``process_images`` (``llava/mm_utils.py`` of MedHEval's baselines, both the baseline and
the mitigation copies) opens each image in the mode it was stored in and, with ``image_aspect_ratio = pad``,
pastes it on a square canvas before CLIP's resize and crop. The canvas colour depends on that mode, with
m = the image processor's ``image_mean``:

* an RGB image: (⌊255·m_R⌋, ⌊255·m_G⌋, ⌊255·m_B⌋) = (122, 116, 104) for CLIP, what the HF
  ``LlavaImageProcessor(do_pad=True)`` also uses;
* a grayscale (mode ``L``) image, as MIMIC-CXR-JPG's chest X-rays are: one grey ⌊255·(m_R + m_G + m_B)/3⌋ = 114.

The resolver decodes every image as RGB and keeps its stored mode in ``image.info``
(:data:`medheval.data.images.SOURCE_MODE`). :func:`pad_grayscale` puts such an image on its grey square before the
processor, whose own padding then has nothing left to do; the result equals the released code's canvas converted to
RGB. The image sits at ((side − w) // 2, (side − h) // 2), the HF processor's offset. The released code draws the
offset along the padded axis from {(side − short) // 2, (side − short) // 2 + 1} with an unseeded ``random``, so its
1-pixel shift cannot be reproduced; this takes the first.
"""

from __future__ import annotations

from typing import Any, Sequence

from PIL import Image

from medheval.data.images import SOURCE_MODE


def grey_for(image_mean: Sequence[float]) -> int:
    """The canvas grey of a mode-``L`` image: ⌊255 · mean(image_mean)⌋ (114 for CLIP's mean)."""
    return int(255 * sum(image_mean) / len(image_mean))


def pad_grayscale(image: Image.Image, image_mean: Sequence[float]) -> Image.Image:
    """``image`` on a square of :func:`grey_for` when it was stored as grayscale and is not square; else itself."""
    if image.info.get(SOURCE_MODE) != "L" or image.width == image.height:
        return image
    side = max(image.size)
    grey = grey_for(image_mean)
    canvas = Image.new("RGB", (side, side), (grey, grey, grey))
    canvas.paste(image.convert("RGB"), ((side - image.width) // 2, (side - image.height) // 2))
    canvas.info[SOURCE_MODE] = "L"
    return canvas


def square_padding_mean(processor: Any) -> Sequence[float] | None:
    """The ``image_mean`` of a processor whose image processor pads to a square: a ``LlavaImageProcessor`` (or its
    PIL or fast variant) with ``do_pad``, as LLaVA-Med-1.5's converted processor is. ``None`` for any other, where
    the released code's canvas does not arise (LLaVA-NeXT's tiles; other processors' ``do_pad`` pads a batch)."""
    image_processor = getattr(processor, "image_processor", None)
    if not type(image_processor).__name__.startswith("LlavaImageProcessor"):
        return None
    if not getattr(image_processor, "do_pad", False):
        return None
    return getattr(image_processor, "image_mean", None) or None

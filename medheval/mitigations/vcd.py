r"""VCD — Visual Contrastive Decoding.

Leng, Zhang, Chen, Li, Lu, Miao, Bing, *Mitigating Object Hallucinations in Large
Vision-Language Models through Visual Contrastive Decoding*, CVPR 2024 (arXiv 2311.16922);
code ``DAMO-NLP-SG/VCD``.

Per step, with ``ℓ`` the logits given the image and ``ℓ'`` the logits given a
diffusion-noised copy of it:

.. math::
    s = (1+\alpha)\,\ell - \alpha\,\ell',\qquad
    s(y) = -\infty \text{ unless } \ell(y) \ge \log\beta + \max \ell

The noised image is ``v' = √ᾱ_t · v + √(1−ᾱ_t) · ε`` on the *processed* (normalised)
``pixel_values``, with the reference schedule ``β_t = sigmoid(linspace(−6, 6, 1000)) ·
(5e−3 − 1e−5) + 1e−5``, ``ᾱ_t = ∏_{s≤t}(1−β_s)`` and ``t = noise_step`` used as a 0-based
index (√ᾱ_500 ≈ 0.8630, √(1−ᾱ_500) ≈ 0.5052).

Presets (``preset=``; explicit arguments override them): ``medheval`` (default) and
``official`` are the same, α = 1, β = 0.1, t = 500: MedHEval's runner and VCD's
``object_hallucination_vqa`` defaults agree (VCD's POPE script uses β = 0.2). The noised stream has the same tokens as the
clean one, so both share one batch and one KV cache (2B rows per forward).

Differences from the upstream code (and why):

- The noised image really reaches the model. MedHEval's copy built the input embeddings
  from the clean image before ``generate``, so its "contrast" branch saw the clean image
  (``reference/medheval_repo.md`` §8).
- Works with greedy decoding as well as sampling (VCD's sampler was patched only into
  the sampling path, issue #8), and the base decoding follows the generation config like
  every other method instead of forcing sampling at T = 1.
- ``noise_seed`` (default 0) draws ε from a private generator reseeded for each image, with
  the same seed for every image (tile k of a LLaVA-NeXT image: ``noise_seed + k``), so results
  are reproducible and do not depend on batch composition, and every item is noised with the
  same draw; ``noise_seed=None`` draws fresh noise per item from torch's global RNG, as the
  upstream code does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import torch

from medheval.decoding.contrast import LogitContrast, PlausibilityCutoff
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset

NUM_DIFFUSION_STEPS = 1000


@functools.lru_cache(maxsize=4)
def _schedule(num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    betas = torch.sigmoid(torch.linspace(-6, 6, num_steps, dtype=torch.float64)) * (5e-3 - 1e-5) + 1e-5
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    return betas, alphas_cumprod


def noise_schedule(noise_step: int, num_steps: int = NUM_DIFFUSION_STEPS) -> tuple[float, float]:
    """``(√ᾱ_t, √(1−ᾱ_t))`` of VCD's schedule at ``t = noise_step`` (0-based)."""
    if not 0 <= int(noise_step) < num_steps:
        raise MitigationError(f"VCD noise_step must be in [0, {num_steps}), got {noise_step}")
    _, alphas_cumprod = _schedule(num_steps)
    a = float(alphas_cumprod[int(noise_step)])
    return a**0.5, (1.0 - a) ** 0.5


def add_diffusion_noise(
    pixel_values: torch.Tensor, noise_step: int = 500, seed: int | None = 0, image_grid_thw: torch.Tensor | None = None
) -> torch.Tensor:
    """VCD's forward-diffusion distortion of processed ``pixel_values``: ``√ᾱ_t·v + √(1−ᾱ_t)·ε``.

    Args:
        pixel_values: ``[N, C, H, W]`` (LLaVA, Gemma 3), ``[N, P, C, H, W]`` (LLaVA-NeXT tiles), or
            Qwen-VL's flattened patches ``[Σ t·h·w, C·T·P·P]`` with ``image_grid_thw`` (one ``[t, h, w]``
            row per image). The noise is added elementwise to the *processed* (normalised) values in
            every layout, as upstream VCD does for LLaVA; for Qwen each image's block of patch rows is
            one unit (its temporal copies get independent noise).
        noise_step: ``t`` (0-based) in the 1000-step schedule.
        seed: ``int`` — ε for every image ``[C, H, W]`` (each tile) is drawn from a generator
            seeded with ``seed + tile index``, so it does not depend on the batch; ``None`` —
            one draw from the global RNG (upstream behaviour).
    """
    signal, noise_scale = noise_schedule(noise_step)
    values = pixel_values.float()
    if seed is None:
        noise = torch.randn_like(values)
    elif values.dim() == 2:
        if image_grid_thw is None:
            raise MitigationError(
                f"VCD: flattened pixel_values {tuple(values.shape)} need image_grid_thw (Qwen-VL) to find each image"
            )
        sizes = image_grid_thw.prod(-1).tolist()
        if sum(sizes) != values.shape[0]:
            raise MitigationError(f"VCD: image_grid_thw covers {sum(sizes)} patch rows, pixel_values has {values.shape[0]}")
        generator = torch.Generator(device="cpu")
        chunks = []
        for size in sizes:
            generator.manual_seed(int(seed))
            chunks.append(torch.randn((int(size), values.shape[1]), generator=generator))
        noise = torch.cat(chunks).to(values.device)
    else:
        unit_shape = values.shape[-3:]
        flat = values.reshape(-1, *unit_shape) if values.dim() == 5 else values
        tiles_per_image = values.shape[1] if values.dim() == 5 else 1
        noise = torch.empty_like(flat)
        generator = torch.Generator(device="cpu")
        for index in range(flat.shape[0]):
            generator.manual_seed(int(seed) + index % tiles_per_image)
            noise[index] = torch.randn(unit_shape, generator=generator).to(flat.device)
        noise = noise.reshape(values.shape)
    return (signal * values + noise_scale * noise).to(pixel_values.dtype)


@dataclasses.dataclass
class VCD(DecodingMethod):
    """Visual Contrastive Decoding (see the module docstring for the formula and defaults).

    Args:
        preset: ``"medheval"`` (default) or ``"official"`` (identical for VCD); the unset options below
            take the preset's values.
        alpha: contrast strength α (``0`` = plain decoding).
        beta: plausibility cutoff β (``0`` = no cutoff).
        noise_step: diffusion step ``t`` of the distortion (0–999).
        noise_seed: seed of the noise (``None`` = torch's global RNG); not part of the presets.
    """

    preset: str = DEFAULT_PRESET
    alpha: float = from_preset()
    beta: float = from_preset()
    noise_step: int = from_preset()
    noise_seed: int | None = 0

    name = "vcd"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"alpha": 1.0, "beta": 0.1, "noise_step": 500},
        "official": {"alpha": 1.0, "beta": 0.1, "noise_step": 500},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "alpha": "MedHEval `model_vqa.py` (`cd_alpha=1`); VCD `object_hallucination_vqa_llava.py` argparse",
        "beta": "MedHEval `cd_beta=0.1`; VCD argparse (its POPE script uses 0.2)",
        "noise_step": "MedHEval `add_diffusion_noise(image, 500)`; VCD argparse `noise_step=500`",
    }

    def __post_init__(self):
        resolve_preset(self)
        noise_schedule(self.noise_step)  # validates the step
        self._cutoff = PlausibilityCutoff(self.beta)
        self._contrast = LogitContrast(self.alpha)

    def check(self, model, ctx: DecodingContext) -> None:
        if ctx.main.inputs.get("pixel_values") is None:
            raise MissingInternalError(
                "VCD needs the raw pixel_values to noise them: pass the processor's pixel_values to generate "
                "(pre-computed mm_encoder_outputs/inputs_embeds cannot be noised)"
            )

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        noised = add_diffusion_noise(ctx.main.inputs["pixel_values"], self.noise_step, self.noise_seed,
                                     ctx.main.inputs.get("image_grid_thw"))
        return [ctx.main.replace("noised", pixel_values=noised)]

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._cutoff(self._contrast(logits["main"], logits["noised"]), logits["main"])


__all__ = ["VCD", "add_diffusion_noise", "noise_schedule"]

"""Image-blind controls (``--control no_image|blank|noise``): does an answer depend on the image at all?

The model under test gets the same question with its images replaced, before any backend or mitigation
sees them (one place, :meth:`Control.images`):

- ``none``: the record's images (the ordinary run).
- ``no_image``: no image. Every backend then renders the prompt it renders for a text-only record:
  the HF backend's chat template gets no image part (so no image token is in the prompt and the processor
  gets no ``images``); the LLaVA-1.5 fallback writes no ``<image>`` line; an API request's user turn is the
  prompt text alone (no image part).
  Nothing is read from the image roots.
- ``blank``: per image, a black image of the same size (mode ``L`` kept, any other mode as RGB).
- ``noise``: per image, uniform random pixels (0–255 per channel) of the same size and mode, drawn from
  ``numpy.random.default_rng([seed, h])`` where ``h`` is the first 8 bytes of SHA-256 of
  ``"<record id>/<image index>"``: the same image for a record whatever the batch, shard or order.
  The seed is the run's ``--seed`` and is recorded in ``run.json``/``results.json`` (``settings.control``).

A 3D model (Med-StepBench's PET/CT volumes, ``record["volumes"]``: {name: 3D array}) gets the same treatment
(:meth:`Control.volumes`): ``no_image`` reads no volume and hands none over; ``blank`` gives zeros of each
volume's shape and dtype; ``noise`` gives uniform values between the volume's own minimum and maximum (so a CT
stays in its HU range), same shape and dtype, from ``numpy.random.default_rng([seed, h])`` with ``h`` hashed
from ``"<record id>/<volume name>"`` (e.g. ``volume``, ``volume_pet``) as for images.

Mitigations see what the model sees: with ``blank`` or ``noise`` a contrastive method (VCD, M3ID, AvisC,
DAMRO …) derives its distorted or masked stream from the blank/noise image. With ``no_image`` there is no
image to contrast, so only image-free methods (DoLa) combine with it; the others are refused before
anything runs.

A run's identity carries the control (``settings.control`` in ``run.json``, ``"control"`` in each
``predictions.jsonl`` line and its log key, the grid's sub-folder): a blind run never mixes with the
with-image run. Runs written before controls existed have none of these fields and read as ``none``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from PIL import Image

CONTROLS = ("none", "no_image", "blank", "noise")
# methods that never look at the image: they combine with no_image (the others contrast or mask the image)
IMAGE_FREE_MITIGATIONS = frozenset({"dola"})


class ControlError(ValueError):
    """An unknown control, or a control that cannot combine with the run (the message says what to do)."""


def check_control(kind: str, where: str = "--control") -> str:
    """``kind`` when it is one of :data:`CONTROLS`, else a :class:`ControlError` naming the choices."""
    if kind not in CONTROLS:
        raise ControlError(f"{where} {kind!r}: unknown control; choose one of {', '.join(CONTROLS)}")
    return kind


def control_of(settings: Mapping[str, Any] | None) -> str:
    """The control a run's ``settings`` record (``"none"`` for runs written before controls existed)."""
    recorded = (settings or {}).get("control")
    if isinstance(recorded, Mapping):
        return str(recorded.get("kind", "none"))
    return str(recorded) if recorded else "none"


def _mode(image: Image.Image) -> str:
    return "L" if image.mode == "L" else "RGB"


def blank_like(image: Image.Image) -> Image.Image:
    """A black image of ``image``'s size (mode ``L`` kept, anything else RGB)."""
    return Image.new(_mode(image), image.size, 0)


def noise_like(image: Image.Image, seed: int, record_id: str, index: int) -> Image.Image:
    """Uniform noise of ``image``'s size and mode, reproducible from (seed, record id, image index)."""
    rng = _stream(seed, record_id, index)
    width, height = image.size
    mode = _mode(image)
    shape = (height, width) if mode == "L" else (height, width, 3)
    return Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode)


def _stream(seed: int, record_id: str, key: str | int) -> np.random.Generator:
    """The noise stream of one image or volume: ``default_rng([seed, first 8 bytes of SHA-256("<id>/<key>")])``."""
    digest = int.from_bytes(hashlib.sha256(f"{record_id}/{key}".encode()).digest()[:8], "big")
    return np.random.default_rng([int(seed), digest])


def noise_volume_like(volume: np.ndarray, seed: int, record_id: str, name: str) -> np.ndarray:
    """Uniform noise of ``volume``'s shape and dtype between its minimum and maximum, reproducible from
    (seed, record id, volume name)."""
    volume = np.asarray(volume)
    low, high = (float(volume.min()), float(volume.max())) if volume.size else (0.0, 1.0)
    return _stream(seed, record_id, name).uniform(low, high, size=volume.shape).astype(volume.dtype)


@dataclass(frozen=True)
class Control:
    """What the model sees in place of a record's images (module docstring)."""

    kind: str = "none"
    seed: int = 0

    def __post_init__(self) -> None:
        check_control(self.kind)

    @property
    def blind(self) -> bool:
        return self.kind != "none"

    def describe(self) -> dict[str, Any] | None:
        """What ``run.json``/``results.json`` record under ``settings.control`` (``None`` for ``none``)."""
        if not self.blind:
            return None
        return {"kind": self.kind, **({"seed": self.seed} if self.kind == "noise" else {})}

    def images(self, record: Mapping[str, Any], images: Sequence[Any]) -> list[Any]:
        """The images the model gets for ``record`` in place of ``images``."""
        if self.kind == "none":
            return list(images)
        if self.kind == "no_image":
            return []
        if self.kind == "blank":
            return [blank_like(image) for image in images]
        return [noise_like(image, self.seed, str(record["id"]), index) for index, image in enumerate(images)]

    def loader(self, load: Callable[[Mapping[str, Any]], Sequence[Any]] | None
               ) -> Callable[[Mapping[str, Any]], list[Any]] | None:
        """``load`` (record -> its images) with the control applied; ``no_image`` reads nothing."""
        if load is None or self.kind == "none":
            return None if load is None else (lambda record: list(load(record)))
        if self.kind == "no_image":
            return lambda record: []
        return lambda record: self.images(record, load(record))

    def volumes(self, record: Mapping[str, Any], volumes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The 3D volumes the model gets for ``record`` in place of ``volumes`` (module docstring)."""
        if self.kind == "none":
            return dict(volumes)
        if self.kind == "no_image":
            return {}
        if self.kind == "blank":
            return {name: np.zeros_like(np.asarray(volume)) for name, volume in volumes.items()}
        return {name: noise_volume_like(volume, self.seed, str(record["id"]), name) for name, volume in volumes.items()}

    def volume_loader(self, read: Callable[[Mapping[str, Any]], Mapping[str, np.ndarray]]
                      ) -> Callable[[Mapping[str, Any]], dict[str, np.ndarray]]:
        """``read`` (record -> its volumes) with the control applied; ``no_image`` reads nothing."""
        if self.kind == "no_image":
            return lambda record: {}
        return lambda record: self.volumes(record, read(record))

    def check_mitigations(self, mitigations: Sequence[str]) -> None:
        """``no_image`` leaves an image-contrasting method nothing to contrast: refused, naming the method."""
        if self.kind != "no_image":
            return
        from medheval.mitigations import NO_MITIGATION, parse_spec

        needing = [spec for spec in mitigations
                   if parse_spec(spec)[0] not in (*NO_MITIGATION, *IMAGE_FREE_MITIGATIONS)]
        if needing:
            raise ControlError(f"--control no_image with --mitigation {', '.join(needing)}: these methods contrast "
                               f"or mask the image, and a no_image run has none. Use --control blank or noise "
                               f"(the method then works on that image), or an image-free method "
                               f"({', '.join(sorted(IMAGE_FREE_MITIGATIONS))})")


def control_slug(control: str, where: str = "control") -> str:
    """``control`` as a piece of a folder or file name: one of :data:`CONTROLS` (else :class:`ControlError`),
    which are all letters, digits and ``_`` already."""
    if not isinstance(control, str):
        raise ControlError(f"{where} {control!r}: unknown control; choose one of {', '.join(CONTROLS)}")
    return check_control(control, where)


def cell_slug(mitigation_slug: str, control: str) -> str:
    """A grid cell's folder: the mitigation's (as before controls existed) with ``__<control>`` when blind
    (:func:`control_slug`: an unknown control never names a folder)."""
    return mitigation_slug if control == "none" else f"{mitigation_slug}__{control_slug(control)}"


__all__ = ["CONTROLS", "Control", "ControlError", "IMAGE_FREE_MITIGATIONS", "blank_like", "cell_slug",
           "check_control", "control_of", "control_slug", "noise_like",
           "noise_volume_like"]

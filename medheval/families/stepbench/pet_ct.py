"""PET/CT volumes (NIfTI, read with ``nibabel``) and their 2D tri-planar views.

A 3D-capable model receives the volume (:func:`load_volume`); a 2D model receives axial, coronal
and sagittal slices rendered with a CT window or as PET / fused PET-on-CT (:func:`render_view`).
Paths are relative to the data folder and can never leave it (:class:`medheval.data.images.LocalFolderSource`).

``nibabel`` is an optional extra: ``pip install medheval[stepbench]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# CT display windows (centre, width) in Hounsfield units: the usual lung and mediastinal settings.
CT_WINDOWS: dict[str, tuple[float, float]] = {"lung": (-600.0, 1500.0), "mediastinal": (50.0, 350.0)}
PET_SUV_MAX = 5.0  # PET shown on SUV 0..5 (a common display range for FDG)
PLANE_AXES = {"axial": 2, "coronal": 1, "sagittal": 0}  # volume index order (x, y, z), RAS-like
MAX_VOXELS_ENV = "MEDHEVAL_VOLUME_MAX_VOXELS"
DEFAULT_MAX_VOXELS = 2**28  # one volume, 1 GiB as float32 (a whole-body CT of 512x512x1000 slices is 262 M)


class VolumeTooLarge(ValueError):
    """A NIfTI header declares more voxels than the cap (:func:`max_voxels`); nothing was read."""


def _nibabel():
    try:
        import nibabel
    except ImportError as error:  # pragma: no cover - depends on the extra
        raise ImportError("reading NIfTI volumes needs nibabel: pip install 'medheval[stepbench]'") from error
    return nibabel


def volume_path(data_dir: str | Path, ref: str) -> Path:
    """``DIR/ref``, refused when ``ref`` is absolute, has ``..``, or resolves outside ``DIR``."""
    from medheval.data.images import LocalFolderSource

    path = LocalFolderSource(data_dir).path_for(ref)
    if not path.is_file():
        raise FileNotFoundError(f"volume {ref!r} not found under {data_dir} (looked for {path})")
    return path


def max_voxels() -> int:
    """The cap on one volume: ``MEDHEVAL_VOLUME_MAX_VOXELS``, default :data:`DEFAULT_MAX_VOXELS`."""
    from medheval.data.images import _env_number

    return int(_env_number(MAX_VOXELS_ENV, DEFAULT_MAX_VOXELS))


def check_voxels(shape: tuple[int, ...], what: str, limit: int | None = None) -> None:
    """Refuse a volume whose header declares more than ``limit`` voxels (default :func:`max_voxels`), before its
    data is read: a few hundred KB of .nii.gz can declare 512^3 or more, allocated in full as float32."""
    limit = max_voxels() if limit is None else limit
    voxels = int(np.prod([int(n) for n in shape], dtype=object)) if shape else 0
    if voxels > limit:
        raise VolumeTooLarge(
            f"{what} declares a volume of {'x'.join(str(int(n)) for n in shape)} = {voxels:,} voxels, over the cap "
            f"of {limit:,}; it was not read. If the volume is genuine, raise the cap with {MAX_VOXELS_ENV}=N.")


def load_volume(data_dir: str | Path, ref: str) -> tuple[np.ndarray, np.ndarray]:
    """The voxel array (float32) and its 4x4 affine of the NIfTI file ``DIR/ref``; :class:`VolumeTooLarge`
    when its header declares more voxels than :func:`max_voxels`."""
    path = volume_path(data_dir, ref)
    image = _nibabel().load(str(path))
    check_voxels(tuple(image.header.get_data_shape()), f"volume {ref!r} ({path})")
    return np.asarray(image.dataobj, dtype=np.float32), np.asarray(image.affine)


def load_record_volumes(data_dir: str | Path, record: dict, fields: tuple[str, ...] = ("volume",)) -> dict[str, np.ndarray]:
    """The volumes a 3D-capable backend receives for one canonical Med-StepBench record: ``meta[field]``
    paths (e.g. ``("volume", "volume_pet")``) read from ``DIR``; a record without one raises, naming it."""
    meta = record.get("meta") or {}
    missing = [field for field in fields if not meta.get(field)]
    if missing:
        raise FileNotFoundError(f"record {record.get('id')!r} has no {missing} in meta; a 3D model needs the volume paths")
    return {field: load_volume(data_dir, meta[field])[0] for field in fields}


def save_volume(array: np.ndarray, path: str | Path, spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> None:
    """Write ``array`` as NIfTI-1 (``.nii`` or ``.nii.gz``) with a diagonal affine of ``spacing`` mm."""
    nib = _nibabel()
    nib.save(nib.Nifti1Image(np.asarray(array, dtype=np.float32), np.diag([*spacing, 1.0])), str(path))


def middle_slice(volume: np.ndarray, plane: str, index: int | None = None) -> np.ndarray:
    """One 2D slice (the middle one by default), rows top to bottom as displayed."""
    axis = PLANE_AXES[plane]
    index = volume.shape[axis] // 2 if index is None else index
    return np.rot90(np.take(volume, index, axis=axis))


def window_ct(slice_hu: np.ndarray, window: str) -> np.ndarray:
    """HU -> 0..1 with ``CT_WINDOWS[window]``: (HU - (c - w/2)) / w, clipped."""
    centre, width = CT_WINDOWS[window]
    return np.clip((slice_hu - (centre - width / 2)) / width, 0.0, 1.0)


def _hot(values: np.ndarray) -> np.ndarray:
    """A black-red-yellow-white colour map for PET on 0..1 (float RGB)."""
    return np.stack([np.clip(3 * values, 0, 1), np.clip(3 * values - 1, 0, 1), np.clip(3 * values - 2, 0, 1)], -1)


def render_view(ct: np.ndarray | None, pet: np.ndarray | None, plane: str, modality: str,
                window: str = "mediastinal", alpha: float = 0.5) -> Image.Image:
    """An RGB view: ``ct`` (windowed grey), ``pet`` (SUV 0..5, hot map) or ``fused`` (PET over CT, ``alpha``)."""
    if modality in ("ct", "fused") and ct is None or modality in ("pet", "fused") and pet is None:
        raise ValueError(f"modality {modality!r} needs the {'CT' if ct is None else 'PET'} volume")
    if modality == "ct":
        rgb = np.repeat(window_ct(middle_slice(ct, plane), window)[..., None], 3, axis=-1)
    elif modality == "pet":
        rgb = _hot(np.clip(middle_slice(pet, plane) / PET_SUV_MAX, 0, 1))
    elif modality == "fused":
        grey = np.repeat(window_ct(middle_slice(ct, plane), window)[..., None], 3, axis=-1)
        rgb = (1 - alpha) * grey + alpha * _hot(np.clip(middle_slice(pet, plane) / PET_SUV_MAX, 0, 1))
    else:
        raise ValueError(f"unknown modality {modality!r}; use ct, pet or fused")
    return Image.fromarray((255 * rgb).round().astype(np.uint8), mode="RGB")


__all__ = ["CT_WINDOWS", "DEFAULT_MAX_VOXELS", "MAX_VOXELS_ENV", "VolumeTooLarge", "check_voxels", "load_record_volumes",
           "load_volume", "max_voxels", "middle_slice", "render_view", "save_volume", "volume_path", "window_ct"]

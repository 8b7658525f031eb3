"""Credentialed images (MIMIC-CXR under PhysioNet's data use agreement) never leave the user's disk.

``datasets`` embeds image files by default when a dataset is pushed (``push_to_hub(...,
embed_external_files=True)``) or saved (``save_to_disk``). A dataset loaded with
``load_benchmark(..., image_roots=...)`` whose rows come from a credentialed source therefore
gets its ``image`` column typed :class:`CredentialedImage`: it decodes like ``datasets.Image``,
but embedding it raises :class:`CredentialedImageError`. The feature type travels with the
dataset through ``select``/``filter``/``map``/``cast``, so the refusal does too. Publishing the
references (the ``images`` column of strings) stays possible: drop the ``image`` column first.

:func:`refuse_credentialed_images` is the explicit guard every push path of :mod:`medheval.publish.hub` calls.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import datasets
from datasets.features.features import register_feature

from medheval.data.schema import is_credentialed


class CredentialedImageError(ValueError):
    """A credentialed source's images were about to be embedded in a published or saved dataset."""


_HOW_TO = ("Drop the image column (ds.remove_columns('image')) and publish the 'images' references instead; "
           "users load the pixels from their own credentialed copy with image_roots=.")


@dataclass(repr=False)
class CredentialedImage(datasets.Image):
    """``datasets.Image`` for credentialed sources: decodes locally, refuses to be embedded."""

    _type: str = field(default="CredentialedImage", init=False, repr=False)

    def __repr__(self) -> str:
        return f"CredentialedImage(mode={self.mode!r}, decode={self.decode!r})"

    def embed_storage(self, storage: Any, *args: Any, **kwargs: Any) -> Any:
        raise CredentialedImageError(
            "refusing to embed credentialed (PhysioNet/MIMIC) images: push_to_hub and save_to_disk would copy the "
            f"image files into the dataset. {_HOW_TO}"
        )


with warnings.catch_warnings():  # register_feature is flagged experimental
    warnings.simplefilter("ignore")
    register_feature(CredentialedImage, "CredentialedImage")


def image_feature(credentialed: bool) -> datasets.Image:
    """The per-image feature for an ``image`` column: :class:`CredentialedImage` when credentialed."""
    return CredentialedImage(mode="RGB") if credentialed else datasets.Image(mode="RGB")


def image_columns(features: datasets.Features) -> list[str]:
    """Top-level columns holding an ``Image`` feature anywhere inside (lists, dicts)."""

    def holds_image(feature: Any) -> bool:
        if isinstance(feature, datasets.Image):
            return True
        if isinstance(feature, dict):
            return any(holds_image(value) for value in feature.values())
        if isinstance(feature, (list, tuple)):
            return any(holds_image(value) for value in feature)
        inner = getattr(feature, "feature", None)
        return inner is not None and holds_image(inner)

    return [name for name, feature in features.items() if holds_image(feature)]


def credentialed_rows(dataset: datasets.Dataset) -> list[str]:
    """Ids (or row indices) of rows from a credentialed source (by ``source`` or ``meta.credentialed``)."""
    columns = [name for name in ("id", "source", "meta") if name in dataset.column_names]
    if "source" not in columns and "meta" not in columns:
        return []
    flagged = []
    for index, row in enumerate(dataset.select_columns(columns).to_list()):
        meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
        if is_credentialed(row.get("source") or "") or bool(meta.get("credentialed")):
            flagged.append(str(row.get("id", index)))
    return flagged


def refuse_credentialed_images(dataset: datasets.Dataset, where: str, credentialed: bool = False) -> None:
    """Raise :class:`CredentialedImageError` when ``dataset`` has an image column and credentialed rows.

    ``credentialed=True`` declares the whole dataset credentialed (e.g. a MIMIC-derived config)."""
    columns = image_columns(dataset.features)
    if not columns:
        return
    flagged = credentialed_rows(dataset)
    if credentialed or flagged:
        examples = ", ".join(flagged[:3]) or "(declared credentialed)"
        raise CredentialedImageError(
            f"{where}: image column(s) {columns} in a dataset with credentialed rows ({len(flagged)}, e.g. {examples}); "
            f"credentialed images are never published. {_HOW_TO}"
        )

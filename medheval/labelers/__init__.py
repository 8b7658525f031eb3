"""Report labelers: a radiology report -> the 14 CheXpert observations.

Every labeler returns, per report, one value per entry of :data:`CONDITIONS`, in that order:
``1`` positive, ``0`` negative, ``-1`` uncertain, ``None`` not mentioned (blank). "No Finding" is
only ever ``1`` or ``None``. The order is CheXbert's head order (``src/constants.py``).

Backends: ``medheval.labelers.chexpert_rules`` (rule-based, offline default) and
``medheval.labelers.chexbert`` (the CheXbert model from local weights).
"""

from __future__ import annotations

from typing import Protocol, Sequence

CONDITIONS: tuple[str, ...] = (
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
    "No Finding",
)

Label = int | None  # 1, 0, -1 or None (blank)


class ReportLabeler(Protocol):
    """Anything that labels reports with the 14 CheXpert observations."""

    name: str

    def label(self, reports: Sequence[str]) -> list[list[Label]]:
        """One 14-value list per report, in :data:`CONDITIONS` order."""
        ...

"""A tiny synthetic Med-StepBench folder, written by code (for tests, benchmarks and the demo).

Everything is made up: small PET/CT volumes (a body, two lungs, one FDG-avid lesion) saved as
NIfTI, their tri-planar PNG views (CT lung and mediastinal windows, PET, fused), and statements
for the four steps in English and Vietnamese, each ``ground_truth`` or ``hallucination``, with
prior/external knowledge and two rationales. No text or image comes from Med-StepBench.

``python -m medheval.families.stepbench.fixtures OUT_DIR [--studies N] [--per-study K]`` writes it from the shell.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

from medheval.families.stepbench import pet_ct
from medheval.families.stepbench import source as stepbench

SHAPE = (24, 24, 32)  # x, y, z voxels

# (step, label, subtype, English, Vietnamese): {side}/{side_vi}/{size}/{suv} are filled per study.
TEMPLATES: tuple[tuple[int, str, str | None, str, str], ...] = (
    (1, "ground_truth", None, "The lesion lies in the {side} lung.", "Tổn thương nằm ở phổi {side_vi}."),
    (1, "hallucination", "anatomical_mismatch", "The lesion lies in the liver.", "Tổn thương nằm ở gan."),
    (2, "ground_truth", None, "There is one focal lesion with increased FDG uptake.",
     "Có một tổn thương khu trú tăng hấp thu FDG."),
    (2, "hallucination", "missing_abnormality", "There is no focal FDG uptake.",
     "Không có điểm tăng hấp thu FDG khu trú."),
    (3, "ground_truth", None, "The lesion measures about {size} mm with SUVmax near {suv}.",
     "Tổn thương kích thước khoảng {size} mm, SUVmax khoảng {suv}."),
    (3, "hallucination", "fabricated_attribute", "The lesion measures about {big} mm with SUVmax near 1.0.",
     "Tổn thương kích thước khoảng {big} mm, SUVmax khoảng 1.0."),
    (4, "ground_truth", None, "The findings suggest a malignant lung tumour.",
     "Các dấu hiệu gợi ý u phổi ác tính."),
    (4, "hallucination", "false_disease", "The findings suggest pneumonia.", "Các dấu hiệu gợi ý viêm phổi."),
)
EXTERNAL = {
    "en": "Focal FDG uptake well above the mediastinal background often points to a malignant process.",
    "vi": "Điểm tăng hấp thu FDG khu trú cao hơn nền trung thất thường gợi ý tổn thương ác tính.",
}
RATIONALE = {
    "llm": {"en": "The bright spot on PET matches the structure described.",
            "vi": "Điểm sáng trên PET khớp với cấu trúc được mô tả."},
    "clinician": {"en": "Checked against the fused axial and coronal views.",
                  "vi": "Đã đối chiếu với ảnh hợp nhất mặt phẳng ngang và đứng ngang."},
}


def make_volumes(seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(CT in HU, PET in SUV, facts): an elliptic body, two lungs, one lesion in one lung."""
    rng = np.random.default_rng(seed)
    x, y, z = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    cx, cy, cz = (n / 2 for n in SHAPE)
    body = ((x - cx) / 11) ** 2 + ((y - cy) / 9) ** 2 <= 1
    right = ((x - cx + 5) / 4) ** 2 + ((y - cy) / 5) ** 2 + ((z - cz) / 10) ** 2 <= 1
    left = ((x - cx - 5) / 4) ** 2 + ((y - cy) / 5) ** 2 + ((z - cz) / 10) ** 2 <= 1
    side = "left" if seed % 2 else "right"
    radius = 2 + seed % 2
    lx = cx + 5 if side == "left" else cx - 5
    lesion = (x - lx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2 <= radius ** 2
    ct = np.full(SHAPE, -1000.0, dtype=np.float32)
    ct[body] = 40.0
    ct[left | right] = -800.0
    ct[lesion] = 60.0
    ct += rng.normal(0, 5, SHAPE).astype(np.float32)
    pet = np.where(body, 1.0, 0.0).astype(np.float32)
    suv = 6.0 + seed % 3
    pet[lesion] = suv
    facts = {"side": side, "side_vi": "trái" if side == "left" else "phải", "size": 2 * radius * 5,
             "big": 2 * radius * 15, "suv": suv}
    return ct, pet, facts


def write_study(root: Path, study: str, seed: int,
                volumes: bool = True) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """Write one study's views, and its NIfTI volumes when ``volumes``; returns (views, volume path, facts)."""
    ct, pet, facts = make_volumes(seed)
    if volumes:
        (root / "volumes" / study).mkdir(parents=True, exist_ok=True)
        pet_ct.save_volume(ct, root / "volumes" / study / "ct.nii.gz")
        pet_ct.save_volume(pet, root / "volumes" / study / "pet.nii.gz")
    views: dict[str, Any] = {}
    for plane in stepbench.PLANES:
        folder = root / "views" / study / plane
        folder.mkdir(parents=True, exist_ok=True)
        entry: dict[str, Any] = {"ct": {}}
        for window in stepbench.WINDOWS:
            pet_ct.render_view(ct, pet, plane, "ct", window).save(folder / f"ct_{window}.png")
            entry["ct"][window] = f"views/{study}/{plane}/ct_{window}.png"
        for modality in ("pet", "fused"):
            pet_ct.render_view(ct, pet, plane, modality).save(folder / f"{modality}.png")
            entry[modality] = f"views/{study}/{plane}/{modality}.png"
        views[plane] = entry
    return views, f"volumes/{study}/ct.nii.gz" if volumes else None, facts


def statement_rows(study: str, views: dict, volume: str | None, facts: dict, per_study: int) -> list[dict[str, Any]]:
    """``per_study`` statements per language for one study (templates cycled, ids numbered)."""
    rows = []
    fill = {**facts}
    for index in range(per_study):
        step, label, subtype, english, vietnamese = TEMPLATES[index % len(TEMPLATES)]
        prior = next((t for t in TEMPLATES if t[0] == step - 1 and t[1] == "ground_truth"), None)
        pair = f"{study}-{index:03d}"
        for language, text, prior_text in (("vi", vietnamese, prior and prior[4]), ("en", english, prior and prior[3])):
            rows.append({
                "statement_id": f"{pair}-{language}", "study_id": study, "step": step,
                "statement": text.format(**fill), "label": label, "subtype": subtype, "language": language,
                "pair_id": pair, "views": views, "volume": volume,
                "prior_knowledge": prior_text.format(**fill) if prior_text else None,
                "external_knowledge": EXTERNAL[language],
                "rationale_llm": RATIONALE["llm"][language], "rationale_clinician": RATIONALE["clinician"][language],
                "volume_pet": volume.replace("ct.nii.gz", "pet.nii.gz") if volume else None,
            })
    return rows


def write_stepbench_fixture(out_dir: str | Path, studies: int = 3, per_study: int = 8,
                            fmt: str = "jsonl", volumes: bool | None = None) -> dict[str, Any]:
    """Write the fixture folder; returns ``{"data_dir", "statements", "n_statements", "studies", "volumes"}``.

    ``volumes=None`` writes the NIfTI volumes when ``nibabel`` (the ``stepbench`` extra) is installed;
    without them the statements carry views only (what 2D models, and the demo, use)."""
    if volumes is None:
        volumes = importlib.util.find_spec("nibabel") is not None
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    names = [f"study{n:03d}" for n in range(studies)]
    for seed, study in enumerate(names):
        views, volume, facts = write_study(root, study, seed, volumes)
        rows.extend(statement_rows(study, views, volume, facts, per_study))
    if fmt == "jsonl":
        path = root / "statements.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = root / "statements.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"fmt must be 'jsonl' or 'parquet', got {fmt!r}")
    return {"data_dir": str(root), "statements": str(path), "n_statements": len(rows), "studies": names,
            "volumes": volumes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--studies", type=int, default=3)
    parser.add_argument("--per-study", type=int, default=8, help="statements per study and language")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    args = parser.parse_args()
    info = write_stepbench_fixture(args.out_dir, args.studies, args.per_study, args.format)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()

"""A small fixture benchmark in MedHEval's real file schemas, written by code.

Everything written here is **synthetic** and not MedHEval data: the questions,
answers, reports, image ids and images were made up for demos and tests, and
none is derived from MedHEval, SLAKE, VQA-RAD, IU-Xray or MIMIC-CXR. Only
the layout is shared: the same relative paths as MedHEval's ``benchmark_data/``,
the same keys in the same order, the same per-source conventions for
``img_name``/``img_id``/``location``/``modality``, and the same kinds of label
noise the released files contain (``shared/reference/medheval_repo.md`` §2).

Every label-noise case is marked ``# NOISE:`` next to its item, so a reader can
see what a builder, parser or scorer is expected to cope with.

    >>> from medheval.families.medheval.fixtures import write_fixture_benchmark
    >>> info = write_fixture_benchmark("/tmp/medheval-fixture")   # doctest: +SKIP
    >>> info["image_roots"]["slake"]                               # doctest: +SKIP
    '/tmp/medheval-fixture/images/slake'

``python -m medheval.families.medheval.fixtures OUT_DIR`` writes the same tree from the shell.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from medheval.data.fetch import FIXTURE_MARKER

FIXTURE_VERSION = "fixtures-v1"

VISUAL = "Visual_Misinterpretation_Hallucination"
FINE = f"{VISUAL}/close-ended/fine-grained"
SLAKE_FILE = f"{FINE}/slake_qa_pairs.json"
RAD_FILE = f"{FINE}/rad_vqa_pairs.json"
IU_FILE = f"{FINE}/xray_closed_pairs.json"
MIMIC_CLOSE_FILE = f"{FINE}/mimic_cxr_closed_pairs.json"
MM_FILE = f"{VISUAL}/close-ended/MM-VisHal.json"
CXR_FILE = f"{VISUAL}/close-ended/CXR-VisHal.json"
REPORT_FILE = f"{VISUAL}/open-ended/MIMIC-CXR_pairs.json"
KNOWLEDGE_CLOSE_FILE = "Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json"
KNOWLEDGE_OPEN_FILE = "Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json"
CONTEXT_FILE = "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"

FIXTURE_FILES = (
    SLAKE_FILE, RAD_FILE, IU_FILE, MIMIC_CLOSE_FILE, MM_FILE, CXR_FILE,
    REPORT_FILE, KNOWLEDGE_CLOSE_FILE, KNOWLEDGE_OPEN_FILE, CONTEXT_FILE,
)
IMAGE_SOURCES = ("slake", "vqa_rad", "iu_xray", "mimic_cxr")

# ---------------------------------------------------------------------------
# Images: short key -> (img_name, img_id, location, modality, drawing kind)
# ---------------------------------------------------------------------------


def _mimic(n: int) -> str:
    # Clearly synthetic ids in the MIMIC-CXR-JPG files/ layout (without "files/").
    return f"p19/p1999990{n}/s5999990{n}/f1c0000{n}-00000000-00000000-00000000-0000000{n}.jpg"


SLAKE_IMAGES = {  # img_id is the int after "xmlab"
    "S1": ("xmlab9001/source.jpg", 9001, "Lung", "CT", "chest"),
    "S2": ("xmlab9002/source.jpg", 9002, "Brain", "MRI", "head"),
    "S3": ("xmlab9003/source.jpg", 9003, "Abdomen", "CT", "abdomen"),
    "S4": ("xmlab9004/source.jpg", 9004, "Chest_lung", "X-Ray", "chest"),
}
RAD_IMAGES = {  # img_id repeats img_name; location is the organ, modality null
    "R1": ("synpic900101.jpg", "synpic900101.jpg", "CHEST", None, "chest"),
    "R2": ("synpic900102.jpg", "synpic900102.jpg", "HEAD", None, "head"),
    "R3": ("synpic900103.jpg", "synpic900103.jpg", "ABD", None, "abdomen"),
}
IU_IMAGES = {  # frontal view 0.png only; location/modality null
    f"I{n}": (f"CXR990{n}_IM-900{n}/0.png", f"CXR990{n}_IM-900{n}/0.png", None, None, "chest")
    for n in (1, 2, 3)
}
MIMIC_IMAGES = {f"M{n}": (_mimic(n), _mimic(n), None, None, "chest") for n in range(1, 9)}

# ---------------------------------------------------------------------------
# Visual close-ended, fine-grained:
# (image, question, answer, hallucination_type, omission_type, question_type, choices)
# omission_type follows the released files: 1 ~ "Yes", 0 ~ "No", -1 ~ multi-choice.
# ---------------------------------------------------------------------------
B, MC = "binary", "multi-choice"

SLAKE_ITEMS = [
    ("S1", "Are the lungs included in this scan?", "Yes", "type_1", 1, B, ""),
    # NOISE: binary answer that is a sentence, not Yes/No.
    ("S2", "Is any lung tissue visible in this image?", "The image does not show any lung tissue.",
     "type_1", 0, B, ""),
    ("S3", "Which organ appears on the left side of this image?", "A: Liver", "type_1", -1, MC,
     "A: Liver, B: Spleen, C: Stomach"),
    ("S1", "In which lung is the larger nodule?", "B: Left lung", "type_2", -1, MC,
     "A: Right lung, B: Left lung, C: Mediastinum, D: Pleura"),
    ("S3", "Is the liver larger than the spleen here?", "Yes", "type_2", 1, B, ""),
    ("S4", "Does this image show a pneumothorax?", "No", "type_3", 0, B, ""),
    # NOISE: content-free choices, just the bare letters "A, B, C, D".
    ("S3", "Which organ shows the abnormal finding?", "Liver", "type_3", -1, MC, "A, B, C, D"),
    # Bare-letter answer to a multi-choice item.
    ("S2", "Which imaging modality produced this image?", "C", "type_4", -1, MC,
     "A: CT, B: X-Ray, C: MRI, D: Ultrasound"),
    ("S1", "Was this image acquired with CT?", "Yes", "type_4", 1, B, ""),
    ("S4", "In which plane was this image taken?", "Coronal", "type_4", -1, MC,
     "A: Axial, B: Coronal, C: Sagittal"),
]

RAD_ITEMS = [
    ("R1", "Can the heart be seen in this image?", "Yes", "type_1", 1, B, ""),
    ("R2", "Which structure forms the bright outer rim?", "B: Skull", "type_1", -1, MC,
     "A: Scalp, B: Skull, C: Ventricle, D: Orbit"),
    ("R2", "Is the midline shifted to one side?", "No", "type_2", 0, B, ""),
    ("R1", "How large is the cardiac silhouette?", "Enlarged", "type_2", -1, MC,
     "A: Normal, B: Enlarged, C: Small"),
    # NOISE: binary answer "Abnormal" (a substring yes/no parser reads it as "no").
    ("R3", "Does this abdominal scan look normal?", "Abnormal", "type_3", 1, B, ""),
    # NOISE: the rare "A, X; B, Y" choices form.
    ("R3", "What is seen inside the dilated bowel loop?", "Stent", "type_3", -1, MC,
     "A, Stent; B, Stool; C, Air"),
    ("R1", "Is there a pleural effusion?", "No", "type_3", 0, B, ""),
    ("R1", "What kind of image is this?", "D", "type_4", -1, MC,
     "A: CT, B: MRI, C: Ultrasound, D: X-ray"),
    ("R3", "Was oral contrast given for this study?", "Yes", "type_4", 1, B, ""),
]

IU_ITEMS = [
    ("I1", "Are both lungs fully inside the field of view?", "Yes", "type_1", 1, B, ""),
    ("I2", "Which structure lies between the two lungs?", "A. Mediastinum", "type_1", -1, MC,
     "A. Mediastinum, B. Liver, C. Stomach"),
    # NOISE: a multi-choice item with a single option (a builder should flag it).
    ("I3", "How would you describe the heart size?", "A", "type_2", -1, MC, "A. Normal heart size"),
    ("I1", "Does the heart look enlarged on this film?", "No", "type_2", 0, B, ""),
    ("I2", "Is there any focal consolidation?", "No", "type_3", 0, B, ""),
    # "A) x, B) y" choices form.
    ("I3", "What abnormality is seen at the right lung base?", "B) Atelectasis", "type_3", -1, MC,
     "A) Pneumothorax, B) Atelectasis, C) Mass"),
    ("I1", "Are degenerative changes seen in the thoracic spine?", "Yes", "type_3", 1, B, ""),
    ("I2", "Which view is this radiograph?", "PA", "type_4", -1, MC,
     "A. Lateral, B. PA, C. AP supine"),
    # NOISE: lowercase "yes".
    ("I3", "Is this a frontal chest radiograph?", "yes", "type_4", 1, B, ""),
]

MIMIC_CLOSE_ITEMS = [
    ("M1", "What does the focal airspace opacity most likely represent?", "B. Pneumonia", "type_3",
     -1, MC, "A. Atelectasis, B. Pneumonia, C. Pneumothorax, D. Lung mass"),
    # NOISE: an option text containing a comma.
    ("M1", "In which region is the opacity located?", "A. Right lower lobe, posterior segment",
     "type_2", -1, MC,
     "A. Right lower lobe, posterior segment, B. Left upper lobe, C. Right middle lobe, D. Lingula"),
    # NOISE: binary answer "Yes, <finding>" rather than a bare Yes.
    ("M2", "Is there a left-sided pleural effusion?", "Yes, small left pleural effusion", "type_3",
     1, B, ""),
    ("M2", "Is an endotracheal tube visible?", "No", "type_1", 0, B, ""),
    ("M3", "Which device projects over the right atrium?", "Central venous catheter", "type_1", -1,
     MC, "A. Pacemaker lead, B. Central venous catheter, C. Nasogastric tube"),
    ("M3", "Is the cardiac size within the normal range?", "Yes", "type_2", 1, B, ""),
    ("M4", "Was this image taken as a portable AP view?", "Yes", "type_4", 1, B, ""),
    ("M4", "Which projection was used for this radiograph?", "C", "type_4", -1, MC,
     "A. PA, B. Lateral, C. AP portable"),
    ("M4", "Are there signs of pulmonary edema?", "No", "type_3", 0, B, ""),
]

# ---------------------------------------------------------------------------
# Visual open-ended (report generation): (qid, image, report, anatomy, measurement, symptom)
# qid 4 is deliberately missing, as the released file has gaps in its qids.
# ---------------------------------------------------------------------------
REPORT_INSTRUCTION = (
    "Write a short radiology report for this chest X-ray. Describe the main anatomical "
    "structures, give any relevant measurements such as size or volume, and list the "
    "findings you observe."
)
REPORT_ITEMS = [
    (0, "M1", "There is a focal airspace opacity in the right lower lobe that is most consistent "
     "with pneumonia. The left lung is clear. The heart and mediastinum are normal in size and "
     "there is no pleural effusion or pneumothorax.",
     ["right lower lobe", "left lung", "heart", "mediastinum", "pleural space"], [],
     ["focal airspace opacity", "pneumonia", "no pleural effusion", "no pneumothorax"]),
    (1, "M2", "A small left pleural effusion blunts the costophrenic angle with adjacent basal "
     "atelectasis. The right lung is clear and the cardiac silhouette is normal.",
     ["left costophrenic angle", "left lung base", "right lung", "heart"], [],
     ["small left pleural effusion", "basal atelectasis", "normal cardiac silhouette"]),
    (2, "M5", "The heart is enlarged with a cardiothoracic ratio of about 0.6. There is "
     "interstitial edema with Kerley B lines and mild vascular congestion, without a focal "
     "consolidation.",
     ["heart", "pulmonary vasculature", "lung interstitium"], ["cardiothoracic ratio of about 0.6"],
     ["cardiomegaly", "interstitial edema", "Kerley B lines", "vascular congestion"]),
    (3, "M6", "Normal chest radiograph. The lungs are well expanded and clear. The heart, "
     "mediastinum and hila are unremarkable and the bones are intact.",
     ["lungs", "heart", "mediastinum", "hila", "bones"], [], ["no acute findings"]),
    (5, "M7", "A 2 cm rounded nodule projects over the left upper zone. There is no effusion. "
     "Follow-up CT is suggested to characterise the nodule.",
     ["left upper zone", "pleural space"], ["2 cm"], ["pulmonary nodule", "no effusion"]),
    (6, "M8", "The lungs are hyperinflated with flattened hemidiaphragms, in keeping with chronic "
     "obstructive disease. A right internal jugular line ends in the lower superior vena cava.",
     ["lungs", "hemidiaphragms", "superior vena cava"], [],
     ["hyperinflation", "flattened hemidiaphragms", "chronic obstructive disease",
      "right internal jugular line"]),
]

# ---------------------------------------------------------------------------
# Knowledge close-ended and context close-ended: (image, question, answer)
# ---------------------------------------------------------------------------
KNOWLEDGE_CLOSE_ITEMS = [
    ("M1", "Is a basal distribution of this kind typical of aspiration?", "Yes"),
    # NOISE: lowercase "yes".
    ("M1", "Would findings like these usually be treated with antibiotics?", "yes"),
    ("M1", "Could a pneumothorax explain this appearance?", "No"),
    ("M1", "Does the appearance point to chronic interstitial lung disease?", "No"),
    ("M5", "Are these findings consistent with congestive heart failure?", "Yes"),
    ("M5", "Are Kerley B lines a recognised sign of interstitial edema?", "Yes"),
    # NOISE: an answer that is neither Yes nor No.
    ("M5", "Can the cause of the hilar fullness be settled from this image alone?", "Unclear"),
    ("M5", "Is this pattern usually caused by a bacterial infection?", "No"),
]
CONTEXT_ITEMS = [
    ("M1", "The patient has had fever and a productive cough for three days. Given that history, "
     "is the right basal opacity more likely infection than tumour?", "Yes"),
    ("M1", "A chest X-ray two weeks ago was reported as clear. Does this make a long-standing "
     "scar the most likely cause of the opacity?", "No"),
    ("M1", "The patient was recently found unresponsive after a fall. Does that raise concern for "
     "aspiration as the cause of the right lower lobe opacity?", "Yes"),
    ("M1", "The white cell count is normal and the patient is afebrile. Does this rule out "
     "pneumonia on its own?", "No"),
    ("M5", "The patient has known heart failure with a low ejection fraction. Is the interstitial "
     "pattern likely to be cardiogenic?", "Yes"),
    ("M5", "The patient's weight rose by 4 kg over a week. Does this support fluid overload as "
     "the cause of the findings?", "Yes"),
    ("M5", "An echocardiogram last month showed normal cardiac function. Does that make "
     "cardiogenic edema more likely?", "No"),
    ("M5", "The patient was started on diuretics yesterday. Would complete resolution of the "
     "edema already be expected on this film?", "No"),
]

# Knowledge open-ended: (image, question, answer)
KNOWLEDGE_OPEN_ITEMS = [
    ("M1", "Explain what lobar pneumonia is and which features of this image point to it.",
     "Lobar pneumonia is an infection that fills the air spaces of a whole lobe or segment with "
     "inflammatory fluid. On a radiograph it shows as a dense, fairly well defined opacity, as "
     "in the right lower lobe here, often with air bronchograms."),
    ("M1", "Why can the right lower lobe be affected by aspiration more often than the left?",
     "The right main bronchus is wider, shorter and more vertical than the left, so aspirated "
     "material tends to pass into it. In an upright patient this material settles in the lower "
     "lobe segments, matching the location of the opacity."),
    ("M1", "What are the usual complications of an untreated bacterial pneumonia?",
     "Untreated bacterial pneumonia can lead to a parapneumonic effusion or empyema, lung "
     "abscess, spread of infection into the blood and respiratory failure. Follow-up imaging "
     "helps to confirm that the opacity clears after treatment."),
    ("M5", "What is the cardiothoracic ratio and what does a value above 0.5 suggest?",
     "The cardiothoracic ratio compares the widest diameter of the heart with the widest inner "
     "diameter of the chest on a PA film. A value above 0.5 suggests cardiomegaly, which fits "
     "the enlarged heart in this image."),
    ("M5", "How does left heart failure lead to interstitial edema on a chest radiograph?",
     "When the left ventricle fails, pressure rises in the pulmonary veins and capillaries. Fluid "
     "then leaks into the interstitium, giving septal Kerley B lines, peribronchial cuffing and "
     "hazy vessels, as seen in this study."),
    ("M5", "What is the usual first-line treatment for cardiogenic pulmonary edema?",
     "First-line treatment is oxygen, sitting the patient up and a loop diuretic to remove "
     "excess fluid, with vasodilators when blood pressure allows. The underlying cause of the "
     "heart failure also needs to be treated."),
]

# ---------------------------------------------------------------------------
# Record builders (keys in the same order as the released files)
# ---------------------------------------------------------------------------


def _fine_grained(items, images, *, img_id_before_qid: bool = False) -> list[dict]:
    records = []
    for qid, (key, question, answer, htype, omission, qtype, choices) in enumerate(items):
        img_name, img_id, location, modality, _ = images[key]
        rec = {
            "img_name": img_name, "question": question, "answer": answer,
            "hallucination_type": htype, "omission_type": omission,
            "question_type": qtype, "choices": choices,
        }
        # SLAKE's file stores img_id before qid; the other three store qid first.
        order = ("img_id", "qid") if img_id_before_qid else ("qid", "img_id")
        rec.update((k, {"img_id": img_id, "qid": qid}[k]) for k in order)
        rec["location"], rec["modality"] = location, modality
        records.append(rec)
    return records


def _mm_record(rec: dict, qid: int, source: str) -> dict:
    # MM-VisHal key order: ... choices, img_id, qid, location, modality, source.
    out = {k: rec[k] for k in ("img_name", "question", "answer", "hallucination_type",
                               "question_type", "choices", "img_id")}
    out.update(qid=qid, location=rec["location"], modality=rec["modality"], source=source)
    return out


def _cxr_record(rec: dict, qid: int) -> dict:
    out = {k: v for k, v in rec.items() if k != "omission_type"}
    out["qid"] = qid
    return out


def build_records() -> dict[str, list[dict]]:
    """All fixture files as ``{relative path under benchmark_data: records}``."""
    slake = _fine_grained(SLAKE_ITEMS, SLAKE_IMAGES, img_id_before_qid=True)
    rad = _fine_grained(RAD_ITEMS, RAD_IMAGES)
    iu = _fine_grained(IU_ITEMS, IU_IMAGES)
    mimic = _fine_grained(MIMIC_CLOSE_ITEMS, MIMIC_IMAGES)
    # Combined files, renumbered as upstream does: second block's qids offset by the first's size.
    mm = [_mm_record(r, i, "SLAKE") for i, r in enumerate(slake)]
    mm += [_mm_record(r, r["qid"] + len(slake), "VQA-RAD") for r in rad]
    cxr = [_cxr_record(r, r["qid"]) for r in iu]
    cxr += [_cxr_record(r, r["qid"] + len(iu)) for r in mimic]

    def mimic_name(key):
        return MIMIC_IMAGES[key][0]

    report = [
        {"img_name": mimic_name(k), "question": REPORT_INSTRUCTION, "answer": text,
         "structured_answer": {"anatomy": anat, "measurement": meas, "symptom": symp},
         "qid": qid, "img_id": mimic_name(k)}
        for qid, k, text, anat, meas, symp in REPORT_ITEMS
    ]

    def binary_file(items):
        return [
            {"img_name": mimic_name(k), "question": q, "answer": a, "ground_truth_type": "binary",
             "choices": "", "qid": qid, "img_id": mimic_name(k)}
            for qid, (k, q, a) in enumerate(items)
        ]

    knowledge_open = [
        {"img_name": mimic_name(k), "question": q, "answer": a, "question_type": "type4_Knowledge",
         "structured_answer": None, "qid": qid, "img_id": mimic_name(k)}
        for qid, (k, q, a) in enumerate(KNOWLEDGE_OPEN_ITEMS)
    ]
    return {
        SLAKE_FILE: slake, RAD_FILE: rad, IU_FILE: iu, MIMIC_CLOSE_FILE: mimic,
        MM_FILE: mm, CXR_FILE: cxr, REPORT_FILE: report,
        KNOWLEDGE_CLOSE_FILE: binary_file(KNOWLEDGE_CLOSE_ITEMS),
        KNOWLEDGE_OPEN_FILE: knowledge_open, CONTEXT_FILE: binary_file(CONTEXT_ITEMS),
    }


# ---------------------------------------------------------------------------
# Synthetic images
# ---------------------------------------------------------------------------


def _ellipse(yy, xx, cy, cx, ry, rx):
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def synthetic_scan(name: str, kind: str = "chest", size: int = 64) -> Image.Image:
    """A small grayscale "scan" whose shapes vary with a seed derived from ``name``."""
    seed = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1) * 2.0 - 1.0
    j = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    img = np.full((size, size), j(5, 20))
    if kind == "head":
        img[_ellipse(yy, xx, j(-0.05, 0.05), j(-0.05, 0.05), j(0.85, 0.92), j(0.72, 0.8))] = j(210, 240)
        img[_ellipse(yy, xx, 0.0, 0.0, j(0.74, 0.8), j(0.6, 0.67))] = j(110, 140)
        for side in (-1, 1):  # ventricles
            img[_ellipse(yy, xx, j(-0.2, 0.0), side * j(0.1, 0.16), j(0.18, 0.26), j(0.05, 0.08))] = j(30, 50)
    else:
        img[_ellipse(yy, xx, j(-0.05, 0.05), j(-0.05, 0.05), j(0.82, 0.92), j(0.75, 0.88))] = j(150, 185)
        if kind == "chest":
            for side in (-1, 1):  # lungs
                img[_ellipse(yy, xx, j(-0.15, 0.0), side * j(0.32, 0.4), j(0.45, 0.55), j(0.2, 0.27))] = j(45, 75)
            img[_ellipse(yy, xx, j(0.2, 0.3), j(0.0, 0.12), j(0.18, 0.25), j(0.16, 0.22))] = j(190, 215)
        else:  # abdomen: a few organ blobs of different density
            for _ in range(3):
                img[_ellipse(yy, xx, j(-0.5, 0.5), j(-0.5, 0.5), j(0.12, 0.3), j(0.12, 0.3))] = j(80, 230)
    img += rng.normal(0.0, 6.0, size=img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _image_bytes(img: Image.Image, name: str) -> bytes:
    buf = io.BytesIO()
    if name.lower().endswith(".png"):
        img.save(buf, format="PNG")
    else:
        img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _write_if_changed(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def write_fixture_benchmark(root: str | Path, *, with_images: bool = True) -> dict:
    """Write the fixture ``benchmark_data/`` tree (and, by default, images) under ``root``.

    Returns ``{"data_dir": str, "image_roots": {source: str}, "counts": {relative_file: n}}``;
    ``image_roots`` is empty when ``with_images`` is false. The output is byte-for-byte
    deterministic for the same inputs.
    """
    root = Path(root)
    data_dir = root / "benchmark_data"
    records = build_records()
    counts = {}
    for rel, recs in records.items():
        text = json.dumps(recs, indent=4, ensure_ascii=False) + "\n"
        _write_if_changed(data_dir / rel, text.encode("utf-8"))
        counts[rel] = len(recs)
    marker = {"fixture_version": FIXTURE_VERSION, "what": "synthetic records in MedHEval's file formats, written by "
              "medheval.families.medheval.fixtures: for trying the pipeline, never for results"}
    _write_if_changed(data_dir / FIXTURE_MARKER, (json.dumps(marker, indent=1) + "\n").encode("utf-8"))

    image_roots: dict[str, str] = {}
    if with_images:
        tables = {"slake": SLAKE_IMAGES, "vqa_rad": RAD_IMAGES, "iu_xray": IU_IMAGES,
                  "mimic_cxr": MIMIC_IMAGES}
        for source in IMAGE_SOURCES:
            src_root = root / "images" / source
            for img_name, _, _, _, kind in tables[source].values():
                img = synthetic_scan(f"{source}/{img_name}", kind)
                _write_if_changed(src_root / img_name, _image_bytes(img, img_name))
            image_roots[source] = str(src_root)
    return {"data_dir": str(data_dir), "image_roots": image_roots, "counts": counts}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m medheval.families.medheval.fixtures OUT_DIR", file=sys.stderr)
        return 2
    info = write_fixture_benchmark(argv[0])
    for rel, n in info["counts"].items():
        print(f"{n:4d}  {rel}")
    print("image roots: " + " ".join(f"{s}={p}" for s, p in info["image_roots"].items()))
    print("run on it with: --data-dir " + info["data_dir"] + " "
          + " ".join(f"--image-root {s}={p}" for s, p in info["image_roots"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

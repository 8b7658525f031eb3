"""A small ClinHallu snapshot written in the Hub dataset's Parquet column layout (for tests).

Layout: ``<root>/<Config>/test-00000-of-00001.parquet`` per source plus a README with the YAML
configs, and ``<root>/images/<source>/<file>`` holding tiny images. Everything here is invented
text written for the tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
from PIL import Image

from medheval.families.clinhallu.trace import render_stages

HUB_FOLDERS = {"vqa_rad": "VQA-RAD", "pathvqa": "PathVQA", "medframeqa": "MedFrameQA", "medxpertqa": "MedXpertQA"}


# A hand-worked ClinHallu table (metric and report tests): per item source, ORG, Rep-V, Rep-K, Rep-VK
# answer right, then h_v, h_k, h_r (1 = hallucinated; None = invalid / not judged)
HAND_TABLE = [
    ("a", 1, 1, 1, 1, 0, 0, 0),
    ("a", 0, 1, 0, 1, 1, 0, 0),
    ("a", None, 1, None, 0, None, 1, 0),
    ("b", 1, 0, 1, None, 0, None, 1),
    ("b", 0, 0, 1, 1, 1, 1, None),
    ("b", 0, None, 0, 1, 0, 0, 0),
]


def scripted_trace_reply(body: dict, answer_of=lambda seed: f"A{seed % 5}") -> str:
    """An OpenAI-style scripted model for ClinHallu traces whose text depends on its request and seed only:
    ORG traces (no assistant prefix) with ``seed % 3 == 0`` have no stage markers (invalid, asked again);
    continuations continue the assistant prefix."""
    seed = body["seed"]
    last = body["messages"][-1]
    prefix = last["content"] if last["role"] == "assistant" else ""
    if not prefix and seed % 3 == 0:
        return f"no markers, seed {seed}"
    full = render_stages(visual_recognition=f"A region seen under seed {seed}.",
                         knowledge_recall=f"A fact recalled under seed {seed}.",
                         reasoning=f"Reasoning written under seed {seed}.", answer=answer_of(seed))
    return full if not prefix else full.split(prefix.rstrip().splitlines()[-1], 1)[1]


def shared_upstream() -> Path:
    """``../shared/data/upstream`` next to the repository (``$MEDHEVAL_SHARED`` overrides ``../shared``)."""
    base = os.environ.get("MEDHEVAL_SHARED") or str(Path(__file__).resolve().parents[2] / "shared")
    return Path(base) / "data" / "upstream"


def gold(vr: str, kr: str, reasoning: str, answer: str, structured: bool) -> dict:
    raw = render_stages(visual_recognition=vr, knowledge_recall=kr, reasoning=reasoning, answer=answer)
    if not structured:
        return {"raw": raw, "visual_recognition": None, "knowledge_recall": None, "reasoning": None}
    return {"raw": raw, "visual_recognition": {"text": vr}, "knowledge_recall": {"text": kr},
            "reasoning": {"text": reasoning, "answer": answer}}


def _row(question, answer, qtype, images, cot, *, letter="", options=(), source_id="", **extra) -> dict:
    row = {"question": question, "answer": answer, "answer_letter": letter, "options": list(options),
           "question_type": qtype, "source_id": source_id, "split": "test", "images": list(images), "gold_cot": cot}
    row.update(extra)
    return row


def rows() -> dict[str, list[dict]]:
    """The rows of each source (invented clinical text)."""
    return {
        "vqa_rad": [
            _row("Is there a pleural effusion?", "yes", "yes_no", ["vqarad_00005.jpg"],
                 gold("Frontal chest radiograph with blunting of the left costophrenic angle.",
                      "Blunted costophrenic angles indicate fluid in the pleural space.",
                      "The blunted angle matches a pleural effusion on the left.", "yes", True),
                 original_index=5),
            _row("Which organ is enlarged?", "the heart", "open_ended", ["vqarad_00009.jpg"],
                 gold("Frontal chest radiograph with a widened cardiac silhouette.",
                      "A cardiothoracic ratio above one half suggests cardiomegaly.",
                      "The silhouette exceeds half the thoracic width, so the heart is enlarged.", "the heart", True),
                 original_index=9),
            _row("Is the liver normal?", "no", "yes_no", ["vqarad_00005.jpg"],
                 gold("Axial abdominal CT with a hypodense hepatic lesion.",
                      "Focal hypodense liver lesions are abnormal findings.",
                      "A focal lesion is present, hence the liver is not normal.", "no", True),
                 original_index=12),
        ],
        "pathvqa": [
            _row("Does this image show necrosis?", "yes", "yes_no", ["pathvqa_00000.jpg"],
                 gold("Hematoxylin and eosin section with pale anucleate cells.",
                      "Coagulative necrosis keeps cell outlines while nuclei vanish.",
                      "Cell ghosts without nuclei show coagulative necrosis here.", "yes", False)),
            _row("What is present?", "granuloma", "open_ended", ["pathvqa_00003.jpg"],
                 {"raw": "[Visual Recognition]\nEpithelioid cells.\n[Reasoning]\nno answer line here",
                  "visual_recognition": None, "knowledge_recall": None, "reasoning": None}),
        ],
        "medframeqa": [
            _row("Based on the frames, what is the most likely diagnosis?", "B. Subdural hematoma",
                 "multiple_choice", [f"brain_sdh_CT__abc123_4_{k}.jpg" for k in (1, 2, 3)],
                 gold("Serial axial CT frames show a crescent of high attenuation along the convexity.",
                      "Acute subdural blood is crescentic and crosses suture lines.",
                      "A crescentic hyperdense collection crossing sutures fits a subdural hematoma.",
                      "B. Subdural hematoma", False),
                 letter="B", options=["A. Epidural hematoma", "B. Subdural hematoma", "C. Normal study"],
                 source_id="brain_sdh_CT__abc123_4", system="central_nervous_system", organ="brain",
                 keyword="subdural_hematoma_CT", modality="CT", video_id="abc123", reasoning_chain="Crescent shape."),
            _row("Which vessel is occluded?", "A. Left MCA", "multiple_choice",
                 [f"brain_stroke_MR__xyz789_2_{k}.jpg" for k in (1, 2)],
                 gold("Diffusion weighted frames show restricted diffusion in the left lateral hemisphere.",
                      "The middle cerebral artery supplies the lateral cerebral convexity.",
                      "Lateral restricted diffusion points to an occluded left middle cerebral artery.",
                      "A. Left MCA", False),
                 letter="A", options=["A. Left MCA", "B. Right ACA"], source_id="brain_stroke_MR__xyz789_2",
                 system="central_nervous_system", organ="brain", keyword="stroke_MR", modality="MR",
                 video_id="xyz789", reasoning_chain="Lateral territory."),
        ],
        "medxpertqa": [
            _row("What is the diagnosis?", "C. Lung cancer", "multiple_choice", ["MM-26-a.jpeg"],
                 gold("Chest CT with a spiculated mass in the right upper lobe.",
                      "Spiculated pulmonary masses in smokers are often malignant.",
                      "A spiculated mass favours a primary lung cancer.", "C. Lung cancer", True),
                 letter="C", options=["A. Pneumonia", "B. Abscess", "C. Lung cancer", "D. Hamartoma"],
                 source_id="MM-26"),
            _row("What explains the rash?", "D. Tinea", "multiple_choice", ["MM-31-a.jpeg", "MM-31-b.jpeg"],
                 gold("Photograph of an annular scaly plaque with central clearing.",
                      "Annular plaques with central clearing are typical of dermatophyte infection.",
                      "An annular scaly plaque with clearing suggests tinea corporis.", "D. Tinea", True),
                 letter="E", options=["A. Psoriasis", "B. Eczema", "C. Lupus", "D. Tinea"], source_id="MM-31"),
        ],
    }


def write_snapshot(root: Path) -> dict:
    """Write the snapshot under ``root``; returns ``{"data_dir", "image_roots", "rows"}``."""
    root = Path(root)
    data = rows()
    configs = []
    image_roots = {}
    for source, items in data.items():
        folder = root / HUB_FOLDERS[source]
        folder.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(items).to_parquet(str(folder / "test-00000-of-00001.parquet"))
        configs.append(f"- config_name: {HUB_FOLDERS[source]}\n  data_files:\n  - split: test\n"
                       f"    path: {HUB_FOLDERS[source]}/test-*.parquet")
        images = root / "images" / source
        images.mkdir(parents=True, exist_ok=True)
        for item in items:
            for shade, name in enumerate(item["images"]):
                Image.new("RGB", (16, 16), (40 * shade, 90, 160)).save(images / name, format="JPEG")
        image_roots[f"clinhallu_{source}"] = str(images)
    (root / "README.md").write_text("---\nconfigs:\n" + "\n".join(configs) + "\n---\n# ClinHallu test snapshot\n")
    return {"data_dir": str(root), "image_roots": image_roots, "rows": data}

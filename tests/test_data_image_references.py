"""A blank image reference in an annotation record is refused when the split loads, naming file, record and field
(MedHEval's ``img_name``: tests/test_medheval_builders.py); a row with no image at all is text-only only where
the benchmark has such rows (ClinHallu)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("image", ["", "   ", None])
def test_a_blank_med_hallmark_image_names_file_record_and_field(tmp_path, image):
    from medheval.families.med_hallmark import source

    path = tmp_path / "Irg.json"
    path.write_text(json.dumps([{"question": "Describe.", "Med-VLM answer": "x", "ground-truth": "y", "qid": 4,
                                 "image": image, "prompt": "p"}]))
    with pytest.raises(ValueError) as caught:
        list(source.irg_records(path))
    message = str(caught.value)
    assert "Irg.json: record #0 (id=4): field 'image'" in message and "is empty" in message


@pytest.mark.parametrize("images", [["a.jpg", ""], [None], ["  "]])
def test_a_blank_clinhallu_image_entry_names_row_and_field(images):
    from medheval.families.clinhallu.source import record

    row = {"question": "Q?", "answer": "A", "question_type": "open", "source_id": "s7", "images": images}
    with pytest.raises(ValueError, match=r"ClinHallu vqa_rad row 3 \(id 'clinhallu/vqa_rad/s7'\): field 'images' "
                                         r"entry \d is .*, expected an image reference"):
        record(row, 3, "vqa_rad")


@pytest.mark.parametrize("images", [[], None, ""])
def test_a_clinhallu_row_without_images_is_text_only_and_flagged(images):
    from medheval.families.clinhallu.source import record

    row = {"question": "Q?", "answer": "A", "question_type": "open", "source_id": "s7", "images": images}
    made = record(row, 3, "vqa_rad")
    assert made["images"] == [] and "no_images" in made["meta"]["quality_flags"]

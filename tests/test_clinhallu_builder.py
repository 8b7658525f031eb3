"""The ClinHallu builder on a snapshot written in the Hub dataset's Parquet layout."""

from __future__ import annotations

import shutil

import datasets
import pytest

from clinhallu_fixture import HUB_FOLDERS
from medheval.data.benchmarks import load_benchmark, prepare_benchmark
from medheval.families.clinhallu import source as clinhallu_source
from medheval.data.schema import validate_record


def _load(snapshot, config, cache, **kwargs):
    return prepare_benchmark("clinhallu", config, data_dir=snapshot["data_dir"], cache_dir=cache, **kwargs)


@pytest.mark.parametrize("config,n", [("vqa_rad", 3), ("pathvqa", 2), ("medframeqa", 2), ("medxpertqa", 2)])
def test_each_source_config(snapshot, dataset_cache, config, n):
    ds = _load(snapshot, config, dataset_cache).dataset
    assert len(ds) == n
    for record in ds:
        validate_record(record)
        assert record["config"] == config and record["benchmark"] == "clinhallu"
        assert record["source"] == f"clinhallu_{config}"
        assert record["id"].startswith(f"clinhallu/{config}/")


def test_all_is_the_union_in_source_order(snapshot, dataset_cache):
    ids = _load(snapshot, "all", dataset_cache).dataset["id"]
    parts = [_load(snapshot, config, dataset_cache).dataset["id"] for config in clinhallu_source.SOURCES]
    assert ids == [rid for part in parts for rid in part]
    assert len(set(ids)) == 9


def test_ids_follow_upstream_sample_identifier(snapshot, dataset_cache):
    ds = _load(snapshot, "all", dataset_cache).dataset
    meta = {r["id"]: r["meta"] for r in ds}
    # VQA-RAD rows carry original_index; PathVQA rows have neither column value -> row index
    assert [r["id"] for r in ds if r["config"] == "vqa_rad"] == [
        "clinhallu/vqa_rad/5", "clinhallu/vqa_rad/9", "clinhallu/vqa_rad/12"]
    assert meta["clinhallu/vqa_rad/9"]["upstream_id"] == "original_index:9"
    assert meta["clinhallu/pathvqa/1"]["upstream_id"] == "original_index:1"
    assert meta["clinhallu/pathvqa/1"]["id_from"] == "row_index"
    assert meta["clinhallu/medxpertqa/MM-26"]["upstream_id"] == "source_id:MM-26"


def test_answer_types_choices_images_and_metadata(snapshot, dataset_cache):
    ds = {r["id"]: r for r in _load(snapshot, "all", dataset_cache).dataset}
    assert ds["clinhallu/vqa_rad/5"]["answer_type"] == "yes_no"
    assert ds["clinhallu/vqa_rad/9"]["answer_type"] == "open"
    frame = ds["clinhallu/medframeqa/brain_sdh_CT__abc123_4"]
    assert frame["answer_type"] == "multiple_choice"
    assert frame["choices"] == ["Epidural hematoma", "Subdural hematoma", "Normal study"]
    assert frame["answer"] == "B. Subdural hematoma" and frame["meta"]["answer_letter"] == "B"
    assert frame["images"] == [f"brain_sdh_CT__abc123_4_{k}.jpg" for k in (1, 2, 3)]
    assert (frame["meta"]["organ"], frame["meta"]["system"], frame["meta"]["modality"]) == (
        "brain", "central_nervous_system", "CT")
    assert frame["meta"]["options"][0] == "A. Epidural hematoma"
    assert len(ds["clinhallu/medxpertqa/MM-31"]["images"]) == 2
    assert "organ" not in ds["clinhallu/vqa_rad/5"]["meta"]


def test_gold_trace_from_structured_fields_and_from_raw(snapshot, dataset_cache):
    rows = snapshot["rows"]
    ds = {r["id"]: r for r in _load(snapshot, "all", dataset_cache).dataset}
    structured = rows["vqa_rad"][0]["gold_cot"]
    assert ds["clinhallu/vqa_rad/5"]["meta"]["gold_trace"] == {
        "visual_recognition": structured["visual_recognition"]["text"],
        "knowledge_recall": structured["knowledge_recall"]["text"],
        "reasoning": structured["reasoning"]["text"], "answer": "yes"}
    from_raw = ds["clinhallu/pathvqa/0"]["meta"]["gold_trace"]
    assert from_raw["visual_recognition"] == "Hematoxylin and eosin section with pale anucleate cells."
    assert from_raw["reasoning"] == "Cell ghosts without nuclei show coagulative necrosis here."
    assert from_raw["answer"] == "yes"


def test_label_noise_is_kept_and_flagged(snapshot, dataset_cache):
    loaded = _load(snapshot, "all", dataset_cache)
    flags = {r["id"]: r["meta"]["quality_flags"] for r in loaded.dataset}
    assert flags["clinhallu/pathvqa/1"] == ["gold_trace_invalid:stage [Visual Recognition] has fewer than 3 words"]
    assert flags["clinhallu/medxpertqa/MM-31"] == ["answer_letter_not_in_options"]
    assert loaded.quality["n_flagged"] == 2 and loaded.quality["n_records"] == 9
    assert [f["relpath"] for f in loaded.files] == [f"{HUB_FOLDERS[s]}/test-00000-of-00001.parquet"
                                                    for s in clinhallu_source.SOURCES]
    assert all(len(f["sha256"]) == 64 and f["origin"] == "data_dir" and f["verified"] is None for f in loaded.files)


def test_images_resolve_from_local_roots_and_missing_ones_are_counted(snapshot, dataset_cache, tmp_path):
    ds = load_benchmark("clinhallu", "medframeqa", data_dir=snapshot["data_dir"], cache_dir=dataset_cache,
                        image_roots=snapshot["image_roots"])
    assert [len(row["image"]) for row in ds] == [3, 2]
    assert ds[0]["image"][0].size == (16, 16)
    roots = dict(snapshot["image_roots"])
    partial = tmp_path / "frames"
    shutil.copytree(roots["clinhallu_medframeqa"], partial)
    (partial / "brain_stroke_MR__xyz789_2_2.jpg").unlink()
    roots["clinhallu_medframeqa"] = str(partial)
    loaded = _load(snapshot, "medframeqa", dataset_cache, image_roots=roots, on_missing="skip")
    assert loaded.dataset["id"] == ["clinhallu/medframeqa/brain_sdh_CT__abc123_4"]
    assert loaded.skipped_missing_images == [("clinhallu/medframeqa/brain_stroke_MR__xyz789_2",
                                              "brain_stroke_MR__xyz789_2_2.jpg")]


def test_edited_snapshot_is_never_served_from_a_stale_cache(snapshot, dataset_cache, tmp_path):
    copy = tmp_path / "snap"
    shutil.copytree(snapshot["data_dir"], copy)
    before = prepare_benchmark("clinhallu", "vqa_rad", data_dir=copy, cache_dir=dataset_cache).dataset
    path = copy / "VQA-RAD" / "test-00000-of-00001.parquet"
    rows = datasets.Dataset.from_parquet(str(path)).to_list()
    rows[0]["question"] = "Edited question?"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    after = prepare_benchmark("clinhallu", "vqa_rad", data_dir=copy, cache_dir=dataset_cache).dataset
    assert before[0]["question"] != after[0]["question"] == "Edited question?"


def test_missing_source_and_bad_rows_are_clear_errors(snapshot, dataset_cache, tmp_path):
    copy = tmp_path / "snap"
    shutil.copytree(snapshot["data_dir"], copy)
    shutil.rmtree(copy / "PathVQA")
    with pytest.raises(clinhallu_source.ClinHalluUnavailable, match=r"'pathvqa'.*\n.*hf download"):
        prepare_benchmark("clinhallu", "pathvqa", data_dir=copy, cache_dir=dataset_cache)
    with pytest.raises(clinhallu_source.ClinHalluUnavailable, match="not a folder"):
        clinhallu_source.load_source("pathvqa", tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"medxpertqa row 4: field 'question' is missing"):
        clinhallu_source.record({"answer": "A"}, 4, "medxpertqa")
    with pytest.raises(ValueError, match="unknown ClinHallu source"):
        clinhallu_source.load_source("slake", copy)


def test_offline_without_snapshot_names_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(clinhallu_source.ClinHalluUnavailable, match="Alibaba-DAMO-Academy/ClinHallu"):
        clinhallu_source.load_source("vqa_rad")


def test_duplicate_upstream_ids_are_refused(snapshot, dataset_cache, tmp_path):
    copy = tmp_path / "snap"
    shutil.copytree(snapshot["data_dir"], copy)
    path = copy / "MedXpertQA" / "test-00000-of-00001.parquet"
    rows = datasets.Dataset.from_parquet(str(path)).to_list()
    rows[1]["source_id"] = rows[0]["source_id"]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(Exception) as raised:  # datasets wraps it in DatasetGenerationError
        prepare_benchmark("clinhallu", "medxpertqa", data_dir=copy, cache_dir=dataset_cache)
    cause = raised.value if isinstance(raised.value, ValueError) else raised.value.__cause__
    assert "duplicate record id 'clinhallu/medxpertqa/MM-26'" in str(cause)


def _snapshot_row(snapshot, source: str = "vqa_rad", position: int = 0) -> dict:
    return dict(snapshot["rows"][source][position])


@pytest.mark.parametrize("change, message", [
    ({"question": 5}, r"ClinHallu vqa_rad row 0 \(id 'clinhallu/vqa_rad/5'\): field 'question' is int 5, expected a "
                      r"string"),
    ({"answer": ["yes"]}, r"row 0 \(id 'clinhallu/vqa_rad/5'\): field 'answer' is list \[\"yes\"\], expected a string"),
    ({"question": "x" * 60_000}, r"row 0 \(id 'clinhallu/vqa_rad/5'\): field 'question' holds 60,000 characters"),
    ({"question_type": "multiple_choice", "options": "A. Heart"},
     r"row 0 \(id 'clinhallu/vqa_rad/5'\): field 'options' is str 'A\. Heart', expected a list of option strings"),
    ({"question_type": "multiple_choice", "options": 3}, r"row 0 .*field 'options' is int 3, expected a list"),
    ({"images": 7}, r"row 0 \(id 'clinhallu/vqa_rad/5'\): field 'images' is int 7, expected a list of image references"),
], ids=["int_question", "list_answer", "huge_question", "string_options", "int_options", "int_images"])
def test_a_row_of_the_wrong_shape_names_source_row_id_and_field(snapshot, change, message):
    """Were: a number question or a list answer became its text ('5', "['yes']"); options "A. Heart" were eight
    one-character options; int options or images stopped the build with TypeError ('int' object is not iterable);
    a 60,000-character question was read (every other builder refuses it)."""
    with pytest.raises(ValueError, match=message):
        clinhallu_source.record({**_snapshot_row(snapshot), **change}, 0, "vqa_rad")


def test_an_empty_question_is_kept_and_flagged(snapshot, dataset_cache, tmp_path):
    """Was: a row whose question is blank loaded without a flag (the MedHEval builders flag empty_question)."""
    copy = tmp_path / "snap"
    shutil.copytree(snapshot["data_dir"], copy)
    path = copy / "VQA-RAD" / "test-00000-of-00001.parquet"
    rows = datasets.Dataset.from_parquet(str(path)).to_list()
    rows[1]["question"] = " \n"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    loaded = prepare_benchmark("clinhallu", "vqa_rad", data_dir=copy, cache_dir=dataset_cache)
    assert loaded.dataset[1]["meta"]["quality_flags"] == ["empty_question"]
    assert loaded.quality["flags"]["empty_question"] == 1

"""Med-StepBench: builder, malformed rows, run options, answer parsing, metric, volumes, prefix caching, runner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medheval.families.stepbench import source as stepbench
from medheval.data.benchmarks import load_benchmark, prepare_benchmark
from medheval.families.stepbench.source import StepBenchDataError, StepBenchOptions, choose_views, parse_verdict
from medheval.families.stepbench.fixtures import write_stepbench_fixture


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> dict:
    return write_stepbench_fixture(tmp_path_factory.mktemp("stepbench"), studies=3, per_study=8)


def _rows(fixture: dict) -> list[dict]:
    return [json.loads(line) for line in Path(fixture["statements"]).read_text(encoding="utf-8").splitlines()]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "statements.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                              encoding="utf-8")
    return tmp_path


# --------------------------------------------------------------------------- builder


def test_configs_and_canonical_fields(fixture, dataset_cache):
    both = load_benchmark("med_stepbench", config="all", data_dir=fixture["data_dir"], cache_dir=dataset_cache)
    english = load_benchmark("med_stepbench:en", data_dir=fixture["data_dir"], cache_dir=dataset_cache)
    vietnamese = load_benchmark("med_stepbench:vi", data_dir=fixture["data_dir"], cache_dir=dataset_cache)
    assert (len(both), len(english), len(vietnamese)) == (48, 24, 24)  # 3 studies x 8 statements x 2 languages
    assert set(english["config"]) == {"en"} and set(vietnamese["config"]) == {"vi"}
    raw = {row["statement_id"]: row for row in _rows(fixture)}
    for row in both:
        source = raw[row["meta"]["statement_id"]]
        assert row["id"] == f"med_stepbench/{source['language']}/{source['statement_id']}"
        assert row["question"] == source["statement"]  # without run options: the statement itself
        assert row["answer"] == source["label"] and row["answer_type"] == "statement"
        assert row["category"] == stepbench.STEPS[source["step"]]
        assert row["choices"] == [] and row["source"] == "med_stepbench"
        assert row["meta"]["step"] == source["step"] and row["meta"]["pair_id"] == source["pair_id"]
        assert row["meta"]["prior_knowledge"] == source["prior_knowledge"]
        assert row["meta"]["views"]["axial/ct/lung"] == source["views"]["axial"]["ct"]["lung"]
        assert row["meta"]["volume_pet"] == source["volume_pet"]  # unknown fields are kept in meta
        # images: every view path of the row, in view-key order
        assert row["images"] == [path for _, path in sorted(row["meta"]["views"].items())]
        assert len(row["images"]) == 12


def test_parquet_gives_the_same_rows(tmp_path, fixture, dataset_cache):
    parquet = write_stepbench_fixture(tmp_path / "pq", studies=3, per_study=8, fmt="parquet")
    a = load_benchmark("med_stepbench", data_dir=fixture["data_dir"], cache_dir=dataset_cache).to_list()
    b = load_benchmark("med_stepbench", data_dir=parquet["data_dir"], cache_dir=dataset_cache).to_list()
    assert a == b


def test_no_data_dir_says_what_to_do(dataset_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match="no public download: pass data_dir"):
        prepare_benchmark("med_stepbench", data_dir=None, cache_dir=dataset_cache)
    with pytest.raises(FileNotFoundError, match="statements.parquet or statements.jsonl"):
        prepare_benchmark("med_stepbench", data_dir=tmp_path, cache_dir=dataset_cache)


def test_editing_the_statements_file_rebuilds(tmp_path, dataset_cache):
    info = write_stepbench_fixture(tmp_path / "d", studies=1, per_study=2)
    rows = _rows(info)
    assert len(load_benchmark("med_stepbench", data_dir=info["data_dir"], cache_dir=dataset_cache)) == 4
    _write(Path(info["data_dir"]), rows[:3])
    assert len(load_benchmark("med_stepbench", data_dir=info["data_dir"], cache_dir=dataset_cache)) == 3


@pytest.mark.parametrize("row, change, message", [
    (2, {"step": 5}, r"row 3 \(statement_id='study000-001-vi'\): field 'step' must be one of 1, 2, 3, 4, got 5"),
    (4, {"label": "maybe"}, r"row 5 .*field 'label' must be one of \['ground_truth', 'hallucination'\]"),
    (1, {"language": "fr"}, r"row 2 .*field 'language' must be one of"),
    (3, {"statement": "  "}, r"row 4 .*field 'statement' is missing or empty"),
    (5, {"statement_id": "study000-000-vi"}, r"row 6 \(statement_id='study000-000-vi'\): field 'statement_id' repeats row 1"),
    (2, {"views": {"axial": "../../etc/passwd.png"}}, r"row 3 .*field 'views.axial' has a '\.\.' component"),
    (2, {"views": {"axial": "/data/a.png"}}, r"row 3 .*field 'views.axial' is an absolute path"),
    (2, {"volume": "volumes/%2e%2e/x.nii"}, r"row 3 .*field 'volume' has a '\.\.' component once percent-decoded"),
    (2, {"volume_pet": "../../etc/pet.nii"}, r"row 3 .*field 'volume_pet' has a '\.\.' component"),
    (1, {"volume_ct": "/data/ct.nii.gz"}, r"row 2 .*field 'volume_ct' is an absolute path"),
    (3, {"views": {}}, r"row 4 .*field 'views' has no image path"),
    (3, {"views": {"axial": "  "}}, r"row 4 \(statement_id='study000-001-en'\): field 'views.axial' is only "
                                    r"whitespace \('  '\)"),
    (2, {"views": {"axial": ""}}, r"row 3 .*field 'views.axial' is empty \(''\)"),
    (1, {"volume": " \t "}, r"row 2 .*field 'volume' is only whitespace"),
    (2, {"volume_pet": ""}, r"row 3 .*field 'volume_pet' is empty"),
    (3, {"views": {"axial": "a.png", "frontal": "b.png"}}, r"row 4 .*field 'views.frontal' is not a view"),
    (2, {"step": "2"}, r"row 3 .*field 'step' must be an integer 1-4, got '2'"),
    (2, {"study_id": 7}, r"row 3 .*field 'study_id' must be a string, got int"),
])
def test_malformed_rows_are_named(tmp_path, fixture, dataset_cache, row, change, message):
    rows = _rows(fixture)[:8]
    if "views" in change:  # one view shape in every row, so only the changed row is wrong
        rows = [{**r, "views": {"axial": "views/study000/axial/fused.png"}} for r in rows]
    rows[row] = {**rows[row], **change}
    with pytest.raises(StepBenchDataError, match=message):
        prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)


@pytest.mark.parametrize("blank", ["   ", "\u3000\u00a0\t"], ids=["spaces", "unicode_whitespace"])
def test_a_blank_nested_view_path_in_parquet_names_the_file_row_and_field(tmp_path, fixture, dataset_cache, blank):
    """A Parquet file goes through the same check: a leaf view path of only (Unicode) whitespace is refused
    naming the file, the row, its statement_id and the dotted field."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(fixture)[:4]
    rows[2]["views"]["axial"]["ct"]["lung"] = blank
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "statements.parquet")
    sid = rows[2]["statement_id"]
    with pytest.raises(StepBenchDataError) as raised:
        prepare_benchmark("med_stepbench", data_dir=tmp_path, cache_dir=dataset_cache)
    assert str(raised.value).startswith(f"{tmp_path / 'statements.parquet'}: row 3 (statement_id={sid!r}): field "
                                        f"'views.axial.ct.lung' is only whitespace ({blank!r}); give a path relative "
                                        f"to DIR, or leave the key out.")

def test_missing_required_field_and_broken_json(tmp_path, fixture, dataset_cache):
    rows = _rows(fixture)[:4]
    rows[2] = {k: v for k, v in rows[2].items() if k != "label"}
    with pytest.raises(StepBenchDataError, match=r"row 3 .*field 'label' is missing or empty"):
        prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)
    good = "".join(json.dumps(r) + "\n" for r in _rows(fixture)[:2])
    (tmp_path / "statements.jsonl").write_text(good + '{"statement_id": "x", "step": 1,\n')
    with pytest.raises(StepBenchDataError, match=r"line 3 \(row 3\): not valid JSON"):
        prepare_benchmark("med_stepbench", data_dir=tmp_path, cache_dir=dataset_cache)
    rows = [{k: v for k, v in r.items() if k != "views"} for r in _rows(fixture)[:2]]
    with pytest.raises(StepBenchDataError, match=r"no column\(s\) \['views'\]"):
        prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)


def test_a_row_longer_than_a_json_block_loads_or_says_why(tmp_path, fixture, dataset_cache, monkeypatch):
    """pyarrow reads JSON in 16 MB blocks; a 36 MB row (a long external-knowledge text) is read with larger
    blocks, and a row beyond the limit is refused by line, never with pyarrow's "straddling object" text."""
    from medheval.families.stepbench import source as stepbench_source

    rows = _rows(fixture)[:3]
    rows[1] = {**rows[1], "external_knowledge": "uptake " * (36 * 2**20 // 7)}  # > 2 blocks: pyarrow refuses
    loaded = prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)
    assert len(loaded.dataset) == 3
    monkeypatch.setattr(stepbench_source, "MAX_ROW_BYTES", 8 << 20)
    with pytest.raises(StepBenchDataError, match=r"statements.jsonl: line 2 is 36 MB, more than one statement row"):
        stepbench_source.read_statements(tmp_path / "statements.jsonl")


def test_mixed_view_shapes_name_the_row(tmp_path, fixture, dataset_cache):
    rows = _rows(fixture)[:4]
    rows[3] = {**rows[3], "views": {"axial": "views/a.png"}}  # earlier rows give axial as an object
    with pytest.raises(StepBenchDataError, match=r"row 4 .*field 'views.axial' is a string here but a object"):
        prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)


# --------------------------------------------------------------------------- inputs and prompts

VIEWS = {"axial/ct/lung": "a_l.png", "axial/ct/mediastinal": "a_m.png", "axial/pet": "a_p.png",
         "axial/fused": "a_f.png", "coronal": "c.png", "sagittal/pet": "s_p.png", "sagittal/ct/lung": None}


@pytest.mark.parametrize("options, expected", [
    ({}, ["a_f.png", "c.png", "s_p.png"]),  # plain path, else fused, else CT, else PET
    ({"modality": "ct"}, ["a_m.png"]),  # mediastinal window by default; planes without CT are left out
    ({"modality": "ct", "window": "lung"}, ["a_l.png"]),
    ({"modality": "pet"}, ["a_p.png", "s_p.png"]),
    ({"modality": "separate"}, ["a_m.png", "a_p.png", "s_p.png"]),
    ({"views": "coronal,axial/ct/lung"}, ["c.png", "a_l.png"]),
])
def test_view_choice(options, expected):
    assert choose_views(VIEWS, StepBenchOptions.from_mapping(options)) == expected


def test_view_choice_errors():
    with pytest.raises(KeyError, match=r"view\(s\) \['sagittal/fused'\] absent"):
        choose_views(VIEWS, StepBenchOptions.from_mapping({"views": ["sagittal/fused"]}))
    with pytest.raises(ValueError, match="knowledge='some'"):
        StepBenchOptions.from_mapping({"knowledge": "some"})
    with pytest.raises(ValueError, match=r"unknown Med-StepBench option\(s\) \['lang'\]"):
        StepBenchOptions.from_mapping({"lang": "en"})


def test_prompt_carries_the_chosen_context():
    meta = {"step": 2, "prior_knowledge": "Lesion in the right lung.", "external_knowledge": "FDG marks glucose use.",
            "rationale_llm": "Bright spot.", "rationale_clinician": "Seen on fused views."}
    plain = stepbench.build_prompt(" The lesion is 10 mm. ", "en", StepBenchOptions(), meta)
    assert "Statement: The lesion is 10 mm.\n" in plain and "previous step" not in plain
    assert plain.endswith("Answer with one word: Consistent or Inconsistent.")
    both = stepbench.build_prompt("S", "en", StepBenchOptions(knowledge="both", rationale="clinician"), meta)
    assert both.index("Finding from the previous step: Lesion in the right lung.") < both.index(
        "Background knowledge: FDG marks glucose use.") < both.index("Explanation offered with the statement: Seen on")
    assert "Bright spot" not in both
    vi = stepbench.build_prompt("Câu", "vi", StepBenchOptions(knowledge="prior"), meta)
    assert "Kết quả của bước trước: Lesion in the right lung." in vi and "Nhận định: Câu" in vi


@pytest.mark.parametrize("step, knowledge_given", [(1, False), (2, True), (3, True), (4, True)])
def test_knowledge_goes_to_steps_2_to_4_only(step, knowledge_given):
    """Med-StepBench Table 3 prints "–" for Step 1 "with knowledge" and its Table 5 covers steps 2-4: Step 1
    (anatomical mapping) has no earlier step and gets no prior or external knowledge, even when its row
    carries some; the rationale is not knowledge and is shown at every step."""
    meta = {"step": step, "prior_knowledge": "Lesion in the right lung.", "external_knowledge": "FDG marks glucose use.",
            "rationale_llm": "Bright spot."}
    for language in ("en", "vi"):
        prompt = stepbench.build_prompt("S", language, StepBenchOptions(knowledge="both", rationale="llm"), meta)
        assert ("Lesion in the right lung." in prompt) is knowledge_given
        assert ("FDG marks glucose use." in prompt) is knowledge_given
        assert "Bright spot." in prompt
    assert stepbench.KNOWLEDGE_STEPS == (2, 3, 4)


def test_run_options_rewrite_prompts_and_views(fixture, dataset_cache):
    loaded = prepare_benchmark("med_stepbench", "all", data_dir=fixture["data_dir"], cache_dir=dataset_cache,
                               image_roots={"med_stepbench": fixture["data_dir"]},
                               run_options={"knowledge": "prior", "modality": "fused"})
    rows = loaded.dataset.to_list()
    studies = [row["meta"]["study_id"] for row in rows]
    assert studies == sorted(studies)  # statements of a study sit together
    for row in rows:
        assert row["images"] == [row["meta"]["views"][f"{p}/fused"] for p in stepbench.PLANES]
        assert ("Finding from the previous step" in row["question"] or "Kết quả của bước trước" in row["question"]) \
            == (row["meta"]["step"] > 1)
    assert loaded.run_options["knowledge"] == "prior" and loaded.run_options["modality"] == "fused"
    assert loaded.run_options["counts"]["missing_prior_knowledge"] == 0
    step1 = sum(row["meta"]["step"] == 1 for row in rows)
    assert step1 and loaded.run_options["counts"]["step1_without_knowledge"] == step1
    assert loaded.run_options["knowledge_steps"] == [2, 3, 4]
    assert len(loaded.resolver.load_record_images(rows[0])) == 3


def test_unsafe_view_path_is_refused_at_image_load(fixture, tmp_path):
    from medheval.data.images import ImageResolver, UnsafeImagePath

    resolver = ImageResolver({"med_stepbench": fixture["data_dir"]})
    with pytest.raises(UnsafeImagePath):
        resolver.load_record_images({"id": "x", "source": "med_stepbench", "images": ["../outside.png"]})


@pytest.mark.parametrize("text, verdict", [
    ("Consistent", "ground_truth"), ("Inconsistent.", "hallucination"), ("The statement is not consistent.", "hallucination"),
    ("Answer: TRUE", "ground_truth"), ("false", "hallucination"), ("Yes, it matches.", "ground_truth"),
    ("No.", "hallucination"), ("This is a hallucination.", "hallucination"), ("Hallucinated finding", "hallucination"),
    ("Correct", "ground_truth"), ("Incorrect", "hallucination"), ("Nhất quán", "ground_truth"),
    ("Không nhất quán", "hallucination"), ("Đúng", "ground_truth"), ("Sai", "hallucination"),
    ("Consistent, there is no other lesion.", "ground_truth"), ("I cannot tell.", None), ("", None), (None, None),
])
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict


# --------------------------------------------------------------------------- metric


def _metric():
    import evaluate

    from medheval.data.registry import metric_path

    return evaluate.load(metric_path("stepbench"))


def test_metric_on_hand_worked_counts():
    H, G = "hallucination", "ground_truth"
    predictions = ["Inconsistent", "No.", "Consistent", "Yes", "false", "??", "hallucination", "consistent", "blah"]
    references = [H, H, H, G, G, G, H, G, H]
    steps = [1, 1, 1, 1, 1, 1, "lesion_identification", 2, 2]
    languages = ["en"] * 6 + ["vi"] * 3
    out = _metric().compute(predictions=predictions, references=references, steps=steps, languages=languages)
    # step 1: TP 2, FN 1, FP 2 (one "false", one unparsed ground truth), TN 1
    s1 = out["per_step"][1]
    assert (s1["tp"], s1["fn"], s1["fp"], s1["tn"], s1["n_unparsed"]) == (2, 1, 2, 1, 1)
    assert s1["precision"] == pytest.approx(0.5) and s1["recall"] == pytest.approx(2 / 3)
    assert s1["f1"] == pytest.approx(4 / 7)
    # step 2: TP 1, FN 1 (unparsed hallucination), TN 1
    s2 = out["per_step"][2]
    assert (s2["tp"], s2["fn"], s2["fp"], s2["tn"]) == (1, 1, 0, 1)
    assert (s2["precision"], s2["recall"], s2["f1"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert out["macro_f1"] == pytest.approx((4 / 7 + 2 / 3) / 2)
    assert out["n_unparsed"] == 2 and out["n"] == 9 and out["positive_class"] == "hallucination"
    assert out["precision"] == pytest.approx(3 / 5) and out["recall"] == pytest.approx(3 / 5)
    assert set(out["by_language"]["en"]["per_step"]) == {1} and set(out["by_language"]["vi"]["per_step"]) == {2}
    assert out["by_language"]["vi"]["macro_f1"] == pytest.approx(2 / 3)
    assert out["correct"] == [True, True, False, True, False, False, True, True, False]
    assert out["parsed"] == [True, True, True, True, True, False, True, True, False]


def test_metric_rejects_bad_inputs():
    metric = _metric()
    with pytest.raises(ValueError, match=r"item 1: reference 'Yes' is not one of"):
        metric.compute(predictions=["a", "b"], references=["hallucination", "Yes"], steps=[1, 1])
    with pytest.raises(ValueError, match=r"item 0: step 5 is not one of 1, 2, 3, 4"):
        metric.compute(predictions=["a"], references=["hallucination"], steps=[5])
    with pytest.raises(ValueError, match=r"steps \(1\)"):
        metric.compute(predictions=["a", "b"], references=["hallucination"] * 2, steps=[1])


def test_zero_denominators_give_zero():
    out = _metric().compute(predictions=["Consistent"], references=["ground_truth"], steps=[3])
    assert out["per_step"][3] == {**out["per_step"][3], "precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}


# --------------------------------------------------------------------------- volumes


def test_volume_round_trip_and_path_safety(fixture):
    from medheval.families.stepbench import pet_ct
    from medheval.data.images import UnsafeImagePath

    ct, affine = pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")
    pet, _ = pet_ct.load_volume(fixture["data_dir"], "volumes/study000/pet.nii.gz")
    assert ct.shape == (24, 24, 32) and np.allclose(np.diag(affine), 1.0)
    assert pet.max() == pytest.approx(6.0) and ct.min() < -900  # lesion SUV of seed 0; air outside the body
    with pytest.raises(UnsafeImagePath):
        pet_ct.load_volume(fixture["data_dir"], "../volumes/study000/ct.nii.gz")
    with pytest.raises(FileNotFoundError, match="volumes/none.nii.gz"):
        pet_ct.load_volume(fixture["data_dir"], "volumes/none.nii.gz")
    record = {"id": "r", "meta": {"volume": "volumes/study000/ct.nii.gz", "volume_pet": "volumes/study000/pet.nii.gz"}}
    volumes = pet_ct.load_record_volumes(fixture["data_dir"], record, ("volume", "volume_pet"))
    assert np.array_equal(volumes["volume"], ct) and np.array_equal(volumes["volume_pet"], pet)
    with pytest.raises(FileNotFoundError, match=r"record 'r' has no \['volume'\]"):
        pet_ct.load_record_volumes(fixture["data_dir"], {"id": "r", "meta": {}})
    # the PNG views are renderings of these volumes
    from PIL import Image

    view = Image.open(Path(fixture["data_dir"]) / "views/study000/axial/ct_lung.png")
    assert np.array_equal(np.asarray(view), np.asarray(pet_ct.render_view(ct, pet, "axial", "ct", "lung")))


def test_a_volume_over_the_voxel_cap_is_refused_before_its_data_is_read(fixture, tmp_path, monkeypatch):
    """A NIfTI header chooses the shape np.asarray allocates (512^3 zeros gzip to 585 KB and load as 512 MiB):
    the declared shape is checked against MEDHEVAL_VOLUME_MAX_VOXELS first, and the error says how to raise it."""
    import nibabel as nib

    from medheval.families.stepbench import pet_ct

    assert pet_ct.max_voxels() == pet_ct.DEFAULT_MAX_VOXELS == 2**28
    monkeypatch.setenv(pet_ct.MAX_VOXELS_ENV, "10000")  # the fixture's 24x24x32 = 18432 voxels are over it
    with pytest.raises(pet_ct.VolumeTooLarge, match=r"volume 'volumes/study000/ct.nii.gz' \(.*ct\.nii\.gz\) declares "
                       r"a volume of 24x24x32 = 18,432 voxels, over the cap of 10,000.*MEDHEVAL_VOLUME_MAX_VOXELS=N"):
        pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")
    monkeypatch.setenv(pet_ct.MAX_VOXELS_ENV, "20000")
    assert pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")[0].shape == (24, 24, 32)

    # a header alone declaring 2000^3 voxels (8 G, 32 GB as float32), with almost no data behind it
    monkeypatch.delenv(pet_ct.MAX_VOXELS_ENV)
    header = nib.Nifti1Header()
    header.set_data_dtype(np.uint8)
    header.set_data_shape((2000, 2000, 2000))
    (tmp_path / "bomb.nii").write_bytes(header.binaryblock + b"\0" * (int(header["vox_offset"]) - 348 + 64))
    with pytest.raises(pet_ct.VolumeTooLarge, match=r"bomb\.nii.*2000x2000x2000 = 8,000,000,000 voxels"):
        pet_ct.load_volume(tmp_path, "bomb.nii")
    monkeypatch.setenv(pet_ct.MAX_VOXELS_ENV, "0")
    with pytest.raises(ValueError, match="MEDHEVAL_VOLUME_MAX_VOXELS"):
        pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")


def test_ct_window_formula():
    from medheval.families.stepbench.pet_ct import window_ct

    # mediastinal window: centre 50, width 350 -> [-125, 225]
    assert window_ct(np.array([-125.0, 50.0, 225.0, 1000.0]), "mediastinal").tolist() == [0.0, 0.5, 1.0, 1.0]


# --------------------------------------------------------------------------- prefix caching and the runner


@pytest.fixture(scope="module")
def tiny():
    from medheval.backends.tiny import build_tiny_llava

    return build_tiny_llava(seed=0)


def test_prefix_cache_gives_the_naive_answers(fixture, dataset_cache, tiny):
    from medheval.backends.hf import HFBackend

    loaded = prepare_benchmark("med_stepbench", "all", data_dir=fixture["data_dir"], cache_dir=dataset_cache,
                               image_roots={"med_stepbench": fixture["data_dir"]}, run_options={"knowledge": "both"})
    records = loaded.dataset.to_list()
    order = list(range(0, len(records), 2)) + list(range(1, len(records), 2))  # studies interleaved
    records = [records[i] for i in order]
    images = [loaded.resolver.load_record_images(r) for r in records]
    model, processor = tiny
    naive = HFBackend(model, processor, batch_size=5, max_new_tokens=6).generate(records, images)
    cached_backend = HFBackend(model, processor, batch_size=5, max_new_tokens=6, prefix_cache=True)
    cached = cached_backend.generate(records, images)
    assert cached == naive
    assert len(set(naive)) > 3  # the answers differ across statements: the check is not vacuous
    assert cached_backend._prefix_cache.prefix_encodings == 3  # one per study
    assert cached_backend.settings()["prefix_cache"] is True
    # a study split over two calls (runner batches) is encoded once; a lone statement works too
    study = [i for i, r in enumerate(records) if r["meta"]["study_id"] == "study001"]
    split = HFBackend(model, processor, batch_size=4, max_new_tokens=6, prefix_cache=True)
    halves = [study[:5], study[5:]]
    got = [text for half in halves for text in split.generate([records[i] for i in half], [images[i] for i in half])]
    assert got == [naive[i] for i in study] and split._prefix_cache.prefix_encodings == 1
    lone = HFBackend(model, processor, max_new_tokens=6, prefix_cache=True).generate(records[:1], images[:1])
    assert lone == naive[:1]


def test_prefix_cache_refuses_a_mitigation(tiny):
    from medheval.backends.base import BackendError
    from medheval.backends.hf import HFBackend

    backend = HFBackend(*tiny, prefix_cache=True, generate_kwargs={"custom_generate": lambda *a, **k: None})
    with pytest.raises(BackendError, match="cannot be combined with a decoding mitigation"):
        backend.generate([{"id": "x", "question": "q", "answer_type": "statement"}], [[]])


def test_run_end_to_end_records_options_and_table(fixture, tmp_path, tiny):
    from medheval.backends.hf import HFBackend
    from medheval.run.runner import RunError, RunSpec, run

    model, processor = tiny
    backend = HFBackend(model, processor, batch_size=16, max_new_tokens=3, prefix_cache=True)
    spec = RunSpec(benchmarks=["med_stepbench:en"], output=tmp_path / "run", data_dir=fixture["data_dir"],
                   image_roots={"med_stepbench": fixture["data_dir"]},
                   benchmark_options={"med_stepbench": {"knowledge": "both", "rationale": "llm"}})
    results = run(spec, backend, batch_size=16)
    entry = results["benchmarks"]["med_stepbench:en"]
    assert entry["run_options"]["knowledge"] == "both" and entry["run_options"]["rationale"] == "llm"
    metric = entry["metrics"]["stepbench"]
    scored = [json.loads(line) for line in (tmp_path / "run" / "scored.jsonl").read_text().splitlines()]
    assert metric["n"] == len(scored) == 24
    assert metric["n_unparsed"] == sum(not item["parsed"] for item in scored)
    assert set(metric["by_language"]) == {"en"}
    assert results["settings"]["benchmark_options"] == {"med_stepbench": {"knowledge": "both", "rationale": "llm"}}
    md = (tmp_path / "run" / "results.md").read_text()
    assert "| EN S1 R | EN S1 F1 |" in md and "| both |" in md
    changed = RunSpec(**{**spec.__dict__, "benchmark_options": {"med_stepbench": {"knowledge": "none"}}})
    with pytest.raises(RunError, match="changed: benchmark_options"):
        run(changed, backend, batch_size=16)
    typo = RunSpec(**{**spec.__dict__, "output": tmp_path / "typo", "benchmark_options": {"med_stepbenc": {}}})
    with pytest.raises(RunError, match=r"benchmark\(s\) \['med_stepbenc'\]"):
        run(typo, backend, batch_size=16)


def test_table3_shape():
    from medheval.report.tables import stepbench_table

    def run(knowledge, f1):
        per_step = {str(s): {"recall": 0.5, "f1": f1} for s in (1, 2, 3, 4)}
        return {"settings": {"model": "m", "mitigation": "none"}, "benchmarks": {
            "med_stepbench:all": {"run_options": {"knowledge": knowledge}, "metrics": {"stepbench": {
                "n_unparsed": 2, "by_language": {"en": {"per_step": per_step}, "vi": {"per_step": {"1": per_step["1"]}}}}}}}}

    table = stepbench_table([run("none", 0.25), run("both", 0.75)]).splitlines()
    assert table[0].startswith("| Model | Mitigation | Knowledge | EN S1 R | EN S1 F1 |") and table[0].endswith(
        "VI S4 F1 | Unparsed |")
    assert table[2] == "| m | none | none | " + " | ".join(["50.0 | 25.0"] * 4) + " | 50.0 | 25.0 | " + \
        " | ".join(["– | –"] * 3) + " | 2 |"
    # Step 1 has no with-knowledge variant (paper Table 3: "–"); steps 2-4 are shown
    assert table[3].startswith("| m | none | both | – | – | 50.0 | 75.0 |")
    assert table[-1] == "Step 1 takes no prior or external knowledge (knowledge goes to steps 2–4 only), so its " \
        "cells in rows with knowledge are –, as in Med-StepBench Table 3."
    assert stepbench_table([run("none", 0.25)]).splitlines()[-1].startswith("| m | none | none | 50.0 | 25.0 |")


def test_cli_run_with_options(fixture, tmp_path, capsys):
    from medheval.cli import main

    data = fixture["data_dir"]
    out = tmp_path / "cli"
    args = ["run", "--benchmark", "med_stepbench:vi", "--model", "tiny-random-llava", "--data-dir", data,
            "--image-root", f"med_stepbench={data}", "--output", str(out), "--prefix-cache", "--max-new-tokens", "2",
            "--limit", "6", "--benchmark-option", "med_stepbench.rationale=clinician"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    entry = results["benchmarks"]["med_stepbench:vi"]
    assert entry["n_scored"] == 6 and entry["run_options"]["rationale"] == "clinician"
    assert results["settings"]["backend"]["prefix_cache"] is True
    assert not any("--prefix-cache" in warning for warning in results["warnings"])  # greedy: the cache serves it
    capsys.readouterr()
    # sampled records cannot use the prefix cache: said, naming the split, not ignored silently
    sampled = tmp_path / "sampled"
    limited = [("2" if before == "--limit" else a) for before, a in zip(["", *args], args)]
    limited[limited.index(str(out))] = str(sampled)
    assert main([*limited, "--do-sample", "--seed", "3"]) == 0
    said = "--prefix-cache is not used where records are sampled: med_stepbench:vi (statement)"
    assert said in capsys.readouterr().err
    assert any(said in warning for warning in json.loads((sampled / "results.json").read_text())["warnings"])
    args[args.index(str(out))] = str(tmp_path / "bad")
    assert main(args[:-1] + ["med_stepbench.knowledge=lots"]) == 2
    assert "knowledge='lots': choose one of ['none', 'prior', 'external', 'both']" in capsys.readouterr().err
    assert main(args[:-1] + ["knowledge=prior"]) == 2
    assert "expected BENCHMARK.KEY=VALUE" in capsys.readouterr().err


def test_fixture_without_volumes_is_a_views_only_benchmark(tmp_path, dataset_cache, monkeypatch):
    """Without nibabel (the stepbench extra) the demo's fixture still builds: views, no volumes."""
    import sys

    monkeypatch.setitem(sys.modules, "nibabel", None)  # import nibabel now fails, as when not installed
    written = write_stepbench_fixture(tmp_path / "data", studies=2, per_study=4, volumes=False)
    assert not written["volumes"] and not (tmp_path / "data" / "volumes").exists()
    ds = prepare_benchmark("med_stepbench", "all", data_dir=written["data_dir"], cache_dir=dataset_cache).dataset
    assert len(ds) == written["n_statements"] == 16
    assert all(ref.startswith("views/") for row in ds for ref in row["images"])


class _VolumeModel:
    """A stand-in 3D model: answers from the CT volume it is handed (bright voxels -> a lesion)."""

    name = "volume-model"
    needs_images = False
    needs_volumes = True

    def __init__(self):
        self.shapes: list[tuple] = []

    def generate(self, records, images):
        out = []
        for record in records:
            ct = record["volumes"]["volume"]
            self.shapes.append((ct.shape, "volume_pet" in record["volumes"]))
            out.append("inconsistent" if float(ct.max()) > 0 else "consistent")
        return out

    def settings(self):
        return {"kind": "volume-model"}


def test_a_3d_backend_receives_each_records_volumes(fixture, fixture_benchmark, tmp_path):
    """needs_volumes: the runner reads meta.volume (and volume_pet) with nibabel and hands the arrays over."""
    from medheval.families.stepbench import pet_ct
    from medheval.run.runner import RunError, RunSpec, run

    model = _VolumeModel()
    spec = RunSpec(benchmarks=["med_stepbench:en"], output=tmp_path / "run", data_dir=fixture["data_dir"])
    run(spec, model)
    ct, _ = pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")
    assert len(model.shapes) == fixture["n_statements"] // 2 and set(model.shapes) == {(ct.shape, True)}
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "stepbench" in results["benchmarks"]["med_stepbench:en"]["metrics"]
    assert results["warnings"] == []  # the user's own statements file has no pin to be checked against
    with pytest.raises(RunError, match="reads 3D volumes"):
        run(RunSpec(benchmarks=["context"], output=tmp_path / "other", data_dir=fixture_benchmark["data_dir"]), model)


class _SeeingVolumeModel(_VolumeModel):
    """A 3D model that keeps every record's volumes as handed over (to check what a blind run shows it)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, dict] = {}
        self.meta: dict[str, dict] = {}

    def generate(self, records, images):
        for record in records:
            self.seen[record["id"]] = {name: volume.copy() for name, volume in record["volumes"].items()}
            self.meta[record["id"]] = record["meta"]
        return ["consistent" for _ in records]


def test_a_blind_run_hands_a_3d_model_no_volume_data(fixture, tmp_path):
    """--control on a 3D model (medheval.run.control): no_image hands over no volume; blank gives zeros of each
    volume's shape; noise gives values of that shape inside the volume's own range, the same for a record in
    any run with the same seed (a rerun into another folder), another with another seed."""
    from medheval.families.stepbench import pet_ct
    from medheval.run.runner import RunSpec, run

    meta: dict[str, dict] = {}

    def blind(kind: str, folder: str, seed: int = 0) -> dict[str, dict]:
        model = _SeeingVolumeModel()
        run(RunSpec(benchmarks=["med_stepbench:en"], output=tmp_path / folder, data_dir=fixture["data_dir"],
                    control=kind, control_seed=seed), model)
        assert len(model.seen) == fixture["n_statements"] // 2
        meta.update(model.meta)
        return model.seen

    ct, _ = pet_ct.load_volume(fixture["data_dir"], "volumes/study000/ct.nii.gz")
    assert all(volumes == {} for volumes in blind("no_image", "no_image").values())
    blank = blind("blank", "blank")
    assert all(set(volumes) == {"volume", "volume_pet"} for volumes in blank.values())
    assert all(v.shape == ct.shape and not v.any() for volumes in blank.values() for v in volumes.values())
    noise, again, other = blind("noise", "noise"), blind("noise", "again"), blind("noise", "other", seed=1)
    rid = sorted(noise)[0]
    real = pet_ct.load_record_volumes(fixture["data_dir"], {"id": rid, "meta": meta[rid]},
                                      ("volume", "volume_pet"))
    for name, volume in noise[rid].items():
        assert volume.shape == real[name].shape and volume.dtype == real[name].dtype
        assert real[name].min() <= volume.min() and volume.max() <= real[name].max()
        assert not np.array_equal(volume, real[name]) and np.array_equal(volume, again[rid][name])
        assert not np.array_equal(volume, other[rid][name])
    assert not np.array_equal(noise[rid]["volume"], noise[rid]["volume_pet"])  # each volume its own stream
    results = json.loads((tmp_path / "noise" / "results.json").read_text())
    assert results["settings"]["control"] == {"kind": "noise", "seed": 0}


def test_metric_leaves_a_none_language_out_of_by_language_and_counts_it():
    # "Yes" on a hallucination: parsed as consistent, a miss; "No" on a ground-truth statement: a miss too.
    out = _metric().compute(predictions=["Inconsistent", "Consistent", "Yes"],
                            references=["hallucination", "ground_truth", "hallucination"],
                            steps=[1, 1, 1], languages=["en", None, "en"])
    assert out["n"] == 3 and out["n_without_language"] == 1
    assert set(out["by_language"]) == {"en"} and out["by_language"]["en"]["n"] == 2
    assert out["accuracy"] == pytest.approx(2 / 3) and out["by_language"]["en"]["accuracy"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["empty", "blank_lines"])
def test_a_statements_file_without_rows_says_so(tmp_path, dataset_cache, content):
    """Were: 'could not be read as JSON Lines: Empty JSON file' (an empty file) and "no column(s) ['views'] in
    any row" (blank lines only)."""
    (tmp_path / "statements.jsonl").write_text(content)
    with pytest.raises(StepBenchDataError, match=r"statements\.jsonl: no statements \(the file holds no rows\); "
                                                 r"write one"):
        prepare_benchmark("med_stepbench", data_dir=tmp_path, cache_dir=dataset_cache)


@pytest.mark.parametrize("views, kind", [(["views/a.png"], "array"), ("views/a.png", "string")])
def test_views_of_another_json_type_in_a_later_row_name_the_row(tmp_path, fixture, dataset_cache, views, kind):
    """Was pyarrow's 'could not be read as JSON Lines: JSON parse error: Column(/views) changed from object to
    array in row 1', naming neither the line nor the statement."""
    rows = _rows(fixture)[:4]
    rows[2] = {**rows[2], "views": views}
    sid = rows[2]["statement_id"]
    with pytest.raises(StepBenchDataError, match=rf"statements\.jsonl: row 3 \(statement_id={sid!r}\): field 'views' "
                                                 rf"is of JSON type {kind} here but object in earlier rows"):
        prepare_benchmark("med_stepbench", data_dir=_write(tmp_path, rows), cache_dir=dataset_cache)

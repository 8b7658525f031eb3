"""The MedHEval builders on the embedded fixtures, and on the real upstream files when present."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import UPSTREAM_MEDHEVAL, requires_upstream

from medheval.data.benchmarks import load_benchmark, prepare_benchmark
from medheval.data.images import MissingImagesError, check_reference
from medheval.families.medheval.source import FILES
from medheval.data.schema import ANSWER_TYPES, FEATURES

SPLITS = {
    "mm_vishal": {"slake": "slake", "vqa_rad": "vqa_rad"},
    "cxr_vishal": {"iu_xray": "iu_xray", "mimic_cxr": "mimic_cxr"},
}
UPSTREAM_COUNTS = {
    ("mm_vishal", "all"): 3610, ("mm_vishal", "slake"): 1536, ("mm_vishal", "vqa_rad"): 2074,
    ("cxr_vishal", "all"): 5587, ("cxr_vishal", "iu_xray"): 2017, ("cxr_vishal", "mimic_cxr"): 3570,
    ("vishal_report", "default"): 490, ("knowledge", "closed"): 2000, ("knowledge", "open"): 2318,
    ("context", "default"): 2000,
}
FILE_OF = {("mm_vishal", "slake"): "slake", ("mm_vishal", "vqa_rad"): "vqa_rad", ("cxr_vishal", "iu_xray"): "iu_xray",
           ("cxr_vishal", "mimic_cxr"): "mimic_cxr", ("vishal_report", "default"): "report",
           ("knowledge", "closed"): "knowledge_closed", ("knowledge", "open"): "knowledge_open",
           ("context", "default"): "context"}


def _raw(data_dir: Path, key: str) -> list[dict]:
    return json.loads((Path(data_dir) / FILES[key].relpath).read_text())


def _check_split(ds, name: str, config: str, data_dir: Path) -> None:
    assert ds.features == FEATURES
    ids = ds["id"]
    assert len(ids) == len(set(ids)), "ids must be unique"
    rows = ds.to_list()
    for row in rows:
        assert row["answer_type"] in ANSWER_TYPES
        assert row["benchmark"] == name and row["id"].startswith(f"{name}/")
        for ref in row["images"]:
            assert check_reference(row["source"], ref), (row["id"], ref)
        if row["answer_type"] == "multiple_choice":
            assert len(row["choices"]) >= 2 or "fewer_than_two_choices" in row["meta"]["quality_flags"], row["id"]
    configs = [config] if (name, config) in FILE_OF else list(SPLITS[name])
    expected = sum(len(_raw(data_dir, FILE_OF[(name, c)])) for c in configs)
    assert len(rows) == expected
    # every id maps back to the upstream qid of its fine-grained file, answers kept verbatim
    for c in configs:
        raw_by_qid = {r["qid"]: r for r in _raw(data_dir, FILE_OF[(name, c)])}
        for row in (r for r in rows if r["config"] == c):
            raw = raw_by_qid[row["meta"]["upstream_qid"]]
            assert row["id"] == f"{name}/{c}/{raw['qid']}"
            assert row["answer"] == str(raw["answer"]) and row["question"] == raw["question"]
            assert row["images"] == [raw["img_name"]]


@pytest.mark.parametrize("name,config", sorted(UPSTREAM_COUNTS))
def test_builder_on_fixtures(name, config, fixture_benchmark, dataset_cache):
    ds = prepare_benchmark(name, config, data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache).dataset
    _check_split(ds, name, config, Path(fixture_benchmark["data_dir"]))


def test_categories_and_answer_types_follow_the_data(fixture_benchmark, dataset_cache):
    ds = load_benchmark("mm_vishal", "all", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    assert set(ds["category"]) <= {"anatomy", "measurement", "symptom", "radiology"}
    assert set(ds["answer_type"]) == {"yes_no", "multiple_choice"}
    for row in ds.to_list():
        assert (row["answer_type"] == "multiple_choice") == (len(row["choices"]) > 0 or
                                                              "fewer_than_two_choices" in row["meta"]["quality_flags"])
    report = load_benchmark("vishal_report", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    assert set(report["answer_type"]) == {"report"} and all(m["structured_answer"] for m in report["meta"])
    assert set(load_benchmark("knowledge:open", data_dir=fixture_benchmark["data_dir"],
                              cache_dir=dataset_cache)["answer_type"]) == {"open"}


def test_label_noise_is_kept_and_flagged(fixture_benchmark, dataset_cache):
    loaded = prepare_benchmark("mm_vishal", "all", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    flags = loaded.quality["flags"]
    assert flags.get("binary_answer_not_yes_no", 0) >= 1
    assert flags.get("choices_are_bare_letters", 0) >= 1
    noisy = [row for row in loaded.dataset.to_list() if "binary_answer_not_yes_no" in row["meta"]["quality_flags"]]
    assert all(row["answer"].strip().lower() not in {"yes", "no"} for row in noisy)  # never re-labelled
    knowledge = prepare_benchmark("knowledge", "closed", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    assert knowledge.quality["flags"].get("binary_answer_not_yes_no", 0) >= 1  # "Unclear"


def test_all_config_is_the_union_of_its_sources(fixture_benchmark, dataset_cache):
    data_dir = fixture_benchmark["data_dir"]
    for name, sources in SPLITS.items():
        union = load_benchmark(name, "all", data_dir=data_dir, cache_dir=dataset_cache)
        parts = [load_benchmark(name, s, data_dir=data_dir, cache_dir=dataset_cache) for s in sources]
        assert sorted(union["id"]) == sorted(i for p in parts for i in p["id"])
        assert Counter(union["source"]) == {s: len(p) for s, p in zip(sources, parts)}


def test_edited_local_copy_is_never_served_from_a_stale_cache(fixture_benchmark, tmp_path, dataset_cache):
    import shutil

    data_dir = tmp_path / "benchmark_data"
    shutil.copytree(fixture_benchmark["data_dir"], data_dir)
    before = load_benchmark("context", data_dir=data_dir, cache_dir=dataset_cache)
    path = data_dir / FILES["context"].relpath
    records = json.loads(path.read_text())
    records[0]["answer"] = "No" if records[0]["answer"] == "Yes" else "Yes"
    path.write_text(json.dumps(records))
    after = load_benchmark("context", data_dir=data_dir, cache_dir=dataset_cache)
    assert before[0]["answer"] != after[0]["answer"]


def test_unknown_names_are_clear_errors(fixture_benchmark):
    with pytest.raises(KeyError, match="mm_vishal"):
        load_benchmark("mm_visha", data_dir=fixture_benchmark["data_dir"])
    with pytest.raises(ValueError, match="no config"):
        load_benchmark("mm_vishal", "iu_xray", data_dir=fixture_benchmark["data_dir"])


def test_missing_annotation_file_names_path_and_url(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_benchmark("context", data_dir=tmp_path)
    assert FILES["context"].relpath in str(info.value) and "raw.githubusercontent.com" in str(info.value)


def test_images_are_attached_lazily_and_missing_ones_reported(fixture_benchmark, dataset_cache, tmp_path):
    import shutil

    roots = dict(fixture_benchmark["image_roots"])
    ds = load_benchmark("cxr_vishal", "all", data_dir=fixture_benchmark["data_dir"], image_roots=roots,
                        cache_dir=dataset_cache)
    first = ds[0]
    assert len(first["image"]) == 1 and first["image"][0].size[0] > 0
    # remove one MIMIC image: error lists the ids, skip drops and counts them
    broken = tmp_path / "mimic"
    shutil.copytree(roots["mimic_cxr"], broken)
    victim_ref = next(r for r in ds.to_list() if r["source"] == "mimic_cxr")["images"][0]
    (broken / victim_ref).unlink()
    roots["mimic_cxr"] = str(broken)
    with pytest.raises(MissingImagesError) as info:
        load_benchmark("cxr_vishal", "all", data_dir=fixture_benchmark["data_dir"], image_roots=roots,
                       cache_dir=dataset_cache)
    affected = [r["id"] for r in load_benchmark("cxr_vishal", "all", data_dir=fixture_benchmark["data_dir"],
                                                 cache_dir=dataset_cache).to_list() if r["images"][0] == victim_ref]
    assert all(rid in str(info.value) for rid in affected[:5])
    loaded = prepare_benchmark("cxr_vishal", "all", data_dir=fixture_benchmark["data_dir"], image_roots=roots,
                               on_missing="skip", cache_dir=dataset_cache)
    assert sorted(rid for rid, _ in loaded.skipped_missing_images) == sorted(affected)
    assert len(loaded.dataset) == len(ds) - len(affected)


@requires_upstream
@pytest.mark.parametrize("name,config", sorted(UPSTREAM_COUNTS))
def test_builder_on_upstream_files(name, config, dataset_cache):
    loaded = prepare_benchmark(name, config, data_dir=UPSTREAM_MEDHEVAL, cache_dir=dataset_cache)
    assert len(loaded.dataset) == UPSTREAM_COUNTS[(name, config)]
    assert all(item["verified"] for item in loaded.files), "the shared copy must match the pinned sha256"
    _check_split(loaded.dataset, name, config, UPSTREAM_MEDHEVAL)


@requires_upstream
def test_upstream_combined_files_match_the_fine_grained_ones(dataset_cache):
    """MM-VisHal.json / CXR-VisHal.json hold the same items as our `all` configs (their qids differ)."""
    base = UPSTREAM_MEDHEVAL / "Visual_Misinterpretation_Hallucination/close-ended"
    for name, filename in (("mm_vishal", "MM-VisHal.json"), ("cxr_vishal", "CXR-VisHal.json")):
        combined = json.loads((base / filename).read_text())
        ours = load_benchmark(name, "all", data_dir=UPSTREAM_MEDHEVAL, cache_dir=dataset_cache)
        key = lambda q, a, img: (q, str(a), img)  # noqa: E731
        assert Counter(key(r["question"], r["answer"], r["img_name"]) for r in combined) == Counter(
            key(q, a, imgs[0]) for q, a, imgs in zip(ours["question"], ours["answer"], ours["images"]))


def test_local_images_are_a_native_lazy_column(fixture_benchmark, dataset_cache, tmp_path):
    import datasets
    import shutil

    roots = {source: tmp_path / source for source in ("iu_xray", "mimic_cxr")}
    for source, root in roots.items():
        shutil.copytree(fixture_benchmark["image_roots"][source], root)
    ds = load_benchmark("cxr_vishal", data_dir=fixture_benchmark["data_dir"], image_roots=roots,
                        cache_dir=dataset_cache)
    # a native Image column; MIMIC rows make it the credentialed subtype that refuses embedding on push
    from medheval.data.credentialed import CredentialedImage

    assert ds.features["image"] == datasets.List(CredentialedImage(mode="RGB"))
    assert isinstance(ds.features["image"].feature, datasets.Image)
    for root in roots.values():
        shutil.rmtree(root)
    assert len(list(ds["id"])) == len(ds)  # metadata access never opens an image
    with pytest.raises(FileNotFoundError):
        ds[0]["image"]  # decoding happens on row access


def test_remote_images_come_through_a_transform(fixture_benchmark, dataset_cache, tmp_path):
    """An hf:// image dataset keyed by reference: rows decode through our fetcher, on access."""
    import datasets
    from PIL import Image

    raw = load_benchmark("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    refs = sorted({ref for refs in raw["images"] for ref in refs})
    root = Path(fixture_benchmark["image_roots"]["slake"])
    images = datasets.Dataset.from_dict({"ref": refs, "image": [Image.open(root / ref) for ref in refs]})
    images.cast_column("image", datasets.Image()).save_to_disk(tmp_path / "slake_images")
    ds = load_benchmark("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache,
                        image_roots={"slake": f"hf://{tmp_path / 'slake_images'}#id_column=ref"})
    row = ds[0]
    assert row["image"][0].mode == "RGB" and row["image"][0].size == Image.open(root / row["images"][0]).size


# -- issue 23, point 9: fields of the wrong type are refused, never coerced ------------------------------------
CONTEXT = "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"


def _copy(fixture_benchmark, tmp_path) -> Path:
    import shutil

    data = tmp_path / "benchmark_data"
    shutil.copytree(fixture_benchmark["data_dir"], data)
    return data


@pytest.mark.parametrize("field, value, shown", [
    ("answer", ["Yes"], "'answer' is list [\"Yes\"], expected a string"),
    ("qid", None, "'qid' is null, expected an integer or a non-empty string"),
    ("question", 42, "'question' is int 42, expected a string"),
    ("img_name", {"path": "x.jpg"}, "'img_name' is dict"),
    ("img_name", None, "'img_name' is null, expected a string"),
    ("img_name", "", "'img_name' is str \"\", expected an image reference"),
    ("img_name", "  ", "'img_name' is str \"  \", expected an image reference"),
    ("question", "x" * 50_001, "'question' holds 50,001 characters, more than the 50,000"),
])
def test_a_field_of_the_wrong_type_names_file_record_and_field(fixture_benchmark, tmp_path, dataset_cache, field,
                                                               value, shown):
    from medheval.data.benchmarks import BenchmarkDataError

    data = _copy(fixture_benchmark, tmp_path)
    records = json.loads((data / CONTEXT).read_text())
    records[2][field] = value
    (data / CONTEXT).write_text(json.dumps(records))
    with pytest.raises(BenchmarkDataError) as caught:
        prepare_benchmark("context", data_dir=data, cache_dir=dataset_cache)
    message = str(caught.value)
    assert CONTEXT in message and "record #2" in message and shown in message


def test_an_overlong_choices_string_names_file_record_and_field(fixture_benchmark, tmp_path, dataset_cache):
    """A choices string is parsed for its options: one of megabytes is refused at load, naming it."""
    from medheval.data.benchmarks import BenchmarkDataError

    data = _copy(fixture_benchmark, tmp_path)
    path = data / FILES["slake"].relpath
    records = json.loads(path.read_text())
    records[1]["choices"] = "A. x" + " " * 60_000 + "B. y"
    path.write_text(json.dumps(records))
    with pytest.raises(BenchmarkDataError, match=r"record #1 .*field 'choices' holds 60,008 characters"):
        prepare_benchmark("mm_vishal", "slake", data_dir=data, cache_dir=dataset_cache)


MIMIC_REF = "p19/p19999901/s59999901/f1c00001-00000000-00000000-00000000-00000001.jpg"


def test_a_record_naming_an_image_its_source_cannot_hold_is_refused_at_load(fixture_benchmark, tmp_path,
                                                                             dataset_cache):
    """A SLAKE record naming a MIMIC-CXR file would load through a default root (``--image-root /data``) and
    be sent or embedded as non-credentialed: the split is refused at load, naming the record and reference."""
    from medheval.data.benchmarks import BenchmarkDataError

    data = _copy(fixture_benchmark, tmp_path)
    path = data / FILES["slake"].relpath
    records = json.loads(path.read_text())
    records[1]["img_name"] = MIMIC_REF
    path.write_text(json.dumps(records))
    with pytest.raises(BenchmarkDataError, match=r"mm_vishal:slake: 1 image reference\(s\) refused: "
                       r"mm_vishal/slake/\S+ \(source 'slake'\): image 'p19/.*\.jpg' does not match the slake "
                       r"layout .*xmlab<N>/source\.jpg"):
        prepare_benchmark("mm_vishal", "slake", data_dir=data, cache_dir=dataset_cache)


def test_reference_problem_names_layout_and_mimic_shaped_files():
    from medheval.data.images import looks_credentialed, reference_problem

    assert reference_problem("slake", "xmlab1/source.jpg", False) is None
    assert reference_problem("mimic_cxr", MIMIC_REF, True) is None
    assert "does not match the slake layout" in reference_problem("slake", MIMIC_REF, False)
    # a source without a known layout: any safe path, but no MIMIC-shaped file unless the record is credentialed
    assert reference_problem("pmc", "figures/a.png", False) is None
    assert "shaped like a MIMIC-CXR image" in reference_problem("pmc", MIMIC_REF, False)
    assert "shaped like a MIMIC-CXR image" in reference_problem("pmc", "x/" + MIMIC_REF.rsplit("/", 1)[1], False)
    assert reference_problem("pmc", MIMIC_REF, True) is None
    assert "'..'" in reference_problem("pmc", "../x.png", False)
    assert looks_credentialed(MIMIC_REF) and not looks_credentialed("xmlab1/source.jpg")


def test_a_file_that_is_not_utf8_names_its_line(fixture_benchmark, tmp_path, dataset_cache):
    from medheval.data.benchmarks import BenchmarkDataError

    data = _copy(fixture_benchmark, tmp_path)
    text = json.dumps(json.loads((data / CONTEXT).read_text()), indent=1).encode()
    third_line = text.index(b"\n", text.index(b"\n") + 1) + 1
    (data / CONTEXT).write_bytes(text[:third_line] + b"\xff" + text[third_line:])
    with pytest.raises(BenchmarkDataError, match=r"MIMIC-CXR_pairs.json: line 3 is not UTF-8 \(byte \d+, b'\\xff'\)"):
        prepare_benchmark("context", data_dir=data, cache_dir=dataset_cache)

"""The fixture benchmark is written in MedHEval's real schemas and is not MedHEval data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import SHARED_UPSTREAM
from PIL import Image

from medheval.families.medheval import fixtures
from medheval.families.medheval.fixtures import FIXTURE_VERSION, write_fixture_benchmark

SHA256SUMS = SHARED_UPSTREAM / "SHA256SUMS"  # ../shared, or $MEDHEVAL_SHARED

# Key sets of the released files (shared/reference/medheval_repo.md §2.1), hard-coded here.
FINE_KEYS = {"img_name", "question", "answer", "hallucination_type", "omission_type",
             "question_type", "choices", "qid", "img_id", "location", "modality"}
MM_KEYS = (FINE_KEYS - {"omission_type"}) | {"source"}
CXR_KEYS = FINE_KEYS - {"omission_type"}
REPORT_KEYS = {"img_name", "question", "answer", "structured_answer", "qid", "img_id"}
BINARY_KEYS = {"img_name", "question", "answer", "ground_truth_type", "choices", "qid", "img_id"}
KNOWLEDGE_OPEN_KEYS = {"img_name", "question", "answer", "question_type", "structured_answer",
                       "qid", "img_id"}

VIS = "Visual_Misinterpretation_Hallucination"
EXPECTED_KEYS = {
    f"{VIS}/close-ended/fine-grained/slake_qa_pairs.json": FINE_KEYS,
    f"{VIS}/close-ended/fine-grained/rad_vqa_pairs.json": FINE_KEYS,
    f"{VIS}/close-ended/fine-grained/xray_closed_pairs.json": FINE_KEYS,
    f"{VIS}/close-ended/fine-grained/mimic_cxr_closed_pairs.json": FINE_KEYS,
    f"{VIS}/close-ended/MM-VisHal.json": MM_KEYS,
    f"{VIS}/close-ended/CXR-VisHal.json": CXR_KEYS,
    f"{VIS}/open-ended/MIMIC-CXR_pairs.json": REPORT_KEYS,
    "Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json": BINARY_KEYS,
    "Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json": KNOWLEDGE_OPEN_KEYS,
    "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json": BINARY_KEYS,
}
FINE_SOURCE = {
    "slake_qa_pairs.json": "slake", "rad_vqa_pairs.json": "vqa_rad",
    "xray_closed_pairs.json": "iu_xray", "mimic_cxr_closed_pairs.json": "mimic_cxr",
}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixture")
    info = write_fixture_benchmark(root)
    data = {rel: json.loads((Path(info["data_dir"]) / rel).read_text(encoding="utf-8"))
            for rel in EXPECTED_KEYS}
    return root, info, data


def _all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_version_and_docstring():
    assert FIXTURE_VERSION == "fixtures-v1"
    assert "synthetic" in fixtures.__doc__ and "not MedHEval data" in fixtures.__doc__


def test_files_are_json_arrays_with_upstream_keys(bench):
    root, info, data = bench
    assert Path(info["data_dir"]) == root / "benchmark_data"
    written = {p.relative_to(root / "benchmark_data").as_posix()
               for p in (root / "benchmark_data").rglob("*.json")}
    assert written == set(EXPECTED_KEYS)
    assert info["counts"] == {rel: len(recs) for rel, recs in data.items()}
    for rel, recs in data.items():
        assert isinstance(recs, list) and recs, rel
        for rec in recs:
            assert set(rec) == EXPECTED_KEYS[rel], (rel, rec.get("qid"))
        qids = [r["qid"] for r in recs]
        assert all(isinstance(q, int) for q in qids), rel
        assert len(set(qids)) == len(qids), f"duplicate qids in {rel}"
        text = (root / "benchmark_data" / rel).read_text(encoding="utf-8")
        assert text.startswith("[\n    {"), f"{rel} is not pretty-printed"


def test_sizes(bench):
    _, info, _ = bench
    counts = {rel.rsplit("/", 1)[-1] if "fine-grained" in rel else rel: n
              for rel, n in info["counts"].items()}
    for name in FINE_SOURCE:
        assert 6 <= counts[name] <= 10
    assert counts[f"{VIS}/open-ended/MIMIC-CXR_pairs.json"] == 6
    assert counts["Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json"] == 8
    assert counts["Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json"] == 6
    assert counts["Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"] == 8
    assert 30 <= sum(info["counts"].values()) <= 120


def test_fine_grained_conventions(bench):
    _, _, data = bench
    for rel, recs in data.items():
        name = rel.rsplit("/", 1)[-1]
        if name not in FINE_SOURCE:
            continue
        types = {(r["hallucination_type"], r["question_type"]) for r in recs}
        assert {t for t, _ in types} == {"type_1", "type_2", "type_3", "type_4"}, name
        assert {q for _, q in types} == {"binary", "multi-choice"}, name
        for r in recs:
            if r["question_type"] == "binary":
                assert r["choices"] == "" and r["omission_type"] in (0, 1)
            else:
                assert r["choices"] and r["omission_type"] == -1
        source = FINE_SOURCE[name]
        for r in recs:
            if source == "slake":
                assert r["img_name"] == f"xmlab{r['img_id']}/source.jpg"
                assert isinstance(r["img_id"], int) and r["modality"] in ("CT", "MRI", "X-Ray")
                assert isinstance(r["location"], str)
            elif source == "vqa_rad":
                assert r["img_name"].startswith("synpic") and r["img_id"] == r["img_name"]
                assert r["location"] in ("CHEST", "HEAD", "ABD") and r["modality"] is None
            else:
                assert r["img_id"] == r["img_name"]
                assert r["location"] is None and r["modality"] is None
                if source == "iu_xray":
                    assert r["img_name"].startswith("CXR") and r["img_name"].endswith("/0.png")
                else:
                    parts = r["img_name"].split("/")
                    assert len(parts) == 4 and parts[0].startswith("p1")
                    assert parts[1].startswith(parts[0]) and parts[2].startswith("s")
                    assert [len(x) for x in parts[3][:-4].split("-")] == [8] * 5
    # Choice formats per source.
    slake = data[f"{VIS}/close-ended/fine-grained/slake_qa_pairs.json"]
    mimic = data[f"{VIS}/close-ended/fine-grained/mimic_cxr_closed_pairs.json"]
    assert any(r["choices"].startswith("A: ") for r in slake)
    assert any(r["choices"].startswith("A. ") for r in mimic)


def test_combined_files_are_renumbered_like_upstream(bench):
    _, _, data = bench
    fine = {n: data[f"{VIS}/close-ended/fine-grained/{n}"] for n in FINE_SOURCE}
    mm, cxr = data[f"{VIS}/close-ended/MM-VisHal.json"], data[f"{VIS}/close-ended/CXR-VisHal.json"]

    iu, mimic = fine["xray_closed_pairs.json"], fine["mimic_cxr_closed_pairs.json"]
    assert len(cxr) == len(iu) + len(mimic)
    for got, src, offset in [(r, s, 0) for r, s in zip(cxr, iu)] + \
            [(r, s, len(iu)) for r, s in zip(cxr[len(iu):], mimic)]:
        assert got["qid"] == src["qid"] + offset
        assert {k: v for k, v in got.items() if k != "qid"} == \
            {k: v for k, v in src.items() if k not in ("qid", "omission_type")}

    slake, rad = fine["slake_qa_pairs.json"], fine["rad_vqa_pairs.json"]
    assert [r["source"] for r in mm] == ["SLAKE"] * len(slake) + ["VQA-RAD"] * len(rad)
    assert [r["qid"] for r in mm] == list(range(len(slake) + len(rad)))
    for got, src in zip(mm, slake + rad):
        assert {k: v for k, v in got.items() if k not in ("qid", "source")} == \
            {k: v for k, v in src.items() if k not in ("qid", "omission_type")}


def test_mimic_splits(bench):
    _, _, data = bench
    report = data[f"{VIS}/open-ended/MIMIC-CXR_pairs.json"]
    kclose = data["Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json"]
    kopen = data["Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json"]
    context = data["Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"]
    assert len({r["question"] for r in report}) == 1
    for r in report:
        assert set(r["structured_answer"]) == {"anatomy", "measurement", "symptom"}
        assert all(isinstance(v, list) for v in r["structured_answer"].values())
    for r in kclose + context:
        assert r["ground_truth_type"] == "binary" and r["choices"] == ""
    assert {r["answer"] for r in context} == {"Yes", "No"}
    for r in kopen:
        assert r["question_type"] == "type4_Knowledge" and r["structured_answer"] is None
    # Images are shared across the MIMIC splits, as upstream.
    knowledge_imgs = {r["img_name"] for r in kclose}
    assert knowledge_imgs == {r["img_name"] for r in kopen} == {r["img_name"] for r in context}
    assert knowledge_imgs & {r["img_name"] for r in report}
    close = data[f"{VIS}/close-ended/fine-grained/mimic_cxr_closed_pairs.json"]
    assert knowledge_imgs & {r["img_name"] for r in close}


def test_label_noise_present(bench):
    _, _, data = bench
    fine = [r for rel, recs in data.items() if "fine-grained" in rel for r in recs]
    binary = [r for r in fine if r["question_type"] == "binary"]
    mc = [r for r in fine if r["question_type"] == "multi-choice"]
    assert any(r["answer"] == "Abnormal" for r in binary)
    assert any(len(r["answer"].split()) > 3 and not r["answer"].lower().startswith(("yes", "no"))
               for r in binary)
    assert any(r["answer"] == "yes" for r in binary)
    slake = data[f"{VIS}/close-ended/fine-grained/slake_qa_pairs.json"]
    assert any(r["choices"] == "A, B, C, D" for r in slake)
    assert any("A) " in r["choices"] for r in mc)
    assert any("Right lower lobe, posterior segment" in r["choices"] for r in mc)
    assert any(", B" not in r["choices"] and "B." not in r["choices"] for r in mc)  # one option
    assert any(r["answer"] in ("A", "B", "C", "D") for r in mc)
    assert any(r["answer"][:3] in ("A. ", "B. ", "C. ", "D. ") for r in mc)
    kclose = data["Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json"]
    answers = {r["answer"] for r in kclose}
    assert "Unclear" in answers and "yes" in answers


def test_images_exist_and_open(bench):
    root, info, data = bench
    assert set(info["image_roots"]) == {"slake", "vqa_rad", "iu_xray", "mimic_cxr"}
    source_of = {"SLAKE": "slake", "VQA-RAD": "vqa_rad"}
    needed = set()
    for rel, recs in data.items():
        name = rel.rsplit("/", 1)[-1]
        for r in recs:
            if name in FINE_SOURCE:
                src = FINE_SOURCE[name]
            elif "source" in r:
                src = source_of[r["source"]]
            elif r["img_name"].startswith("CXR"):
                src = "iu_xray"
            else:
                src = "mimic_cxr"
            needed.add((src, r["img_name"]))
    for src, img_name in needed:
        path = Path(info["image_roots"][src]) / img_name
        assert path.is_file(), path
        with Image.open(path) as im:
            assert im.format == ("PNG" if img_name.endswith(".png") else "JPEG")
            assert im.size == (64, 64)
    # Only referenced images are written.
    on_disk = {(p.relative_to(root / "images").parts[0],
                "/".join(p.relative_to(root / "images").parts[1:]))
               for p in (root / "images").rglob("*") if p.is_file()}
    assert on_disk == needed


def test_deterministic_and_no_images_option(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_fixture_benchmark(a)
    write_fixture_benchmark(b)
    files_a = _all_files(a)
    assert files_a == _all_files(b)
    write_fixture_benchmark(a)  # rewriting in place changes nothing
    assert _all_files(a) == files_a
    info = write_fixture_benchmark(c, with_images=False)
    assert info["image_roots"] == {}
    assert not (c / "images").exists()
    assert {k: v for k, v in files_a.items() if k.startswith("benchmark_data/")} == _all_files(c)


@pytest.mark.skipif(not SHA256SUMS.is_file(), reason="shared/data/upstream is not available")
def test_no_fixture_file_equals_an_upstream_file(bench):
    root, _, _ = bench
    upstream = {line.split()[0] for line in SHA256SUMS.read_text().splitlines() if line.strip()}
    for path in (root / "benchmark_data").rglob("*.json"):
        assert hashlib.sha256(path.read_bytes()).hexdigest() not in upstream, path

"""The push guard's content scan covers every repo, gated or not (security audit: non-gated manifests).

Gating is inferred from a folder's card and Parquet files; a ``publish.json`` entry that says
``"gated": false`` used to skip the content scan, so a hand-written entry pushed its folder as it was
(``files: {}``) or pushed any file whose sha256 it listed, MIMIC-CXR images included. Each case below
pushes against a Hub on 127.0.0.1 (tests/hub_server.py): the push must stop before the first request,
naming the file, and the Hub must receive nothing. The controls show that legitimate pushes (a
non-credentialed dataset, a metric Space, a mitigation repo, results, an older manifest without a
file record) still land."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_server import OWNER_TOKEN, HubServer, loopback_hub  # noqa: F401 - loopback_hub is a fixture

from medheval.data.credentialed import CredentialedImageError
from medheval.data.schema import FEATURES
from medheval.publish import hub

TOKEN = OWNER_TOKEN
DICOM_ID = "f1c00001-00000000-00000000-00000000-00000001"  # the fixture's synthetic MIMIC-CXR dicom id
MIMIC_DIR = "p19/p19999901/s59999901"


@pytest.fixture(scope="module")
def export(tmp_path_factory, fixture_benchmark, dataset_cache) -> Path:
    out = tmp_path_factory.mktemp("ungated")
    hub.export_all(out, kinds=["datasets"], names=["mm_vishal"], data_dir=fixture_benchmark["data_dir"],
                   cache_dir=dataset_cache)
    return out


def _nothing_reached(fake: HubServer) -> None:
    assert fake.repos == {} and fake.lfs_objects == {}
    assert not [request for request in fake.requests if request[0] in ("POST", "PUT")]


def _jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.RandomState(1).randint(0, 255, (48, 48), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _dicom() -> bytes:
    return bytes(128) + b"DICM" + b"\x02\x00\x00\x00UL\x04\x00" + bytes(100)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(export: Path, out: Path) -> None:
    shutil.copytree(export, out, symlinks=True)
    entries = json.loads((out / "publish.json").read_text())
    for entry in entries:
        entry["folder"] = str(out / Path(entry["folder"]).relative_to(export))
    (out / "publish.json").write_text(json.dumps(entries))


# -- a hand-written entry ------------------------------------------------------------------------

PLANTED = {  # relative path -> bytes: what a hand-written entry tries to publish
    f"{DICOM_ID}.jpg": _jpeg(),  # the audit's reproduction: a bare MIMIC-CXR dicom id
    "view.jpg": _jpeg(),  # the same image under a name that says nothing
    "scan": _dicom(),  # a DICOM file without extension
    f"files/{MIMIC_DIR}/{DICOM_ID}.jpg": _jpeg(),  # the MIMIC-CXR-JPG layout
    f"{MIMIC_DIR}/notes.txt": b"text under a MIMIC-CXR study folder\n",
}
KINDS = {"datasets": ("dataset", "medheval/evil"), "metrics": ("space", "medheval/evil"),
         "results": ("model", "org/model")}


@pytest.mark.parametrize("record", ["folder as it is", "sha256 listed"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("relpath", sorted(PLANTED))
def test_a_non_gated_manifest_entry_cannot_publish_mimic_images(tmp_path, loopback_hub, relpath, kind, record):
    out = tmp_path / "out"
    folder = out / kind / "evil"
    (folder / relpath).parent.mkdir(parents=True)
    (folder / relpath).write_bytes(PLANTED[relpath])
    repo_type, repo_id = KINDS[kind]
    files = {relpath: _sha(folder / relpath)} if record == "sha256 listed" else {}
    (out / "publish.json").write_text(json.dumps([{"folder": str(folder), "repo_id": repo_id, "repo_type": repo_type,
                                                   "kind": kind, "gated": False, "files": files}]))
    with pytest.raises(CredentialedImageError, match=f"{repo_id}: .*{relpath.split('/')[-1]}") as raised:
        hub.push(hub.read_manifest(out), token=TOKEN)
    assert re.search(r"export (it )?again|remove it", str(raised.value))  # and says what to do
    _nothing_reached(loopback_hub)


# -- an exported non-gated repo, with files added and recorded -----------------------------------


def _binary_parquet(path: Path) -> None:
    pq.write_table(pa.table({"id": ["x"], "image": [_jpeg()]}), path)


def _base64_text(path: Path) -> None:
    path.write_text("scan: " + base64.b64encode(_jpeg()).decode())


def _parquet_metadata(path: Path) -> None:
    table = pa.table({"id": ["x"]}).replace_schema_metadata({b"scan": base64.b64encode(_jpeg())})
    pq.write_table(table, path)


ADDED = {
    "extra/view.jpg": lambda path: path.write_bytes(_jpeg()),
    "extra/scan.dcm": lambda path: path.write_bytes(_dicom()),
    "extra/notes.txt": _base64_text,
    "extra/images.parquet": _binary_parquet,
    "extra/meta.parquet": _parquet_metadata,
    f"{DICOM_ID}.txt": lambda path: path.write_text("a report named by its dicom id\n"),
}


@pytest.mark.parametrize("relpath", sorted(ADDED))
def test_listing_a_files_sha256_never_exempts_it_from_the_scan(export, tmp_path, loopback_hub, relpath):
    out = tmp_path / "out"
    _copy(export, out)
    folder = out / "datasets" / "mm_vishal"
    (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
    ADDED[relpath](folder / relpath)
    entries = json.loads((out / "publish.json").read_text())
    assert [entry["gated"] for entry in entries] == [False]
    entries[0]["files"][relpath] = _sha(folder / relpath)  # the attacker records it too
    (out / "publish.json").write_text(json.dumps(entries))
    with pytest.raises(CredentialedImageError, match=f"medheval/mm_vishal: {relpath}"):
        hub.push(hub.read_manifest(out), token=TOKEN)
    _nothing_reached(loopback_hub)


# -- credentialed sources, whatever their spelling -------------------------------------------------


@pytest.mark.parametrize("source", ["MIMIC_CXR", "Mimic-CXR", " mimic_iv", "MIMIC-CXR-JPG"])
def test_a_credentialed_source_in_any_case_makes_the_repo_gated(tmp_path, loopback_hub, source):
    out = tmp_path / "out"
    folder = out / "datasets" / "notes"
    (folder / "cxr").mkdir(parents=True)
    (folder / "README.md").write_text("---\npretty_name: notes\nlicense: other\n---\nQuestions.\n")
    rows = {"id": ["notes/cxr/1"], "benchmark": ["notes"], "config": ["cxr"], "images": [["img1.jpg"]],
            "question": ["Is there an effusion?"], "answer": ["no"], "answer_type": ["closed"],
            "choices": [["yes", "no"]], "category": ["anatomy"], "source": [source], "meta": [{}]}
    datasets.Dataset.from_dict(rows, features=FEATURES).to_parquet(str(folder / "cxr" / "test-00000-of-00001.parquet"))
    repo = hub.recorded(hub.RepoFolder(str(folder), "medheval/notes", "dataset", "datasets", gated=False))
    hub.write_manifest(out, [repo])
    assert hub.check_recorded_files(hub.read_manifest(out)[0]) is True  # MIMIC-derived rows: gated
    hub.push(hub.read_manifest(out), token=TOKEN)
    assert loopback_hub.repos[("dataset", "medheval/notes")].gated == "manual"


def test_credentialed_source_names():
    for source in ("mimic_cxr", "MIMIC_CXR", "Mimic-Cxr", "mimic_iv", "MIMIC-IV", "MIMIC-CXR-JPG"):
        assert hub.credentialed_source(source), source
    for source in ("slake", "vqa_rad", "iu_xray", "", None):
        assert not hub.credentialed_source(source), source
    assert hub.mimic_file_name(f"a/{MIMIC_DIR}/x.txt") and hub.mimic_file_name(f"{DICOM_ID.upper()}.dcm")
    assert not hub.mimic_file_name("mimic_cxr/test-00000-of-00001.parquet")


# -- the controls: legitimate pushes land ------------------------------------------------------------


def test_every_kind_of_legitimate_repo_still_pushes(tmp_path, loopback_hub, fixture_benchmark, dataset_cache):
    from huggingface_hub import HfApi

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"benchmarks": {"mm_vishal:slake": {"n_scored": 4, "metrics": {
        "close_ended_accuracy": {"accuracy": 0.75, "n": 4}}}}, "settings": {"mitigation": "none"}, "labels": {}}))
    out = tmp_path / "out"
    repos = hub.export_all(out, kinds=["datasets", "metrics", "mitigations"], names=["mm_vishal", "medihall_score", "vcd"],
                           data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache, results=(run, "org/model"))
    assert {repo.kind for repo in repos} == {"datasets", "metrics", "mitigations", "results"}
    HfApi(token=TOKEN).create_repo("org/model")  # results go to the evaluated model's existing repo
    hub.push(hub.read_manifest(out), token=TOKEN)
    for repo in repos:
        pushed = loopback_hub.repos[(repo.repo_type, repo.repo_id)]
        files = {path: hashlib.sha256(data).hexdigest() for path, data in pushed.files.items()
                 if path != ".gitattributes"}
        assert files == repo.files, repo.repo_id
        assert pushed.gated in (False, None), repo.repo_id


def test_an_older_manifest_without_a_file_record_still_pushes_a_clean_folder(export, tmp_path, loopback_hub):
    out = tmp_path / "out"
    _copy(export, out)
    entries = json.loads((out / "publish.json").read_text())
    recorded = entries[0]["files"]
    entries[0]["files"] = {}
    (out / "publish.json").write_text(json.dumps(entries))
    hub.push(hub.read_manifest(out), token=TOKEN)
    pushed = loopback_hub.repos[("dataset", "medheval/mm_vishal")]
    assert {path: hashlib.sha256(data).hexdigest() for path, data in pushed.files.items()
            if path != ".gitattributes"} == recorded

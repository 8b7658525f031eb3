"""Publishing to the Hub: repo folders and cards, the credentialed-image guard, and a round trip
through a fake Hub on 127.0.0.1 (tests/hub_server.py) read back with datasets, evaluate and
transformers by Hub id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO
from hub_server import HubServer

from medheval.publish import hub
from medheval.data.benchmarks import load_benchmark, prepare_benchmark
from medheval.data.credentialed import CredentialedImage, CredentialedImageError, refuse_credentialed_images

TESTS = Path(__file__).resolve().parent


# -- folders and cards (offline) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory, fixture_benchmark, dataset_cache):
    out = tmp_path_factory.mktemp("publish")
    repos = hub.export_all(out, org="medheval", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    return out, {(repo.repo_type, repo.repo_id): repo for repo in repos}


def _card(path: Path) -> dict:
    meta, body = hub.split_card(path.read_text())
    assert meta and body.strip(), path
    return meta


def test_every_unit_gets_a_repo_folder_and_a_manifest(exported):
    out, repos = exported
    kinds = {kind: {repo_id for (kind_, repo_id) in repos if kind_ == kind} for kind in ("dataset", "space", "model")}
    assert "medheval/cxr_vishal" in kinds["dataset"] and "medheval/medihall_score" in kinds["space"]
    assert "medheval/vcd" in kinds["model"]
    manifest = hub.read_manifest(out)
    assert {(r.repo_type, r.repo_id) for r in manifest} == set(repos)
    # not exported, and said so: ClinHallu is its authors' Hub repo, Med-StepBench is the user's data,
    # Med-HallMark's files are not in this MedHEval data_dir
    skipped = json.loads((out / "skipped.json").read_text())
    assert set(skipped) == {"clinhallu", "med_stepbench", "med_hallmark"}
    assert "Alibaba-DAMO-Academy/ClinHallu" in skipped["clinhallu"]
    assert "annotation files not available" in skipped["med_hallmark"]


def test_offline_without_a_data_dir_a_skipped_dataset_says_how_to_provide_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "empty_cache"))  # nothing fetched by other tests
    with pytest.raises(hub.PublishError, match="no dataset was exported"):
        hub.export_all(tmp_path / "out", kinds=["datasets"])
    err = capsys.readouterr().err
    assert "skipped dataset mm_vishal: annotation files not available (" in err
    assert "offline" in err and "pass --data-dir DIR" in err


def test_a_dataset_that_is_never_published_is_refused_by_name(tmp_path):
    with pytest.raises(hub.PublishError, match="med_stepbench.*no public release"):
        hub.export_all(tmp_path, kinds=["datasets"], names=["med_stepbench"])


REQUIRED_CARD_FIELDS = {
    "dataset": ("configs", "dataset_info", "license", "license_name", "license_link", "task_categories",
                "size_categories", "source_datasets"),
    "space": ("title", "sdk", "tags", "description"),
    "model": ("library_name", "base_model", "tags"),
}


def test_every_published_card_parses_with_its_fields(exported):
    out, repos = exported
    for (kind, repo_id), repo in repos.items():
        meta = _card(Path(repo.folder) / "README.md")
        missing = [name for name in REQUIRED_CARD_FIELDS[kind] if not meta.get(name)]
        assert not missing, (repo_id, missing)
        if kind == "dataset":
            # gated exactly when some config holds MIMIC-derived rows
            assert bool(meta.get("extra_gated_fields")) == repo.gated == (
                "extended|mimic-cxr-jpg" in meta["source_datasets"]), repo_id


def test_dataset_card_yaml_has_what_the_hub_reads(exported, fixture_benchmark, dataset_cache):
    out, repos = exported
    repo = repos[("dataset", "medheval/cxr_vishal")]
    meta = _card(Path(repo.folder) / "README.md")
    assert [c["config_name"] for c in meta["configs"]] == ["all", "iu_xray", "mimic_cxr"]
    assert [c for c in meta["configs"] if c.get("default")] == [meta["configs"][0]]
    assert meta["configs"][2]["data_files"] == [{"split": "test", "path": "mimic_cxr/test-*"}]
    info = {entry["config_name"]: entry for entry in meta["dataset_info"]}
    n_mimic = len(prepare_benchmark("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"],
                                    cache_dir=dataset_cache).dataset)
    assert info["mimic_cxr"]["splits"] == [{"name": "test", "num_bytes": info["mimic_cxr"]["splits"][0]["num_bytes"],
                                            "num_examples": n_mimic}]
    assert {"name": "images", "list": "string"} in info["mimic_cxr"]["features"]
    assert meta["license"] == "other" and meta["license_name"] and meta["license_link"].startswith("https://")
    assert meta["task_categories"] == ["visual-question-answering"] and meta["size_categories"] == ["n<1K"]
    assert meta["source_datasets"] == ["extended|iu_xray", "extended|mimic-cxr-jpg"]
    # MIMIC-derived: gated, with the PhysioNet fields
    assert repo.gated and "PhysioNet" in meta["extra_gated_prompt"]
    assert set(meta["extra_gated_fields"].values()) == {"text", "checkbox"}
    # every config's Parquet file is where the card says
    for config in info:
        assert (Path(repo.folder) / config / "test-00000-of-00001.parquet").is_file()


def test_non_credentialed_dataset_is_not_gated(exported):
    out, repos = exported
    repo = repos[("dataset", "medheval/mm_vishal")]
    meta = _card(Path(repo.folder) / "README.md")
    assert not repo.gated and "extra_gated_prompt" not in meta and "extra_gated_fields" not in meta
    assert meta["source_datasets"] == ["extended|slake", "extended|vqa_rad"]


def test_mimic_parquet_holds_references_not_bytes(exported):
    out, repos = exported
    for (kind, repo_id), repo in repos.items():
        if kind != "dataset" or not repo.gated:
            continue
        for path in Path(repo.folder).rglob("*.parquet"):
            schema = pq.read_schema(path)
            assert str(schema.field("images").type) == "list<element: string>", path
            assert all("binary" not in str(field.type) for field in schema), path
            assert b"Image" not in (schema.metadata or {}).get(b"huggingface", b""), path
        hub.check_no_credentialed_bytes(repo)  # the push-time check agrees


def test_push_check_refuses_image_bytes_in_a_credentialed_repo(exported, tmp_path):
    out, repos = exported
    repo = repos[("dataset", "medheval/cxr_vishal")]
    planted = Path(repo.folder) / "mimic_cxr" / "leak.jpg"
    planted.write_bytes(b"\xff\xd8\xff")
    try:
        with pytest.raises(CredentialedImageError, match="leak.jpg"):
            hub.check_no_credentialed_bytes(repo)
    finally:
        planted.unlink()
    table = datasets.Dataset.from_dict({"id": ["x"], "source": ["mimic_cxr"], "image": [{"bytes": b"\x89PNG", "path": None}]},
                                       features=datasets.Features({"id": datasets.Value("string"),
                                                                   "source": datasets.Value("string"),
                                                                   "image": datasets.Image()}))
    bad = hub.RepoFolder(str(tmp_path), "medheval/bad", "dataset", "datasets", gated=True)
    table.to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(CredentialedImageError, match="bad.parquet"):
        hub.check_no_credentialed_bytes(bad)


def test_a_mimic_config_with_an_image_column_is_refused(fixture_benchmark, dataset_cache, tmp_path):
    ds = load_benchmark("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"],
                        image_roots=fixture_benchmark["image_roots"], cache_dir=dataset_cache)
    assert isinstance(ds.features["image"].feature, CredentialedImage)
    assert ds[0]["image"][0].size == (64, 64)  # still decodes locally
    with pytest.raises(CredentialedImageError, match="credentialed rows"):
        refuse_credentialed_images(ds, "cxr_vishal:mimic_cxr")
    # the refusal travels with the dataset through transforms, and blocks datasets' own embedding
    derived = ds.select([0]).filter(lambda row: True).map(lambda row: row)
    assert isinstance(derived.features["image"].feature, CredentialedImage)
    with pytest.raises(CredentialedImageError, match="refusing to embed"):
        derived.save_to_disk(str(tmp_path / "saved"))
    # the safe way: references only
    refuse_credentialed_images(ds.remove_columns("image"), "refs")
    # a non-credentialed source keeps the plain Image type and may be embedded
    iu = load_benchmark("cxr_vishal", "iu_xray", data_dir=fixture_benchmark["data_dir"],
                        image_roots=fixture_benchmark["image_roots"], cache_dir=dataset_cache)
    assert type(iu.features["image"].feature) is datasets.Image
    iu.select([0]).save_to_disk(str(tmp_path / "iu"))


def test_metric_space_folder(exported):
    out, repos = exported
    repo = repos[("space", "medheval/medihall_score")]
    folder = Path(repo.folder)
    meta = _card(folder / "README.md")
    assert meta["sdk"] == "static" and repo.space_sdk == "static" and "evaluate" in meta["tags"]
    assert meta["title"] and meta["description"]
    assert (folder / "medihall_score.py").is_file() and (folder / "index.html").is_file()
    requirements = [line.strip() for line in (folder / "requirements.txt").read_text().splitlines()]
    assert "medheval" in requirements and "medheval-hf" not in requirements


def test_mitigation_repo_folder(exported):
    out, repos = exported
    repo = repos[("model", "medheval/vcd")]
    folder = Path(repo.folder)
    meta = _card(folder / "README.md")
    assert meta["base_model"] and meta["library_name"] == "transformers" and "custom_generate" in meta["tags"]
    assert (folder / "custom_generate" / "generate.py").is_file()
    assert (folder / "custom_generate" / "requirements.txt").read_text().split()[0].startswith("medheval>=")
    for kind_name, mitigation in repos.items():  # every mitigation card has the sections custom_generate users expect
        if kind_name[0] == "model":
            assert mitigation.warnings == [], kind_name
            headings = [line.lstrip("#").strip().lower() for line in
                        (Path(mitigation.folder) / "README.md").read_text().splitlines() if line.startswith("## ")]
            assert set(hub.MITIGATION_SECTIONS) <= set(headings), (kind_name, headings)


def _results(random_weights: bool) -> dict:
    run = {"benchmarks": {"cxr_vishal:mimic_cxr": {"n_scored": 4, "metrics": {"close_ended_accuracy": {
        "accuracy": 0.75, "n": 4, "n_unparsed": 1, "accuracy_by_category": {"anatomy": 1.0}}}}},
        "settings": {"mitigation": "vcd:alpha=1", "model": "org/model"}, "labels": {}}
    if random_weights:
        run["labels"]["random_weights"] = "demo"
    return {"runs": [run, {**run, "settings": {"mitigation": "none", "model": "org/model"}}]}


def test_eval_results_files(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(_results(random_weights=False)))
    repo = hub.export_results(tmp_path / "run", tmp_path / "out", "org/model")
    files = sorted((Path(repo.folder) / ".eval_results").iterdir())
    assert [f.name for f in files] == ["cxr_vishal_mimic_cxr.yaml", "cxr_vishal_mimic_cxr_vcd_alpha_1.yaml"]
    entries = yaml.safe_load(files[1].read_text())
    # counts and nested breakdowns are not headline numbers: one entry, accuracy
    assert len(entries) == 1
    entry = entries[0]
    assert entry["dataset"] == {"id": "medheval/cxr_vishal", "task_id": "mimic_cxr/close_ended_accuracy/accuracy"}
    assert entry["value"] == 0.75 and "mitigation=vcd:alpha=1" in entry["notes"] and "n=4" in entry["notes"]
    assert repo.repo_id == "org/model" and repo.repo_type == "model"
    (tmp_path / "run" / "results.json").write_text(json.dumps(_results(random_weights=True)))
    with pytest.raises(hub.PublishError, match="random-weight"):
        hub.export_results(tmp_path / "run", tmp_path / "out2", "org/model")


@pytest.mark.parametrize("split", ["../../../../victim/x:y", "/tmp/absolute:y", "cxr_vishal:../../up", "a/b:c",
                                   "..:x"])
def test_a_split_key_cannot_write_outside_the_output_folder(tmp_path, split):
    """Issue 23 point 2: the YAML file name comes from results.json; a hostile key is refused, nothing lands outside."""
    from medheval.cli import main

    # the work sits deep in tmp_path, so any '..' a hostile key climbs lands in tmp_path, which nothing else writes
    # (the worker's basetemp, shared with other tests' caches and background writers, is not compared)
    work = tmp_path.joinpath(*"abcdefgh")
    results = _results(random_weights=False)
    results["runs"][0]["benchmarks"] = {split: results["runs"][0]["benchmarks"]["cxr_vishal:mimic_cxr"]}
    (work / "run").mkdir(parents=True)
    (work / "run" / "results.json").write_text(json.dumps(results))
    absolute_before = Path("/tmp/absolute").exists()
    before = sorted(str(p) for p in tmp_path.rglob("*") if work not in p.parents)
    with pytest.raises(hub.PublishError, match="expected BENCHMARK:CONFIG"):
        hub.export_results(work / "run", work / "out", "org/model")
    assert main(["publish", "--results", str(work / "run"), "--model-repo", "org/model",
                 "--to", str(work / "out2")]) == 2
    after = sorted(str(p) for p in tmp_path.rglob("*") if work not in p.parents)
    assert after == before and not list(work.rglob("*.yaml"))
    assert Path("/tmp/absolute").exists() == absolute_before
    for repo in ("../model", "org/..", "org/model/../../x", "/abs/model"):
        with pytest.raises(hub.PublishError, match="expected ORG/MODEL"):
            hub.export_results(work / "run", work / "out", repo)


def _png(size: int = 64) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (size, size, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _evasions() -> dict[str, bytes]:
    """Issue 23 point 3: each way a MIMIC image could slip past a check by file name."""
    import base64
    import gzip
    import io
    import zipfile

    import numpy as np

    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(200)
    dicom = bytes(128) + b"DICM" + b"\x02\x00\x00\x00UL\x04\x00" + bytes(100)
    array = io.BytesIO()
    np.save(array, np.zeros((4, 4), dtype=np.uint8))
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("p10/s1/view.jpg", jpeg)
    return {
        "scan.dicom": dicom,
        "scan_without_extension": dicom,
        "view.jpg.gz": gzip.compress(jpeg),
        "view.jfif": jpeg,
        "view.jpe": jpeg,
        "view.jp2": b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(64),
        "pixels.npy": array.getvalue(),
        "image_base64.txt": b"the image: " + base64.b64encode(_png()),
        "image_data_url.json": b'{"image": "data:image/png;base64,iVBORw0KGgo="}',
        "images.zip": archive.getvalue(),
        "other.bin": bytes(range(256)),
    }


@pytest.mark.parametrize("name", sorted(_evasions()))
def test_the_credentialed_guard_reads_content_not_names(exported, name):
    _, repos = exported
    repo = repos[("dataset", "medheval/cxr_vishal")]
    planted = Path(repo.folder) / "mimic_cxr" / name
    planted.write_bytes(_evasions()[name])
    try:
        with pytest.raises(CredentialedImageError, match=f"mimic_cxr/{name} is a "):
            hub.check_no_credentialed_bytes(repo)
        with pytest.raises(CredentialedImageError):
            hub.push([repo], token=False)  # checked before anything is uploaded
    finally:
        planted.unlink()
    hub.check_no_credentialed_bytes(repo)  # the export itself passes


def test_a_symlink_is_refused_in_every_repo(exported, tmp_path):
    _, repos = exported
    outside = tmp_path / "p10_s1_view.jpg"
    outside.write_bytes(b"\xff\xd8\xff" + bytes(10))
    for key in (("dataset", "medheval/cxr_vishal"), ("dataset", "medheval/mm_vishal")):
        repo = repos[key]
        link = Path(repo.folder) / "notes.txt"
        link.symlink_to(outside)
        try:
            with pytest.raises(CredentialedImageError, match="notes.txt is a symbolic link"):
                hub.check_no_credentialed_bytes(repo)
        finally:
            link.unlink()


def test_base64_strings_in_a_credentialed_parquet_are_refused(tmp_path):
    import base64

    table = datasets.Dataset.from_dict({"id": ["x"], "source": ["mimic_cxr"],
                                        "images": [[base64.b64encode(_png()).decode()]]})
    table.to_parquet(str(tmp_path / "test.parquet"))
    bad = hub.RepoFolder(str(tmp_path), "medheval/bad", "dataset", "datasets", gated=True)
    with pytest.raises(CredentialedImageError, match="column 'images' holds base64 data"):
        hub.check_no_credentialed_bytes(bad)


# -- the round trip through a fake Hub ------------------------------------------------------------


def _client_env(hub_url: str, home: Path, token: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                          "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update({"HF_ENDPOINT": hub_url, "HF_HOME": str(home / "hf_home"), "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_UPDATE_DOWNLOAD_COUNTS": "0",
                "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])})
    if token:
        env["HF_TOKEN"] = token
    return env


@pytest.mark.slow
def test_round_trip_through_a_hub_on_loopback(tmp_path, fixture_benchmark, dataset_cache, monkeypatch):
    import evaluate

    with HubServer(tokens={"hf_owner_token": "owner"}) as fake:
        env = _client_env(fake.url, tmp_path, "hf_owner_token")
        publish = subprocess.run(
            [sys.executable, "-m", "medheval.cli", "publish", "--push", "--org", "medheval", "--to",
             str(tmp_path / "out"), "--data-dir", fixture_benchmark["data_dir"],
             "--name", "cxr_vishal,medihall_score,vcd"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert publish.returncode == 0, publish.stderr[-3000:]
        assert "hf_owner_token" not in publish.stdout + publish.stderr  # the token is never logged
        repos = fake.repos
        assert set(repos) == {("dataset", "medheval/cxr_vishal"), ("space", "medheval/medihall_score"),
                              ("model", "medheval/vcd")}
        assert repos[("dataset", "medheval/cxr_vishal")].gated == "manual"
        assert repos[("space", "medheval/medihall_score")].sdk == "static"
        assert "mimic_cxr/test-00000-of-00001.parquet" in repos[("dataset", "medheval/cxr_vishal")].files
        assert "custom_generate/generate.py" in repos[("model", "medheval/vcd")].files

        client = subprocess.run(
            [sys.executable, str(TESTS / "hub_roundtrip_client.py"), str(tmp_path / "client.json"),
             fixture_benchmark["data_dir"], json.dumps(fixture_benchmark["image_roots"])],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stderr[-3000:]
        got = json.loads((tmp_path / "client.json").read_text())
        assert fake.unhandled == [], fake.unhandled
        user_repo_files = repos.get(("dataset", "owner/my-mimic-copy"))
        fake_refs_parquet = [p for p in repos[("dataset", "owner/my-mimic-refs")].files if p.endswith(".parquet")]

    # datasets: same records as load_benchmark
    local = load_benchmark("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    assert got["dataset_rows"] == json.loads(json.dumps(local.to_list(), default=str))
    assert len(got["dataset_rows"]) == len(local) > 0
    # evaluate: the Hub module computes what the local module computes
    local_metric = evaluate.load(str(REPO / "metrics" / "medihall_score"))
    expected = local_metric.compute(predictions=["Yes.", "No."], references=["No", "No"],
                                    questions=["Is there a mass?"] * 2, ids=["a", "b"])
    assert got["metric"] == json.loads(json.dumps(expected, default=str))
    assert got["metric"]["medihall_score"] == 0.5  # "Yes." to a "No" item is catastrophic (0.0), "No." correct (1.0)
    # transformers: custom_generate by Hub id equals the local VCD
    assert got["vcd_hub"] == got["vcd_local"]
    # gating: anonymous refused, the owner's token allowed
    assert got["gated_anonymous"] and got["gated_anonymous"].startswith("GatedRepoError"), got["gated_anonymous"]
    assert got["gated_with_token"] is None and got["public_anonymous"] is None
    # a user's push_to_hub of MIMIC images is refused before any Parquet reaches the Hub; references go through
    assert got["user_push"] and got["user_push"].startswith("CredentialedImageError"), got["user_push"]
    assert not [p for p in (user_repo_files.files if user_repo_files else {}) if p.endswith(".parquet")]
    assert fake_refs_parquet
    assert got["user_push_without_images"] is None, got["user_push_without_images"]



# -- bare metric names ----------------------------------------------------------------------------

_BARE_LOAD = """
import json, sys, evaluate
metric = evaluate.load("medihall_score")
out = metric.compute(predictions=["Yes.", "No."], references=["No", "No"], questions=["Is there a mass?"] * 2)
print(json.dumps({"score": out["medihall_score"], "file": sys.modules[type(metric).__module__].__file__}))
"""


def _offline_modules_env(tmp_path):
    """The client's environment, offline, with evaluate's module cache in ``tmp_path/modules``."""
    env = _client_env("http://127.0.0.1:9", tmp_path, None)
    env.update({"HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_EVALUATE_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    return env


def _python(args: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_install_metrics_makes_bare_names_load(tmp_path):
    env = _offline_modules_env(tmp_path)
    before = _python(["-c", _BARE_LOAD], env, tmp_path)
    assert before.returncode != 0 and "medihall_score" in before.stderr  # not there yet
    install = _python(["-m", "medheval.cli", "install-metrics", "--name", "medihall_score,close_ended_accuracy"],
                      env, tmp_path)
    assert install.returncode == 0, install.stderr[-2000:]
    assert (tmp_path / "modules" / "evaluate_modules" / "metrics" / "evaluate-metric--medihall_score").is_dir()
    offline = _python(["-c", _BARE_LOAD], env, tmp_path)
    assert offline.returncode == 0, offline.stderr[-2000:]
    got = json.loads(offline.stdout.strip().splitlines()[-1])
    assert got["score"] == 0.5 and "evaluate-metric--medihall_score" in got["file"]
    # online, a Hub without evaluate-metric/medihall_score: evaluate falls back to the same registered module
    with HubServer() as fake:
        online_env = {**env, "HF_ENDPOINT": fake.url}
        del online_env["HF_EVALUATE_OFFLINE"], online_env["HF_HUB_OFFLINE"]
        online = subprocess.run([sys.executable, "-c", _BARE_LOAD], env=online_env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
        asked = [path for _, path, _ in fake.requests]
    assert online.returncode == 0, online.stderr[-2000:]
    assert json.loads(online.stdout.strip().splitlines()[-1])["score"] == 0.5
    assert any("evaluate-metric/medihall_score" in path for path in asked)  # the Hub was asked first


_MEDHEVAL_ID_LOAD = """
import json, sys, evaluate
accuracy = evaluate.load("medheval/close_ended_accuracy")
hallu = evaluate.load("medheval/medihall_score")
acc = accuracy.compute(predictions=["Yes.", "No, there is none.", "The answer is B"], references=["Yes", "Yes", "B"],
                       answer_types=["yes_no", "yes_no", "multiple_choice"], choices=[[], [], ["Effusion", "Pneumonia"]])
score = hallu.compute(predictions=["Yes.", "No."], references=["No", "No"], questions=["Is there a mass?"] * 2)
print(json.dumps({"accuracy": acc["accuracy"], "medihall": score["medihall_score"],
                  "files": [sys.modules[type(m).__module__].__file__ for m in (accuracy, hallu)]}))
"""


@pytest.mark.slow
def test_install_metrics_makes_medheval_ids_load_offline(tmp_path):
    """``evaluate.load("medheval/<name>")`` offline, from a folder that is not the repository: evaluate skips
    the Hub and reads its module cache's ``medheval--<name>``, which install-metrics writes."""
    env = _offline_modules_env(tmp_path)
    before = _python(["-c", _MEDHEVAL_ID_LOAD], env, tmp_path)
    assert before.returncode != 0 and "medheval/close_ended_accuracy" in before.stderr  # not there yet
    install = _python(["-m", "medheval.cli", "install-metrics", "--name", "close_ended_accuracy,medihall_score"],
                      env, tmp_path)
    assert install.returncode == 0, install.stderr[-2000:]
    for name in ("close_ended_accuracy", "medihall_score"):  # one line per id, the id as evaluate.load takes it
        assert f'installed {name}: evaluate.load("medheval/{name}")' in install.stdout
        assert f'installed {name}: evaluate.load("{name}")' in install.stdout
    offline = _python(["-c", _MEDHEVAL_ID_LOAD], env, tmp_path)
    assert offline.returncode == 0, offline.stderr[-2000:]
    got = json.loads(offline.stdout.strip().splitlines()[-1])
    assert got["accuracy"] == pytest.approx(2 / 3) and got["medihall"] == 0.5  # worked out by hand
    assert "medheval--close_ended_accuracy" in got["files"][0] and "medheval--medihall_score" in got["files"][1]
    assert all(str(tmp_path / "modules") in path for path in got["files"])


def test_med_hallmark_exports_with_its_mimic_config_gated(tmp_path):
    """Med-HallMark's IRG items are MIMIC-CXR reports: the repo is gated, its Parquet holds no image bytes."""
    import pyarrow.parquet as pq

    from conftest import SHARED_UPSTREAM

    files = SHARED_UPSTREAM / "med-hallmark"
    if not files.is_dir():
        pytest.skip("../shared/data/upstream/med-hallmark is absent")
    (repo,) = hub.export_all(tmp_path, kinds=["datasets"], names=["med_hallmark"], data_dir=files,
                             cache_dir=tmp_path / "cache")
    assert repo.gated
    meta = _card(Path(repo.folder) / "README.md")
    assert {entry["config_name"] for entry in meta["configs"]} == {
        "conventional", "counterfactual", "confidence_weakening", "irg"}
    for parquet in Path(repo.folder).rglob("*.parquet"):
        schema = pq.read_schema(parquet)
        assert not any("binary" in str(field.type) for field in schema), parquet
    irg = pq.read_table(next((Path(repo.folder) / "irg").rglob("*.parquet")))
    assert irg.num_rows == 359 and set(irg.column("source").to_pylist()) == {"mimic_cxr"}


def test_publish_fails_when_every_dataset_is_skipped_and_leaves_no_empty_folder(tmp_path):
    """Issue 23, point 12: a data dir without annotation files used to exit 0 with empty repo folders."""
    empty = tmp_path / "no_annotations"
    empty.mkdir()
    out = tmp_path / "out"
    code = subprocess.run(
        [sys.executable, "-m", "medheval.cli", "publish", "--to", str(out), "--kind", "datasets",
         "--data-dir", str(empty)], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert code.returncode == 2, code.stderr
    assert "no dataset was exported" in code.stderr
    assert "mm_vishal: annotation files not available" in code.stderr  # the reason, per dataset
    assert not (out / "datasets").exists()  # no half-written folders
    assert set(json.loads((out / "skipped.json").read_text())) >= {"mm_vishal", "cxr_vishal", "med_stepbench"}


def test_unpinned_annotation_files_are_named_on_console_manifest_and_card(exported, fixture_benchmark,
                                                                          dataset_cache, tmp_path):
    """Issue 23, point 12: fixture data and modified copies are published with a notice, never silently."""
    import shutil

    from medheval.data.fetch import FIXTURE_MARKER

    out, repos = exported
    manifest = {entry["repo_id"]: entry for entry in json.loads((out / "publish.json").read_text())}
    warnings = manifest["medheval/mm_vishal"]["warnings"]
    assert warnings and all("embedded fixture" in warning for warning in warnings)
    card = (Path(repos[("dataset", "medheval/mm_vishal")].folder) / "README.md").read_text()
    assert "## Not the released annotation files" in card and "embedded fixture" in card
    assert not manifest["medheval/vcd"]["warnings"]

    edited = tmp_path / "edited"  # a real modified copy: the fixture files without the fixture marker
    shutil.copytree(fixture_benchmark["data_dir"], edited)
    (edited / FIXTURE_MARKER).unlink()
    run = subprocess.run(
        [sys.executable, "-m", "medheval.cli", "publish", "--to", str(tmp_path / "out2"), "--kind", "datasets",
         "--name", "mm_vishal", "--data-dir", str(edited)], capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr
    assert "warning:" in run.stderr and "not the pinned" in run.stderr and "a modified copy" in run.stderr
    entry = json.loads((tmp_path / "out2" / "publish.json").read_text())[0]
    assert any("a modified copy" in warning for warning in entry["warnings"])

"""vishal_report:ba4586e: the report-generation file as it stood before upstream commit 42e36fc, pinned at
ba4586e with its sha256 and loaded by the same code as the released file (data_dir first, then the pinned URL)."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest

from medheval.data.benchmarks import load_benchmark, prepare_benchmark
from medheval.cli import main
from medheval.data.fetch import AnotherConfigsFile, ChecksumMismatch, PinnedFile
from medheval.families.medheval import source
from medheval.integrations import splits

from conftest import UPSTREAM_MEDHEVAL, requires_upstream

# three items in the schema of the earlier file (same keys as the released one; the instruction differs)
OLD = [{"img_name": f"p10/p10{i:06d}/s5{i:07d}/{i:08x}-00000000-00000000-00000000-00000000.jpg", "question": "Describe the findings in this X-ray.",
        "answer": f"Reference report {i}: small left effusion.", "qid": i, "img_id": f"p10/img{i}.jpg",
        "structured_answer": {"anatomy": ["left lung"], "measurement": [], "symptom": ["effusion"]}}
       for i in (0, 7, 499)]
PAYLOAD = json.dumps(OLD).encode()
RELPATH = source.REPORT_BA4586E.relpath


def test_the_pin_names_the_earlier_commit_and_the_released_path():
    pin = source.FILES["report_ba4586e"]
    assert pin is source.REPORT_BA4586E and pin.relpath == source.FILES["report"].relpath
    assert pin.url == ("https://raw.githubusercontent.com/Aofei-Chang/MedHEval/"
                       f"ba4586e84dbd947003f954b10f95fa8ed8b05b68/benchmark_data/{RELPATH}")
    assert pin.sha256 == "121c6d6e17a6ecd8394cf92d260ca0c099f682241d0d6b01c6f504435886991f" != source.FILES["report"].sha256
    assert splits.default_config("vishal_report") == "default"  # naming the benchmark alone keeps the released file


@pytest.fixture()
def server():
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            ok = self.path == "/old.json"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(PAYLOAD) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(PAYLOAD)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/old.json", hits
    httpd.shutdown()
    httpd.server_close()


def _offline_off(monkeypatch, tmp_path):
    for name in ("HF_HUB_OFFLINE", "MEDHEVAL_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))


def test_the_config_downloads_the_pinned_file_and_verifies_it(server, tmp_path, monkeypatch):
    url, hits = server
    _offline_off(monkeypatch, tmp_path)
    monkeypatch.setitem(source.FILES, "report_ba4586e",
                        PinnedFile(RELPATH, url, hashlib.sha256(PAYLOAD).hexdigest()))
    loaded = prepare_benchmark("vishal_report", "ba4586e", cache_dir=str(tmp_path / "ds"))
    assert [r["id"] for r in loaded.dataset] == ["vishal_report/ba4586e/0", "vishal_report/ba4586e/7",
                                                  "vishal_report/ba4586e/499"]
    assert {r["question"] for r in loaded.dataset} == {"Describe the findings in this X-ray."}
    assert loaded.dataset[2]["meta"]["structured_answer"]["symptom"] == ["effusion"]
    assert [(f["origin"], f["verified"]) for f in loaded.files] == [("download", True)] and hits == ["/old.json"]


def test_a_download_with_another_sha256_is_refused(server, tmp_path, monkeypatch):
    url, hits = server
    _offline_off(monkeypatch, tmp_path)
    monkeypatch.setitem(source.FILES, "report_ba4586e", PinnedFile(RELPATH, url, "0" * 64))
    with pytest.raises(ChecksumMismatch, match="expected 0000"):
        prepare_benchmark("vishal_report", "ba4586e", cache_dir=str(tmp_path / "ds"))
    assert hits == ["/old.json"] and not list((tmp_path / "cache").rglob("*.json"))


def test_a_local_copy_of_the_earlier_folder_is_read_first(tmp_path, dataset_cache):
    data_dir = tmp_path / "benchmark_data"
    (data_dir / RELPATH).parent.mkdir(parents=True)
    (data_dir / RELPATH).write_bytes(PAYLOAD)
    loaded = prepare_benchmark("vishal_report", "ba4586e", data_dir=str(data_dir), cache_dir=dataset_cache)
    assert len(loaded.dataset) == 3 and loaded.files[0]["origin"] == "data_dir"
    # these are not the pinned bytes: said (verified False), not refused, as for every local copy
    assert loaded.files[0]["verified"] is False and loaded.files[0]["expected_sha256"] == source.REPORT_BA4586E.sha256
    again = load_benchmark("vishal_report:ba4586e", data_dir=str(data_dir), cache_dir=dataset_cache)
    assert again[0]["id"] == "vishal_report/ba4586e/0"


def test_the_config_is_a_harness_task_outside_the_medheval_group():
    from medheval.integrations.lmms_eval.write_tasks import TASKS_DIR, groups

    assert ("vishal_report", "ba4586e") in splits.harness_splits()
    assert (Path(TASKS_DIR) / "medheval_vishal_report_ba4586e.yaml").is_file()
    assert "medheval_vishal_report_ba4586e" not in groups()["medheval"]
    assert "medheval_vishal_report_default" in groups()["medheval"]


def test_the_paper_protocols_run_the_released_report_file_and_say_why():
    """Both MedHEval protocols cover vishal_report by name, so they run its default config (the released 490-item
    file the paper describes); their cards record that choice as inferred, with the revision it is not."""
    from medheval.run.paper_protocols.medheval import BASELINE, MITIGATION

    for protocol in (BASELINE, MITIGATION):
        assert "vishal_report" in protocol.benchmarks
        notes = [note for note in protocol.inferred if note.startswith("vishal_report runs its released file")]
        assert len(notes) == 1 and "490" in notes[0] and "vishal_report:ba4586e" in notes[0] and "42e36fc" in notes[0]
        card = (Path(__file__).resolve().parents[1] / "docs" / "protocols" / f"{protocol.name}.md").read_text()
        assert notes[0] in card


def _data_dir_with(tmp_path: Path, payload: bytes) -> Path:
    data_dir = tmp_path / "benchmark_data"
    (data_dir / RELPATH).parent.mkdir(parents=True)
    (data_dir / RELPATH).write_bytes(payload)
    return data_dir


@pytest.mark.parametrize(("config", "other", "other_key"), [("ba4586e", "default", "report"),
                                                            ("default", "ba4586e", "report_ba4586e")])
def test_a_local_file_pinned_for_the_other_config_is_refused(config, other, other_key, tmp_path, dataset_cache,
                                                             monkeypatch, capsys):
    """Both configs read the same relative path: a --data-dir file with the *other* config's pinned bytes would load
    under this config's ids with only a "modified copy" warning, so it is refused, naming both configs and how to
    get the right file; `medheval list` shows that config as unavailable (–) instead of counting it."""
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    pinned = source.FILES[other_key]
    monkeypatch.setitem(source.FILES, other_key, PinnedFile(pinned.relpath, pinned.url, digest))
    data_dir = _data_dir_with(tmp_path, PAYLOAD)
    own = source.FILES["report_ba4586e" if other_key == "report" else "report"]
    with pytest.raises(AnotherConfigsFile) as refused:
        prepare_benchmark("vishal_report", config, data_dir=str(data_dir), cache_dir=dataset_cache)
    assert str(refused.value) == (
        f"{data_dir / RELPATH} is the file of config `{other}` (sha256 {digest}), not of `{config}` (sha256 "
        f"{own.sha256}): `{config}` needs a --data-dir copy of {own.url.removesuffix(RELPATH)} (that upstream "
        f"commit), or drop --data-dir to download its file")
    assert len(prepare_benchmark("vishal_report", other, data_dir=str(data_dir), cache_dir=dataset_cache).dataset) == 3
    assert main(["list", "--json", "--data-dir", str(data_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["item_counts"]["vishal_report"] == {config: None, other: 3}


@requires_upstream
def test_the_released_upstream_folder_is_refused_for_ba4586e(dataset_cache):
    """The current benchmark_data/ holds the released (490-item) report file: `ba4586e` refuses it."""
    with pytest.raises(AnotherConfigsFile, match=r"is the file of config `default` \(sha256 9b933043"):
        prepare_benchmark("vishal_report", "ba4586e", data_dir=str(UPSTREAM_MEDHEVAL), cache_dir=dataset_cache)

"""Pinned annotation downloads: data_dir override, cache, verified download, clear offline errors."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from medheval.data.fetch import AnnotationUnavailable, ChecksumMismatch, PinnedFile, fetch

PAYLOAD = b'[{"qid": 0, "question": "Is there a fracture?", "answer": "No"}]'


@pytest.fixture()
def server():
    """Serves PAYLOAD at /data.json on 127.0.0.1 and counts the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            if self.path == "/data.json":
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAYLOAD)))
                self.end_headers()
                self.wfile.write(PAYLOAD)
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()
    httpd.server_close()


def pinned(url: str, payload: bytes = PAYLOAD) -> PinnedFile:
    return PinnedFile("sub/data.json", url, hashlib.sha256(payload).hexdigest())


def test_download_is_verified_and_cached(server, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    base, hits = server
    pin = pinned(f"{base}/data.json")
    first = fetch(pin, cache_dir=tmp_path)
    assert first.origin == "download" and first.verified and first.path.read_bytes() == PAYLOAD
    second = fetch(pin, cache_dir=tmp_path)
    assert second.origin == "cache" and second.path == first.path
    assert hits == ["/data.json"]  # the second call made no request


def test_checksum_mismatch_keeps_nothing(server, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    base, _ = server
    pin = pinned(f"{base}/data.json", payload=b"other bytes")
    with pytest.raises(ChecksumMismatch, match="expected"):
        fetch(pin, cache_dir=tmp_path)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_offline_error_names_file_url_and_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDHEVAL_OFFLINE", "1")
    pin = pinned("https://example.invalid/data.json")
    with pytest.raises(AnnotationUnavailable) as info:
        fetch(pin, cache_dir=tmp_path)
    message = str(info.value)
    assert "sub/data.json" in message and "https://example.invalid/data.json" in message and "data_dir" in message


def test_unreachable_server_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pin = pinned("http://127.0.0.1:9/data.json")  # discard port: connection refused
    with pytest.raises(AnnotationUnavailable, match="download failed"):
        fetch(pin, cache_dir=tmp_path, timeout=2)


def test_data_dir_wins_and_reports_unverified_bytes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.json").write_bytes(b"[]")
    got = fetch(pinned("https://example.invalid/data.json"), data_dir=tmp_path)
    assert got.origin == "data_dir" and not got.verified and got.sha256 == hashlib.sha256(b"[]").hexdigest()
    with pytest.raises(AnnotationUnavailable, match="has no file"):
        fetch(PinnedFile("missing.json", "https://example.invalid/m", "0" * 64), data_dir=tmp_path)


def test_a_folder_named_by_a_variable_is_the_only_place_looked_in_when_set(tmp_path, monkeypatch):
    pin = pinned("https://example.invalid/data.json")
    for folder in ("copy", "data"):
        (tmp_path / folder / "sub").mkdir(parents=True)
        (tmp_path / folder / "sub" / "data.json").write_bytes(PAYLOAD)
    monkeypatch.setenv("MEDHEVAL_TEST_COPY", str(tmp_path / "copy"))
    got = fetch(pin, data_dir=tmp_path / "data", folder_env="MEDHEVAL_TEST_COPY")
    assert got.path == tmp_path / "copy" / "sub" / "data.json" and got.verified and got.origin == "data_dir"
    monkeypatch.setenv("MEDHEVAL_TEST_COPY", str(tmp_path / "empty"))
    with pytest.raises(AnnotationUnavailable, match=r"not available \(not in \$MEDHEVAL_TEST_COPY=.*empty, looked at"):
        fetch(pin, data_dir=tmp_path / "data", folder_env="MEDHEVAL_TEST_COPY")


def test_an_optional_data_dir_without_the_file_is_passed_over(server, tmp_path, monkeypatch):
    """``data_dir_optional``: the cache and the download are tried next; found nowhere, the error lists every
    place looked in. Without it, a data_dir lacking the file is still an error."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("MEDHEVAL_TEST_COPY", raising=False)
    base, hits = server
    pin, data, cache = pinned(f"{base}/data.json"), tmp_path / "data", tmp_path / "cache"
    with pytest.raises(AnnotationUnavailable, match="has no file"):
        fetch(pin, data_dir=data, cache_dir=cache)
    assert not hits
    monkeypatch.setenv("MEDHEVAL_OFFLINE", "1")
    with pytest.raises(AnnotationUnavailable) as info:
        fetch(pin, data_dir=data, cache_dir=cache, folder_env="MEDHEVAL_TEST_COPY", data_dir_optional=True)
    assert str(info.value).endswith(f"looked in: $MEDHEVAL_TEST_COPY (not set); {data / 'sub' / 'data.json'} "
                                    f"(the data folder: absent); the cache {cache}")
    monkeypatch.delenv("MEDHEVAL_OFFLINE")
    got = fetch(pin, data_dir=data, cache_dir=cache, data_dir_optional=True)
    assert got.origin == "download" and got.verified and hits == ["/data.json"]

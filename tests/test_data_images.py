"""medheval.data.images: local folders, HTTP URL templates with basic auth, HF datasets, resolver."""

from __future__ import annotations

import base64
import io
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

import pytest
from conftest import UPSTREAM_MEDHEVAL
from PIL import Image

from medheval.data.images import (
    REFERENCE_PATTERNS,
    HFDatasetSource,
    ImageDecodeError,
    ImageError,
    ImageFetchError,
    ImageNotFound,
    ImageResolver,
    ImageSource,
    LocalFolderSource,
    MissingImagesError,
    NoImageRoot,
    UnsafeImagePath,
    URLTemplateSource,
    check_reference,
    parse_image_root,
    parse_image_root_args,
)

SLAKE = "xmlab102/source.jpg"
VQA_RAD = "synpic54610.jpg"
IU = "CXR3030_IM-1405/0.png"
MIMIC = "p19/p19454978/s57331547/7d047120-3bd6b3b2-ab2cd7c2-13a47f0a-34da1f7e.jpg"

USER, PASSWORD = "alice", "s3cr3t-Pa55word"


def encode(color: tuple[int, int, int], fmt: str, size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color if mode == "RGB" else color[0]).save(buffer, format=fmt)
    return buffer.getvalue()


def record(rid: str, source: str, *refs: str) -> dict:
    return {"id": rid, "source": source, "images": list(refs), "question": "q", "answer": "a"}


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real ~/.netrc, no credentials or proxies from the environment."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    for name in list(os.environ):
        if name.endswith(("_USERNAME", "_PASSWORD")) or name.upper() in ("NETRC", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    "source, ref",
    [
        ("slake", SLAKE),
        ("vqa_rad", VQA_RAD),
        ("iu_xray", IU),
        ("iu_xray", "CXR1000_IM-0003-1001/1.png"),
        ("mimic_cxr", MIMIC),
        ("mimic_cxr", "p10/p10000032/s50414267/02aa804e-bde0afdd-112c0b34-7bc16630-4e384014.jpg"),
        ("other_source", "any/nested/file name.dcm"),
        ("other_source", "img%20one.png"),
    ],
)
def test_check_reference_accepts(source: str, ref: str) -> None:
    assert check_reference(source, ref)


@pytest.mark.parametrize(
    "source, ref",
    [
        ("slake", "xmlab102/source.png"),
        ("slake", "imgs/xmlab102/source.jpg"),
        ("vqa_rad", "synpic54610.png"),
        ("vqa_rad", "images/synpic1.jpg"),
        ("iu_xray", "CXR3030_IM-1405.png"),
        ("iu_xray", "CXR3030/0.png"),
        ("mimic_cxr", "files/" + MIMIC),  # relative to files/, not its parent
        ("mimic_cxr", "p18/p19454978/s57331547/7d047120-3bd6b3b2-ab2cd7c2-13a47f0a-34da1f7e.jpg"),  # p18 != p19...
        ("mimic_cxr", "p19/p19454978/s57331547/7d047120.jpg"),
        ("mimic_cxr", "p19/p19454978/7d047120-3bd6b3b2-ab2cd7c2-13a47f0a-34da1f7e.jpg"),
        ("other_source", "../etc/passwd"),
        ("other_source", "/etc/passwd"),
        ("other_source", "a/../../x"),
        ("other_source", "%2e%2e/x"),
        ("other_source", "%252e%252e/x"),
        ("other_source", "a\\..\\x"),
        ("other_source", "a\x00b"),
        ("other_source", "https://evil.example/x.jpg"),
        ("other_source", "C:/x.jpg"),
        ("other_source", "a//b"),
        ("other_source", "./a"),
        ("other_source", ""),
    ],
)
def test_check_reference_rejects(source: str, ref: str) -> None:
    assert not check_reference(source, ref)


def test_patterns_cover_known_sources() -> None:
    assert set(REFERENCE_PATTERNS) >= {"slake", "vqa_rad", "iu_xray", "mimic_cxr"}
    assert not check_reference("slake", 123)  # type: ignore[arg-type]


def test_upstream_references_are_well_formed() -> None:
    """Every img_name of the real MedHEval files matches a known pattern (skipped without them)."""
    import json

    root = UPSTREAM_MEDHEVAL
    files = sorted(root.rglob("*.json")) if root.is_dir() else []
    if not files:
        pytest.skip("upstream MedHEval annotation files not present")
    refs = []
    for path in files:
        data = json.loads(path.read_text())
        rows = data if isinstance(data, list) else []
        refs += [row["img_name"] for row in rows if isinstance(row, dict) and isinstance(row.get("img_name"), str)]
    assert refs
    bad = [ref for ref in refs if not any(check_reference(source, ref) for source in REFERENCE_PATTERNS)]
    assert bad == []


# --------------------------------------------------------------------------- local folders


@pytest.fixture()
def image_tree(tmp_path: Path) -> dict[str, Path]:
    """Real per-source layouts with small generated images."""
    roots = {
        "slake": tmp_path / "slake" / "imgs",
        "vqa_rad": tmp_path / "vqa_rad" / "VQA_RAD Image Folder",
        "iu_xray": tmp_path / "iu_xray" / "images",
        "mimic_cxr": tmp_path / "mimic-cxr-jpg" / "2.1.0" / "files",
    }
    files = {
        "slake": (SLAKE, encode((255, 0, 0), "JPEG")),
        "vqa_rad": (VQA_RAD, encode((0, 255, 0), "JPEG")),
        "iu_xray": (IU, encode((90, 0, 0), "PNG", mode="L")),
        "mimic_cxr": (MIMIC, encode((0, 0, 255), "JPEG")),
    }
    for source, (ref, data) in files.items():
        path = roots[source] / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return roots


def test_local_open_every_layout(image_tree: dict[str, Path]) -> None:
    resolver = ImageResolver({source: str(root) for source, root in image_tree.items()})
    refs = {"slake": SLAKE, "vqa_rad": VQA_RAD, "iu_xray": IU, "mimic_cxr": MIMIC}
    for source, ref in refs.items():
        image = resolver.open(source, ref)
        assert image.mode == "RGB" and image.size == (8, 6)
    assert resolver.open("slake", SLAKE).getpixel((3, 3))[0] > 200
    assert resolver.open("iu_xray", IU).getpixel((1, 1)) == (90, 90, 90)  # grayscale PNG -> RGB
    images = resolver.load_record_images(record("r1", "mimic_cxr", MIMIC, MIMIC))
    assert len(images) == 2 and all(isinstance(im, Image.Image) for im in images)
    assert resolver.load_record_images(record("text-only", "mimic_cxr")) == []


def test_local_source_basics(image_tree: dict[str, Path]) -> None:
    source = LocalFolderSource(image_tree["slake"])
    assert isinstance(source, ImageSource)
    assert source.exists(SLAKE)
    assert not source.exists("xmlab1/source.jpg")
    assert source.open_bytes(SLAKE)[:2] == b"\xff\xd8"
    assert str(image_tree["slake"]) in source.describe()
    with pytest.raises(ImageNotFound) as info:
        source.open_bytes("xmlab1/source.jpg")
    assert "xmlab1/source.jpg" in str(info.value)


@pytest.mark.parametrize(
    "ref", ["../etc/passwd", "/etc/passwd", "a/../../x", "xmlab1/../../../etc/passwd", "..\\x", "a\x00.jpg", "%2e%2e/x"]
)
def test_local_traversal_rejected(image_tree: dict[str, Path], ref: str) -> None:
    source = LocalFolderSource(image_tree["slake"])
    for call in (source.exists, source.open_bytes):
        with pytest.raises(UnsafeImagePath) as info:
            call(ref)
        assert str(image_tree["slake"]) in str(info.value)
    resolver = ImageResolver({"slake": source})
    with pytest.raises(UnsafeImagePath):
        resolver.open("slake", ref)


def test_local_symlink_outside_root_rejected(tmp_path: Path, image_tree: dict[str, Path]) -> None:
    secret = tmp_path / "outside" / "secret.jpg"
    secret.parent.mkdir()
    secret.write_bytes(encode((1, 2, 3), "JPEG"))
    root = image_tree["vqa_rad"]
    (root / "synpic1.jpg").symlink_to(secret)
    (root / "linkdir").symlink_to(secret.parent, target_is_directory=True)
    (root / "synpic2.jpg").symlink_to(root / VQA_RAD)  # inside the root: fine
    source = LocalFolderSource(root)
    for ref in ("synpic1.jpg", "linkdir/secret.jpg"):
        with pytest.raises(UnsafeImagePath, match="outside the root"):
            source.open_bytes(ref)
        with pytest.raises(UnsafeImagePath):
            source.exists(ref)
    assert source.open_bytes("synpic2.jpg") == (root / VQA_RAD).read_bytes()


def test_local_root_given_through_a_symlink(tmp_path: Path, image_tree: dict[str, Path]) -> None:
    link = tmp_path / "slake-link"
    link.symlink_to(image_tree["slake"], target_is_directory=True)
    assert LocalFolderSource(link).exists(SLAKE)


def test_missing_images_reported_by_id(image_tree: dict[str, Path]) -> None:
    resolver = ImageResolver({"slake": str(image_tree["slake"]), "mimic_cxr": str(image_tree["mimic_cxr"])})
    records = [
        record("medheval/slake/1", "slake", SLAKE),
        record("medheval/slake/2", "slake", "xmlab9/source.jpg"),
        record("medheval/mimic/1", "mimic_cxr", MIMIC),
        record("medheval/mimic/2", "mimic_cxr", MIMIC.replace("7d047120", "00000000")),
        record("medheval/text/1", "slake"),  # no image: always kept
        record("medheval/slake/3", "slake", SLAKE, "xmlab9/source.jpg"),
    ]
    missing = resolver.find_missing(records, progress=False)
    assert missing == [
        ("medheval/slake/2", "xmlab9/source.jpg"),
        ("medheval/mimic/2", MIMIC.replace("7d047120", "00000000")),
        ("medheval/slake/3", "xmlab9/source.jpg"),
    ]

    with pytest.raises(MissingImagesError) as info:
        resolver.partition(records)
    error = info.value
    assert isinstance(error, ImageError)
    assert error.missing == missing
    message = str(error)
    for rid in ("medheval/slake/2", "medheval/mimic/2", "medheval/slake/3"):
        assert rid in message
    assert "3 image(s) missing for 3 record(s)" in message
    assert "--image-root" in message and 'on_missing="skip"' in message

    kept, skipped = resolver.partition(records, on_missing="skip", progress=False)
    assert [r["id"] for r in kept] == ["medheval/slake/1", "medheval/mimic/1", "medheval/text/1"]
    assert skipped == missing
    assert len({rid for rid, _ in skipped}) == 3

    with pytest.raises(ValueError, match="on_missing"):
        resolver.partition(records, on_missing="ignore")


def test_missing_error_lists_first_ids_and_count(tmp_path: Path) -> None:
    resolver = ImageResolver({"vqa_rad": str(tmp_path)})
    records = [record(f"rad/{i}", "vqa_rad", f"synpic{i}.jpg") for i in range(250)]
    with pytest.raises(MissingImagesError) as info:
        resolver.partition(records, progress=True)  # > 200 checks: progress bar path
    message = str(info.value)
    assert "250 image(s) missing" in message
    assert "rad/0:" in message and "rad/19:" in message and "rad/20:" not in message
    assert "and 230 more" in message
    assert len(info.value.missing) == 250


def test_source_without_root(image_tree: dict[str, Path]) -> None:
    resolver = ImageResolver({"slake": str(image_tree["slake"])})
    assert resolver.has_root("slake") and not resolver.has_root("mimic_cxr")
    with pytest.raises(NoImageRoot) as info:
        resolver.open("mimic_cxr", MIMIC)
    assert isinstance(info.value, ImageNotFound)
    assert "--image-root mimic_cxr=" in str(info.value)
    records = [record("a", "slake", SLAKE), record("b", "mimic_cxr", MIMIC)]
    with pytest.raises(MissingImagesError, match="--image-root mimic_cxr="):
        resolver.partition(records)
    kept, skipped = resolver.partition(records, on_missing="skip")
    assert [r["id"] for r in kept] == ["a"] and skipped == [("b", MIMIC)]


def test_default_root_and_not_found_message(image_tree: dict[str, Path]) -> None:
    resolver = ImageResolver({"*": image_tree["mimic_cxr"]})  # a Path is accepted too
    assert resolver.has_root("anything")
    assert resolver.open("mimic_cxr", MIMIC).size == (8, 6)
    with pytest.raises(ImageNotFound) as info:
        resolver.open("mimic_cxr", MIMIC.replace("p19454978", "p19000000"))
    message = str(info.value)
    assert "mimic_cxr" in message and "p19000000" in message
    assert str(image_tree["mimic_cxr"]) in message  # where it looked
    assert "files/" in message  # what to do: point at MIMIC-CXR-JPG files/


def test_headers_are_checked_up_front_and_decode_errors_name_the_ref_and_record(tmp_path: Path) -> None:
    (tmp_path / "synpic7.jpg").write_bytes(b"this is not a jpeg")
    resolver = ImageResolver({"vqa_rad": str(tmp_path)})
    with pytest.raises(MissingImagesError, match=r"undecodable .*\n  - r: synpic7.jpg") as info:
        resolver.partition([record("r", "vqa_rad", "synpic7.jpg")])
    assert info.value.missing == [] and [u[:2] for u in info.value.undecodable] == [("r", "synpic7.jpg")]
    check = resolver.check_records([record("r", "vqa_rad", "synpic7.jpg")], on_missing="skip", progress=False)
    assert check.kept == [] and check.missing == [] and check.undecodable[0][:2] == ("r", "synpic7.jpg")
    with pytest.raises(ImageDecodeError, match="synpic7.jpg"):
        resolver.open("vqa_rad", "synpic7.jpg")
    with pytest.raises(ImageDecodeError, match="record 'r': .*synpic7.jpg"):
        resolver.load_record_images(record("r", "vqa_rad", "synpic7.jpg"))


# --------------------------------------------------------------------------- specs


def test_parse_image_root(tmp_path: Path) -> None:
    local = parse_image_root(str(tmp_path))
    assert isinstance(local, LocalFolderSource) and local.root == tmp_path
    from_file_url = parse_image_root(tmp_path.as_uri())
    assert isinstance(from_file_url, LocalFolderSource) and from_file_url.root == tmp_path
    assert isinstance(parse_image_root("relative/imgs:v2"), LocalFolderSource)

    url = parse_image_root("https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}")
    assert isinstance(url, URLTemplateSource)
    assert url.url_for(MIMIC) == "https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/" + MIMIC
    appended = parse_image_root("https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/")
    assert isinstance(appended, URLTemplateSource)
    assert appended.template == "https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}"
    assert appended.env_prefix == "PHYSIONET"
    quoted = parse_image_root("http://127.0.0.1:1/VQA_RAD Image Folder/{path}?dl=1")
    assert isinstance(quoted, URLTemplateSource)
    assert quoted.url_for("a b/c#d.jpg").endswith("/a%20b/c%23d.jpg?dl=1")

    hf = parse_image_root("hf://someone/iu-xray-images:test#id_column=uid,image_column=img")
    assert isinstance(hf, HFDatasetSource)
    assert (hf.split, hf.id_column, hf.image_column) == ("test", "uid", "img")
    assert isinstance(parse_image_root("hf://someone/images"), HFDatasetSource)

    for bad in ("s3://bucket/images", "ftp://host/x", "", "hf://", "hf://x#colour=red"):
        with pytest.raises(ValueError):
            parse_image_root(bad)


def test_parse_image_root_args() -> None:
    assert parse_image_root_args(
        [
            "mimic_cxr=https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}?a=b",
            "slake=/data/slake/imgs",
            "/data/default",
        ]
    ) == {
        "mimic_cxr": "https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}?a=b",
        "slake": "/data/slake/imgs",
        "*": "/data/default",
    }
    assert parse_image_root_args(["https://host/x/{path}?token=a=b"]) == {"*": "https://host/x/{path}?token=a=b"}
    assert parse_image_root_args(["hf://user/ds#id_column=uid"]) == {"*": "hf://user/ds#id_column=uid"}
    assert parse_image_root_args(["iu_xray=hf://user/ds#id_column=uid"]) == {"iu_xray": "hf://user/ds#id_column=uid"}
    with pytest.raises(ValueError):
        parse_image_root_args(["slake="])
    with pytest.raises(ValueError):
        parse_image_root_args(["slake=/a", "slake=/b"])


# --------------------------------------------------------------------------- HTTP


class _Handler(BaseHTTPRequestHandler):
    # per-server copies are made in the fixture
    images: ClassVar[dict[str, tuple[bytes, str]]] = {}
    credentials: ClassVar[tuple[str, str] | None] = None
    flaky_left: ClassVar[dict[str, int]] = {}
    hits: ClassVar[list[tuple[str, str]]] = []
    sleep_s: ClassVar[float] = 2.0

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _authorized(self) -> bool:
        if self.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        return self.headers.get("Authorization") == expected

    def _serve(self, with_body: bool) -> None:
        self.hits.append((self.command, self.path))
        path = self.path.split("?", 1)[0]
        if path.startswith("/slow/"):
            time.sleep(self.sleep_s)
        if path.startswith("/nohead/") and self.command == "HEAD":
            self._reply(405, b"", "text/plain", with_body)
            return
        if path.startswith("/flaky/") and self.flaky_left.get(path, 0) > 0:
            self.flaky_left[path] -= 1
            self._reply(503, b"busy", "text/plain", with_body)
            return
        if path.startswith("/login/"):
            self._reply(200, b"<html>please log in</html>", "text/html; charset=utf-8", with_body)
            return
        if not self._authorized():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        key = unquote(path).split("/", 2)[-1]  # /<prefix>/<ref>
        if key not in self.images:
            self._reply(404, b"not found", "text/plain", with_body)
            return
        data, ctype = self.images[key]
        self._reply(200, data, ctype, with_body)

    def _reply(self, status: int, data: bytes, ctype: str, with_body: bool) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._serve(True)

    def do_HEAD(self) -> None:
        self._serve(False)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the thread pool opens 8 connections at once


@pytest.fixture()
def server():
    """A loopback image server requiring basic auth; yields (base_url, handler class)."""
    handler = type(
        "Handler",
        (_Handler,),
        {
            "images": {
                MIMIC: (encode((0, 0, 255), "JPEG"), "image/jpeg"),
                IU: (encode((10, 200, 10), "PNG"), "image/png"),
                "dir with space/img#1.png": (encode((7, 7, 7), "PNG"), "image/png"),
                "corrupt.jpg": (b"garbage", "image/jpeg"),
            },
            "credentials": (USER, PASSWORD),
            "flaky_left": {},
            "hits": [],
        },
    )
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _assert_no_secret(*texts: object) -> None:
    for text in texts:
        assert PASSWORD not in str(text)


def test_http_requires_credentials(server) -> None:
    base, _ = server
    source = URLTemplateSource(base + "/files/{path}", retries=0)
    assert source.auth_origin == "no credentials"
    for call in (source.open_bytes, source.exists):
        with pytest.raises(ImageFetchError) as info:
            call(MIMIC)
        message = str(info.value)
        assert info.value.status == 401
        assert "credentials" in message and "MEDHEVAL_IMAGE_USERNAME" in message and "netrc" in message
        assert base + "/files/" + MIMIC in message  # names the URL


def test_http_wrong_password_never_leaks(server) -> None:
    base, _ = server
    wrong = PASSWORD + "-wrong"
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, wrong), retries=0)
    with pytest.raises(ImageFetchError) as info:
        source.open_bytes(MIMIC)
    assert "refused" in str(info.value) and "explicit auth" in str(info.value)
    for text in (info.value, repr(info.value), source.describe(), repr(source), info.value.url):
        assert wrong not in str(text)
    resolver = ImageResolver({"mimic_cxr": source})
    with pytest.raises(ImageFetchError) as info2:
        resolver.partition([record("m", "mimic_cxr", MIMIC)])
    assert wrong not in str(info2.value) and wrong not in repr(resolver)


def test_http_explicit_auth(server) -> None:
    base, handler = server
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD))
    assert source.exists(MIMIC) and source.exists(IU)
    assert not source.exists(IU.replace("3030", "9999"))
    assert Image.open(io.BytesIO(source.open_bytes(IU))).size == (8, 6)
    assert source.open_bytes("dir with space/img#1.png")[:4] == b"\x89PNG"
    assert ("HEAD", "/files/" + MIMIC) in handler.hits
    _assert_no_secret(source.describe(), repr(source))
    with pytest.raises(ImageNotFound) as info:
        source.open_bytes("synpic1.jpg")
    assert "synpic1.jpg" in str(info.value) and base in str(info.value)

    resolver = ImageResolver({"mimic_cxr": source, "iu_xray": source})
    assert resolver.open("mimic_cxr", MIMIC).getpixel((2, 2))[2] > 200
    with pytest.raises(ImageDecodeError, match="corrupt.jpg"):
        resolver.open("mimic_cxr", "corrupt.jpg")
    with pytest.raises(ImageNotFound) as info:
        resolver.open("mimic_cxr", MIMIC.replace("7d047120", "00000000"))
    assert "mimic_cxr" in str(info.value) and "physionet" in str(info.value).lower()
    _assert_no_secret(info.value, resolver.describe())


def test_http_credentials_in_url_are_stripped(server) -> None:
    base, _ = server
    spec = base.replace("http://", f"http://{USER}:{PASSWORD}@") + "/files/{path}"
    source = parse_image_root(spec)
    assert isinstance(source, URLTemplateSource)
    assert source.open_bytes(IU)[:4] == b"\x89PNG"
    _assert_no_secret(source.describe(), repr(source), source.template)
    with pytest.raises(ImageNotFound) as info:
        source.open_bytes("nope.png")
    _assert_no_secret(info.value)


def test_http_env_credentials(server, monkeypatch: pytest.MonkeyPatch) -> None:
    base, _ = server
    monkeypatch.setenv("MEDHEVAL_IMAGE_USERNAME", USER)
    monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", PASSWORD)
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", "127.0.0.1")  # the one host they belong to
    generic = URLTemplateSource(base + "/files/{path}")
    assert generic.auth_origin == "env MEDHEVAL_IMAGE_USERNAME/MEDHEVAL_IMAGE_PASSWORD"
    assert generic.open_bytes(MIMIC)[:2] == b"\xff\xd8"
    _assert_no_secret(generic.describe(), repr(generic))

    monkeypatch.setenv("TESTSRV_USERNAME", USER)
    monkeypatch.setenv("TESTSRV_PASSWORD", PASSWORD)
    monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", "not-the-password")
    prefixed = URLTemplateSource(base + "/files/{path}", env_prefix="TESTSRV")  # host prefix wins
    assert prefixed.auth_origin == "env TESTSRV_USERNAME/TESTSRV_PASSWORD"
    assert prefixed.exists(MIMIC)


def test_physionet_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHYSIONET_USERNAME", USER)
    monkeypatch.setenv("PHYSIONET_PASSWORD", PASSWORD)
    source = URLTemplateSource("https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}")
    assert source.auth_origin == "env PHYSIONET_USERNAME/PHYSIONET_PASSWORD"
    _assert_no_secret(source.describe(), repr(source))


def test_http_netrc_credentials(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, _ = server
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text(f"machine 127.0.0.1\n  login {USER}\n  password {PASSWORD}\n")
    netrc_file.chmod(0o600)
    source = URLTemplateSource(base + "/files/{path}", netrc_file=str(netrc_file))
    assert source.auth_origin.startswith("netrc")
    assert source.open_bytes(IU)[:4] == b"\x89PNG"
    _assert_no_secret(source.describe(), repr(source))

    home = Path(os.environ["HOME"])  # the isolated HOME: ~/.netrc is the default
    (home / ".netrc").write_text(netrc_file.read_text())
    (home / ".netrc").chmod(0o600)
    default = URLTemplateSource(base + "/files/{path}")
    assert default.exists(IU)

    with pytest.raises(ValueError, match="does not exist"):
        URLTemplateSource(base + "/files/{path}", netrc_file=str(tmp_path / "absent"))


def test_http_timeout(server) -> None:
    base, handler = server
    handler.sleep_s = 30.0  # far past the timeout, however slow the machine (daemon threads: no wait at teardown)
    source = URLTemplateSource(base + "/slow/{path}", auth=(USER, PASSWORD), timeout=0.3, retries=1, backoff=0.01)
    started = time.monotonic()
    with pytest.raises(ImageFetchError, match=r"timed out after 0\.3 s") as info:
        source.open_bytes(MIMIC)
    assert time.monotonic() - started < 15  # two attempts of 0.3 s (a margin for a loaded machine), not 30 s
    assert [path for _, path in handler.hits] == ["/slow/" + MIMIC] * 2  # the retry: one more attempt, no more
    assert info.value.status is None
    _assert_no_secret(info.value)


def test_http_retries_5xx_then_succeeds(server) -> None:
    base, handler = server
    handler.flaky_left["/flaky/" + IU] = 2
    source = URLTemplateSource(base + "/flaky/{path}", auth=(USER, PASSWORD), retries=2, backoff=0.01)
    assert source.open_bytes(IU)[:4] == b"\x89PNG"
    handler.flaky_left["/flaky/" + IU] = 5
    with pytest.raises(ImageFetchError) as info:
        source.open_bytes(IU)
    assert info.value.status == 503


def test_http_head_not_allowed_falls_back_to_get(server) -> None:
    base, handler = server
    source = URLTemplateSource(base + "/nohead/{path}", auth=(USER, PASSWORD))
    assert source.exists(IU)
    assert not source.exists("missing.png")
    assert ("GET", "/nohead/" + IU) in handler.hits


def test_http_login_page_is_not_an_image(server) -> None:
    base, _ = server
    source = URLTemplateSource(base + "/login/{path}")
    with pytest.raises(ImageFetchError, match="HTML page"):
        source.open_bytes(IU)


@pytest.mark.parametrize("ref", ["%2e%2e/%2e%2e/etc/passwd", "%2E%2E/x", "../x", "/etc/passwd", "https://evil/x", "a/%2e%2e/%2e%2e/x"])
def test_url_traversal_rejected(server, ref: str) -> None:
    base, handler = server
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD))
    with pytest.raises(UnsafeImagePath):
        source.url_for(ref)
    with pytest.raises(UnsafeImagePath):
        source.exists(ref)
    with pytest.raises(UnsafeImagePath):
        source.open_bytes(ref)
    assert handler.hits == []  # nothing was requested


def test_http_find_missing_uses_thread_pool(server) -> None:
    base, handler = server
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD))
    resolver = ImageResolver({"mimic_cxr": source})
    records = [record("m/ok", "mimic_cxr", MIMIC)] + [
        record(f"m/{i}", "mimic_cxr", MIMIC.replace("7d047120", f"{i:08x}")) for i in range(20)
    ]
    missing = resolver.find_missing(records, progress=False)
    assert [rid for rid, _ in missing] == [f"m/{i}" for i in range(20)]
    assert all(method == "HEAD" for method, _ in handler.hits)
    kept, skipped = resolver.partition(records, on_missing="skip", progress=False)
    assert [r["id"] for r in kept] == ["m/ok"] and len(skipped) == 20


def test_http_cache_dir(server, tmp_path: Path) -> None:
    base, handler = server
    cache = tmp_path / "cache"
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD), cache_dir=cache)
    first = source.open_bytes(IU)
    hits = len(handler.hits)
    assert source.open_bytes(IU) == first and source.exists(IU)
    assert len(handler.hits) == hits  # served from the cache
    assert list(cache.rglob("0.png"))
    assert URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD)).cache_dir is None  # off by default


def test_a_symbolic_link_planted_in_the_image_cache_is_neither_read_nor_written_through(server, tmp_path: Path) -> None:
    """Someone who can write into a shared image cache plants links: a cached "image" that is a link to a file
    outside the cache (read as the record's image, then sent to a model), and a cache sub-folder that is a link
    to another folder (a downloaded credentialed image written there). Both are refused naming the reference;
    nothing is read from or written outside the cache."""
    import hashlib
    import os

    from medheval.data.images import _redact_url

    base, handler = server
    cache = tmp_path / "cache"
    source = URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD), cache_dir=cache)
    folder = cache / hashlib.sha256(_redact_url(source.template).encode()).hexdigest()[:16]
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = outside / "not-this-image.png"
    Image.new("RGB", (3, 3), (0, 255, 0)).save(planted)
    linked = "CXR1_IM-0001/0.png"
    (folder / linked).parent.mkdir(parents=True)
    os.symlink(planted, folder / linked)  # a cached "image" that is a link to a file outside the cache
    with pytest.raises(UnsafeImagePath, match="outside the image cache"):
        source.open_bytes(linked)
    with pytest.raises(UnsafeImagePath, match="outside the image cache"):
        source.exists(linked)
    os.symlink(outside, folder / IU.split("/")[0])  # the reference's folder is a link to another folder
    with pytest.raises(UnsafeImagePath, match="outside the image cache"):
        source.open_bytes(IU)
    assert sorted(p.name for p in outside.iterdir()) == ["not-this-image.png"]  # nothing written there
    assert planted.read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- HF datasets


@pytest.fixture()
def hf_dataset():
    datasets = pytest.importorskip("datasets")
    ids = ["slake/xmlab1", "slake/xmlab2", "rad/synpic3"]
    images = [Image.new("RGB", (5, 4), (255, 0, 0)), Image.new("L", (6, 3), 128), Image.new("RGB", (2, 2), (0, 0, 9))]
    return datasets.Dataset.from_dict({"id": ids, "image": images}).cast_column("image", datasets.Image())


def test_hf_dataset_source(hf_dataset) -> None:
    source = HFDatasetSource(hf_dataset)
    assert isinstance(source, ImageSource)
    assert source.exists("slake/xmlab2") and not source.exists("slake/xmlab9")
    assert Image.open(io.BytesIO(source.open_bytes("slake/xmlab1"))).size == (5, 4)
    with pytest.raises(ImageNotFound, match="slake/xmlab9"):
        source.open_bytes("slake/xmlab9")

    resolver = ImageResolver({"*": source})
    image = resolver.open("slake", "slake/xmlab2")
    assert image.mode == "RGB" and image.size == (6, 3) and image.getpixel((0, 0)) == (128, 128, 128)
    records = [record("a", "slake", "slake/xmlab1"), record("b", "vqa_rad", "rad/synpic3", "rad/synpic4")]
    kept, skipped = resolver.partition(records, on_missing="skip", progress=False)
    assert [r["id"] for r in kept] == ["a"] and skipped == [("b", "rad/synpic4")]


def test_hf_dataset_source_columns_and_paths(hf_dataset, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    renamed = hf_dataset.rename_columns({"id": "uid", "image": "img"})
    source = HFDatasetSource(renamed, id_column="uid", image_column="img")
    assert source.exists("rad/synpic3")
    with pytest.raises(ValueError, match="id_column"):
        HFDatasetSource(renamed).exists("rad/synpic3")

    # images stored as file paths (Image(decode=False) storage with path, no bytes)
    path = tmp_path / "synpic5.jpg"
    path.write_bytes(encode((1, 2, 3), "JPEG"))
    by_path = datasets.Dataset.from_dict({"id": ["synpic5"], "image": [str(path)]}).cast_column("image", datasets.Image())
    assert HFDatasetSource(by_path).open_bytes("synpic5") == path.read_bytes()

    # a save_to_disk folder, loaded lazily from an hf:// spec
    saved = tmp_path / "saved"
    renamed.save_to_disk(str(saved))
    lazy = parse_image_root(f"hf://{saved}#id_column=uid,image_column=img")
    assert isinstance(lazy, HFDatasetSource) and str(saved) in lazy.describe()
    assert ImageResolver({"slake": lazy}).open("slake", "slake/xmlab1").size == (5, 4)

    duplicated = datasets.Dataset.from_dict({"id": ["x", "x"], "image": [str(path), str(path)]})
    with pytest.raises(ValueError, match="duplicate"):
        HFDatasetSource(duplicated).exists("x")


def test_a_dataset_named_by_a_spec_reads_stored_paths_only_inside_its_own_files(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile dataset chooses the path a row stores: a local MIMIC image under a "slake" id, or ~/.netrc.
    From a spec (a folder or a Hub id) a path is read only inside the dataset's own files."""
    datasets = pytest.importorskip("datasets")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    outside = tmp_path / "private" / "mimic.jpg"
    outside.parent.mkdir()
    outside.write_bytes(encode((9, 9, 9), "JPEG"))
    hostile = tmp_path / "hostile"
    datasets.Dataset.from_dict({"id": ["xmlab9/source.jpg"], "image": [str(outside)]}).save_to_disk(str(hostile))
    with pytest.raises(UnsafeImagePath, match=r"row 0 stores the file path .*mimic\.jpg.*outside the dataset's own files"):
        ImageResolver({"slake": f"hf://{hostile}"}).open_bytes("slake", "xmlab9/source.jpg")

    own = tmp_path / "own"
    (own / "files").mkdir(parents=True)
    (own / "files" / "a.jpg").write_bytes(encode((1, 1, 1), "JPEG"))
    datasets.Dataset.from_dict({"id": ["a"], "image": [str(own / "files" / "a.jpg")]}).save_to_disk(str(own))
    assert ImageResolver({"slake": f"hf://{own}"}).open_bytes("slake", "a") == (own / "files" / "a.jpg").read_bytes()

    # a Hub id: its rows may point into its own repo in the Hub cache, nowhere else
    hub_cache = tmp_path / "hf" / "hub"
    mine = hub_cache / "datasets--someone--slake-images" / "snapshots" / "abc" / "b.jpg"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(encode((2, 2, 2), "JPEG"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    rows = {"id": ["b", "c"], "image": [str(mine), str(outside)]}
    monkeypatch.setattr(datasets, "load_dataset", lambda spec, split: datasets.Dataset.from_dict(rows))
    hub = ImageResolver({"slake": "hf://someone/slake-images"})
    assert hub.open_bytes("slake", "b") == mine.read_bytes()
    with pytest.raises(UnsafeImagePath, match="row 1 stores the file path"):
        hub.open_bytes("slake", "c")
    # a Dataset object passed in Python is the caller's own: read wherever it points
    assert HFDatasetSource(datasets.Dataset.from_dict(rows)).open_bytes("c") == outside.read_bytes()


@pytest.mark.parametrize("victim", ["hub/models--victim--private/snapshots/abc/secret.jpg",
                                    "hub/datasets--victim--gated/snapshots/abc/secret.jpg",
                                    "datasets/victim___gated/default/0.0.0/abc/secret.jpg",
                                    "datasets/downloads/extracted/0123abcd/secret.jpg"])
@pytest.mark.parametrize("spec", ["folder", "hub id"])
@pytest.mark.parametrize("stored", ["image struct", "string column"])
def test_a_dataset_never_reads_another_cached_repos_files(victim: str, spec: str, stored: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile dataset's row points at a file of another repo in the Hugging Face caches (a private model, a
    gated dataset, someone else's extracted archive): refused, whether the dataset is a folder or a Hub id."""
    datasets = pytest.importorskip("datasets")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    home = tmp_path / "hf"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    secret = home / victim
    secret.parent.mkdir(parents=True)
    secret.write_bytes(encode((7, 7, 7), "JPEG"))
    if stored == "string column":
        hostile = datasets.Dataset.from_dict({"id": ["x"], "image": [str(secret)]})
    else:  # an Image cell's storage, {bytes, path}, with no bytes (save_to_disk would embed an Image's file)
        hostile = datasets.Dataset.from_dict(
            {"id": ["x"], "image": [{"bytes": None, "path": str(secret)}]},
            features=datasets.Features({"id": datasets.Value("string"),
                                        "image": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}}))
    if spec == "folder":
        hostile.save_to_disk(str(tmp_path / "hostile"))
        root = f"hf://{tmp_path / 'hostile'}"
    else:
        monkeypatch.setattr(datasets, "load_dataset", lambda spec, split: hostile)
        root = "hf://attacker/images"
    with pytest.raises(UnsafeImagePath, match=r"row 0 stores the file path .*secret\.jpg"):
        parse_image_root(root).open_bytes("x")


def test_a_hub_dataset_reads_the_files_of_its_own_extracted_archives(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive in the dataset's own repo is extracted by ``datasets`` to a hashed folder of the downloads
    cache: its rows may point there, and not into another archive's folder."""
    datasets = pytest.importorskip("datasets")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    import zipfile

    from datasets.utils.extract import ExtractManager

    home = tmp_path / "hf"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    extracted = {}
    for repo in ("datasets--someone--slake-images", "datasets--victim--gated"):
        archive = home / "hub" / repo / "snapshots" / "abc" / "images.zip"
        archive.parent.mkdir(parents=True)
        with zipfile.ZipFile(archive, "w") as zipped:
            zipped.writestr("a.jpg", encode((3, 3, 3), "JPEG"))
        extracted[repo] = Path(ExtractManager(cache_dir=str(home / "datasets" / "downloads")).extract(str(archive)))
    own, other = (extracted[repo] / "a.jpg" for repo in ("datasets--someone--slake-images", "datasets--victim--gated"))
    rows = {"id": ["own", "other"], "image": [str(own), str(other)]}
    monkeypatch.setattr(datasets, "load_dataset", lambda spec, split: datasets.Dataset.from_dict(rows))
    source = parse_image_root("hf://someone/slake-images")
    assert source.open_bytes("own") == own.read_bytes()
    with pytest.raises(UnsafeImagePath, match="row 1 stores the file path"):
        source.open_bytes("other")


def test_an_image_declaring_a_huge_canvas_is_refused_before_it_is_decoded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A decompression bomb: a few KB of PNG that decode to gigabytes. The canvas is checked from the header."""
    from medheval.data.images import check_pixels

    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "big.png").write_bytes(encode((0, 0, 0), "PNG", size=(300, 200)))
    (folder / "small.png").write_bytes(encode((0, 0, 0), "PNG", size=(100, 100)))
    monkeypatch.setenv("MEDHEVAL_IMAGE_MAX_PIXELS", "10000")
    resolver = ImageResolver({"vqa_rad": str(folder)})
    assert resolver.open("vqa_rad", "small.png").size == (100, 100)  # exactly at the cap
    with pytest.raises(ImageDecodeError, match=r"declares 300x200 = 60,000 pixels, over the cap of 10,000.*"
                                               r"MEDHEVAL_IMAGE_MAX_PIXELS"):
        resolver.open("vqa_rad", "big.png")
    with Image.open(folder / "big.png") as opened:  # the judge's media and report thumbnails use the same check
        with pytest.raises(ImageDecodeError, match="my image"):
            check_pixels(opened, "my image")
    monkeypatch.setenv("MEDHEVAL_IMAGE_MAX_PIXELS", "0")
    with pytest.raises(ValueError, match="MEDHEVAL_IMAGE_MAX_PIXELS"):
        resolver.open("vqa_rad", "small.png")


@pytest.mark.parametrize("host, prefix", [
    ("physionet.org", "PHYSIONET"), ("www.physionet.org", "PHYSIONET"), ("mirror.physionet.org", "PHYSIONET"),
    ("physionet.io", "PHYSIONET_IO"), ("physionet.net", "PHYSIONET_NET"),
    ("physionet.org.example.com", "PHYSIONET_ORG_EXAMPLE_COM"), ("images.example.com", "IMAGES_EXAMPLE_COM"),
    ("127.0.0.1", None), ("[::1]", None),
])
def test_credentials_from_the_environment_go_to_their_own_host_only(host: str, prefix: str | None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``PHYSIONET_PASSWORD`` was sent to any host whose second-to-last label was "physionet"."""
    monkeypatch.setenv("PHYSIONET_USERNAME", USER)
    monkeypatch.setenv("PHYSIONET_PASSWORD", PASSWORD)
    source = URLTemplateSource(f"https://{host}/files/{{path}}")
    assert source.env_prefix == prefix
    sent = source.auth_origin == "env PHYSIONET_USERNAME/PHYSIONET_PASSWORD"
    assert sent == (prefix == "PHYSIONET")


def test_an_overlong_path_component_is_an_unsafe_reference_naming_the_record(tmp_path: Path) -> None:
    """A name over 255 bytes raised the OS's raw ENAMETOOLONG, which stopped a run even with --on-missing skip:
    it is now refused as an unsafe reference (the error names the record), and a path the OS cannot look up
    for another reason (too long in all) counts as missing."""
    from medheval.data.images import MAX_COMPONENT_BYTES, check_reference

    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "ok.png").write_bytes(encode((1, 2, 3), "PNG"))
    resolver = ImageResolver({"slake": str(folder)})
    long_name = "a" * 300 + ".jpg"
    assert MAX_COMPONENT_BYTES == 255
    assert not check_reference("other", long_name) and not check_reference("other", "d/" + "é" * 128 + "/x.jpg")
    assert check_reference("other", "d/" + "a" * 255)
    with pytest.raises(UnsafeImagePath, match=r"record 'slake/1': unsafe image reference .*longer than 255 bytes"):
        resolver.partition([{"id": "slake/1", "source": "slake", "images": [long_name]}], "skip", progress=False)
    with pytest.raises(UnsafeImagePath, match=r"record 'slake/1': .*longer than 255 bytes"):
        resolver.load_record_images({"id": "slake/1", "source": "slake", "images": [long_name]})
    # every component short, the whole path past PATH_MAX: missing, so --on-missing skip skips it
    too_deep = "/".join(["b" * 250] * 20) + ".png"
    kept, skipped = resolver.partition([{"id": "slake/2", "source": "slake", "images": [too_deep]},
                                        {"id": "slake/3", "source": "slake", "images": ["ok.png"]}], "skip",
                                       progress=False)
    assert [r["id"] for r in kept] == ["slake/3"] and skipped == [("slake/2", too_deep)]
    with pytest.raises(ImageNotFound, match=r"record 'slake/2': image .* not found.*cannot be read here"):
        resolver.load_record_images({"id": "slake/2", "source": "slake", "images": [too_deep]})


@pytest.mark.parametrize("fmt", ["EPS", "ICO", "PPM"])
def test_an_image_in_a_format_outside_the_allow_list_is_refused_before_any_plugin_parses_it(
        fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every PIL plugin was reachable from an image a dataset or server chose (an EPS runs Ghostscript): only
    IMAGE_FORMATS open, in the resolver, its up-front header check, report thumbnails and judge images."""
    from PIL import EpsImagePlugin

    from medheval.data.images import IMAGE_FORMATS
    from medheval.judges.media import to_judge_image
    from medheval.report.html import _thumbnail

    assert set(IMAGE_FORMATS) >= {"JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP"} and fmt not in IMAGE_FORMATS
    ghostscript: list[object] = []
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *args, **kwargs: ghostscript.append(args))
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "x.png").write_bytes(encode((5, 6, 7), fmt, size=(16, 16)))  # named like a PNG
    resolver = ImageResolver({"slake": str(folder)})
    with pytest.raises(ImageDecodeError, match=r"record 'slake/1': image 'x.png' .*not an image in an allowed format "
                                               r"\(JPEG, .*\).*EPS"):
        resolver.load_record_images(record("slake/1", "slake", "x.png"))
    check = resolver.check_records([record("slake/1", "slake", "x.png")], "skip", progress=False)
    assert not check.kept and "allowed format" in check.undecodable[0][2]
    assert _thumbnail({"images": ["x.png"], "source": "slake"}, {"slake": str(folder)}) is None
    with pytest.raises(ValueError, match="allowed format"):
        to_judge_image((folder / "x.png").read_bytes())
    assert ghostscript == []


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP"])
def test_every_allowed_format_decodes(fmt: str, tmp_path: Path) -> None:
    (tmp_path / "x.img").write_bytes(encode((5, 6, 7), fmt, size=(16, 16)))
    image = ImageResolver({"slake": str(tmp_path)}).open("slake", "x.img")
    assert image.size == (16, 16) and image.mode == "RGB"


# --------------------------------------------------------------------------- checks on the resolver's threads


def _check_folder(folder: Path) -> list[dict]:
    """A folder with one file of each kind and records over it (the known answers: test below)."""
    folder.mkdir()
    png = encode((1, 2, 3), "PNG")
    (folder / "good.png").write_bytes(png)
    (folder / "good.jpg").write_bytes(encode((1, 2, 3), "JPEG"))
    (folder / "text.png").write_bytes(b"not an image")
    (folder / "empty.png").write_bytes(b"")
    (folder / "header_cut.png").write_bytes(png[:20])  # signature + part of IHDR
    (folder / "body_cut.png").write_bytes(png[:50])  # IHDR whole, IDAT cut: caught only when decoded
    (folder / "big.png").write_bytes(encode((0, 0, 0), "PNG", size=(300, 200)))
    (folder / "dir.png").mkdir()
    return [
        record("r1", "slake", "good.png"), record("r2", "slake", "text.png"), record("r3", "slake", "absent.png"),
        record("r4", "slake", "big.png", "good.png"), record("r5", "slake", "header_cut.png"),
        record("r6", "slake", "body_cut.png"), record("r7", "slake", "good.png", "absent.png"),
        record("r8", "slake", "good.jpg"), record("r9", "slake", "empty.png"), record("r10", "slake", "dir.png"),
        record("r11", "vqa_rad", "x.jpg"),  # no root for vqa_rad
    ]


@pytest.mark.parametrize("workers, pool_min, pooled", [(1, 0, False), (4, 0, True), (4, 9, True), (4, 10, False)])
def test_the_up_front_check_gives_each_file_its_known_answer_inline_or_on_threads(
        workers: int, pool_min: int, pooled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import medheval.data.images as images

    records = _check_folder(tmp_path / "imgs")
    monkeypatch.setenv("MEDHEVAL_IMAGE_MAX_PIXELS", "10000")
    monkeypatch.setattr(images, "POOL_MIN_LOCAL", pool_min)
    threads: set[str] = set()
    header_problem = images._header_problem
    monkeypatch.setattr(images, "_header_problem",
                        lambda root, ref: threads.add(threading.current_thread().name) or header_problem(root, ref))
    resolver = ImageResolver({"slake": str(tmp_path / "imgs")}, workers=workers)
    check = resolver.check_records(records, on_missing="skip", progress=False)
    main = threading.current_thread().name
    assert (threads != {main}) is pooled and main in threads  # 9 files to check; the first always inline
    assert [r["id"] for r in check.kept] == ["r1", "r6", "r8"]
    assert check.missing == [("r3", "absent.png"), ("r7", "absent.png"), ("r10", "dir.png"), ("r11", "x.jpg")]
    assert [u[:2] for u in check.undecodable] == [("r2", "text.png"), ("r4", "big.png"),
                                                 ("r5", "header_cut.png"), ("r9", "empty.png")]
    reasons = [u[2] for u in check.undecodable]
    assert "'text.png' is not an image in an allowed format" in reasons[0]
    assert "declares 300x200 = 60,000 pixels, over the cap of 10,000" in reasons[1]
    assert reasons[2] == "OSError: Truncated File Read" and "not an image" in reasons[3]
    with pytest.raises(MissingImagesError) as info:
        resolver.check_records(records, progress=False)
    assert info.value.missing == check.missing and info.value.undecodable == check.undecodable
    assert info.value.unconfigured == ["vqa_rad"]
    threads.clear()
    assert resolver.find_missing(records, progress=False) == check.missing and not threads  # no header read
    with pytest.raises(ImageDecodeError, match="body_cut.png"):  # passed the header check, fails when decoded
        resolver.open("slake", "body_cut.png")


def test_pooled_results_keep_record_order_whatever_order_the_checks_finish_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import medheval.data.images as images

    folder = tmp_path / "imgs"
    folder.mkdir()
    names = [f"{i:02d}.png" for i in range(24)]
    for i, name in enumerate(names):
        if i % 3:  # every third absent, every fourth not an image
            (folder / name).write_bytes(b"junk" if i % 4 == 0 else encode((i, i, i), "PNG"))
    order = names[::2] + names[1::2]  # records not in file-name order
    finished: list[str] = []
    header_problem = images._header_problem

    def slow_first(root: ImageSource, ref: str) -> str | None:
        time.sleep(0.002 * (24 - int(ref[:2])))  # the first-submitted check ends last
        finished.append(ref)
        return header_problem(root, ref)

    monkeypatch.setattr(images, "_header_problem", slow_first)
    monkeypatch.setattr(images, "POOL_MIN_LOCAL", 0)
    records = [record(f"id-{name}", "slake", name) for name in order]
    pooled = ImageResolver({"slake": str(folder)}, workers=8).check_records(records, "skip", progress=False)
    assert sorted(finished) == sorted(n for n in order if int(n[:2]) % 3)  # each existing file once ...
    assert finished != [n for n in order if int(n[:2]) % 3]  # ... finishing out of record order
    monkeypatch.setattr(images, "_header_problem", header_problem)
    serial = ImageResolver({"slake": str(folder)}, workers=1).check_records(records, "skip", progress=False)
    assert pooled == serial
    expect_missing = [n for n in order if int(n[:2]) % 3 == 0]
    expect_broken = [n for n in order if int(n[:2]) % 3 and int(n[:2]) % 4 == 0]
    assert pooled.missing == [(f"id-{n}", n) for n in expect_missing]
    assert [u[:2] for u in pooled.undecodable] == [(f"id-{n}", n) for n in expect_broken]
    assert [r["id"] for r in pooled.kept] == [f"id-{n}" for n in order if n not in expect_missing + expect_broken]


def pool_threads() -> int:
    """The threads a thread pool runs (named ``ThreadPoolExecutor-…``); other libraries' daemons (tqdm's
    monitor) are not counted."""
    return sum(thread.name.startswith("ThreadPoolExecutor") for thread in threading.enumerate())


def test_a_check_that_raises_on_a_thread_raises_the_first_in_record_order_and_leaves_no_thread_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import medheval.data.images as images

    folder, outside = tmp_path / "imgs", tmp_path / "elsewhere.png"
    folder.mkdir()
    outside.write_bytes(encode((1, 1, 1), "PNG"))
    names = [f"{i:03d}.png" for i in range(200)]
    for name in names:
        (folder / name).write_bytes(encode((1, 1, 1), "PNG"))
    for name in ("005.png", "002.png"):
        (folder / name).unlink()
        (folder / name).symlink_to(outside)  # resolves outside the root: UnsafeImagePath
    exists = LocalFolderSource.exists
    calls: list[str] = []
    threads: set[str] = set()

    def slow_exists(self: LocalFolderSource, ref: str) -> bool:
        calls.append(ref)
        threads.add(threading.current_thread().name)
        time.sleep(0.05 if ref == "005.png" else 0.005)  # the second unsafe file raises first
        return exists(self, ref)

    monkeypatch.setattr(LocalFolderSource, "exists", slow_exists)
    monkeypatch.setattr(images, "POOL_MIN_LOCAL", 0)
    first = ["010.png", "005.png"]  # 010 is checked inline, then r005 is the first unsafe one in record order
    records = [record(f"r{name[:3]}", "slake", name) for name in first + [n for n in names if n not in first]]
    before = pool_threads()
    with pytest.raises(UnsafeImagePath, match=r"^record 'r005': .*005.png") as info:
        ImageResolver({"slake": str(folder)}, workers=2).check_records(records, "skip", progress=False)
    assert info.value.record_ids == ["r005"]
    assert pool_threads() == before  # the pool is shut down, no check left running
    assert len(calls) < 200 and len(threads) > 1  # on threads; those not yet begun were cancelled

    header_problem = images._header_problem

    def broken(root: ImageSource, ref: str) -> str | None:
        if ref in ("100.png", "150.png"):
            raise RuntimeError(f"bug reading {ref}")
        return header_problem(root, ref)

    monkeypatch.setattr(LocalFolderSource, "exists", exists)
    monkeypatch.setattr(images, "_header_problem", broken)
    safe = [r for r in records if r["id"] not in ("r002", "r005")]
    with pytest.raises(RuntimeError, match="bug reading 100.png"):  # an unexpected error is not swallowed
        ImageResolver({"slake": str(folder)}, workers=2).check_records(safe, "skip", progress=False)
    assert pool_threads() == before


def test_local_and_remote_images_are_checked_together_in_record_order(server, tmp_path: Path) -> None:
    base, handler = server
    (tmp_path / "ok.png").write_bytes(encode((1, 2, 3), "PNG"))
    (tmp_path / "bad.png").write_bytes(b"junk")
    resolver = ImageResolver({"slake": str(tmp_path),
                              "mimic_cxr": URLTemplateSource(base + "/files/{path}", auth=(USER, PASSWORD))})
    gone = MIMIC.replace("7d047120", "00000000")
    records = [record("m1", "mimic_cxr", gone), record("s1", "slake", "bad.png"), record("m2", "mimic_cxr", MIMIC),
               record("s2", "slake", "gone.png"), record("s3", "slake", "ok.png"), record("m3", "mimic_cxr", gone)]
    check = resolver.check_records(records, "skip", progress=False)
    assert check.missing == [("m1", gone), ("s2", "gone.png"), ("m3", gone)]
    assert [u[:2] for u in check.undecodable] == [("s1", "bad.png")]  # a remote header is read only when fetched
    assert [r["id"] for r in check.kept] == ["m2", "s3"]
    assert sorted(path for _, path in handler.hits) == sorted({f"/files/{gone}", f"/files/{MIMIC}"})  # one each


def test_a_root_that_cannot_open_is_tried_once_not_once_per_thread(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import medheval.data.images as images
    from medheval.data.images import ImageRootUnavailable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(images, "POOL_MIN_LOCAL", 0)
    loads: list[str] = []
    load = HFDatasetSource._load

    def counted(self: HFDatasetSource) -> object:
        loads.append(threading.current_thread().name)
        time.sleep(0.01)  # the other threads would queue on the source's lock meanwhile
        return load(self)

    monkeypatch.setattr(HFDatasetSource, "_load", counted)
    resolver = ImageResolver({"slake": f"hf://{tmp_path / 'absent'}"}, workers=4)
    with pytest.raises(ImageRootUnavailable, match="cannot open the dataset"):
        resolver.check_records([record(f"r{i}", "slake", f"{i}.png") for i in range(20)], progress=False)
    assert loads == [threading.current_thread().name]

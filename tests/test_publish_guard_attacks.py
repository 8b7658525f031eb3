"""Issue 31, class 3: the push guard allows; it does not block.

A gated (MIMIC-derived) repo folder may receive only what the exporter wrote and recorded in
``publish.json``. Each case below is an attacker's edit of an exported ``cxr_vishal`` folder (and, where
it helps them, of ``publish.json`` too) followed by ``hub.push(hub.read_manifest(out))`` against a Hub on
127.0.0.1: the push must stop before the first request, naming the file, and the Hub must receive nothing.
A clean export pushed the same way lands (the control that shows the push would upload)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_server import OWNER_TOKEN, HubServer, loopback_hub  # noqa: F401 - loopback_hub is a fixture

from medheval.data.credentialed import CredentialedImageError
from medheval.publish import hub

TOKEN = OWNER_TOKEN
PARQUET = "mimic_cxr/test-00000-of-00001.parquet"


@pytest.fixture(scope="module")
def export(tmp_path_factory, fixture_benchmark, dataset_cache) -> Path:
    out = tmp_path_factory.mktemp("guard")
    hub.export_all(out, kinds=["datasets"], names=["cxr_vishal", "mm_vishal"], data_dir=fixture_benchmark["data_dir"],
                   cache_dir=dataset_cache)
    return out


def _jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.RandomState(1).randint(0, 255, (48, 48), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _pixels() -> np.ndarray:
    return np.random.RandomState(2).randint(0, 255, (32, 32), dtype=np.uint8)


def _manifest(out: Path) -> list[dict]:
    return json.loads((out / "publish.json").read_text())


def _record(out: Path, relpath: str | None = None, **changes) -> None:
    """What an attacker who also edits publish.json does: record ``relpath`` with its new sha256."""
    entries = _manifest(out)
    for entry in entries:
        if entry["repo_id"] != "medheval/cxr_vishal":
            continue
        if relpath:
            entry["files"][relpath] = hashlib.sha256((Path(entry["folder"]) / relpath).read_bytes()).hexdigest()
        entry.update(changes)
    (out / "publish.json").write_text(json.dumps(entries))


def _wrapped_base64(folder: Path) -> str:
    (folder / "mimic_cxr" / "notes.txt").write_text(base64.encodebytes(_jpeg()).decode())  # 76-char lines
    return "mimic_cxr/notes.txt"


def _pixel_parquet(folder: Path) -> str:
    pq.write_table(pa.table({"id": ["p10/s1"], "pixels": [_pixels().ravel().tolist()]}),
                   folder / "mimic_cxr" / "extra-00000.parquet")
    return "mimic_cxr/extra-00000.parquet"


def _pgm(folder: Path) -> str:
    rows = "\n".join(" ".join(map(str, row)) for row in _pixels())
    (folder / "mimic_cxr" / "view.pgm.txt").write_text(f"P2\n32 32\n255\n{rows}\n")
    return "mimic_cxr/view.pgm.txt"


def _base85(folder: Path) -> str:
    (folder / "eval_notes.md").write_text(base64.b85encode(_jpeg()).decode())
    return "eval_notes.md"


def _hexdump(folder: Path) -> str:
    data = _jpeg()
    lines = [f"{offset:08x}: {binascii.hexlify(data[offset:offset + 16], ' ').decode()}"
             for offset in range(0, len(data), 16)]
    (folder / "iu_xray" / "dump.txt").write_text("\n".join(lines))
    return "iu_xray/dump.txt"


def _renamed(folder: Path) -> str:
    (folder / PARQUET).rename(folder / "mimic_cxr" / "train.parquet")
    return "mimic_cxr/train.parquet"


def _added_and_recorded(folder: Path) -> str:
    name = _wrapped_base64(folder)
    _record(folder.parent.parent, name)  # the manifest lists it too: not a file the exporter writes
    return name


def _card_edited(folder: Path) -> str:
    with open(folder / "README.md", "a") as card:
        card.write("\n<!-- " + base64.encodebytes(_jpeg()).decode() + " -->\n")
    return "README.md"


def _parquet_with_pixel_column(folder: Path) -> str:
    table = pq.read_table(folder / PARQUET)
    pixels = pa.array([_pixels().ravel().tolist()] * table.num_rows, type=pa.list_(pa.int64()))
    pq.write_table(table.append_column("pixels", pixels), folder / PARQUET)
    _record(folder.parent.parent, PARQUET)  # sha256 recomputed in publish.json: the schema still gives it away
    return PARQUET


def _parquet_with_pixels_as_references(folder: Path) -> str:
    table = pq.read_table(folder / PARQUET)
    ints = pa.array([_pixels().ravel().tolist()] * table.num_rows, type=pa.list_(pa.int64()))
    table = table.set_column(table.schema.get_field_index("images"), "images", ints)
    pq.write_table(table, folder / PARQUET)
    _record(folder.parent.parent, PARQUET)
    return PARQUET


def _parquet_metadata(folder: Path) -> str:
    table = pq.read_table(folder / PARQUET)
    metadata = {**table.schema.metadata, b"scan": base64.b64encode(_jpeg())}
    pq.write_table(table.replace_schema_metadata(metadata), folder / PARQUET)
    _record(folder.parent.parent, PARQUET)
    return PARQUET


def _ungated_in_manifest(folder: Path) -> str:
    name = _pgm(folder)
    _record(folder.parent.parent, gated=False, files={})  # "not gated, nothing recorded": the content says MIMIC
    return "holds MIMIC-derived data"


def _symlink(folder: Path) -> str:
    jpeg = folder.parent.parent.parent / "p10_s1.jpg"
    jpeg.write_bytes(_jpeg())
    (folder / "mimic_cxr" / "view").symlink_to(jpeg)
    return "mimic_cxr/view"


def _linked_folder(folder: Path) -> str:
    elsewhere = folder.parent.parent.parent / "mimic-cxr-jpg"
    elsewhere.mkdir()
    (elsewhere / "view.jpg").write_bytes(_jpeg())
    (folder / "images").symlink_to(elsewhere, target_is_directory=True)
    return "images"


ATTACKS: dict[str, Callable[[Path], str]] = {
    "line-wrapped base64 of a JPEG": _wrapped_base64,
    "Parquet column of pixel lists": _pixel_parquet,
    "plain-text PGM": _pgm,
    "base85 text": _base85,
    "hex dump": _hexdump,
    "renamed Parquet": _renamed,
    "added file, recorded in publish.json": _added_and_recorded,
    "card edited after export": _card_edited,
    "extra numeric-list column, sha256 re-recorded": _parquet_with_pixel_column,
    "images column turned into pixels, sha256 re-recorded": _parquet_with_pixels_as_references,
    "base64 in Parquet metadata, sha256 re-recorded": _parquet_metadata,
    "publish.json says not gated": _ungated_in_manifest,
    "symbolic link to a JPEG": _symlink,
    "symbolic link to an image folder": _linked_folder,
}


def _copy(export: Path, out: Path) -> None:
    shutil.copytree(export, out, symlinks=True)
    entries = _manifest(out)
    for entry in entries:  # the copy's folders
        entry["folder"] = str(out / Path(entry["folder"]).relative_to(export))
    (out / "publish.json").write_text(json.dumps(entries))


def _ungated_card_edited(folder: Path) -> str:
    with open(folder.parent / "mm_vishal" / "README.md", "a") as card:
        card.write("\nedited after export\n")
    return "README.md changed after export"


def _half_written(folder: Path) -> str:
    (folder.parent / "mm_vishal" / "eval.yaml").unlink()  # what a publish killed mid-export used to leave
    return "eval.yaml listed in publish.json but missing"


ATTACKS.update({"non-gated repo: card edited after export": _ungated_card_edited,
                "non-gated repo: half-written folder": _half_written})


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_gated_repo_receives_only_what_the_exporter_wrote(export, tmp_path, loopback_hub, attack):
    out = tmp_path / "out"
    _copy(export, out)
    named = ATTACKS[attack](out / "datasets" / "cxr_vishal")
    with pytest.raises((CredentialedImageError, hub.PublishError), match=f"_vishal: .*{named}|{named}.*"):
        hub.push(hub.read_manifest(out), token=TOKEN)
    assert loopback_hub.repos == {} and loopback_hub.lfs_objects == {}
    assert not [request for request in loopback_hub.requests if request[0] in ("POST", "PUT")]


def test_a_manifest_cannot_point_the_upload_elsewhere(export, tmp_path, loopback_hub):
    out = tmp_path / "out"
    shutil.copytree(export, out)
    elsewhere = tmp_path / "physionet" / "mimic-cxr-jpg"
    elsewhere.mkdir(parents=True)
    (elsewhere / "view.jpg").write_bytes(_jpeg())
    entries = _manifest(out)
    entries[0].update(folder=str(elsewhere), gated=False, files={"view.jpg": "0" * 64})
    (out / "publish.json").write_text(json.dumps(entries))
    with pytest.raises(hub.PublishError, match="would land outside"):
        hub.push(hub.read_manifest(out), token=TOKEN)
    assert loopback_hub.requests == []


def test_a_clean_export_is_pushed_with_exactly_its_recorded_files(export, tmp_path, loopback_hub):
    """The control: the same push of an untouched export reaches the Hub, gated, with the recorded files only."""
    out = tmp_path / "out"
    _copy(export, out)
    repo, plain = hub.read_manifest(out)
    assert repo.repo_id == "medheval/cxr_vishal" and not plain.gated and plain.files
    assert repo.gated and set(repo.files) == {"README.md", "eval.yaml", "all/test-00000-of-00001.parquet",
                                              "iu_xray/test-00000-of-00001.parquet", PARQUET}
    hub.push([repo, plain], token=TOKEN)
    pushed = loopback_hub.repos[("dataset", "medheval/cxr_vishal")]
    files = {path: data for path, data in pushed.files.items() if path != ".gitattributes"}  # the Hub's own
    assert pushed.gated == "manual"
    assert {path: hashlib.sha256(data).hexdigest() for path, data in files.items()} == repo.files
    assert loopback_hub.repos[("dataset", "medheval/mm_vishal")].gated in (False, None)


def test_a_file_swapped_after_the_checks_never_reaches_the_hub(export, tmp_path, loopback_hub, monkeypatch):
    """The race: the checks read the exported Parquet, then an attacker swaps in pixels before the upload."""
    out = tmp_path / "out"
    _copy(export, out)
    checks = hub.check_no_credentialed_bytes

    def check_then_swap(repo):
        checks(repo)
        if repo.repo_id == "medheval/cxr_vishal":
            _parquet_with_pixel_column(Path(repo.folder))

    monkeypatch.setattr(hub, "check_no_credentialed_bytes", check_then_swap)
    with pytest.raises(CredentialedImageError, match=f"cxr_vishal: {PARQUET} changed during the push"):
        hub.push(hub.read_manifest(out), token=TOKEN)
    assert loopback_hub.repos == {} and loopback_hub.lfs_objects == {}

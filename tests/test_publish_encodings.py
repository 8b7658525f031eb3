"""The push guard reads pixels in any spelling: each case hides a small JPEG (made here by PIL, never real
data) in a results folder as an audit found it slipping through (wrapped, URL-safe, slash-escaped or split
base64, bytes as numbers, an ASCII PGM, a Parquet list of integers); :func:`hub.check_no_credentialed_bytes`
must refuse each one, naming the file. Ordinary text with long words, ids, hashes and short number lists
still passes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medheval.data.credentialed import CredentialedImageError
from medheval.publish import content_scan, hub


def _jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


JPEG = _jpeg()
B64 = base64.b64encode(JPEG).decode()


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _pixels() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 255, (48, 48))


HOSTILE: dict[str, Callable[[], bytes]] = {
    "wrapped.yaml": lambda: ("- value: 1\n  notes: |\n" + "".join(f"    {line}\n" for line in
                                                                base64.encodebytes(JPEG).decode().splitlines())).encode(),
    "wrapped_escaped.json": lambda: json.dumps({"notes": base64.encodebytes(JPEG).decode()}).encode(),
    "urlsafe.json": lambda: json.dumps({"img": base64.urlsafe_b64encode(JPEG).decode()}).encode(),
    "slash_escaped.json": lambda: json.dumps({"img": "data:image/jpeg;base64," + B64}).replace("/", "\\/").encode(),
    "slash_escaped_no_url.json": lambda: json.dumps({"img": B64}).replace("/", "\\/").encode(),
    "chunked.json": lambda: json.dumps([B64[i : i + 1000] for i in range(0, len(B64), 1000)]).encode(),
    "chunked_small.yaml": lambda: "".join(f"- {B64[i : i + 64]}\n" for i in range(0, len(B64), 64)).encode(),
    "bytes_as_ints.json": lambda: json.dumps(list(JPEG)).encode(),
    "signed_bytes.csv": lambda: "\n".join(",".join(str(b - 128) for b in JPEG[i : i + 16])
                                          for i in range(0, len(JPEG), 16)).encode(),
    "rows_of_pixels.json": lambda: json.dumps(_pixels().tolist()).encode(),
    "image.pgm": lambda: ("P2\n# a comment\n48 48\n255\n"
                          + " ".join(map(str, _pixels().ravel()))).encode(),
    "image_short.txt": lambda: b"P3 2 1 255 0 0 0 255 255 255\n",
    "binary.pgm": lambda: b"P5\n48 48\n127\n" + bytes(int(v) % 128 for v in _pixels().ravel()),
    "uint8_list.parquet": lambda: _parquet(pa.table({"id": ["a"], "pixels": pa.array([list(JPEG)],
                                                                                      type=pa.list_(pa.uint8()))})),
    "int8_fixed.parquet": lambda: _parquet(pa.table({"pixels": pa.array([[1, 2, 3, 4]],
                                                                        type=pa.list_(pa.int8(), 4))})),
    "int64_list.parquet": lambda: _parquet(pa.table({"pixels": [list(JPEG)]})),
    "int_rows.parquet": lambda: _parquet(pa.table({"pixels": [_pixels().tolist()]})),
    "struct_ints.parquet": lambda: _parquet(pa.table({"meta": [{"scan": {"v": list(JPEG)}}]})),
    "wrapped_in_string.parquet": lambda: _parquet(pa.table({"notes": [base64.encodebytes(JPEG).decode()]})),
    "chunked_rows.parquet": lambda: _parquet(pa.table({"notes": [B64[i : i + 500] for i in range(0, len(B64), 500)]})),
    "ints_in_string.parquet": lambda: _parquet(pa.table({"notes": [json.dumps(list(JPEG))]})),
}


def _folder(tmp_path: Path, name: str, data: bytes) -> hub.RepoFolder:
    folder = tmp_path / "results" / "org--model"
    (folder / ".eval_results").mkdir(parents=True)
    (folder / ".eval_results" / name).write_bytes(data)
    return hub.recorded(hub.RepoFolder(str(folder), "org/model", "model", "results"))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_pixels_in_any_spelling_are_refused(tmp_path, name):
    repo = _folder(tmp_path, name, HOSTILE[name]())
    with pytest.raises(CredentialedImageError, match=name.replace(".", r"\.")):
        hub.check_recorded_files(repo)
        hub.check_no_credentialed_bytes(repo)


PLAIN: dict[str, bytes] = {
    "prose.md": (" ".join(["the heart size is within normal limits and the lungs are clear"] * 80)).encode(),
    "ids.yaml": "".join(f"- vqa_rad/all/{i}\n" for i in range(2000)).encode(),
    # digests as the provenance record and cards write them, each beside its file's name
    "hashes.json": json.dumps([{"relpath": f"split_{i}.json", "sha256": hashlib.sha256(str(i).encode()).hexdigest()}
                               for i in range(300)]).encode(),
    "few_hashes.json": json.dumps([hashlib.sha256(str(i).encode()).hexdigest() for i in range(31)]).encode(),
    "commit_per_row.json": json.dumps([{"config": "ba4586e", "id": f"vishal_report/ba4586e/{i}"}
                                       for i in range(500)]).encode(),
    "answers.json": json.dumps(["Yes", "No", "Left", "Right", "CT", "MRI"] * 500).encode(),
    "numbers.yaml": ("value: [" + ", ".join(str(i % 256) for i in range(400)) + "]\n"
                     + "".join(f"- {{year: {2000 + i}, n: {i}}}\n" for i in range(300))).encode(),
    "code.py": ("def score(predictions: list[str], references: list[str]) -> dict[str, float]:\n"
                "    return {\"accuracy\": sum(p == r for p, r in zip(predictions, references)) / 2}\n" * 60).encode(),
    "probably_image.md": b"P2 is the second page; see the figure.\n",
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_ordinary_text_still_passes(tmp_path, name):
    repo = _folder(tmp_path, name, PLAIN[name])
    hub.check_no_credentialed_bytes(repo)


def test_text_columns_in_parquet_still_pass_and_numeric_lists_never_do(tmp_path):
    """The exporter writes text, lists of text and JSON text only: a list-of-numbers column (even short boxes)
    is refused by its type (security audit: pixels as float lists, int16 rows, one pixel per row)."""
    table = pa.table({"id": [f"slake/all/{i}" for i in range(500)], "config": ["ba4586e"] * 500,
                      "question": ["Is there a fracture in the left femur?"] * 500})
    hub.check_no_credentialed_bytes(_folder(tmp_path / "text", "text.parquet", _parquet(table)))
    boxes = table.append_column("bbox", pa.array([[i, i + 1, 20, 30] for i in range(500)]))
    with pytest.raises(CredentialedImageError, match=r"boxes\.parquet has column\(s\) that are not text.*bbox"):
        hub.check_no_credentialed_bytes(_folder(tmp_path / "boxes", "boxes.parquet", _parquet(boxes)))


def test_normalise_joins_what_json_and_yaml_split():
    assert content_scan.normalise(b'["ab\\/c", "d+e",\n "f\\ng"]') == b"ab/cd+efg"
    assert content_scan.normalise(b'"a\\u002fb\\u003d"') == b"a/b="


def test_integer_list_fields_count_nested_rows_together():
    rows = pa.chunked_array([pa.array([_pixels().tolist(), [[1, 2]]])])
    assert hub.integer_list_fields(rows, "pixels") == ["pixels[][] (up to 2304 integers in one row)"]
    assert hub.integer_list_fields(pa.chunked_array([pa.array([[1, 2, 3, 4]] * 1000)]), "bbox") == []

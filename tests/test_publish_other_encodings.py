"""Known answers for the publish guard's other encodings (:mod:`medheval.publish.content_scan`): a small PNG, JPEG
and DICOM-shaped payload (made here, never real data) as base32, base32hex, base85, ascii85 or bytes mapped onto a
Unicode block (braille ``chr(0x2800 + b)``, ``chr(0x100 + b)``) is refused in a results.json string field, a
Parquet column and a card, naming the file, the column or the field; benign text on the other side of each
threshold (reports, Chinese, upper-case words, digests, rules of ``=`` and ``~``, one-block scripts) passes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import textwrap

import numpy as np
import pytest
import yaml

from medheval.data.credentialed import CredentialedImageError
from medheval.publish import content_scan, hub
from publish_folders import parquet_bytes, repo_folder
from report_runs import export_results_json

RNG = np.random.default_rng(7)


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(RNG.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _jpeg() -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:96, 0:96]
    buffer = io.BytesIO()
    Image.fromarray(((np.sin(x / 7) + np.cos(y / 11) + 2) * 60).astype("uint8"), "L").save(buffer, "JPEG")
    return buffer.getvalue()


def _dicom() -> bytes:
    """A DICOM-shaped file: the zero preamble, ``DICM``, a group-2 element, zero padding and 12-bit pixels."""
    pixels = RNG.integers(0, 4096, 700, dtype=np.uint16).tobytes()
    return bytes(128) + b"DICM" + b"\x02\x00\x00\x00UL\x04\x00" + bytes(200) + pixels


PAYLOADS = {"png": _png(), "jpeg": _jpeg(), "dicom": _dicom()}  # 1.2-1.8 KB each: over the 1 KB thresholds
ENCODINGS = {  # name: (encode, the kind the guard names)
    "base32": (lambda data: base64.b32encode(data).decode(), "base32 text"),
    "base32 lower": (lambda data: base64.b32encode(data).decode().lower(), "base32 text"),
    "base32hex": (lambda data: base64.b32hexencode(data).decode(), "base32 text"),
    "base85": (lambda data: base64.b85encode(data).decode(), "base85 text"),
    "ascii85": (lambda data: base64.a85encode(data).decode(), "ascii85 text"),
    "ascii85 adobe": (lambda data: base64.a85encode(data, adobe=True, wrapcol=76).decode(), "ascii85 text"),
    "braille": (lambda data: "".join(chr(0x2800 + byte) for byte in data), "bytes as characters"),
    "latin extended": (lambda data: "".join(chr(0x100 + byte) for byte in data), "bytes as characters"),
}
CASES = [(payload, encoding) for payload in PAYLOADS for encoding in ENCODINGS]


def _encoded(payload: str, encoding: str) -> tuple[str, str]:
    encode, kind = ENCODINGS[encoding]
    return encode(PAYLOADS[payload]), kind


# ------------------------------------------------------------------------------------ refused


@pytest.mark.parametrize("payload, encoding", CASES)
def test_the_scanner_names_each_encoding(payload, encoding):
    text, kind = _encoded(payload, encoding)
    assert content_scan.text_kind(text.encode(), hub.MAGIC_BYTES) == kind
    assert content_scan.text_kind(json.dumps({"settings": {"model": text}}).encode(), hub.MAGIC_BYTES) == kind
    assert content_scan.text_kind(json.dumps([text], ensure_ascii=False).encode(), hub.MAGIC_BYTES) == kind


@pytest.mark.parametrize("payload, encoding", CASES)
def test_an_image_in_a_results_json_string_field_is_refused(tmp_path, payload, encoding):
    text, kind = _encoded(payload, encoding)
    results = {"settings": {"model": text, "mitigation": "none"}, "benchmarks": {}}
    with pytest.raises(hub.PublishError, match=r"results\.json: settings\.model"):
        export_results_json(tmp_path, results, "org/model")
    # base32 of 2048 characters or more is in base64's alphabet: hub.BASE64_RUN, read first, names it base64
    with pytest.raises(CredentialedImageError, match=f"results\\.json is a (base64 text|{kind})"):
        hub.check_no_credentialed_bytes(repo_folder(tmp_path, "results.json", json.dumps(results).encode()))


@pytest.mark.parametrize("payload, encoding", CASES)
def test_an_image_split_over_a_parquet_column_is_refused(tmp_path, payload, encoding):
    text, kind = _encoded(payload, encoding)
    rows = [text[i : i + 300] for i in range(0, len(text), 300)]
    data = parquet_bytes({"id": [f"r{i}" for i in range(len(rows))], "question": rows})
    with pytest.raises(CredentialedImageError, match=f"data/test\\.parquet column 'question' holds {kind}"):
        hub.check_no_credentialed_bytes(repo_folder(tmp_path, "data/test.parquet", data))


@pytest.mark.parametrize("payload, encoding", CASES)
def test_an_image_wrapped_in_a_card_is_refused(tmp_path, payload, encoding):
    """After a heading (which the normalised text joins in front of the first line), wrapped at 76 characters."""
    text, kind = _encoded(payload, encoding)
    card = "---\nlicense: mit\n---\n# Model\n\n" + "\n".join(textwrap.wrap(text, 76)) + "\n"
    with pytest.raises(CredentialedImageError, match=f"README\\.md is a {kind}"):
        hub.check_no_credentialed_bytes(repo_folder(tmp_path, "README.md", card.encode()))


def test_thresholds_on_both_sides():
    """1 KB of bytes: 1,640 base32 characters, 1,280 base85 or ascii85, 1,024 characters in one block."""
    data = RNG.integers(0, 256, 1100, dtype=np.uint8).tobytes()
    for encode, below, at, kind in ((base64.b32encode, 1020, 1025, "base32 text"),
                                    (base64.b32hexencode, 1020, 1025, "base32 text"),
                                    (base64.b85encode, 1020, 1024, "base85 text"),
                                    (base64.a85encode, 1020, 1024, "ascii85 text")):
        assert len(encode(data[:below])) < len(encode(data[:at])) <= content_scan.MIN_B85_RUN + 360
        assert content_scan.text_kind(encode(data[:below]), hub.MAGIC_BYTES) is None, kind
        assert content_scan.text_kind(encode(data[:at]), hub.MAGIC_BYTES) == kind
    jpeg = PAYLOADS["jpeg"]
    as_braille = "".join(chr(0x2800 + byte) for byte in jpeg)
    assert content_scan.block_run(as_braille[:1023].encode(), hub.MAGIC_BYTES) is False
    assert content_scan.block_run(as_braille[:1024].encode(), hub.MAGIC_BYTES) is True
    escaped = "".join(f"\\u{0x2800 + byte:04X}" for byte in jpeg[:1024])  # as a YAML card escapes it
    assert content_scan.block_run(escaped.encode(), hub.MAGIC_BYTES) is True
    shifted = "".join(chr(0x2800 + byte) for byte in b"\x00" * 4 + jpeg)  # no header: its 1,024 bytes' diversity
    assert content_scan.block_run(shifted.encode(), hub.MAGIC_BYTES) is True


# ------------------------------------------------------------------------------------ passes

ZH = ("检查所见：胸廓对称，气管居中。双肺纹理增多、紊乱，右下肺野见斑片状模糊影，边界不清。心影大小、形态未见明显异常。"
      "双侧膈面光整，肋膈角锐利。诊断意见：右下肺炎症，建议治疗后复查。")
RU = "Легочные поля без очаговых и инфильтративных изменений, корни структурны, синусы свободны. "
DIGESTS = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(31)]
BENIGN = {
    "report.md": ("FINDINGS: The heart size is normal. There is no pleural effusion or pneumothorax. The lungs are "
                  "clear without focal consolidation. IMPRESSION: No acute cardiopulmonary process.\n" * 300).encode(),
    "chinese.md": (ZH * 300).encode(),
    "chinese.json": json.dumps([{"id": i, "report": ZH * 3} for i in range(300)], ensure_ascii=False).encode(),
    "chinese_escaped.json": json.dumps([{"id": i, "report": ZH * 3} for i in range(300)]).encode(),
    "README.md": ("---\n" + yaml.dump({"description": ZH * 40, "pretty_name": "X"}) + "---\n# X\n").encode(),
    "russian.md": (RU * 300).encode(),
    "kana.md": ("ココロノサイズハセイジョウデス。" * 300).encode(),
    "braille.md": ("⠠⠞⠓⠑⠀⠓⠑⠁⠗⠞⠀⠊⠎⠀⠝⠕⠗⠍⠁⠇⠲⠀" * 300).encode(),
    "upper_words.md": " ".join(["ABDOMINAL", "RADIOGRAPH", "CT2", "MRI3", "T2W", "DWI", "PA", "AP", "LATERAL",
                                "SAGITTAL", "CORONAL", "AXIAL", "FLAIR", "STIR"] * 400).encode(),
    "digests.json": json.dumps(DIGESTS).encode(),
    "digests_upper.json": json.dumps([digest.upper() for digest in DIGESTS]).encode(),
    "files.txt": "\n".join(f"s{i}.json {hashlib.sha256(b'%d' % i).hexdigest()}" for i in range(500)).encode(),
    "rules.md": b"# Title\n" + b"=" * 10000 + b"\n\n" + b"~" * 10000 + b"\n" + b"-=~" * 3000 + b"\n",
    "long_words.md": ("pneumonoultramicroscopicsilicovolcanoconiosis " * 400).encode(),
    "models.json": json.dumps([f"org{i}/Qwen2.5-VL-{i}B-Instruct" for i in range(500)]).encode(),
    "results.json": json.dumps({"benchmarks": {f"split{i}": {"metrics": {"accuracy": i / 97, "n": i}}
                                               for i in range(300)}}).encode(),
    "data/reports.parquet": parquet_bytes({"id": [f"r{i}" for i in range(300)], "report": [ZH * 2] * 150 + [RU] * 150}),
}


@pytest.mark.parametrize("relpath", sorted(BENIGN))
def test_benign_text_still_passes(tmp_path, relpath):
    hub.check_no_credentialed_bytes(repo_folder(tmp_path, relpath, BENIGN[relpath]))

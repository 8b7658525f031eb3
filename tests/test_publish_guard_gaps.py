"""Known answers for the publish guard's four closed gaps (:mod:`medheval.publish.content_scan`, payloads made
here, never real data): bytes mapped onto a 256-wide window of code points not aligned to a Unicode block; a
small image (under the 1 KB thresholds) whose short run decodes to its header; a headerless payload mostly zero
bytes; base64 cut by punctuation. Benign text on the other side of each rule (scripts of one block, digests,
UUIDs, model names, acronym-heavy reports) passes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medheval.data.credentialed import CredentialedImageError
from medheval.publish import content_scan, hub

RNG = np.random.default_rng(11)


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(RNG.integers(0, 256, (6, 6), dtype=np.uint8), "L").save(buffer, "PNG")
    return buffer.getvalue()


def _jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(RNG.integers(0, 256, (48, 48), dtype=np.uint8), "L").save(buffer, "JPEG")
    return buffer.getvalue()


PNG, JPEG = _png(), _jpeg()  # about 100 bytes; about 2.7 KB
NOISE = RNG.integers(0, 256, 1600, dtype=np.uint8).tobytes()  # headerless bytes: 2,136 base64 characters
# headerless, 6/7 zero bytes: 24 zeros then 4 other bytes (an image's black border), 1,568 bytes
ZEROS = b"".join(bytes(24) + RNG.integers(1, 256, 4, dtype=np.uint8).tobytes() for _ in range(56))


def kind(text: str | bytes) -> str | None:
    return content_scan.text_kind(text.encode() if isinstance(text, str) else text, hub.MAGIC_BYTES)


def _folder(tmp_path: Path, relpath: str, data: bytes) -> hub.RepoFolder:
    folder = tmp_path / "repo"
    (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
    (folder / relpath).write_bytes(data)
    return hub.RepoFolder(str(folder), "org/x", "dataset", "datasets")


def _parquet(columns: dict[str, list[str]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def _mapped(data: bytes, base: int) -> str:
    return "".join(chr(base + byte) for byte in data)


# ------------------------------------------------------------------ 1. a byte mapping onto any 256-wide window


@pytest.mark.parametrize("base", [0x2810, 0x4E80, 0x0480, 0x1F5A0, 0xF0])
def test_a_byte_mapping_off_a_block_boundary_is_refused(base):
    """0x2810: braille spilling into the next block; 0x4E80: inside CJK; 0xF0: Latin-1 then Latin Extended."""
    assert kind(_mapped(JPEG, base)) == "bytes as characters"
    assert kind(json.dumps({"note": _mapped(JPEG, base)})) == "bytes as characters"  # \\uXXXX escapes undone
    assert kind(_mapped(NOISE, base)) == "bytes as characters"  # no header: 1,024 bytes take ~250 values


def test_block_run_on_both_sides():
    jpeg = _mapped(JPEG, 0x2810)
    assert content_scan.block_run(jpeg[:1023].encode(), hub.MAGIC_BYTES) is False  # under MIN_BLOCK_RUN
    assert content_scan.block_run(jpeg[:1024].encode(), hub.MAGIC_BYTES) is True
    cut = ".".join(jpeg[i : i + 100] for i in range(0, len(jpeg), 100))  # ASCII between pieces is dropped
    assert content_scan.block_run(cut.encode(), hub.MAGIC_BYTES) is True
    # 192 distinct values in 1,024 characters with no header: refused; 191: passes
    for values, expected in ((192, True), (191, False)):
        cycle = np.resize(np.arange(values), 1024) + 1  # starts at 1: no header
        assert content_scan.block_run(_mapped(bytes(cycle.tolist()), 0x2810).encode()) is expected, values


def test_a_headerless_mapping_mostly_zero_bytes_passes():
    """The documented limit: no header and a few dozen distinct values read as a script of one block."""
    assert kind(_mapped(ZEROS[:1200], 0x2810)) is None


SCRIPTS = {
    "chinese": "检查所见：胸廓对称，气管居中。双肺纹理增多、紊乱，右下肺野见斑片状模糊影，边界不清。心影大小、形态未见明显异常。"
               "双侧膈面光整，肋膈角锐利。诊断意见：右下肺炎症，建议治疗后复查。患者男性，六十五岁，因咳嗽咳痰一周入院。",
    "russian": "Легочные поля без очаговых и инфильтративных изменений, корни структурны, синусы свободны. Сердце не "
               "расширено, аорта уплотнена. Заключение: патологических изменений органов грудной клетки не выявлено. "
               "Пациентка поступила с жалобами на кашель, слабость и повышение температуры тела.",
    "kana": "かんじゃさんのしょうじょうについてくわしくせつめいします。せきとたんがいっしゅうかんつづいており、ねつはさんじゅう"
            "はちどです。ぱぴぷぺぽ、がぎぐげご、ざじずぜぞ、ゃゅょっ。ココロノサイズハセイジョウデス。ヴァヴィヴェヴォ、ファフィ"
            "フェフォ。ー・「」『』〜",  # U+3001..U+30FC: one window of 251 code points, 98 of them
    "korean": "흉부 방사선 사진에서 우하엽에 침윤이 관찰됩니다. 심장 크기는 정상이며 흉수는 없습니다. 폐렴이 의심되므로 임상 "
              "증상과 함께 평가하시기 바랍니다. 환자는 일주일 전부터 기침과 가래가 있었습니다.",
    "braille": "⠠⠞⠓⠑⠀⠓⠑⠁⠗⠞⠀⠊⠎⠀⠝⠕⠗⠍⠁⠇⠲⠀⠠⠝⠕⠀⠏⠇⠑⠥⠗⠁⠇⠀⠑⠋⠋⠥⠎⠊⠕⠝⠲⠀⠼⠁⠃⠉⠙⠑⠋⠛⠓⠊⠚⠀⠿⠷⠮⠾⠯⠽⠺⠹⠸⠱⠳⠻⠧⠵⠫⠭",
    "greek": "Η καρδιά έχει φυσιολογικό μέγεθος. Δεν υπάρχει πλευριτική συλλογή ή πνευμοθώρακας. Οι πνεύμονες είναι "
             "καθαροί χωρίς εστιακή πύκνωση.",
    "arabic": "حجم القلب طبيعي. لا يوجد انصباب جنبي أو استرواح صدري. الرئتان صافيتان دون تكثف بؤري.",
    "thai": "ขนาดหัวใจปกติ ไม่มีน้ำในเยื่อหุ้มปอดหรือลมในเยื่อหุ้มปอด ปอดทั้งสองข้างใส ไม่พบการอักเสบเฉพาะที่",
    "hindi": "हृदय का आकार सामान्य है। कोई फुफ्फुस बहाव या न्यूमोथोरैक्स नहीं है। फेफड़े साफ हैं।",
    "emoji": "".join(chr(code) for code in range(0x1F600, 0x1F650)) + "👍👎👏🙏💪❤️🧡💛💚💙💜🖤",  # 80 faces in one window
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_text_in_any_script_passes(tmp_path, script):
    text = SCRIPTS[script] * (5000 // len(SCRIPTS[script]) + 1)  # 5,000 characters or more
    assert kind(text) is None
    assert kind(json.dumps({"report": text})) is None  # escaped
    hub.check_no_credentialed_bytes(_folder(tmp_path, "data/test.parquet", _parquet({"report": [text] * 5})))


# ---------------------------------------------------------------- 2. a small image, however short


@pytest.mark.parametrize("encode, name", [
    (lambda data: base64.b64encode(data).decode(), "base64 text"),
    (lambda data: base64.urlsafe_b64encode(data).decode(), "base64 text"),
    (lambda data: data.hex(), "hex text"),
    (lambda data: base64.b32encode(data).decode(), "base32 text"),
    (lambda data: base64.b85encode(data).decode(), "base85 text"),
])
def test_a_small_image_is_refused(tmp_path, encode, name):
    text = encode(PNG)
    assert len(PNG) < 200 and kind(json.dumps({"settings": {"model": text}})) == name
    assert kind(f"# Card\n\nSee {text} here.\n") == name
    data = _parquet({"id": ["a", "b", "c"], "question": ["Is there a mass?", text, "Where?"]})
    with pytest.raises(CredentialedImageError, match=f"column 'question' holds {name} in row 1;"):
        hub.check_no_credentialed_bytes(_folder(tmp_path, "data/test.parquet", data))


def test_the_header_rule_on_both_sides():
    """64 decoded bytes with a JPEG header are refused, 63 pass; 64 bytes with no header pass."""
    jpeg = b"\xff\xd8\xff\xe0" + bytes(range(100, 200))
    assert kind(base64.b64encode(jpeg[:63]).decode()) is None
    assert kind(base64.b64encode(jpeg[:64]).decode()) == "base64 text"
    assert kind(base64.b64encode(NOISE[:1000]).decode()) is None  # mixed, but under 2,048 and no header
    assert kind("data:image/png;base64,iVBO") == "text with an image data URL"  # a data URL of any length


def test_a_dicom_header_at_offset_128_is_refused():
    dicom = bytes(128) + b"DICM" + bytes(range(1, 60))
    assert kind(base64.b64encode(dicom).decode()) == "base64 text"
    assert kind(dicom.hex()) == "hex text"


# ------------------------------------------------------------- 3. headerless bytes, mostly zeros


@pytest.mark.parametrize("encode, name", [
    (base64.b64encode, "base64 text"), (base64.b85encode, "base85 text"), (base64.b32encode, "base32 text")])
def test_a_headerless_payload_mostly_zero_bytes_is_refused(encode, name):
    text = encode(ZEROS).decode()
    assert not all(content_scan._share(text.encode(), characters) >= share
                   for characters, share in content_scan.ENCODINGS[[e.kind for e in content_scan.ENCODINGS].index(name)].mix)
    assert kind(json.dumps({"notes": text})) == name  # mixed once its runs of zero bytes are left out


def test_mixed_measures_the_rest_only_when_it_is_long_enough():
    assert content_scan.mixed(content_scan.BASE64, b"A" * 2000 + b"Ab1cD2eF3gH4") is False  # 12 left: not read
    noise = base64.b64encode(NOISE[:60])  # 80 characters of base64 of bytes
    assert content_scan.mixed(content_scan.BASE64, b"A" * 2000 + noise) is True
    assert content_scan.mixed(content_scan.BASE64, b"A" * 2000 + noise.lower()) is False  # no upper case left


# --------------------------------------------------------------------- 4. base64 cut by punctuation


@pytest.mark.parametrize("cut", [";", "|", ".", ":", "!", "#", "; ", " | ", "..."])
def test_base64_cut_by_punctuation_is_refused(cut):
    text = base64.b64encode(NOISE).decode()  # no header: the mix and the 56 symbols count
    assert kind(json.dumps({"notes": cut.join(text[i : i + 100] for i in range(0, len(text), 100))})) == "base64 text"
    assert kind(json.dumps([text[i : i + 1000] + cut for i in range(0, len(text), 1000)])) == "base64 text"


def test_base64_cut_in_a_parquet_column_is_refused(tmp_path):
    text = base64.b64encode(NOISE).decode()
    rows = [text[i : i + 60] + ";" for i in range(0, len(text), 60)]
    data = _parquet({"id": [f"r{i}" for i in range(len(rows))], "question": rows})
    with pytest.raises(CredentialedImageError, match="column 'question' holds base64 text split over its rows"):
        hub.check_no_credentialed_bytes(_folder(tmp_path, "data/test.parquet", data))


def test_a_cut_longer_than_max_gap_ends_the_chain():
    text = base64.b64encode(NOISE).decode()
    assert kind(("." * 9).join(text[i : i + 100] for i in range(0, len(text), 100))) is None


DIGESTS = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(400)]
CUT_BENIGN = {
    "digests; ": "; ".join(DIGESTS),
    "digests | ": " | ".join(DIGESTS),
    "uuids; ": ";".join(str(uuid.UUID(int=int(digest[:32], 16))) for digest in DIGESTS),
    "uuids upper": ";".join(str(uuid.UUID(int=int(digest[:32], 16))).upper() for digest in DIGESTS),
    "model names": json.dumps([f"meta-llama/Llama-3.{i % 3}-{i}B-Vision-Instruct." for i in range(300)]
                              + [f"Qwen/Qwen2.5-VL-{i}B-Instruct" for i in range(300)]),
    "report": ("FINDINGS: PA and LAT views. A 3.2 x 4.1 cm RUL mass; no PE. CT T2W/FLAIR: 5 mm focus. Dr. Smith, "
               "MRI 14:30. Hb 12.4 g/dL; WBC 11.2; CRP 48. IMPRESSION: Pneumonia. Follow-up CXR in 6-8 wk. " * 60),
    "dotted ids": ".".join(f"1.2.840.113619.2.55.3.{i}.{i * 7}" for i in range(300)),  # DICOM UIDs
}


@pytest.mark.parametrize("name", sorted(CUT_BENIGN))
def test_benign_text_cut_by_punctuation_passes(tmp_path, name):
    assert kind(CUT_BENIGN[name]) is None
    hub.check_no_credentialed_bytes(_folder(tmp_path, "notes.md", CUT_BENIGN[name].encode()))

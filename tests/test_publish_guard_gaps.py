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
import pyarrow.parquet as pq
import pytest

from medheval.data.credentialed import CredentialedImageError
from conftest import UPSTREAM_MEDHEVAL, requires_upstream
from medheval.publish import content_scan, hub
from publish_folders import parquet_bytes, repo_folder

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


def _npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, (np.arange(64 * 64).reshape(64, 64) % 7).astype(np.uint8))  # a mask: 7 values, no diversity
    return buffer.getvalue()


NPY = _npy()


def test_a_mapping_after_a_nearby_character_is_refused():
    """The block-aligned check runs as before (a run of one block, ASCII included, its low bytes): a non-ASCII
    character within 256 code points before the payload (``é`` before ``chr(0x100 + b)``) cannot hide its
    header; with any start, a header of 4 bytes or more is looked for at every position."""
    for prefix in ("Résumé: ", "é", "\u00e9", ""):
        assert kind(json.dumps({"note": prefix, "blob": _mapped(NPY, 0x100)}, ensure_ascii=False)) \
            == "bytes as characters", prefix
        assert kind(prefix + _mapped(NPY, 0x100)) == "bytes as characters", prefix
    for base in (0x2810, 0x4E80, 0x0480):  # off a block boundary: the NumPy header (6 bytes) where it starts
        for prefix in ("", "Résumé: ", "⠀⠁⠂ ", "Характер ", "中文 "):
            assert kind(prefix + _mapped(NPY, base)) == "bytes as characters", (hex(base), prefix)


# natural text, several passages per script; the first words of a passage decide where a window would start, so
# the reviewer's openings (``Ха`` reads as BM less a free start, ``επ`` and ``é..ô`` too) and every word of each
# passage as an opening are tried
SCRIPTS = {
    "chinese": ["检查所见：胸廓对称，气管居中。双肺纹理增多、紊乱，右下肺野见斑片状模糊影，边界不清。心影大小、形态未见明显异常。"
                "双侧膈面光整，肋膈角锐利。诊断意见：右下肺炎症，建议治疗后复查。患者男性，六十五岁，因咳嗽咳痰一周入院。",
                "胸部CT平扫示：双肺纹理增多，右肺上叶尖段可见一大小约12mm×10mm的结节影，边缘毛糙，可见分叶及毛刺征，邻近胸膜牵拉。"
                "纵隔内未见明显肿大淋巴结，心影大小正常，双侧胸腔未见积液。印象：右肺上叶结节，考虑周围型肺癌可能，建议进一步检查。"],
    "russian": ["Легочные поля без очаговых и инфильтративных изменений, корни структурны, синусы свободны. Сердце не "
                "расширено, аорта уплотнена. Заключение: патологических изменений органов грудной клетки не выявлено. "
                "Пациентка поступила с жалобами на кашель, слабость и повышение температуры тела.",
                "Характер изменений в легких: в нижних отделах обоих легких определяются участки уплотнения легочной "
                "ткани по типу матового стекла, преимущественно субплеврально, с утолщением междольковых перегородок. "
                "Плевральный выпот не выявлен. Средостение не смещено, лимфатические узлы не увеличены.",
                "Хаотичные тяжи, Юношеский возраст, Щитовидная железа: эхо-картина без особенностей; «контроль» через "
                "месяц — рекомендовано.",
                # 'екдо' of 'человек до' spells DICM less 0x3F1 (at 128 into a window): no mapping starts there
                "Пациент поступил с жалобами на кашель и слабость. Легочные поля без очаговых изменений, корни "
                "структурны. Сердце не расширено. Заключение: патологических изменений не выявлено. Человек доставлен "
                "в приемное отделение в удовлетворительном состоянии, век дома не выходил."],
    "kana": ["かんじゃさんのしょうじょうについてくわしくせつめいします。せきとたんがいっしゅうかんつづいており、ねつはさんじゅう"
             "はちどです。ぱぴぷぺぽ、がぎぐげご、ざじずぜぞ、ゃゅょっ。ココロノサイズハセイジョウデス。ヴァヴィヴェヴォ、ファフィ"
             "フェフォ。ー・「」『』〜",  # U+3001..U+30FC: one window of 251 code points, 98 of them
             "ここではかんじゃさんのしょけんについてせつめいしますみぎのはいにちいさなかげがありますがおおきさはじゅうにみりでふち"
             "はすこしふぞろいですきょうすいはありませんしんぞうのおおきさはふつうです"],
    "japanese": ["胸部単純CTでは、右肺上葉に約12mmの結節影を認めます。辺縁はやや不整で、スピキュラを伴っています。縦隔リンパ節の"
                 "腫大はありません。胸水は認めません。心拡大はありません。所見：右肺上葉結節、肺癌の可能性があり、精査をお勧めします。"],
    "korean": ["흉부 방사선 사진에서 우하엽에 침윤이 관찰됩니다. 심장 크기는 정상이며 흉수는 없습니다. 폐렴이 의심되므로 임상 "
               "증상과 함께 평가하시기 바랍니다. 환자는 일주일 전부터 기침과 가래가 있었습니다.",
               "흉부 CT에서 우측 폐 상엽에 약 12mm 크기의 결절이 관찰됩니다. 경계는 불규칙하며 침상 돌기를 동반합니다."],
    "braille": ["⠠⠞⠓⠑⠀⠓⠑⠁⠗⠞⠀⠊⠎⠀⠝⠕⠗⠍⠁⠇⠲⠀⠠⠝⠕⠀⠏⠇⠑⠥⠗⠁⠇⠀⠑⠋⠋⠥⠎⠊⠕⠝⠲⠀⠼⠁⠃⠉⠙⠑⠋⠛⠓⠊⠚⠀⠿⠷⠮⠾⠯⠽⠺⠹⠸⠱⠳⠻⠧⠵⠫⠭",
                "⠠⠇⠥⠝⠛⠎⠀⠁⠗⠑⠀⠉⠇⠑⠁⠗⠲⠀⠠⠝⠕⠀⠋⠕⠉⠁⠇⠀⠉⠕⠝⠎⠕⠇⠊⠙⠁⠞⠊⠕⠝⠲"],
    "greek": ["Η καρδιά έχει φυσιολογικό μέγεθος. Δεν υπάρχει πλευριτική συλλογή ή πνευμοθώρακας. Οι πνεύμονες είναι "
              "καθαροί χωρίς εστιακή πύκνωση.",
              "επίσης παρατηρείται πάχυνση του υπεζωκότα και μικρή πλευριτική συλλογή στη δεξιά βάση του πνεύμονα χωρίς "
              "ενδείξεις πνευμοθώρακα ή διόγκωσης λεμφαδένων του μεσοθωρακίου."],
    "french": ["Le poumon présente une côte fracturée. À l'examen, on note une opacité alvéolaire du lobe inférieur droit "
               "évoquant une pneumopathie; côté gauche, épanchement pleural modéré. Le médiastin est élargi, hôpital, "
               "« contrôle » à prévoir après traitement. Pas de pneumothorax décelé.",
               "présente une côte fracturée, Résumé: épanchement, œdème, cœur, naïf, Noël, ça, où, déjà."],
    "german": ["Die Lunge zeigt eine Verschattung im rechten Unterfeld, vereinbar mit einer Pneumonie; Größe des Herzens "
               "unauffällig, Zwerchfell glatt begrenzt, keine Ergüsse, überwiegend ältere Veränderungen."],
    "polish/vietnamese": ["Zmiany zapalne w płucu prawym, niewielki płyn w jamie opłucnej, serce nie powiększone, "
                          "śródpiersie bez poszerzeń, żebra bez złamań, źródło zakażenia niejasne.",
                          "Phổi phải có tổn thương dạng nốt kích thước khoảng mười hai milimét, bờ không đều, có tua gai. "
                          "Không có tràn dịch màng phổi. Bóng tim không to. Trung thất không có hạch to."],
    "arabic/hebrew": ["حجم القلب طبيعي. لا يوجد انصباب جنبي أو استرواح صدري. الرئتان صافيتان دون تكثف بؤري.",
                      "تظهر الأشعة المقطعية للصدر عقدة في الفص العلوي للرئة اليمنى بحجم حوالي ١٢ ملم مع حواف غير منتظمة",
                      "בבדיקת סי טי של בית החזה נמצא קשר בגודל של כשנים עשר מילימטר באונה העליונה של הריאה הימנית"],
    "thai/hindi": ["ขนาดหัวใจปกติ ไม่มีน้ำในเยื่อหุ้มปอดหรือลมในเยื่อหุ้มปอด ปอดทั้งสองข้างใส ไม่พบการอักเสบเฉพาะที่",
                   "हृदय का आकार सामान्य है। कोई फुफ्फुस बहाव या न्यूमोथोरैक्स नहीं है। फेफड़े साफ हैं।",
                   "छाती के सीटी स्कैन में दाहिने फेफड़े के ऊपरी भाग में लगभग बारह मिलीमीटर की गांठ दिखाई देती है"],
    "emoji": ["".join(chr(code) for code in range(0x1F600, 0x1F650)) + "👍👎👏🙏💪❤️🧡💛💚💙💜🖤"],  # 80 faces in one window
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_text_in_any_script_passes(tmp_path, script):
    for passage in SCRIPTS[script]:
        text = passage * (5000 // len(passage) + 1)  # 5,000 characters or more
        assert kind(text) is None, passage[:20]
        assert kind(json.dumps({"report": text})) is None, passage[:20]  # escaped
        assert kind(json.dumps({"id": "r1", "answer": text}, ensure_ascii=False)) is None, passage[:20]
        words = passage.split()
        for at in range(len(words)):  # every word as the opening: no choice of first words passes it
            opening = " ".join(words[at:] + words[:at])
            assert content_scan.block_run((opening * (5000 // len(opening) + 1)).encode(), hub.MAGIC_BYTES) is False, \
                (script, words[at])
    hub.check_no_credentialed_bytes(repo_folder(tmp_path, "data/test.parquet", parquet_bytes({"report": [text] * 5})))


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
    data = parquet_bytes({"id": ["a", "b", "c"], "question": ["Is there a mass?", text, "Where?"]})
    with pytest.raises(CredentialedImageError, match=f"column 'question' holds {name} in row 1;"):
        hub.check_no_credentialed_bytes(repo_folder(tmp_path, "data/test.parquet", data))


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


def _cut(text: str, cut: str, every: int = 40) -> str:
    return cut.join(text[i : i + every] for i in range(0, len(text), every))


@pytest.mark.parametrize("cut", [";", "|", ".", ":", "!", "#", "; ", " | ", "...", ";\t"])
def test_an_image_cut_by_punctuation_is_refused(tmp_path, cut):
    """Pieces of 40 characters: each under the 86 a run's header test reads, so only the chain finds it."""
    text = _cut(base64.b64encode(JPEG).decode(), cut)
    assert kind(json.dumps({"notes": text})) == "base64 text"
    assert kind(f"# Card\n\nThe image: {text} (cut)\n") == "base64 text"
    data = parquet_bytes({"id": ["a", "b"], "question": ["Is there a mass?", text]})
    with pytest.raises(CredentialedImageError, match="column 'question' holds base64 text in row 1;"):
        hub.check_no_credentialed_bytes(repo_folder(tmp_path, "data/test.parquet", data))


@pytest.mark.parametrize("encode, name", [
    (lambda data: data.hex(), "hex text"), (lambda data: base64.b32encode(data).decode(), "base32 text"),
    (lambda data: base64.b85encode(data).decode(), "base85 text")])
def test_an_image_cut_by_punctuation_in_other_encodings_is_refused(encode, name):
    assert kind(json.dumps({"notes": _cut(encode(JPEG), ".", 20)})) == name


def test_what_ends_a_chain():
    """A chain lies in one line of one string, its pieces of 16 characters or more: the known limits."""
    text = base64.b64encode(JPEG).decode()
    assert kind(json.dumps({"notes": _cut(text, "." * 9)})) is None  # a cut longer than MAX_GAP
    assert kind(json.dumps({"notes": _cut(text, ";", 12)})) is None  # pieces under MIN_PIECE
    assert kind(json.dumps({"notes": _cut(text, ";é")})) is None  # a non-ASCII character (and é is no cut)
    assert kind(json.dumps({"notes": _cut(text, " ")})) == "base64 text"  # whitespace alone: a wrapped run
    assert kind(json.dumps({"notes": _cut(text, ";\n")})) is None  # a line break
    assert kind(json.dumps([piece + ";" for piece in _cut(text, "\n").split("\n")])) is None  # across values
    rows = [piece + ";" for piece in _cut(text, "\n").split("\n")]  # across a Parquet column's rows
    assert hub._values_kind(rows) is None
    assert content_scan.chains(content_scan.BASE64, "é".encode().join([b"A" * 40] * 4)) == []


def test_a_headerless_payload_cut_by_punctuation_passes():
    """The documented limit: a chain is refused by its decoded header alone (ids, SRI hashes and tokens cut by
    dots are mixed like base64 too), so headerless bytes cut by punctuation pass. An image has a header."""
    text = base64.b64encode(NOISE).decode()
    assert kind(json.dumps({"notes": _cut(text, ";")})) is None
    (chain,) = content_scan.chains(content_scan.BASE64, _cut(text, ";").encode())
    assert len(chain) > 2000 and text.encode().startswith(chain)


def _token(rng: np.random.Generator, size: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), size))


def _ids() -> dict[str, str]:
    rng = np.random.default_rng(3)
    sri = {f"asset{i}.js": "sha256-" + base64.b64encode(hashlib.sha256(b"%d" % i).digest()).decode() for i in range(100)}
    return {
        "api message ids": "\n".join(json.dumps({"id": f"slake-{i}", "response_id": "msg_" + _token(rng, 24),
                                                 "answer": "left lung"}) for i in range(300)),
        "chatcmpl ids": "\n".join(json.dumps({"id": f"vqa_rad_{i:04d}", "request": "chatcmpl-" + _token(rng, 29)})
                                  for i in range(300)),
        "SRI map": json.dumps(sri, indent=2),
        "SRI yaml": "\n".join(f"{name}: {value}" for name, value in sri.items()),
        "dotted ids": ".".join(_token(rng, 20) for _ in range(300)),
        "dotted ids, one line each": "\n".join(".".join(_token(rng, 20) for _ in range(8)) for _ in range(300)),
        "JWT-like tokens": "\n".join(f"{_token(rng, 36)}.{_token(rng, 80)}.{_token(rng, 43)}" for _ in range(50)),
        "oid list": "\n".join(f"oid sha256:{hashlib.sha256(b'%d' % i).hexdigest()}" for i in range(300)),
        "python source": "".join((Path(hub.__file__).parents[1] / relpath).read_text() for relpath in (
            "run/runner.py", "report/published.py", "publish/results_check.py", "data/benchmarks.py")),
    }


DIGESTS = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(400)]
CUT_BENIGN = {
    "digests; ": "; ".join(DIGESTS),
    "digests | ": " | ".join(DIGESTS),
    "digests;": ";".join(DIGESTS),
    "uuids; ": ";".join(str(uuid.UUID(int=int(digest[:32], 16))) for digest in DIGESTS),
    "uuids upper": ";".join(str(uuid.UUID(int=int(digest[:32], 16))).upper() for digest in DIGESTS),
    "model names": json.dumps([f"meta-llama/Llama-3.{i % 3}-{i}B-Vision-Instruct." for i in range(300)]
                              + [f"Qwen/Qwen2.5-VL-{i}B-Instruct" for i in range(300)]),
    "report": ("FINDINGS: PA and LAT views. A 3.2 x 4.1 cm RUL mass; no PE. CT T2W/FLAIR: 5 mm focus. Dr. Smith, "
               "MRI 14:30. Hb 12.4 g/dL; WBC 11.2; CRP 48. IMPRESSION: Pneumonia. Follow-up CXR in 6-8 wk. " * 60),
    "DICOM UIDs": ".".join(f"1.2.840.113619.2.55.3.{i}.{i * 7}" for i in range(300)),
    **_ids(),
}


@pytest.mark.parametrize("name", sorted(CUT_BENIGN))
def test_benign_text_cut_by_punctuation_passes(tmp_path, name):
    assert kind(CUT_BENIGN[name]) is None
    hub.check_no_credentialed_bytes(repo_folder(tmp_path, "notes.md", CUT_BENIGN[name].encode()))


def test_the_published_results_table_passes(tmp_path):
    """medheval/report/published.jsonl (package data): ids and numbers, once refused as base64 cut by dots."""
    from medheval.report.published import PUBLISHED_FILE

    assert kind(PUBLISHED_FILE.read_bytes()) is None
    hub.check_no_credentialed_bytes(repo_folder(tmp_path, "published.jsonl", PUBLISHED_FILE.read_bytes()))


@requires_upstream
@pytest.mark.parametrize("name", ["mm_vishal", "cxr_vishal"])
def test_the_real_benchmarks_meta_columns_pass(tmp_path, dataset_cache, name):
    """The exported benchmarks (their `meta` JSON columns were once refused as base64 split over their rows):
    built from ../shared in a temporary folder, never copied into the repo."""
    repo = hub.export_dataset(name, tmp_path, data_dir=UPSTREAM_MEDHEVAL, cache_dir=dataset_cache)
    table = pq.read_table(Path(repo.folder) / "all" / "test-00000-of-00001.parquet")
    meta = table.column("meta").to_pylist()
    assert len(meta) > 100 and hub._values_kind(meta) is None
    hub.check_no_credentialed_bytes(repo)


def test_the_refused_row_is_found_in_chunks():
    rows = [f"short benign text number {i} about the left lung" for i in range(1000)]
    rows[700] = base64.b64encode(JPEG).decode()
    assert hub._first_row(rows) == "in row 700"
    blob = base64.b64encode(NOISE * 8).decode()
    split = [blob[i : i + 40] for i in range(0, len(blob), 40)]  # no row alone holds the bytes
    assert hub._values_kind(split) == "base64 text"
    assert hub._first_row(split) == "split over its rows, from row 0"
    assert hub._first_row(split[:200]) == "split over its rows"

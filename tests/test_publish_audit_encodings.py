"""Security audit (encoded images through publish): each proof of concept of the audit, made here with a small
JPEG from PIL (never real data), must be refused or stripped; legitimate content on the other side of each
threshold still passes.

1. base64/hex split over JSON object values (made_with, a meta structured_answer, a Parquet cell's JSON);
2. an image hidden inside a valid Parquet file, between the column chunks and the footer;
3. pixels as numbers (a flat int column, float lists, int16 rows, CSV floats, ':'-separated, 16-bit JSON) or as
   Latin-1 text (raw or \\u00XX-escaped)."""

from __future__ import annotations

import base64
import copy
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medheval.data.credentialed import CredentialedImageError
from medheval.publish import content_scan, hub, meta_check, results_check
from report_runs import export_results_json


def _jpeg(size: int = 96) -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size]
    pixels = ((np.sin(x / 7) + np.cos(y / 11) + 2) * 60).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, "JPEG")
    return buffer.getvalue()


JPEG = _jpeg(200)  # about 4 KB: base64 and hex far over the 2048-character runs
B64 = base64.b64encode(JPEG).decode()
PIXELS = np.random.default_rng(1).integers(0, 256, (64, 64), dtype=np.uint8)


def _results(made_with: dict) -> dict:
    return {"settings": {"model": "org/model", "mitigation": "none"},
            "provenance": {"protocol": "clean", "made_with": made_with},
            "benchmarks": {"mm_vishal:all": {"n_records": 4, "n_scored": 4,
                                             "metrics": {"close_ended_accuracy": {"accuracy": 0.5, "n": 4}}}}}


def _export(tmp_path: Path, results: dict) -> hub.RepoFolder:
    return export_results_json(tmp_path, results, "org/model")


def _chunks(text: str, size: int, prefix: str) -> dict[str, str]:
    return {f"{prefix}{i:03d}": text[j : j + size] for i, j in enumerate(range(0, len(text), size))}


# ------------------------------------------------------------------------ 1. results and made_with


@pytest.mark.parametrize("encoded", ["hex", "base64"])
def test_an_image_split_over_made_with_versions_is_refused(tmp_path, encoded):
    """hex/poc_hex.py, hex/poc_b64dict.py: versions as a dict of 480-character chunks."""
    text = JPEG.hex() if encoded == "hex" else B64
    with pytest.raises(hub.PublishError, match=r"provenance\.made_with\.versions"):
        _export(tmp_path, _results({"versions": _chunks(text, 480, "layer")}))
    assert not any((tmp_path / "out").rglob("*.json"))


def test_unknown_generation_keys_are_left_out_of_the_provenance_record(tmp_path):
    """rescore/make.py: a predictions file's first ``generation`` dict carried base64 chunks into the record."""
    generation = {"max_new_tokens": 8, "do_sample": False, "temperature": None, **_chunks(B64, 450, "opt_")}
    repo = _export(tmp_path, _results({"generation": generation, "seed": 0, "extra": B64[:400]}))
    record = json.loads(next((Path(repo.folder) / hub.PROVENANCE_DIR).glob("*.json")).read_text())
    assert record["made_with"] == {"generation": {"max_new_tokens": 8, "do_sample": False, "temperature": None},
                                   "seed": 0}
    assert any("left out of .eval_results_provenance" in warning and "generation.opt_000" in warning
               and "made_with.extra" in warning for warning in repo.warnings)
    hub.check_no_credentialed_bytes(repo)


@pytest.mark.parametrize("made_with, field", [
    ({"generation": {"temperature": "0.7" + B64[:100]}}, "generation.temperature"),
    ({"generation": {"do_sample": 1}}, "generation.do_sample"),
    ({"seed": "0"}, "seed"),
    ({"inputs": {"tokenization": B64[:200]}}, "inputs.tokenization"),
    ({"versions": {"torch": "2.13.0 " + "A" * 60}}, "versions.torch"),
])
def test_a_known_made_with_key_of_the_wrong_type_is_refused(tmp_path, made_with, field):
    with pytest.raises(hub.PublishError, match=f"provenance\\.made_with\\.{field.replace('.', '[.]')}"):
        _export(tmp_path, _results(made_with))


def test_a_real_runs_made_with_still_publishes(tmp_path):
    made = {"seed": 1234, "versions": {"medheval": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu",
                                       "transformers": "5.24.0", "datasets": "5.2.0", "evaluate": "0.4.6",
                                       "huggingface_hub": None},
            "inputs": {"grey_padding": True, "tokenization": "upstream_chunked"},
            "generation": {"do_sample": True, "max_new_tokens": 512, "temperature": 0.7, "top_p": 0.9, "top_k": 50,
                           "num_beams": 1, "repetition_penalty": 1.0}}
    repo = _export(tmp_path, _results(copy.deepcopy(made)))
    record = json.loads(next((Path(repo.folder) / hub.PROVENANCE_DIR).glob("*.json")).read_text())
    assert record["made_with"] == made and not repo.warnings
    hub.check_no_credentialed_bytes(repo)


def test_a_dataset_revision_entry_with_unknown_keys_is_refused():
    revision = {"files": [{"relpath": "a.json", "sha256": "a" * 64, "pinned": True, "note": B64[:400]}],
                "sha256": "b" * 64}
    with pytest.raises(results_check.ResultsError, match=r"dataset_revision\.files\[0\] has unexpected key"):
        results_check.check_dataset_revision(revision, "results.json", "dataset_revision")
    revision["files"][0].pop("note")
    results_check.check_dataset_revision(revision, "results.json", "dataset_revision")
    with pytest.raises(results_check.ResultsError, match="unexpected key"):
        results_check.check_dataset_revision({**revision, "extra": "x"}, "results.json", "dataset_revision")


# ----------------------------------------------------------------------------- 1. exported meta


def test_meta_keeps_the_builders_keys_only():
    meta = {"upstream_qid": 3, "img_id": "abc.jpg", "credentialed": True, "quality_flags": ["empty_question"],
            "structured_answer": {"anatomy": ["left lung"], "measurement": [], "symptom": ["effusion"]},
            "raw_choices": "A: yes B: no", "smuggled": B64[:300]}
    kept, dropped = meta_check.publishable_meta(meta, "knowledge:open record 1")
    assert dropped == ["smuggled"] and "smuggled" not in kept and kept["structured_answer"]["symptom"] == ["effusion"]


@pytest.mark.parametrize("key, value", [
    ("structured_answer", _chunks(B64, 1500, "finding_")),  # export/poc_export.py
    ("structured_answer", {"anatomy": [B64[:1500]]}),
    ("released_response", B64 * 3),
    ("img_id", B64[:300]),
    ("quality_flags", ["x"] * 65),
])
def test_a_known_meta_key_of_the_wrong_shape_stops_the_export(key, value):
    with pytest.raises(meta_check.MetaError, match=f"record 1: meta.{key}"):
        meta_check.publishable_meta({key: value}, "knowledge:open record 1")


def test_an_annotation_file_smuggling_an_image_in_structured_answer_is_not_exported(tmp_path, dataset_cache):
    """export/poc_export.py end to end: the export stops, naming the record and the key, and writes nothing."""
    from medheval.families.medheval import fixtures

    fx = fixtures.write_fixture_benchmark(tmp_path / "fx")
    path = Path(fx["data_dir"]) / fixtures.KNOWLEDGE_OPEN_FILE
    records = json.loads(path.read_text())
    records[0]["structured_answer"] = _chunks(B64, 1500, "finding_")
    path.write_text(json.dumps(records))
    with pytest.raises(hub.PublishError, match=r"knowledge:open record .*meta\.structured_answer"):
        hub.export_all(tmp_path / "out", kinds=["datasets"], names=["knowledge"], data_dir=fx["data_dir"],
                       cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "out").rglob("*.parquet"))


def test_a_gated_parquet_with_meta_keys_no_builder_writes_is_refused_at_push(tmp_path, fixture_benchmark,
                                                                              dataset_cache):
    (repo,) = hub.export_all(tmp_path / "out", kinds=["datasets"], names=["knowledge"],
                             data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    assert repo.gated and hub.check_recorded_files(repo)
    relpath = "open/test-00000-of-00001.parquet"
    path = Path(repo.folder) / relpath
    table = pq.read_table(path)
    metas = table.column("meta").to_pylist()
    metas[0] = json.dumps({**json.loads(metas[0]), "note": "x"})
    table = table.set_column(table.schema.get_field_index("meta"), table.schema.field("meta"),
                             pa.array(metas, type=table.schema.field("meta").type))
    pq.write_table(table, path)
    hub.rewrite_parquet(path, path)
    repo.files[relpath] = hub._sha256(path)  # an attacker who also edits publish.json
    with pytest.raises(CredentialedImageError, match=r"open/test-00000-of-00001\.parquet row 0: meta holds keys"):
        hub.check_recorded_files(repo)


# ------------------------------------------------------------------------------- 1. the scanner


def test_the_scanner_joins_the_values_of_a_json_object():
    """hex and base64 split over the values (or the keys) of an object, escaped as \\u00XX, or in a cell's JSON."""
    hexed = JPEG.hex()
    cases = {
        "b64 values": json.dumps({"generation": {"max_new_tokens": 8, **_chunks(B64, 450, "opt_")}}),
        "hex values": json.dumps({"versions": _chunks(hexed, 480, "layer")}),
        "hex keys": json.dumps({chunk: 1 for chunk in _chunks(hexed, 480, "k").values()}),
        "escaped": json.dumps({key: "".join(f"\\u{ord(c):04x}" for c in value)
                               for key, value in _chunks(B64, 450, "k").items()}).replace("\\\\u", "\\u"),
        "cell json": json.dumps([json.dumps(_chunks(B64, 1000, "k"))]),
        "yaml mapping": "".join(f"{key}: {value}\n" for key, value in _chunks(B64, 450, "k").items()),
    }
    for name, text in cases.items():
        assert content_scan.text_kind(text.encode(), hub.MAGIC_BYTES) in ("base64 text", "hex text"), name


@pytest.mark.parametrize("name, text", [
    ("digest per file", json.dumps([{"relpath": f"s{i}.json", "sha256": f"{i:064x}"} for i in range(300)])),
    ("31 bare digests", json.dumps([f"{i:064x}" for i in range(31)])),
    ("commit in every row", json.dumps([{"config": "ba4586e", "benchmark": "vishal_report"}] * 600)),
    ("provenance", json.dumps({"made_with": {"generation": {"max_new_tokens": 8, "do_sample": False}},
                               "model_revision": {"kind": "hub", "id": "org/m", "commit": "0" * 40}})),
])
def test_ordinary_json_still_passes_the_scanner(name, text):
    assert content_scan.text_kind(text.encode(), hub.MAGIC_BYTES) is None, name


def test_32_bare_digests_in_a_row_read_as_hex_bytes():
    assert content_scan.text_kind(json.dumps([f"{i:064x}" for i in range(32)]).encode()) == "hex text"


# --------------------------------------------------------------------- 2. an image inside a Parquet file


def _polyglot(path: Path) -> None:
    """parq/poc_polyglot.py: the JPEG between the column data and the footer; pyarrow reads the table fine."""
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["q1", "q2"]}), sink)
    data = sink.getvalue()
    cut = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:cut] + JPEG + data[cut:])


def test_rewrite_parquet_drops_bytes_hidden_beside_the_table(tmp_path):
    path = tmp_path / "data" / "test-00000-of-00001.parquet"
    _polyglot(path)
    assert JPEG in path.read_bytes() and pq.read_table(path).num_rows == 2
    hub.rewrite_parquet(path, path)
    assert JPEG[:64] not in path.read_bytes()
    assert pq.read_table(path).to_pylist() == [{"id": "a", "question": "q1"}, {"id": "b", "question": "q2"}]
    again = tmp_path / "again.parquet"
    hub.rewrite_parquet(path, again)
    assert again.read_bytes() == path.read_bytes()  # idempotent: an exported file is uploaded unchanged


def test_push_uploads_a_polyglot_parquet_without_the_image(tmp_path, monkeypatch):
    """The upload gets the Parquet file as its table writes it, in a gated repo and an ungated one."""
    import huggingface_hub

    uploaded: dict[str, bytes] = {}

    class Api:
        def __init__(self, **_: object) -> None:
            pass

        def create_repo(self, *_: object, **__: object) -> None:
            pass

        def update_repo_settings(self, *_: object, **__: object) -> None:
            pass

        def upload_folder(self, repo_id: str, folder_path: str, **_: object) -> str:
            for file in Path(folder_path).rglob("*.parquet"):
                uploaded[f"{repo_id}/{file.name}"] = file.read_bytes()
            return f"https://hub/{repo_id}"

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    repos = []
    for gated in (False,):  # a gated repo is refused earlier: the polyglot lacks the exporter's schema
        folder = tmp_path / f"repo{gated}"
        _polyglot(folder / "data" / "test-00000-of-00001.parquet")
        repos.append(hub.recorded(hub.RepoFolder(str(folder), f"org/x{gated}", "dataset", "datasets", gated=gated)))
    hub.push(repos)
    assert uploaded and all(JPEG[:64] not in data for data in uploaded.values())
    assert all(pq.read_table(io.BytesIO(data)).num_rows == 2 for data in uploaded.values())


def test_an_exported_gated_parquet_is_pushed_rewritten_and_unchanged(tmp_path, fixture_benchmark, dataset_cache):
    (repo,) = hub.export_all(tmp_path / "out", kinds=["datasets"], names=["knowledge"],
                             data_dir=fixture_benchmark["data_dir"], cache_dir=dataset_cache)
    snapshot = hub._snapshot(repo, tmp_path / "copy")
    for relpath, digest in repo.files.items():
        assert hub._sha256(snapshot / relpath) == digest, relpath


# -------------------------------------------------------------------- 3. pixels as numbers or text


def _folder(tmp_path: Path, name: str, data: bytes) -> hub.RepoFolder:
    folder = tmp_path / name.split(".")[0]
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    return hub.RepoFolder(str(folder), "org/x", "dataset", "datasets")


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


HOSTILE = {  # parq/poc_parquet.py, parq/poc_latin1.py
    "flat_int_column.parquet": lambda: _parquet(pa.table({"pixel": pa.array(PIXELS.ravel().astype("int64"))})),
    "float_list.parquet": lambda: _parquet(pa.table({"id": ["a"], "emb": [list((PIXELS.ravel() / 255.0)
                                                                              .astype("float32"))]})),
    "int16_rows.parquet": lambda: _parquet(pa.table({"row": [list(map(int, r)) for r in PIXELS.astype("int16")]})),
    "pixel_per_row_strings.parquet": lambda: _parquet(pa.table({"answer": [str(v) for v in PIXELS.ravel()]})),
    "pixels_floats.csv": lambda: ",".join(f"{v / 255:.3f}" for v in PIXELS.ravel()).encode(),
    "pixels_colon.txt": lambda: ":".join(str(v) for v in PIXELS.ravel()).encode(),
    "pixels_16bit.json": lambda: json.dumps([int(v) * 257 for v in PIXELS.ravel()]).encode(),
    "pixels_in_object.json": lambda: json.dumps({f"p{i}": int(v) for i, v in enumerate(PIXELS.ravel())}).encode(),
    "hex_bytes.txt": lambda: ":".join(f"{b:02x}" for b in JPEG).encode(),
    "notes.md": lambda: JPEG.decode("latin-1").encode("utf-8"),
    "card.json": lambda: json.dumps({"text": JPEG.decode("latin-1")}).encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_pixels_as_numbers_or_characters_are_refused(tmp_path, name):
    with pytest.raises(CredentialedImageError, match=name.replace(".", r"\.")):
        hub.check_no_credentialed_bytes(_folder(tmp_path, name, HOSTILE[name]()))


PLAIN = {
    "results.md": ("| model | split | accuracy | f1 | n |\n|---|---|---|---|---|\n" + "".join(
        f"| model-{i} | mm_vishal:all | {i / 300:.3f} | {i / 310:.3f} | {i} |\n" for i in range(300))).encode(),
    "scores.csv": ("\n".join(f"{i / 7:.4f},{i / 9:.4f}" for i in range(200))).encode(),  # 400 floats in a row
    "french.md": ("Le cœur est de taille normale; épanchement pleural à gauche, très discret. " * 200).encode(),
    "symbols.md": ("Dose 5 µg ± 0.5 at 37 °C, 3 × daily. " * 300).encode(),
    "numbers_few.parquet": _parquet(pa.table({"id": [f"r{i}" for i in range(100)], "score": [i / 100 for i in
                                                                                             range(100)]})),
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_legitimate_tables_and_prose_still_pass(tmp_path, name):
    hub.check_no_credentialed_bytes(_folder(tmp_path, name, PLAIN[name]))


def test_number_thresholds_on_both_sides():
    assert content_scan.number_run(b", ".join(b"%d" % (i % 256) for i in range(511))) is None
    assert content_scan.number_run(b", ".join(b"%d" % (i % 256) for i in range(512))) == "list of byte values"
    assert content_scan.number_run(b"; ".join(b"%.2f" % (i / 3) for i in range(1023))) is None
    assert content_scan.number_run(b"; ".join(b"%.2f" % (i / 3) for i in range(1024))) == "list of numbers"
    assert content_scan.number_run(b" ".join(b"row%d: 1 2 3" % i for i in range(2000))) is None  # labels break runs


def test_latin1_threshold_on_both_sides():
    text = ("a" * 800 + "\u00ff" * 224).encode()  # 22% of 1024
    assert not content_scan.latin1_text(text)
    assert content_scan.latin1_text(("a" * 760 + "\u00ff" * 264).encode())  # 26%
    assert content_scan.latin1_text(("a" * 760 + "\\u00ff" * 264).encode())  # as JSON escapes

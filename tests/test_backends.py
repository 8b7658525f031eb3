"""Backends: the HF backend on a tiny random LLaVA built in the test, and the predictions file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from medheval.backends import Backend, BackendError, PredictionsFileBackend
from medheval.backends.hf import HFBackend
from medheval.backends.tiny import build_tiny_llava
from medheval.run.prompts import PROMPT_VERSION

ANSWER_TYPES = ["yes_no", "open", "multiple_choice", "report", "statement"]
QUESTION_WORDS = (
    "is there a pleural effusion in the left lower lobe of this chest x ray with cardiomegaly "
    "and pulmonary edema or a fracture of the rib"
).split()


def make_records(n: int, seed: int = 0, images_per_record=lambda i: 1):
    """``n`` canonical records with varying prompt lengths and answer types, and their images."""
    rs = np.random.RandomState(seed)
    records, images = [], []
    for i in range(n):
        answer_type = ANSWER_TYPES[i % len(ANSWER_TYPES)]
        question = " ".join(rs.choice(QUESTION_WORDS, rs.randint(2, 18))) + "?"
        choices = ["liver", "spleen", "kidney", "heart"][: rs.randint(2, 5)] if answer_type == "multiple_choice" else []
        records.append(
            {
                "id": f"test/cfg/{i}",
                "benchmark": "test",
                "config": "cfg",
                "images": [f"img{i}.png"],
                "question": question,
                "answer": "yes",
                "answer_type": answer_type,
                "choices": choices,
                "category": "anatomy",
                "source": "slake",
                "meta": {},
            }
        )
        imgs = []
        for _ in range(images_per_record(i)):
            h, w = rs.randint(16, 64, size=2)
            imgs.append(Image.fromarray((rs.rand(h, w, 3) * 255).astype("uint8")))
        images.append(imgs)
    return records, images


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("tiny-llava")
    model, processor = build_tiny_llava(seed=0, save_dir=str(save_dir))
    return model, processor, save_dir


# -- HF backend ---------------------------------------------------------------------------


def test_outputs_are_strings_one_per_record(tiny):
    model, processor, _ = tiny
    records, images = make_records(7)
    backend = HFBackend(model, processor, batch_size=3, max_new_tokens=6)
    assert isinstance(backend, Backend)
    assert backend.needs_images is True
    outputs = backend.generate(records, images)
    assert len(outputs) == len(records)
    assert all(isinstance(o, str) and o for o in outputs)
    assert all(o == o.strip() for o in outputs)
    assert len(set(outputs)) > 1  # the prompt/image actually matter


def test_batch_size_invariance(tiny):
    model, processor, _ = tiny
    records, images = make_records(12, seed=1)
    reference = HFBackend(model, processor, batch_size=1, max_new_tokens=12).generate(records, images)
    for bs in (4, 8):
        outputs = HFBackend(model, processor, batch_size=bs, max_new_tokens=12).generate(records, images)
        assert outputs == reference, f"batch_size={bs} changed the outputs"


def test_batch_invariance_with_mixed_image_counts(tiny):
    model, processor, _ = tiny
    records, images = make_records(8, seed=2, images_per_record=lambda i: [1, 2, 0][i % 3])
    reference = HFBackend(model, processor, batch_size=1, max_new_tokens=8).generate(records, images)
    assert HFBackend(model, processor, batch_size=8, max_new_tokens=8).generate(records, images) == reference


def test_images_change_the_answer(tiny):
    model, processor, _ = tiny
    records, images = make_records(1)
    other = [[Image.new("RGB", (30, 30), (255, 0, 0))]]
    backend = HFBackend(model, processor, max_new_tokens=10)
    assert backend.generate(records, images) != backend.generate(records, other)


def test_save_and_reload_through_from_pretrained(tiny):
    model, processor, save_dir = tiny
    records, images = make_records(5, seed=3)
    in_memory = HFBackend(model, processor, batch_size=2, max_new_tokens=8).generate(records, images)
    loaded = HFBackend(str(save_dir), batch_size=2, max_new_tokens=8, dtype="float32", device="cpu")
    assert loaded.name == str(save_dir)
    assert loaded.generate(records, images) == in_memory
    assert loaded.settings()["random_weights"] is True


def test_seeded_sampling_is_reproducible(tiny):
    model, processor, _ = tiny
    records, images = make_records(6, seed=4)

    def sample(seed):
        backend = HFBackend(
            model, processor, batch_size=3, max_new_tokens=10, do_sample=True, temperature=1.0, top_p=0.95, seed=seed
        )
        return backend.generate(records, images)

    first = sample(seed=11)
    assert sample(seed=11) == first
    assert sample(seed=12) != first
    greedy = HFBackend(model, processor, batch_size=3, max_new_tokens=10).generate(records, images)
    assert first != greedy


def test_fallback_prompt_without_chat_template(tiny):
    model, processor, _ = tiny
    backend = HFBackend(model, processor)
    records, images = make_records(3)
    with_template = backend.format_prompt(records[0], 1)
    backend._use_chat_template = False
    fallback = backend.format_prompt(records[0], 1)
    assert fallback.startswith("USER: <image>\n") and fallback.endswith(" ASSISTANT:")
    assert with_template.strip() == fallback.strip()  # the tiny template is LLaVA-1.5 style too
    assert len(backend.generate(records, images)) == 3


def test_prompt_comes_from_medheval_prompts(tiny):
    model, processor, _ = tiny
    backend = HFBackend(model, processor)
    rec = {"id": "a/b/c", "question": "Is the heart enlarged?", "answer_type": "yes_no", "choices": []}
    assert "Is the heart enlarged? Please answer Yes or No." in backend.format_prompt(rec, 1)
    with pytest.raises(ValueError, match="a/b/c"):
        backend.generate([dict(rec, answer_type="bogus")], [[]])


def test_settings_record_generation_and_mark_random_weights(tiny, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_doNotLeakThisValue123")
    model, processor, _ = tiny
    backend = HFBackend(model, processor, batch_size=4, max_new_tokens=16, seed=5, generate_kwargs={"num_beams": 1})
    settings = backend.settings()
    json.dumps(settings)
    assert settings["model"] == backend.name == "tiny-random-llava"
    assert settings["random_weights"] is True
    assert settings["prompt_version"] == PROMPT_VERSION
    expected = {"batch_size": 4, "max_new_tokens": 16, "do_sample": False, "seed": 5, "dtype": "float32"}
    assert expected.items() <= settings.items()
    for key in ("temperature", "top_p", "device"):
        assert key in settings
    assert settings["generate_kwargs"] == {"num_beams": 1}
    assert "hf_doNotLeakThisValue123" not in json.dumps(settings)
    backend.device = "cuda:1"  # a data-parallel process's device: recorded as the type, as a single process's
    assert backend.settings()["device"] == "cuda"
    for key in settings:
        assert not any(word in key.lower() for word in ("hf_token", "access_token", "api_key", "password", "authorization", "secret"))


def test_mismatched_images_length_is_an_error(tiny):
    model, processor, _ = tiny
    records, images = make_records(3)
    with pytest.raises(BackendError, match="3 records but 2 image lists"):
        HFBackend(model, processor).generate(records, images[:2])


def test_missing_local_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(BackendError) as err:
        HFBackend(str(missing))
    assert str(missing) in str(err.value)
    assert "local directory" in str(err.value)


def test_unloadable_hub_id_offline_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(BackendError) as err:
        HFBackend("medheval-test/no-such-model")
    message = str(err.value)
    assert "medheval-test/no-such-model" in message
    assert "local directory" in message and "HF_HUB_OFFLINE" in message


# -- predictions file ---------------------------------------------------------------------


def write_jsonl(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def test_predictions_file_valid(tmp_path):
    path = write_jsonl(
        tmp_path / "preds.jsonl",
        [
            {"id": "b/c/1", "prediction": "Yes", "model": "my-vlm"},
            "",
            {"id": "b/c/2", "prediction": "No, there is no effusion.", "model": "my-vlm", "latency_s": 0.3},
        ],
    )
    backend = PredictionsFileBackend(path)
    assert isinstance(backend, Backend)
    assert backend.needs_images is False
    assert backend.name == "my-vlm"
    assert backend.ids() == ["b/c/1", "b/c/2"]
    records = [{"id": "b/c/2"}, {"id": "b/c/1"}]
    assert backend.generate(records, [[], []]) == ["No, there is no effusion.", "Yes"]
    settings = backend.settings()
    json.dumps(settings)
    assert settings["num_predictions"] == 2 and len(settings["sha256"]) == 64
    assert PredictionsFileBackend(path, name="other").name == "other"


def test_predictions_file_name_defaults_to_stem(tmp_path):
    path = write_jsonl(tmp_path / "llava-med.jsonl", [{"id": "b/c/1", "prediction": "Yes"}])
    assert PredictionsFileBackend(path).name == "llava-med"


def test_predictions_file_invalid_json_names_line(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"id": "b/c/1", "prediction": "Yes"}, {"id": "b/c/2", "prediction": "No"}, '{"id": "b/c/3", "prediction": '],
    )
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    assert "line 3" in str(err.value) and "invalid JSON" in str(err.value)


def test_predictions_file_missing_keys_and_wrong_types(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "b/c/1", "text": "Yes"},
            {"prediction": "No"},
            {"id": "b/c/3", "prediction": 1},
            {"id": "b/c/4", "prediction": None},
            ["not", "an", "object"],
        ],
    )
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    message = str(err.value)
    assert "line 1" in message and "'prediction'" in message and "'text'" in message
    assert "line 2" in message and "'id'" in message
    assert "line 3" in message and "must be a string" in message
    assert "line 4" in message
    assert "line 5" in message
    assert '"prediction"' in message  # the expected shape is shown


def test_predictions_file_null_and_odd_values_say_what_to_write(tmp_path):
    """A null prediction said ``got NoneType`` (Python's word) and not what to do; a non-string ``mitigation`` was
    accepted and recorded in results.json as the text of a Python dict."""
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "b/c/1", "prediction": None},
        '{"id": "b/c/2", "prediction": NaN}',
        {"id": "b/c/3", "prediction": "yes", "mitigation": {"alpha": 1}},
        {"id": "b/c/4", "prediction": "yes", "control": ["blank"]},
    ])
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    message = str(err.value)
    assert ("line 1 (id 'b/c/1'): 'prediction' must be a string, got null: write \"\" for an empty answer, or leave "
            "the line out and pass --allow-missing-predictions") in message
    assert "line 2 (id 'b/c/2'): 'prediction' must be a string, got a number (nan)" in message
    assert ("line 3 (id 'b/c/3'): 'mitigation' must be a string, as a run writes it (e.g. \"none\" or "
            "\"vcd:alpha=1\"), got an object") in message
    assert "line 4 (id 'b/c/4'): 'control' must be a string" in message and "got an array" in message
    assert "NoneType" not in message


@pytest.mark.parametrize("name,content,said,command", [
    ("preds.csv", 'id,prediction\nb/c/1,yes\n"b/c/2","no, none"\n', "looks like a CSV table (columns ['id', 'prediction'])",
     "csv.DictReader"),
    ("preds.tsv", "id\tprediction\nb/c/1\tyes\n", "looks like a TSV table", 'delimiter="\\t"'),
    ("answers.csv", "qid,answer\n1,yes\n", "columns ['qid', 'answer']",
     "name the columns holding the record id and the model output 'id' and 'prediction', then python -c"),
    ("preds.json", '[\n {"id": "b/c/1", "prediction": "yes"},\n {"id": "b/c/2", "prediction": "no"}\n]\n',
     "looks like one JSON array", "json.load"),
    ("one.json", '[{"id": "b/c/1", "prediction": "yes"}]\n', "looks like one JSON array", "json.load"),
    ("pretty.jsonl", '{\n  "id": "b/c/1",\n  "prediction": "yes"\n}\n', "one JSON document spread over several lines",
     "json.load"),
])
def test_predictions_file_in_another_format_says_so_and_how_to_convert(tmp_path, name, content, said, command):
    """A CSV, TSV or JSON-array file got one "invalid JSON" per line (cut off at 2,000 characters on the command line,
    with the expected shape at its end) and no word of the format or of what to do. The hint comes first, and its
    command converts the file (run here on the CSV and JSON ones)."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    message = str(err.value)
    head = message.split("\n")[0]
    assert head.startswith(f"predictions file {str(path)!r} has ") and said in head and command in head
    assert "not JSON Lines (one JSON object per line" in head and "Convert it:" in head
    if name in ("preds.csv", "preds.json", "pretty.jsonl"):
        import shlex
        from pathlib import Path
        import subprocess
        import sys

        converted = head.split("Convert it: ", 1)[1].rstrip(":")
        program, _, target = converted.partition(" > ")
        argv = shlex.split(program)
        out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, check=True).stdout
        Path(shlex.split(target)[0]).write_text(out, encoding="utf-8")
        backend = PredictionsFileBackend(shlex.split(target)[0])
        assert backend.ids()[0] == "b/c/1"


@pytest.mark.parametrize("content", [
    '{"id": "b/c/1", "prediction": "he said "hi""}\n{"id": "b/c/2", "prediction": "no"}\n',  # unescaped quote
    '{"id": "b/c/1", "prediction": "yes"\n{"id": "b/c/2", "prediction": "no"}\n',  # a truncated first line
    '{"id": "b/c/1", "prediction": "yes"},\n{"id": "b/c/2", "prediction": "no"},\n',  # trailing commas
    '["b/c/1", "yes"]\n["b/c/2", "no"]\n',  # one array per line: not one JSON array
    'x{"id": "b/c/1", "prediction": "yes, no"}\n{"id": "b/c/2", "prediction": "no"}\n',  # a stray byte, a comma
])
def test_predictions_file_broken_first_line_is_not_called_another_format(tmp_path, content):
    """A JSON Lines file whose first line is broken was told it 'looks like one JSON document spread over several
    lines' (or a CSV table) and given a command that fails on it: the hint is only given when the whole file is one
    JSON document, or, for a table, when no line is a JSON object."""
    path = tmp_path / "preds.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    head = str(err.value).split("\n")[0]
    assert "looks like" not in head and "Convert it" not in head
    assert head.endswith("problem(s):")


def test_predictions_file_json_array_with_byte_order_mark_converts(tmp_path):
    """The JSON commands open the file as utf-8-sig: a file with a byte order mark (skipped by the reader, so it got
    the hint) made the suggested command fail with 'Unexpected UTF-8 BOM'."""
    import shlex
    import subprocess
    import sys

    path = tmp_path / "with bom's.json"
    path.write_text('\ufeff[{"id": "b/c/1", "prediction": "yes"}]\n', encoding="utf-8")
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    head = str(err.value).split("\n")[0]
    assert "looks like one JSON array" in head
    program, _, target = head.split("Convert it: ", 1)[1].rstrip(":").partition(" > ")
    out = subprocess.run([sys.executable, *shlex.split(program)[1:]], capture_output=True, text=True, check=True).stdout
    (tmp_path / shlex.split(target)[0]).write_text(out, encoding="utf-8")
    assert PredictionsFileBackend(shlex.split(target)[0]).ids() == ["b/c/1"]


@pytest.mark.parametrize("name,content", [
    ("upper.csv", "ID,Prediction\nb/c/1,yes\n"),
    ("spaced.csv", 'id, prediction\nb/c/1,"yes, small"\n'),
    ("upper.tsv", "Id\tPREDICTION\nb/c/1\tyes\n"),
])
def test_predictions_table_with_other_case_or_spaced_header_converts(tmp_path, name, content):
    """The hint matched the header case- and space-blind ('ID,Prediction' needs no renaming) but its command read
    r["id"] and r["prediction"] exactly: it stopped with KeyError: 'id'."""
    import shlex
    import subprocess
    import sys

    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    head = str(err.value).split("\n")[0]
    converted = head.split("Convert it: ", 1)[1].rstrip(":")
    assert converted.startswith("python -c")  # no renaming asked
    program, _, target = converted.partition(" > ")
    out = subprocess.run([sys.executable, *shlex.split(program)[1:]], capture_output=True, text=True, check=True).stdout
    (tmp_path / "out.jsonl").write_text(out, encoding="utf-8")
    backend = PredictionsFileBackend(tmp_path / "out.jsonl")
    assert backend.ids() == ["b/c/1"]


@pytest.mark.parametrize("name", ["preds.JSONL", "preds.Jsonl"])
def test_predictions_hint_never_writes_over_its_source(tmp_path, name):
    """'preds.JSONL' holding a JSON array was told to convert itself '> preds.jsonl': on a case-insensitive file
    system (macOS, Windows) that is the same file, emptied by the shell before the command reads it."""
    import shlex

    path = tmp_path / name
    path.write_text('[{"id": "b/c/1", "prediction": "yes"}]\n', encoding="utf-8")
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    head = str(err.value).split("\n")[0]
    target = shlex.split(head.split("Convert it: ", 1)[1].rstrip(":").partition(" > ")[2])[0]
    assert target.lower() != str(path).lower() and target == str(tmp_path / "preds-lines.jsonl")


def test_predictions_file_reports_all_duplicates(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "b/c/1", "prediction": "Yes"},
            {"id": "b/c/2", "prediction": "No"},
            {"id": "b/c/1", "prediction": "No"},
            {"id": "b/c/2", "prediction": "Yes"},
            {"id": "b/c/1", "prediction": "Yes"},
        ],
    )
    with pytest.raises(BackendError) as err:
        PredictionsFileBackend(path)
    message = str(err.value)
    assert "'b/c/1' on lines 1, 3, 5" in message
    assert "'b/c/2' on lines 2, 4" in message


def test_predictions_file_missing_ids(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": "b/c/0", "prediction": "Yes"}, {"id": "extra/1", "prediction": "x"}])
    backend = PredictionsFileBackend(path)
    records = [{"id": f"b/c/{i}"} for i in range(30)]
    missing, extra = backend.check_against([r["id"] for r in records])
    assert missing == [f"b/c/{i}" for i in range(1, 30)]
    assert extra == ["extra/1"]
    with pytest.raises(BackendError) as err:
        backend.generate(records, [[] for _ in records])
    message = str(err.value)
    assert "29 id(s)" in message and "'b/c/1'" in message and "'b/c/20'" in message
    assert "'b/c/21'" not in message and "9 more" in message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_predictions_file_empty(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BackendError, match="empty"):
        PredictionsFileBackend(path)


def test_predictions_file_not_found(tmp_path):
    with pytest.raises(BackendError, match="does not exist"):
        PredictionsFileBackend(tmp_path / "nope.jsonl")

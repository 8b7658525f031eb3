"""CheXbert backend and the chexbert_similarity metric on a tiny random checkpoint in the real layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO

from medheval.labelers import CONDITIONS
from medheval.labelers.chexbert import (
    CHEXBERT_PATH_ENV,
    CHEXBERT_TOKENIZER_ENV,
    CheXbertCheckpointError,
    CheXbertLabeler,
    CheXbertTokenizerMissing,
    CheXbertWeightsMissing,
    build_random_chexbert,
    get_chexbert_labeler,
)

METRIC_DIR = str(REPO / "metrics" / "chexbert_similarity")

REPORTS = [
    "No acute cardiopulmonary process.",
    "Mild cardiomegaly.\n\nSmall left pleural effusion. No pneumothorax.",
    "",
    "Endotracheal tube in place. Right basilar atelectasis, possible pneumonia cannot be excluded.",
    "The lungs are clear. Heart size is normal.",
    "   Stable   moderate  pulmonary edema , unchanged since prior.  ",
    "New rib fracture (left).",
    "Opacity " * 40,
    "Lung nodule, likely lesion. Pacemaker device seen.",
    "no",
    "Cardiomediastinal silhouette within normal limits; no effusion, no consolidation.",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """chexbert.pth + config.json + vocab.txt in one folder (the layout the loader expects)."""
    return build_random_chexbert(tmp_path_factory.mktemp("chexbert"))


@pytest.fixture(scope="module")
def labeler(tiny) -> CheXbertLabeler:
    return CheXbertLabeler(tiny, device="cpu", batch_size=4)


def _raw(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _save_variant(src: Path, folder: Path, edit) -> Path:
    """Copy the tiny model's folder and write an edited checkpoint into it."""
    shutil.copytree(src.parent, folder)
    checkpoint = _raw(src)
    edit(checkpoint)
    torch.save(checkpoint, folder / "chexbert.pth")
    return folder / "chexbert.pth"


# ------------------------------------------------------------------------------------------------
# the file layout and loading


def test_tiny_checkpoint_has_the_real_layout(tiny):
    checkpoint = _raw(tiny)
    assert set(checkpoint) == {"epoch", "model_state_dict", "optimizer_state_dict"}
    keys = list(checkpoint["model_state_dict"])
    assert all(key.startswith("module.") for key in keys)
    assert "module.bert.embeddings.word_embeddings.weight" in keys
    assert "module.bert.pooler.dense.weight" in keys
    heads = [checkpoint["model_state_dict"][f"module.linear_heads.{i}.weight"].shape for i in range(14)]
    assert heads == [torch.Size([4, 32])] * 13 + [torch.Size([2, 32])]
    assert "module.linear_heads.14.weight" not in keys
    assert {p.name for p in tiny.parent.iterdir()} >= {"chexbert.pth", "config.json", "vocab.txt"}


def test_loads_and_labels_with_the_allowed_values(labeler):
    labels = labeler.label(REPORTS)
    assert len(labels) == len(REPORTS)
    assert all(len(row) == len(CONDITIONS) == 14 for row in labels)
    for row in labels:
        assert all(value in (1, 0, -1, None) for value in row[:13])
        assert row[13] in (1, None)  # No Finding: blank or positive only
        assert all(value is None or type(value) is int for value in row)
    assert labeler.name == "chexbert"
    assert list(labeler.label_dicts(REPORTS[:1])[0]) == list(CONDITIONS)


def test_class_index_to_label_mapping_through_the_file(tmp_path):
    # CheXbert CLASS_MAPPING: 0 blank, 1 positive, 2 negative, 3 uncertain -> None, 1, 0, -1
    classes = [0, 1, 2, 3, 3, 2, 1, 0, 2, 2, 3, 1, 0, 1]
    path = build_random_chexbert(tmp_path / "fixed", head_classes=classes)
    labels = CheXbertLabeler(path, device="cpu").label(REPORTS[:3])
    expected = [None, 1, 0, -1, -1, 0, 1, None, 0, 0, -1, 1, None, 1]
    assert labels == [expected] * 3
    blank = build_random_chexbert(tmp_path / "blank", head_classes=[0] * 14)
    assert CheXbertLabeler(blank, device="cpu").label(["x"]) == [[None] * 14]


def test_deterministic_and_independent_of_batch_size_and_order(labeler):
    first, second = labeler.label(REPORTS), labeler.label(REPORTS)
    assert first == second
    assert labeler.label(REPORTS, batch_size=1) == labeler.label(REPORTS, batch_size=8) == first
    e1 = labeler.embed(REPORTS, batch_size=1)
    e8 = labeler.embed(REPORTS, batch_size=8)
    assert torch.equal(labeler.embed(REPORTS, batch_size=8), e8)
    torch.testing.assert_close(e1, e8, atol=1e-5, rtol=1e-5)
    reversed_embeddings = labeler.embed(REPORTS[::-1], batch_size=3)
    torch.testing.assert_close(reversed_embeddings.flip(0), e8, atol=1e-5, rtol=1e-5)
    labels, embeddings = labeler.label_and_embed(REPORTS, batch_size=8)
    assert labels == first and torch.equal(embeddings, e8)


def test_embed_is_the_final_layer_cls_state(labeler):
    embeddings = labeler.embed(REPORTS)
    assert embeddings.shape == (len(REPORTS), 32) and embeddings.dtype == torch.float32
    assert labeler.embed([]).shape == (0, 32)
    ids = labeler.encode(REPORTS[:1])
    with torch.inference_mode():
        out = labeler.model.bert(input_ids=torch.tensor(ids),
                                 attention_mask=torch.ones(1, len(ids[0]), dtype=torch.long))
    torch.testing.assert_close(embeddings[0], out.last_hidden_state[0, 0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(embeddings[0], out.pooler_output[0])  # raw [CLS], not BERT's pooler


def test_text_preparation_and_truncation_match_chexbert(labeler):
    from transformers.models.bert import BertTokenizerLegacy

    slow = BertTokenizerLegacy.from_pretrained(str(labeler.tokenizer_dir))
    cls, sep = slow.cls_token_id, slow.sep_token_id
    texts = REPORTS + ["effusion " * 600]
    for text, ids in zip(texts, labeler.encode(texts)):
        # upstream bert_tokenizer.tokenize: tokenize, encode_plus, cut to 511 + [SEP]; empty -> [CLS, SEP]
        cleaned = " ".join(text.strip().replace("\n", " ").split())
        tokens = slow.tokenize(cleaned)
        expected = [cls] + slow.convert_tokens_to_ids(tokens) + [sep] if tokens else [cls, sep]
        if len(expected) > 512:
            expected = expected[:511] + [sep]
        assert ids == expected
    assert len(labeler.encode(["effusion " * 600])[0]) == 512
    assert labeler.encode([""]) == [[cls, sep]]
    assert labeler.encode(["No  acute\n\nprocess. "]) == labeler.encode(["no acute process."])


def test_accepts_old_transformers_buffers_and_unprefixed_keys(tiny, tmp_path):
    def add_buffers(checkpoint):
        state = checkpoint["model_state_dict"]
        state["module.bert.embeddings.position_ids"] = torch.arange(512).unsqueeze(0)

    with_buffers = _save_variant(tiny, tmp_path / "buffers", add_buffers)
    reference = CheXbertLabeler(tiny, device="cpu").embed(REPORTS[:2])
    torch.testing.assert_close(CheXbertLabeler(with_buffers, device="cpu").embed(REPORTS[:2]), reference)

    def unprefix(checkpoint):
        checkpoint["model_state_dict"] = {k[len("module."):]: v for k, v in checkpoint["model_state_dict"].items()}

    plain = _save_variant(tiny, tmp_path / "plain", unprefix)
    torch.testing.assert_close(CheXbertLabeler(plain, device="cpu").embed(REPORTS[:2]), reference)


def test_loads_the_legacy_pre_zip_format(tiny, tmp_path):
    # the released chexbert.pth dates from torch 1.4, before the zip serialisation (no mmap there)
    folder = tmp_path / "legacy"
    shutil.copytree(tiny.parent, folder)
    torch.save(_raw(tiny), folder / "chexbert.pth", _use_new_zipfile_serialization=False)
    reference = CheXbertLabeler(tiny, device="cpu")
    legacy = CheXbertLabeler(folder / "chexbert.pth", device="cpu")
    assert legacy.label(REPORTS) == reference.label(REPORTS)
    torch.testing.assert_close(legacy.embed(REPORTS), reference.embed(REPORTS))


# ------------------------------------------------------------------------------------------------
# wrong checkpoints and missing files


@pytest.mark.parametrize("case, needle", [
    ("missing_key", "missing keys: linear_heads.13.bias"),
    ("extra_key", "unexpected keys: linear_heads.14.weight"),
    ("wrong_shape", "wrong shapes (checkpoint vs model): linear_heads.13.weight (4, 32) (model: (2, 32))"),
    ("encoder_key_removed", "missing keys: bert.encoder.layer.1.output.LayerNorm.weight"),
    ("no_model_state_dict", "has no 'model_state_dict'"),
    ("mixed_prefix", "some keys have the 'module.' prefix and some do not"),
])
def test_mismatched_checkpoint_is_a_clear_error(tiny, tmp_path, case, needle):
    def edit(checkpoint):
        state = checkpoint["model_state_dict"]
        if case == "missing_key":
            del state["module.linear_heads.13.bias"]
        elif case == "extra_key":
            state["module.linear_heads.14.weight"] = torch.zeros(4, 32)
        elif case == "wrong_shape":
            state["module.linear_heads.13.weight"] = torch.zeros(4, 32)
        elif case == "encoder_key_removed":
            del state["module.bert.encoder.layer.1.output.LayerNorm.weight"]
        elif case == "no_model_state_dict":
            checkpoint["state_dict"] = checkpoint.pop("model_state_dict")
        elif case == "mixed_prefix":
            state["linear_heads.0.weight"] = state.pop("module.linear_heads.0.weight")

    path = _save_variant(tiny, tmp_path / case, edit)
    with pytest.raises(CheXbertCheckpointError) as info:
        CheXbertLabeler(path, device="cpu")
    message = str(info.value)
    assert needle in message
    assert str(path) in message
    assert "chexbert.pth" in message  # says what file is expected


def test_config_that_does_not_match_the_checkpoint_names_the_shapes(tiny, tmp_path):
    folder = tmp_path / "other_config"
    shutil.copytree(tiny.parent, folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"], config["num_attention_heads"] = 64, 4
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheXbertCheckpointError, match=r"wrong shapes .*bert\.embeddings\.word_embeddings\.weight"):
        CheXbertLabeler(folder / "chexbert.pth", device="cpu")


def test_file_that_is_not_a_checkpoint(tmp_path, tiny):
    folder = tmp_path / "junk"
    shutil.copytree(tiny.parent, folder)
    (folder / "chexbert.pth").write_text("not a checkpoint")
    with pytest.raises(CheXbertCheckpointError, match="cannot read .* as a PyTorch checkpoint"):
        CheXbertLabeler(folder / "chexbert.pth", device="cpu")
    torch.save([1, 2, 3], folder / "chexbert.pth")
    with pytest.raises(CheXbertCheckpointError, match="has no 'model_state_dict'"):
        CheXbertLabeler(folder / "chexbert.pth", device="cpu")


def test_missing_tokenizer_is_a_clear_error(tiny, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tiny, alone / "chexbert.pth")
    with pytest.raises(CheXbertTokenizerMissing) as info:
        CheXbertLabeler(alone / "chexbert.pth", device="cpu")
    message = str(info.value)
    assert "bert-base-uncased" in message and "vocab.txt" in message and "hf download bert-base-uncased" in message
    assert str(alone) in message and "tokenizer_path" in message
    with pytest.raises(CheXbertTokenizerMissing, match="not found: .*nowhere"):
        CheXbertLabeler(alone / "chexbert.pth", tokenizer_path=tmp_path / "nowhere", device="cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheXbertTokenizerMissing, match="has no tokenizer file"):
        CheXbertLabeler(alone / "chexbert.pth", tokenizer_path=empty, device="cpu")
    # the tokenizer folder given explicitly, or in a bert-base-uncased/ subfolder next to the checkpoint
    assert CheXbertLabeler(alone / "chexbert.pth", tokenizer_path=tiny.parent, device="cpu").label(["no"])
    shutil.copytree(tiny.parent, alone / "bert-base-uncased", ignore=shutil.ignore_patterns("*.pth"))
    assert CheXbertLabeler(alone / "chexbert.pth", device="cpu").tokenizer_dir == alone / "bert-base-uncased"


def test_missing_checkpoint_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv(CHEXBERT_PATH_ENV, raising=False)
    with pytest.raises(CheXbertWeightsMissing, match="CheXbert checkpoint not found: .*nope.pth"):
        CheXbertLabeler(tmp_path / "nope.pth")
    monkeypatch.setenv(CHEXBERT_PATH_ENV, str(tmp_path / "env.pth"))
    with pytest.raises(CheXbertWeightsMissing, match=rf"env\.pth \(from \${CHEXBERT_PATH_ENV}\)"):
        get_chexbert_labeler()


def test_shared_labeler_is_loaded_once(tiny, monkeypatch):
    monkeypatch.setenv(CHEXBERT_PATH_ENV, str(tiny))
    monkeypatch.setenv(CHEXBERT_TOKENIZER_ENV, str(tiny.parent))
    first = get_chexbert_labeler(device="cpu")
    assert get_chexbert_labeler(str(tiny), device="cpu") is first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matches_cpu(tiny, labeler):
    gpu = CheXbertLabeler(tiny, device="cuda")
    assert gpu.label(REPORTS) == labeler.label(REPORTS)
    torch.testing.assert_close(gpu.embed(REPORTS), labeler.embed(REPORTS), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------------
# the evaluate module


@pytest.fixture(scope="module")
def metric():
    import evaluate

    return evaluate.load(METRIC_DIR)


def test_metric_identical_reports_score_one(metric, tiny):
    results = metric.compute(predictions=REPORTS, references=REPORTS, chexbert_path=str(tiny), device="cpu")
    assert results["n"] == len(REPORTS)
    assert len(results["similarities"]) == len(REPORTS)
    for value in results["similarities"]:
        assert value == pytest.approx(1.0, abs=1e-6)
    assert results["chexbert_similarity"] == pytest.approx(1.0, abs=1e-6)
    assert results["chexbert_similarity_std"] == pytest.approx(0.0, abs=1e-6)


def test_metric_values_per_item_and_caching(metric, tiny, labeler):
    predictions, references = REPORTS, REPORTS[::-1]
    results = metric.compute(predictions=predictions, references=references, chexbert_path=str(tiny),
                             device="cpu", batch_size=3)
    assert -1.0 <= results["chexbert_similarity"] <= 1.0
    assert len(results["similarities"]) == results["n"] == len(predictions)
    assert all(-1.0 - 1e-9 <= value <= 1.0 + 1e-9 for value in results["similarities"])
    expected = torch.nn.functional.cosine_similarity(labeler.embed(references).double(),
                                                     labeler.embed(predictions).double(), dim=1)
    assert results["similarities"] == pytest.approx(expected.tolist(), abs=1e-5)
    mean = sum(results["similarities"]) / len(predictions)
    assert results["chexbert_similarity"] == pytest.approx(mean)
    metric.compute(predictions=predictions[:2], references=references[:2], chexbert_path=str(tiny), device="cpu")
    assert len(metric._chexbert_labelers) == 1  # the model was loaded once for both calls


def test_metric_upstream_compat_prepares_predictions_as_medheval(metric, tiny):
    module = __import__(type(metric).__module__, fromlist=["upstream_prediction"])
    assert module.upstream_prediction("No.") == "No report generated."
    assert module.upstream_prediction("Assistant: Heart size is normal.") == " Heart size is normal."
    assert module.upstream_prediction("Pneumothorax is present") == "Pneumothorax is prese"  # upstream's char strip
    results = metric.compute(predictions=["No."], references=["No report generated."], chexbert_path=str(tiny),
                             device="cpu", upstream_compat=True)
    assert results["similarities"][0] == pytest.approx(1.0, abs=1e-6)


def test_metric_without_weights_says_where_to_get_them(metric, monkeypatch):
    monkeypatch.delenv(CHEXBERT_PATH_ENV, raising=False)
    with pytest.raises(CheXbertWeightsMissing) as info:
        metric.compute(predictions=["No effusion."], references=["No effusion."])
    message = str(info.value)
    for needle in ("chexbert_similarity needs the CheXbert checkpoint", "stanfordmlgroup/CheXbert",
                   "StanfordAIMI/RRG_scorers", "LICENSE", "chexbert_path=",
                   "--metric-option chexbert_similarity.chexbert_path=", CHEXBERT_PATH_ENV, "bert-base-uncased"):
        assert needle in message, needle


def test_metric_reads_the_environment_variable(metric, tiny, monkeypatch):
    monkeypatch.setenv(CHEXBERT_PATH_ENV, str(tiny))
    results = metric.compute(predictions=["No effusion."], references=["No effusion."], device="cpu")
    assert results["n"] == 1 and results["chexbert_similarity"] == pytest.approx(1.0, abs=1e-6)


def test_run_eval_computes_chexbert_similarity_per_item(fixture_benchmark, tiny, tmp_path):
    from medheval.data.benchmarks import load_benchmark
    from medheval.cli import main

    rows = load_benchmark("vishal_report", data_dir=fixture_benchmark["data_dir"]).to_list()
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text("".join(json.dumps({"id": row["id"], "prediction": row["answer"]}) + "\n" for row in rows))
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "vishal_report", "--predictions", str(predictions), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--metrics", "chexbert_similarity",
                 "--metric-option", f"chexbert_similarity.chexbert_path={tiny}",
                 "--metric-option", "chexbert_similarity.device=cpu"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    values = results["benchmarks"]["vishal_report:default"]["metrics"]["chexbert_similarity"]
    assert values["n"] == len(rows) and values["chexbert_similarity"] == pytest.approx(1.0, abs=1e-6)
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert len(scored) == len(rows) and all(item["similarities"] == pytest.approx(1.0, abs=1e-6) for item in scored)

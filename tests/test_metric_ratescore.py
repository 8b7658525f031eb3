"""RaTEScore: the scoring arithmetic by hand, tag decoding, sentences, the model path with tiny random models."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from conftest import load_metric_offline
import torch

from medheval.radiology import ratescore_scoring as sc

REPO = Path(__file__).resolve().parents[1]
METRIC_DIR = REPO / "metrics" / "ratescore"
REPORTS = [
    "No pleural effusion. Mild cardiomegaly.",
    "Small left pleural effusion. There is a 2.5 cm nodule in the right upper lobe.\nNo pneumothorax.",
    "Heart size is normal. Lungs are clear.",
    "Bibasilar opacities likely atelectasis or pneumonia.",
]


def uniform_matrix(**overrides):
    """All 25 type pairs weigh 1 unless overridden (keys like non_abnormality__abnormality)."""
    names = ["abnormality", "non-abnormality", "disease", "non-disease", "anatomy"]
    matrix = {f"{a}_{b}": 1.0 for a in names for b in names}
    for key, value in overrides.items():
        a, b = key.split("__")
        matrix[f"{a.replace('_', '-')}_{b.replace('_', '-')}"] = value
    return matrix


# --------------------------------------------------------------------------------------------------
# Arithmetic (no model)


def test_identical_entities_score_one():
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    types = ["ABNORMALITY", "ANATOMY", "NON-DISEASE"]
    # every entity matches itself (cos 1) and its own type: S = Σ 1·W·1 / Σ W = 1 both ways -> 2·1·1/2 = 1
    for matrix in ("long", "short"):
        result = sc.pair_score(embeddings, embeddings.clone(), types, types, sc.load_affinity(matrix))
        assert result["score"] == pytest.approx(1.0) and result["ref_to_pred"] == pytest.approx(1.0)


def test_case_worked_by_hand():
    # Reference R: r1 "no effusion" NON-ABNORMALITY e=(1, 0); r2 "left lung" ANATOMY e=(0, 1).
    # Generated G: g1 "effusion" ABNORMALITY e=(0.8, 0.6); g2 "left lung" ANATOMY e=(0, 1).
    # Weights: 1 everywhere except W[NON-ABN, ABN] = 0.5 and W[ABN, NON-ABN] = 0.25; neg_weight = 0.5.
    affinity = sc.load_affinity(uniform_matrix(non_abnormality__abnormality=0.5, abnormality__non_abnormality=0.25)
                                | {"neg_weight": 0.5})
    reference = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    generated = torch.tensor([[0.8, 0.6], [0.0, 1.0]])
    ref_types, gen_types = ["NON-ABNORMALITY", "ANATOMY"], ["ABNORMALITY", "ANATOMY"]
    # S(R -> G): r1: cos(g1) = 0.8 > cos(g2) = 0 -> g1, a negation pair: 0.8 · W 0.5 · neg 0.5 = 0.2, weight 0.5;
    #            r2: cos(g1) = 0.6 < cos(g2) = 1 -> g2: 1 · 1 · 1 = 1, weight 1.
    #            S = (0.2 + 1) / (0.5 + 1) = 0.8
    assert sc.directional_score(reference, generated, ref_types, gen_types, affinity) == pytest.approx(0.8)
    # S(G -> R): g1: cos(r1) = 0.8 > cos(r2) = 0.6 -> r1, negation: 0.8 · W 0.25 · 0.5 = 0.1, weight 0.25;
    #            g2 -> r2: 1, weight 1.  S = (0.1 + 1) / (0.25 + 1) = 0.88
    assert sc.directional_score(generated, reference, gen_types, ref_types, affinity) == pytest.approx(0.88)
    # RaTEScore = 2 · 0.8 · 0.88 / (0.8 + 0.88) = 1.408 / 1.68 = 0.838095...
    result = sc.pair_score(generated, reference, gen_types, ref_types, affinity)
    assert result == pytest.approx({"score": 1.408 / 1.68, "ref_to_pred": 0.8, "pred_to_ref": 0.88})
    # the same pair with the package's "long" weights, by the formula
    long = sc.load_affinity("long")
    w1, w2, w3 = (long.weights[("NON-ABNORMALITY", "ABNORMALITY")], long.weights[("ANATOMY", "ANATOMY")],
                  long.weights[("ABNORMALITY", "NON-ABNORMALITY")])
    r2g = (0.8 * w1 * long.neg_weight + w2) / (w1 + w2)
    g2r = (0.8 * w3 * long.neg_weight + w2) / (w3 + w2)
    assert sc.pair_score(generated, reference, gen_types, ref_types, long)["score"] == pytest.approx(
        2 * r2g * g2r / (r2g + g2r))


def test_disjoint_and_empty():
    # orthogonal embeddings: every best cosine is 0 -> S = 0 both ways -> score 0 (not 0.5)
    a, b = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert sc.pair_score(a, b, ["DISEASE"], ["DISEASE", "ANATOMY"], sc.load_affinity())["score"] == 0.0
    # a report without entities: 0.5, as upstream
    empty = sc.pair_score(torch.zeros(0, 3), b, [], ["DISEASE", "ANATOMY"], sc.load_affinity())
    assert empty == {"score": 0.5, "ref_to_pred": None, "pred_to_ref": None}


def test_affinity_matrices():
    long, short = sc.load_affinity("long"), sc.load_affinity("short")
    assert long.neg_weight == pytest.approx(0.8716553966489615)
    assert short.neg_weight == pytest.approx(0.3611577852354489)
    assert long.weights[("DISEASE", "DISEASE")] == pytest.approx(0.8460555030578727) and len(long.weights) == 25
    assert long.types == sc.ENTITY_TYPES
    old = sc.upstream_050_affinity()  # what MedHEval ran: ratescore 0.5.0
    assert old.neg_weight == 0.3612 and old.weights == long.weights
    assert sc.load_affinity("long", neg_weight=0.1).neg_weight == 0.1
    with pytest.raises(ValueError, match="no weight for the entity type pair"):
        long.weight("DISEASE", "MEDICATION")
    with pytest.raises(ValueError, match="neg_weight"):
        sc.load_affinity(uniform_matrix())
    with pytest.raises(ValueError, match="cannot read the affinity matrix"):
        sc.load_affinity("/nonexistent/weights.json")


def test_decode_bio_worked_cases():
    # a three-token entity closed by O
    assert sc.decode_bio(["[CLS]", "no", "pleural", "effusion", "[SEP]"],
                         ["O", "B-NON-ABNORMALITY", "I-NON-ABNORMALITY", "I-NON-ABNORMALITY", "O"]) == \
        [(1, 3, "NON-ABNORMALITY")]
    # B followed by B: two one-token entities
    assert sc.decode_bio(["[CLS]", "left", "effusion", "[SEP]"], ["O", "B-ANATOMY", "B-DISEASE", "O"]) == \
        [(1, 1, "ANATOMY"), (2, 2, "DISEASE")]
    # an entity still open at the end runs to the second-last token
    assert sc.decode_bio(["[CLS]", "mild", "edema", "[SEP]"], ["O", "B-DISEASE", "I-DISEASE", "I-DISEASE"]) == \
        [(1, 2, "DISEASE")]
    # I followed by B closes the span and re-opens at the I token (upstream quirk), B then O emits
    assert sc.decode_bio(["[CLS]", "left", "lung", "edema", "[SEP]"],
                         ["O", "B-ANATOMY", "I-ANATOMY", "B-DISEASE", "O"]) == [(1, 2, "ANATOMY"), (3, 3, "DISEASE")]
    # the last tag is never read as the current one
    assert sc.decode_bio(["effusion", "edema"], ["O", "B-DISEASE"]) == []


def test_decode_bio_matches_the_package():
    if importlib.util.find_spec("RaTEScore") is None or importlib.util.find_spec("medspacy") is None:
        pytest.skip("the ratescore package (which imports medspacy) is not installed")
    from RaTEScore.utils import post_process

    class Joiner:
        @staticmethod
        def convert_tokens_to_string(tokens):
            return " ".join(tokens)

    import random

    rng = random.Random(0)
    tags = ["O"] + [f"{p}-{t}" for t in sc.ENTITY_TYPES for p in "BI"]
    for _ in range(2000):
        n = rng.randint(2, 9)
        tokens = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
        labels = [rng.choice(tags) for _ in range(n)]
        expected = post_process(tokens, labels, Joiner)
        ours = [(" ".join(tokens[s:e + 1]), t) for s, e, t in sc.decode_bio(tokens, labels)]
        assert ours == expected, (tokens, labels)


def test_directional_score_matches_the_package():
    if importlib.util.find_spec("RaTEScore") is None or importlib.util.find_spec("medspacy") is None:
        pytest.skip("the ratescore package (which imports medspacy) is not installed")
    from RaTEScore import scorer as package_scorer
    from RaTEScore.utils import compute

    # 0.6.0 reads neg_weight from the matrix; 0.5.0 (DEFAULT_MATRIX, no _LONG) hard-codes 0.3612
    long = sc.load_affinity("long") if hasattr(package_scorer, "DEFAULT_MATRIX_LONG") else sc.upstream_050_affinity()
    package_matrix = {(k.split("_")[0].upper(), k.split("_")[1].upper()): v for k, v in sc.AFFINITY_LONG.items()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        a, b = torch.randn(4, 8, generator=generator), torch.randn(3, 8, generator=generator)
        ta = [sc.ENTITY_TYPES[int(i)] for i in torch.randint(0, 5, (4,), generator=generator)]
        tb = [sc.ENTITY_TYPES[int(i)] for i in torch.randint(0, 5, (3,), generator=generator)]
        assert sc.directional_score(a, b, ta, tb, long) == pytest.approx(compute(a, b, ta, tb, package_matrix))


def test_rule_sentence_splitter():
    assert sc.split_sentences_rules("Heart size is normal. There is a 2.5 cm nodule.\nNo effusion.") == [
        "Heart size is normal.", "There is a 2.5 cm nodule.", "No effusion."]
    # as PyRuSH does on this line (checked with medspacy 1.3.1)
    line = "Findings: lungs clear.  Impression: 1. No acute process. 2. Stable cardiomegaly."
    assert sc.split_sentences_rules(line) == [
        "Findings: lungs clear.", "Impression: 1.", "No acute process.", "2. Stable cardiomegaly."]
    assert sc.split_sentences_rules("Mild edema, e.g. in the bases.") == ["Mild edema, e.g. in the bases."]
    assert sc.split_sentences_rules("OK. ..  \n\n No.") == ["OK.", "No."]  # ".." fails the upstream filter (< 3 chars)
    assert sc.split_sentences_rules("") == []


# --------------------------------------------------------------------------------------------------
# The metric module and the models


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from medheval.radiology.tiny_models import build_random_ratescore_models

    return build_random_ratescore_models(tmp_path_factory.mktemp("rate"), seed=1)


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def test_module_files_present():
    for name in ("ratescore.py", "README.md", "requirements.txt", "app.py"):
        assert (METRIC_DIR / name).is_file(), name
    source = (METRIC_DIR / "ratescore.py").read_text()
    assert not any(line.startswith("import ") and "," in line for line in source.splitlines()), "one import per line"


def test_missing_models_are_clear_errors(metric, tiny_models, monkeypatch):
    from medheval.radiology.ratescore_model import RaTEScoreWeightsMissing

    monkeypatch.delenv("MEDHEVAL_RATESCORE_NER_PATH", raising=False)
    monkeypatch.delenv("MEDHEVAL_RATESCORE_EMBEDDING_PATH", raising=False)
    with pytest.raises(RaTEScoreWeightsMissing) as caught:
        metric.compute(predictions=["a"], references=["b"])
    for needle in ("ner_model_path", "MEDHEVAL_RATESCORE_NER_PATH", "Angelakeke/RaTE-NER-Deberta",
                   "FremyCompany/BioLORD-2023-C", "--metric-option ratescore.embedding_model_path"):
        assert needle in str(caught.value)
    with pytest.raises(RaTEScoreWeightsMissing, match="embedding_model_path"):
        metric.compute(predictions=["a"], references=["b"], ner_model_path=str(tiny_models[0]))
    with pytest.raises(RaTEScoreWeightsMissing, match="not found"):
        metric.compute(predictions=["a"], references=["b"], ner_model_path="/nonexistent/rate-ner",
                       embedding_model_path=str(tiny_models[1]))


def test_scorer_shapes_and_determinism(tiny_models):
    from medheval.radiology.ratescore_model import RaTEScorer

    scorer = RaTEScorer(*map(str, tiny_models), device="cpu")
    entities, n_sentences = scorer.extract_entities(REPORTS + [""], sc.split_sentences_rules, batch_size=3)
    assert len(entities) == 5 and entities[4] == [] and n_sentences == 8
    assert sum(map(len, entities)) > 0
    for report in entities:
        for text, entity_type in report:
            assert isinstance(text, str) and entity_type in sc.ENTITY_TYPES
    # batching does not change the entities (tags are read over each sentence's own tokens)
    assert scorer.extract_entities(REPORTS, sc.split_sentences_rules, batch_size=1)[0] == entities[:4]
    vectors = scorer.embed([text for report in entities for text, _ in report])
    assert all(vector.shape == (24,) for vector in vectors.values())
    again = RaTEScorer(*map(str, tiny_models), device="cpu")
    assert again.extract_entities(REPORTS, sc.split_sentences_rules)[0] == entities[:4]
    text = next(text for report in entities for text, _ in report)
    assert torch.equal(again.embed([text])[text], scorer.embed([text])[text])


def test_metric_end_to_end(metric, tiny_models):
    ner, embedding = map(str, tiny_models)
    predictions = [REPORTS[0], REPORTS[1], "", "Assistant: " + REPORTS[3]]
    references = [REPORTS[0], REPORTS[2], REPORTS[2], REPORTS[3]]
    kwargs = dict(ner_model_path=ner, embedding_model_path=embedding, sentence_splitter="rules", device="cpu")
    out = metric.compute(predictions=predictions, references=references, return_entities=True, **kwargs)
    assert out["n"] == 4 and out["sentence_splitter"] == "rules" and out["affinity_matrix"] == "long"
    for key in ("ratescore_per_item", "ref_to_pred_per_item", "pred_to_ref_per_item", "prediction_entities",
                "reference_entities"):
        assert len(out[key]) == 4, key
    # in [0, 1] up to float32 rounding of the cosines (identical entities give cos 1 ± 1e-7, as upstream)
    assert all(math.isfinite(s) and -1e-6 <= s <= 1.0 + 1e-6 for s in out["ratescore_per_item"])
    assert out["ratescore"] == pytest.approx(sum(out["ratescore_per_item"]) / 4)
    # identical reports (the "Assistant:" prefix is dropped natively) -> 1 up to float32 rounding,
    # or 0.5 when they have no entity
    for i in (0, 3):
        expected = 1.0 if out["prediction_entities"][i] else 0.5
        assert out["ratescore_per_item"][i] == pytest.approx(expected, abs=1e-6)
    assert out["prediction_entities"][2] == [] and out["ratescore_per_item"][2] == 0.5
    assert out["n_no_entity_predictions"] >= 1
    assert metric.compute(predictions=predictions, references=references, return_entities=True, **kwargs) == out
    short = metric.compute(predictions=predictions, references=references, affinity_matrix="short", **kwargs)
    assert short["neg_weight"] == pytest.approx(0.3611577852354489)


def test_upstream_compat(metric, tiny_models):
    ner, embedding = map(str, tiny_models)
    out = metric.compute(predictions=REPORTS, references=REPORTS[::-1], ner_model_path=ner,
                         embedding_model_path=embedding, sentence_splitter="rules", device="cpu", upstream_compat=True)
    assert out["upstream_compat"] is True and out["neg_weight"] == 0.3612 and "0.5.0" in out["affinity_matrix"]
    module = sys.modules[type(metric).__module__]
    assert module.clean_prediction("Assistant: effusion", upstream_compat=True) == " effusio"
    assert module.clean_prediction("Assistant: effusion") == "effusion"


def test_models_are_loaded_once_per_metric_instance(metric, tiny_models, monkeypatch):
    from medheval.radiology import ratescore_model

    built = []
    real = ratescore_model.RaTEScorer

    class Counting(real):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ratescore_model, "RaTEScorer", Counting)
    metric.__dict__.pop("_ratescore_scorers", None)
    monkeypatch.setenv("MEDHEVAL_RATESCORE_NER_PATH", str(tiny_models[0]))
    monkeypatch.setenv("MEDHEVAL_RATESCORE_EMBEDDING_PATH", str(tiny_models[1]))
    for _ in range(3):
        metric.compute(predictions=REPORTS, references=REPORTS[::-1], sentence_splitter="rules", device="cpu")
    assert len(built) == 1


def test_wrong_checkpoints_are_clear_errors(tiny_models, tmp_path):
    from medheval.radiology.ratescore_model import RaTEScoreCheckpointError, RaTEScorer
    from medheval.radiology.tiny_models import write_tiny_bert

    ner, embedding = map(str, tiny_models)
    with pytest.raises(RaTEScoreCheckpointError, match="not a token-classification"):
        RaTEScorer(embedding, embedding, device="cpu")  # the encoder given as the NER model
    default_labels = write_tiny_bert(tmp_path / "labels", architecture="BertForTokenClassification")
    with pytest.raises(RaTEScoreCheckpointError, match="B-/I-"):
        RaTEScorer(str(default_labels), embedding, device="cpu")  # LABEL_0/LABEL_1, not RaTE's tags
    other_types = write_tiny_bert(tmp_path / "types", architecture="BertForTokenClassification",
                                  id2label={0: "O", 1: "B-MEDICATION", 2: "I-MEDICATION"})
    with pytest.raises(RaTEScoreCheckpointError, match="MEDICATION"):
        RaTEScorer(str(other_types), embedding, device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RaTEScoreCheckpointError, match="no config.json"):
        RaTEScorer(ner, str(tmp_path / "empty"), device="cpu")
    weights_file = tmp_path / "model.bin"
    weights_file.write_bytes(b"x")
    with pytest.raises(RaTEScoreCheckpointError, match="is a file"):
        RaTEScorer(str(weights_file), embedding, device="cpu")
    broken = write_tiny_bert(tmp_path / "broken", architecture="BertModel")
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RaTEScoreCheckpointError, match="synonym encoder"):
        RaTEScorer(ner, str(broken), device="cpu")


def test_hub_id_without_network_is_a_clear_error(tiny_models, monkeypatch):
    import huggingface_hub.constants

    from medheval.radiology.ratescore_model import RaTEScorer, RaTEScoreWeightsMissing

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RaTEScoreWeightsMissing, match="Angelakeke/RaTE-NER-Deberta"):
        RaTEScorer("Angelakeke/RaTE-NER-Deberta", str(tiny_models[1]), device="cpu")


def test_medspacy_splitter_needs_medspacy():
    from medheval.radiology.ratescore_model import RaTEScoreError, make_sentence_splitter

    name, _ = make_sentence_splitter("auto")
    assert name == ("medspacy" if importlib.util.find_spec("medspacy") else "rules")
    with pytest.raises(RaTEScoreError, match="sentence_splitter"):
        make_sentence_splitter("spacy")
    if importlib.util.find_spec("medspacy") is None:
        with pytest.raises(RaTEScoreError, match="medspacy"):
            make_sentence_splitter("medspacy")


def test_same_scores_as_the_package(tiny_models):
    """With medspacy and the ratescore package installed: bit-identical to RaTEScore().compute_score."""
    if importlib.util.find_spec("RaTEScore") is None or importlib.util.find_spec("medspacy") is None:
        pytest.skip("the ratescore package (which imports medspacy) is not installed")
    from RaTEScore import RaTEScore

    from medheval.radiology.ratescore_model import RaTEScorer, make_sentence_splitter

    ner, embedding = map(str, tiny_models)
    predictions, references = REPORTS, REPORTS[1:] + REPORTS[:1]
    package = RaTEScore(bert_model=ner, eval_model=embedding, use_gpu=False)
    expected = package.compute_score(list(predictions), list(references))
    has_neg = "neg_weight" in package.matrix_path  # 0.6.0; 0.5.0 hard-codes 0.3612
    affinity = sc.load_affinity(package.matrix_path) if has_neg else sc.upstream_050_affinity()
    _, split = make_sentence_splitter("medspacy")
    rows = RaTEScorer(ner, embedding, device="cpu").score(predictions, references, affinity, split,
                                                          upstream_batching=True)["rows"]
    assert [row["score"] for row in rows] == expected

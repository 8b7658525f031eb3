"""RadGraph F1: the graph arithmetic by hand, the model path with a tiny random RadGraph, the errors."""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
from conftest import load_metric_offline

from medheval.radiology import radgraph_rewards as rewards

REPO = Path(__file__).resolve().parents[1]
METRIC_DIR = REPO / "metrics" / "radgraph_f1"
TEXTS = [
    "No acute cardiopulmonary process.",
    "Small left pleural effusion. Heart size is normal.",
    "ET tube terminates 2 cm above the carina; bibasilar opacities likely atelectasis.",
]


def graph(*entities):
    """entities: (tokens, label, [(relation, target_id), ...]) with ids 1, 2, ... in order."""
    return {"text": "", "entities": {str(i): {"tokens": tokens, "label": label, "start_ix": i, "end_ix": i,
                                              "relations": [[rel, str(target)] for rel, target in relations]}
                                     for i, (tokens, label, relations) in enumerate(entities, start=1)}}


# Reference: "small left pleural effusion"
REFERENCE = graph(
    ("small", "OBS-DP", [("modify", 4)]),
    ("left", "ANAT-DP", [("modify", 3)]),
    ("pleural", "ANAT-DP", []),
    ("effusion", "OBS-DP", [("located_at", 3)]),
)
# Generated: "large left pleural Effusion, no pneumothorax" (capital E; "pleural" also modifies "Effusion")
GENERATED = graph(
    ("large", "OBS-DP", [("modify", 4)]),
    ("left", "ANAT-DP", [("modify", 3)]),
    ("pleural", "ANAT-DP", [("modify", 4)]),
    ("Effusion", "OBS-DP", [("located_at", 3)]),
    ("pneumothorax", "OBS-DA", []),
)


# --------------------------------------------------------------------------------------------------
# Arithmetic (no model)


def test_identical_graphs_score_one():
    scores = rewards.medheval_scores(REFERENCE, copy.deepcopy(REFERENCE))
    assert scores == {"entity_f1": 1.0, "relation_f1": 1.0, "radgraph_f1": 1.0}
    assert rewards.f1radgraph_rewards(REFERENCE, REFERENCE) == {"simple": 1.0, "partial": 1.0, "complete": 1.0}


def test_disjoint_graphs_score_zero():
    other = graph(("heart", "ANAT-DP", [("modify", 2)]), ("enlarged", "OBS-DP", []))
    for upstream in (False, True):
        assert rewards.medheval_scores(other, REFERENCE, upstream) == {"entity_f1": 0.0, "relation_f1": 0.0,
                                                                        "radgraph_f1": 0.0}
    assert rewards.f1radgraph_rewards(other, REFERENCE) == {"simple": 0.0, "partial": 0.0, "complete": 0.0}


def test_partial_overlap_worked_by_hand():
    # Entities (case-sensitive): G = {large, left, pleural, Effusion, pneumothorax} (5),
    # R = {small, left, pleural, effusion} (4); G∩R = {left, pleural} = 2.
    # P = 2/5, R = 2/4, F1 = 2·(2/5)(1/2) / (2/5 + 1/2) = (2/5) / (9/10) = 4/9.
    # Relations ((head), (target), type):
    #   G = {large->Effusion modify, left->pleural modify, pleural->Effusion modify, Effusion->pleural located_at} (4)
    #   R = {small->effusion modify, left->pleural modify, effusion->pleural located_at} (3)
    #   G∩R = {left->pleural modify} = 1; P = 1/4, R = 1/3, F1 = 2·(1/12) / (7/12) = 2/7.
    # RadGraph F1 = (4/9 + 2/7) / 2 = (28/63 + 18/63) / 2 = 23/63.
    scores = rewards.medheval_scores(GENERATED, REFERENCE)
    assert scores["entity_f1"] == pytest.approx(4 / 9)
    assert scores["relation_f1"] == pytest.approx(2 / 7)
    assert scores["radgraph_f1"] == pytest.approx(23 / 63)
    # simple (RG_E) = the entity F1 = 4/9.
    # partial (RG_ER): G = {(large,T), (left,T), (pleural,T), (Effusion,T), (pneumothorax)} (5),
    #   R = {(small,T), (left,T), (pleural), (effusion,T)} (4): only (left,ANAT-DP,True) is shared
    #   ("pleural" has a relation in G only): P = 1/5, R = 1/4, F1 = 2·(1/20) / (9/20) = 2/9.
    # complete (RG_ER-bar): relation tuples are lowercased (radgraph 0.1.18), so "Effusion" = "effusion":
    #   G = {large modify effusion, left modify pleural, pleural modify effusion, effusion located_at pleural,
    #        (pneumothorax, OBS-DA)} (5), R = {small modify effusion, left modify pleural, (pleural, ANAT-DP),
    #        effusion located_at pleural} (4); shared 2: P = 2/5, R = 2/4, F1 = 4/9
    #   (without the lowercasing only 1 would be shared: 2/9).
    assert rewards.f1radgraph_rewards(GENERATED, REFERENCE) == pytest.approx(
        {"simple": 4 / 9, "partial": 2 / 9, "complete": 4 / 9})
    # F1 is symmetric: swapping the sides swaps P and R only.
    assert rewards.medheval_scores(REFERENCE, GENERATED)["radgraph_f1"] == pytest.approx(23 / 63)


def test_empty_sets_native_versus_upstream():
    no_relations = graph(("pneumothorax", "OBS-DA", []), ("acute", "OBS-DA", []))
    # Identical, relation-free: native entity 1, relation 1 (two empty sets agree) -> 1.0;
    # upstream (CXR-Report-Metric compute_f1) relation F1 0 -> (1 + 0) / 2 = 0.5.
    assert rewards.medheval_scores(no_relations, no_relations)["radgraph_f1"] == 1.0
    assert rewards.medheval_scores(no_relations, no_relations, upstream_compat=True)["radgraph_f1"] == 0.5
    empty = {"text": "", "entities": {}}
    assert rewards.medheval_scores(empty, empty)["radgraph_f1"] == 1.0
    assert rewards.medheval_scores(empty, empty, upstream_compat=True)["radgraph_f1"] == 0.0
    # One side empty: 0 either way; F1RadGraph is 0 whenever a side has no entity.
    assert rewards.medheval_scores(empty, REFERENCE)["radgraph_f1"] == 0.0
    assert rewards.f1radgraph_rewards(empty, empty) == {"simple": 0.0, "partial": 0.0, "complete": 0.0}


def test_set_f1_and_sets():
    assert rewards.set_f1({1, 2, 3}, {2, 3, 4, 5}) == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert rewards.set_f1(set(), set()) == 0.0 and rewards.set_f1(set(), set(), both_empty=1.0) == 1.0
    assert rewards.relation_set(REFERENCE) == {(("small", "OBS-DP"), ("effusion", "OBS-DP"), "modify"),
                                               (("left", "ANAT-DP"), ("pleural", "ANAT-DP"), "modify"),
                                               (("effusion", "OBS-DP"), ("pleural", "ANAT-DP"), "located_at")}
    assert rewards.count_relations(GENERATED) == 4


def test_malformed_graphs_are_clear_errors():
    with pytest.raises(ValueError, match="'entities'"):
        rewards.entity_set({"text": "x"})
    dangling = graph(("left", "ANAT-DP", [("modify", 9)]))
    with pytest.raises(ValueError, match="does not point at an entity"):
        rewards.relation_set(dangling)


def _random_graph(rng, words, labels):
    n = rng.randint(0, 5)
    entities = [(rng.choice(words), rng.choice(labels), []) for _ in range(n)]
    entities = [(t, lab, [(rng.choice(["modify", "located_at", "suggestive_of"]), rng.randint(1, n))
                          for _ in range(rng.randint(0, 2))]) for t, lab, _ in entities]
    return graph(*entities)


def test_rewards_match_the_radgraph_package():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package_rewards = pytest.importorskip("radgraph.rewards", exc_type=ImportError)
    import random

    rng = random.Random(0)
    words, labels = ["Left", "left", "lung", "effusion", "Effusion", "small"], ["ANAT-DP", "OBS-DP", "OBS-U"]
    for _ in range(300):
        generated, reference = _random_graph(rng, words, labels), _random_graph(rng, words, labels)
        expected = package_rewards.compute_reward(generated, reference, "all")
        ours = rewards.f1radgraph_rewards(generated, reference)
        assert (ours["simple"], ours["partial"], ours["complete"]) == pytest.approx(expected)


# --------------------------------------------------------------------------------------------------
# The metric module and the model


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def test_module_files_present():
    for name in ("radgraph_f1.py", "README.md", "requirements.txt", "app.py"):
        assert (METRIC_DIR / name).is_file(), name
    source = (METRIC_DIR / "radgraph_f1.py").read_text()
    assert not any(line.startswith("import ") and "," in line for line in source.splitlines()), "one import per line"


def test_metric_on_given_graphs_needs_no_model(metric, monkeypatch):
    monkeypatch.delenv("MEDHEVAL_RADGRAPH_PATH", raising=False)
    out = metric.compute(predictions=["g", "same"], references=["r", "same"],
                         prediction_graphs=[GENERATED, REFERENCE], reference_graphs=[REFERENCE, REFERENCE])
    # item 1: 23/63 (worked above), item 2: 1.0 -> mean (23/63 + 1) / 2 = 43/63
    assert out["radgraph_f1_per_item"] == pytest.approx([23 / 63, 1.0])
    assert out["radgraph_f1"] == pytest.approx(43 / 63)
    assert out["radgraph_partial"] == pytest.approx((2 / 9 + 1) / 2)
    assert out["n"] == 2 and out["mean_relations_prediction"] == pytest.approx((4 + 3) / 2)
    only = metric.compute(predictions=["g"], references=["r"], reward_level="partial",
                          prediction_graphs=[GENERATED], reference_graphs=[REFERENCE])
    assert "radgraph_simple" not in only and only["radgraph_partial"] == pytest.approx(2 / 9)
    with pytest.raises(ValueError, match="reward_level"):
        metric.compute(predictions=["g"], references=["r"], reward_level="full",
                       prediction_graphs=[GENERATED], reference_graphs=[REFERENCE])


def test_missing_model_is_a_clear_error(metric, monkeypatch):
    from medheval.radiology.radgraph_model import RadGraphWeightsMissing

    monkeypatch.delenv("MEDHEVAL_RADGRAPH_PATH", raising=False)
    with pytest.raises(RadGraphWeightsMissing) as caught:
        metric.compute(predictions=["a"], references=["b"])
    message = str(caught.value)
    for needle in ("radgraph_path", "MEDHEVAL_RADGRAPH_PATH", "StanfordAIMI/RRG_scorers",
                   "--metric-option radgraph_f1.radgraph_path", "physionet.org"):
        assert needle in message
    with pytest.raises(RadGraphWeightsMissing, match="not found"):
        metric.compute(predictions=["a"], references=["b"], radgraph_path="/nonexistent/radgraph")


def test_annotator_shapes_and_determinism(tiny_radgraph):
    from medheval.radiology.radgraph_model import RadGraphAnnotator, load_radgraph
    from medheval.radiology.tiny_models import V1_ENTITY_LABELS

    annotator = load_radgraph(tiny_radgraph, device="cpu")
    assert annotator.model_type == "radgraph" and annotator.dataset == "radgraph"
    assert annotator.encoder == str(tiny_radgraph / "encoder")
    graphs = annotator.annotate(TEXTS + ["", TEXTS[0]])
    assert len(graphs) == 5 and graphs[3] == {"text": "", "entities": {}} and graphs[4] == graphs[0]
    assert graphs[0]["text"] == "No acute cardiopulmonary process ."  # RadGraph v1 splits around punctuation
    assert sum(len(g["entities"]) for g in graphs) > 0
    for g in graphs:
        for entity_id, entity in g["entities"].items():
            assert entity["label"] in V1_ENTITY_LABELS
            span = g["text"].split()[entity["start_ix"]: entity["end_ix"] + 1]
            assert entity["tokens"] == " ".join(span)
            for relation, target in entity["relations"]:
                assert relation in ("modify", "located_at", "suggestive_of") and target in g["entities"]
    assert annotator.annotate(TEXTS) == graphs[:3]
    again = RadGraphAnnotator(tiny_radgraph, device="cpu")
    assert again.annotate(TEXTS) == graphs[:3]


def test_same_graphs_as_the_radgraph_package(tiny_radgraph, tmp_path, radgraph_pkg):
    """The package's own RadGraph class, pointed at the same files, extracts exactly the same graphs."""
    from medheval.radiology.radgraph_model import load_radgraph

    ours = load_radgraph(tiny_radgraph, device="cpu").annotate(TEXTS)  # also installs the transformers-5 shim
    cache = tmp_path / "cache"
    shutil.copytree(tiny_radgraph, cache / "radgraph")
    config = json.loads((cache / "radgraph" / "config.json").read_text())
    encoder = str(cache / "radgraph" / "encoder")  # the package reads the encoder name from config.json only
    config["dataset_reader"]["token_indexers"]["bert"]["model_name"] = encoder
    config["model"]["embedder"]["token_embedders"]["bert"]["model_name"] = encoder
    (cache / "radgraph" / "config.json").write_text(json.dumps(config))
    package = radgraph_pkg.RadGraph(model_type="radgraph", model_cache_dir=str(cache), cuda=-1)
    theirs = package(TEXTS)
    assert [theirs[str(i)]["entities"] for i in range(len(TEXTS))] == [g["entities"] for g in ours]


def test_metric_end_to_end(metric, tiny_radgraph):
    predictions = [TEXTS[0], TEXTS[1], "", "Assistant: " + TEXTS[2]]
    references = [TEXTS[0], TEXTS[2], TEXTS[1], TEXTS[2]]
    out = metric.compute(predictions=predictions, references=references, radgraph_path=str(tiny_radgraph),
                         device="cpu", return_graphs=True)
    assert out["n"] == 4 and out["model_type"] == "radgraph"
    for key in ("radgraph_f1_per_item", "entity_f1_per_item", "relation_f1_per_item", "simple_per_item",
                "partial_per_item", "complete_per_item", "prediction_graphs", "reference_graphs"):
        assert len(out[key]) == 4, key
    for key in ("radgraph_f1", "radgraph_entity_f1", "radgraph_relation_f1", "radgraph_simple", "radgraph_partial",
                "radgraph_complete"):
        assert 0.0 <= out[key] <= 1.0 and math.isfinite(out[key]), key
    # identical texts -> identical graphs -> every score 1 (item 0, and item 3 once "Assistant:" is dropped)
    assert out["radgraph_f1_per_item"][0] == 1.0 and out["radgraph_f1_per_item"][3] == 1.0
    assert out["simple_per_item"][0] == (1.0 if out["prediction_graphs"][0]["entities"] else 0.0)
    # the empty prediction: no graph, every score 0
    assert out["prediction_graphs"][2]["entities"] == {} and out["radgraph_f1_per_item"][2] == 0.0
    assert out["n_empty_predictions"] == 1
    assert metric.compute(predictions=predictions, references=references, radgraph_path=str(tiny_radgraph),
                          device="cpu", return_graphs=True) == out


def test_model_is_loaded_once_per_metric_instance(metric, tiny_radgraph, monkeypatch):
    from medheval.radiology import radgraph_model

    built = []
    real = radgraph_model.RadGraphAnnotator

    class Counting(real):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(radgraph_model, "RadGraphAnnotator", Counting)
    metric.__dict__.pop("_radgraph_annotators", None)
    for _ in range(3):
        metric.compute(predictions=TEXTS, references=TEXTS[::-1], radgraph_path=str(tiny_radgraph), device="cpu")
    assert len(built) == 1


def test_environment_variable_and_archive(metric, tiny_radgraph, tmp_path, monkeypatch):
    direct = metric.compute(predictions=TEXTS, references=TEXTS[::-1], radgraph_path=str(tiny_radgraph), device="cpu")
    archive = tmp_path / "radgraph.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # the real archives hold config.json etc. at the top level
        for item in sorted(tiny_radgraph.iterdir()):
            tar.add(item, arcname=item.name)
    monkeypatch.setenv("MEDHEVAL_RADGRAPH_PATH", str(archive))
    from_archive = metric.compute(predictions=TEXTS, references=TEXTS[::-1], device="cpu")
    assert from_archive["radgraph_f1_per_item"] == direct["radgraph_f1_per_item"]
    from medheval.radiology.radgraph_model import resolve_radgraph_dir

    extracted = resolve_radgraph_dir(archive)
    assert extracted.name.startswith("radgraph-") and (extracted / "weights.th").is_file()
    assert resolve_radgraph_dir(tiny_radgraph.parent) == tiny_radgraph  # a folder holding one model folder


def test_upstream_compat_cleans_predictions_like_medheval(metric, tiny_radgraph):
    module = sys.modules[type(metric).__module__]
    assert module.clean_prediction("Assistant: No effusion.") == "No effusion."
    # a character-set strip: the trailing "n" of "consolidation" goes too
    assert module.clean_prediction("Assistant: consolidation", upstream_compat=True) == " consolidatio"
    assert module.clean_prediction("No.", upstream_compat=True) == "No report generated."
    out = metric.compute(predictions=["No."], references=["No report generated."], radgraph_path=str(tiny_radgraph),
                         device="cpu", upstream_compat=True)
    assert out["upstream_compat"] is True and out["n_empty_predictions"] == 0
    relation_free = out["relation_f1_per_item"][0]
    assert out["entity_f1_per_item"][0] == (1.0 if out["mean_entities_prediction"] else 0.0)
    assert relation_free == (1.0 if out["mean_relations_prediction"] else 0.0)


def test_wrong_checkpoints_are_clear_errors(tiny_radgraph, tmp_path):
    from medheval.radiology.radgraph_model import RadGraphCheckpointError, RadGraphWeightsMissing, load_radgraph
    from medheval.radiology.tiny_models import build_random_radgraph

    # weights of another architecture (hidden size 8 instead of 16) under the same config
    other = build_random_radgraph(tmp_path / "other", hidden_size=8)
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_radgraph, mixed)
    shutil.copy(other / "weights.th", mixed / "weights.th")
    with pytest.raises(RadGraphCheckpointError, match="another shape"):
        load_radgraph(mixed, device="cpu")
    # a file that is not a torch state dict
    (mixed / "weights.th").write_bytes(b"not a checkpoint")
    with pytest.raises(RadGraphCheckpointError, match="not a loadable torch state dict"):
        load_radgraph(mixed, device="cpu")
    # a BERT folder is not a RadGraph model
    with pytest.raises(RadGraphCheckpointError, match="not a RadGraph model folder"):
        load_radgraph(tiny_radgraph / "encoder", device="cpu")
    # a config.json that is not DyGIE's
    bert_config = tmp_path / "bertconfig"
    shutil.copytree(tiny_radgraph, bert_config)
    shutil.copy(tiny_radgraph / "encoder" / "config.json", bert_config / "config.json")
    with pytest.raises(RadGraphCheckpointError, match=r"not a RadGraph \(DyGIE\+\+\) config"):
        load_radgraph(bert_config, device="cpu")
    # no encoder available offline: the error says where to put it
    no_encoder = tmp_path / "no_encoder"
    shutil.copytree(tiny_radgraph, no_encoder)
    shutil.rmtree(no_encoder / "encoder")
    with pytest.raises(RadGraphWeightsMissing, match="encoder"):
        load_radgraph(no_encoder, device="cpu")
    # ... and an explicit encoder folder fixes it
    annotator = load_radgraph(no_encoder, encoder_path=tiny_radgraph / "encoder", device="cpu")
    assert annotator.annotate(TEXTS[:1]) == load_radgraph(tiny_radgraph, device="cpu").annotate(TEXTS[:1])
    with pytest.raises(RadGraphCheckpointError, match="not a readable tar archive"):
        bogus = tmp_path / "bogus.tar.gz"
        bogus.write_bytes(b"plain bytes")
        load_radgraph(bogus, device="cpu")


def test_legacy_tokenizer_api(tiny_radgraph):
    from transformers import AutoTokenizer

    from medheval.radiology.radgraph_model import add_legacy_tokenizer_api

    tokenizer = add_legacy_tokenizer_api(AutoTokenizer.from_pretrained(tiny_radgraph / "encoder"))
    assert tokenizer.encode_plus("a", "b", add_special_tokens=True)["input_ids"] == tokenizer("a", "b")["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert tokenizer.build_inputs_with_special_tokens([7, 8]) == [cls, 7, 8, sep]


def test_archive_safety_and_model_type_names(tmp_path, radgraph_pkg):
    import io

    from medheval.radiology.radgraph_model import (RadGraphCheckpointError, RadGraphError, infer_model_type,
                                                   resolve_radgraph_dir)

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("../escaped.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(RadGraphCheckpointError, match="unsafe archive member"):
        resolve_radgraph_dir(evil)
    assert not (tmp_path.parent / "escaped.json").exists()
    assert infer_model_type(Path("/m/radgraph-xl")) == "radgraph-xl"
    assert infer_model_type(Path("/cache/modern-radgraph-xl-0123abcd")) == "modern-radgraph-xl"
    assert infer_model_type(Path("/cache/radgraph-0123abcd")) == "radgraph"
    assert infer_model_type(Path("/physionet/model-0123abcd")) == "radgraph"
    assert infer_model_type(Path("/x"), "echograph") == "echograph"
    with pytest.raises(RadGraphError, match="unknown RadGraph model_type"):
        infer_model_type(Path("/x"), "radgraph2")

"""RadGraph decoding in linear time: the same graphs as radgraph 0.1.18's own decoding, and long reports.

The package's decoding is the brute-force definition here (``get_entity``'s scans, ``Span`` objects
holding the whole report); it is cubic in the report length, so it is compared on short inputs,
and the long degenerate report is checked for completing in bounded memory.
"""

from __future__ import annotations

import random
import tracemalloc
import warnings
from pathlib import Path

import pytest
from conftest import load_metric_offline

from medheval.radiology import radgraph_decoding as decoding
from medheval.radiology import radgraph_rewards as rewards

SENTENCE = "Trace right effusion and faint left basal collapse. "
NORMAL_REPORTS = [
    "No acute cardiopulmonary process.",
    "Tiny right effusion. Heart not enlarged.",
    "Endotracheal tube tip 4 cm over the carina; patchy right base opacity, maybe collapse.",
    "New right chest port, tip in the lower SVC; faint left base haze / small effusion (unchanged).",
    "Lungs: clear!  No pneumothorax?  Moderate cardiomegaly, unchanged since prior.",
    "Frontal and side chest images. Clear lungs, no focal opacity, fluid or congestion. "
    "Heart and mediastinum look ordinary. Bones intact.",
    "x",
    "no",
    "",
    "   ",
    SENTENCE * 3,
    SENTENCE * 12,
]


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(Path(__file__).resolve().parents[1] / "metrics" / "radgraph_f1")


@pytest.fixture(scope="module")
def annotators(tiny_radgraph):
    from medheval.radiology.radgraph_model import RadGraphAnnotator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DyGIE warns about one-word reports
        return {"linear": RadGraphAnnotator(tiny_radgraph, device="cpu"),
                "package": RadGraphAnnotator(tiny_radgraph, device="cpu", decoding="package"),
                "blocks": RadGraphAnnotator(tiny_radgraph, device="cpu", pair_block_bytes=4096)}


def _predictions(rng: random.Random, words: int) -> tuple[list[list], list[list]]:
    """Random NER rows and relation rows in the package's JSON shapes, duplicates and dangling spans included."""
    spans = [(start, start + width) for start in range(words) for width in range(3) if start + width < words]
    ner = [[*span, rng.choice(["ANAT-DP", "OBS-DP", "OBS-U", "OBS-DA"]), 0.5, 0.9]
           for span in rng.sample(spans, rng.randint(0, min(len(spans), 12)))]
    if ner and rng.random() < 0.3:
        ner.append([ner[0][0], ner[0][1], "OBS-U", 0.1, 0.2])  # a span named twice
    relations = [[*rng.choice(spans), *rng.choice(spans), rng.choice(["modify", "located_at", "suggestive_of"]),
                  0.3, 0.6] for _ in range(rng.randint(0, 25))]
    if ner and relations and rng.random() < 0.5:
        relations.append(list(relations[0]))  # a repeated relation
    rng.shuffle(relations)
    return ner, relations


def test_graph_entities_equals_get_entity_on_random_predictions(radgraph_pkg):
    from radgraph.utils import get_entity

    rng = random.Random(0)
    for case in range(400):
        words = [f"w{i}" for i in range(rng.randint(1, 9))]
        ner, relations = _predictions(rng, len(words))
        expected = get_entity(ner, relations, words)
        assert decoding.graph_entities(ner, decoding.RelationTable.from_rows(relations), words) == expected, case


def test_graph_entities_gives_separate_lists_to_a_span_named_twice():
    ner = [(0, 0, "ANAT-DP"), (1, 1, "OBS-DP"), (0, 0, "OBS-U")]
    entities = decoding.graph_entities(ner, decoding.RelationTable.from_rows([(0, 0, 1, 1, "modify")]), ["a", "b"])
    assert entities["1"]["relations"] == entities["3"]["relations"] == [["modify", "2"]]
    entities["1"]["relations"][0][0] = "changed"
    assert entities["3"]["relations"] == [["modify", "2"]]


def test_linear_decoding_equals_the_package_decoding_on_normal_reports(annotators):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = annotators["package"].annotate(NORMAL_REPORTS)
        for name in ("linear", "blocks"):
            assert annotators[name].annotate(NORMAL_REPORTS) == expected, name
    assert sum(len(graph["entities"]) for graph in expected) > 100  # the random model finds plenty
    assert any(entity["relations"] for graph in expected for entity in graph["entities"].values())


def test_metric_outputs_equal_those_of_the_package_decoding(annotators, tiny_radgraph, metric):
    predictions, references = NORMAL_REPORTS, NORMAL_REPORTS[3:] + NORMAL_REPORTS[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = annotators["package"]
        expected = metric.compute(predictions=predictions, references=references,
                                  prediction_graphs=package.annotate(predictions),
                                  reference_graphs=package.annotate(references), model_type="radgraph")
        got = metric.compute(predictions=predictions, references=references, radgraph_path=str(tiny_radgraph),
                             device="cpu")
    assert got == expected
    assert len(set(got["radgraph_f1_per_item"])) > 3


def test_a_long_degenerate_report_completes_in_bounded_memory(annotators):
    """A ~3,000-character repetition (460 words): the package's decoding allocates ~1 GB of Python strings
    here (each of its ~50,000 relation spans copies the report) and grows with the cube of the length."""
    long_report = SENTENCE * 50
    tracemalloc.start()
    try:
        graph = annotators["linear"].annotate([long_report])[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    words = graph["text"].split()
    relations = rewards.count_relations(graph)
    assert len(words) == 450 and relations > 10_000
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB of Python allocations"
    for entity in graph["entities"].values():
        assert entity["tokens"] == " ".join(words[entity["start_ix"]: entity["end_ix"] + 1])
        assert all(target in graph["entities"] for _, target in entity["relations"])
    assert annotators["blocks"].annotate([long_report])[0] == graph  # the pair tensor in 4 kB row blocks


def test_long_report_through_the_metric(tiny_radgraph, metric):
    out = metric.compute(predictions=[SENTENCE * 50, SENTENCE], references=[SENTENCE, SENTENCE],
                         radgraph_path=str(tiny_radgraph), device="cpu")
    assert out["n"] == 2 and out["radgraph_f1_per_item"][1] == 1.0
    assert 0.0 <= out["radgraph_f1_per_item"][0] <= 1.0
    assert out["mean_relations_prediction"] > out["mean_relations_reference"]


def test_blockwise_relation_scores_equal_the_package_formula(radgraph_pkg):
    import torch

    from radgraph.dygie.models.relation import RelationExtractor

    class Head:  # the two modules blockwise_relation_scores reads, with the package's layer shapes
        _active_namespace = "radgraph__relation_labels"

        def __init__(self, dim: int) -> None:
            feedforward = torch.nn.Sequential(torch.nn.Linear(3 * dim, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                              torch.nn.ReLU())
            feedforward.input_dim = 3 * dim
            self._relation_feedforwards = {self._active_namespace: feedforward}
            self._relation_scorers = {self._active_namespace: torch.nn.Linear(8, 3)}

    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        for k, dim in ((1, 4), (7, 5), (23, 6)):
            head = Head(dim)
            embeddings = torch.randn(1, k, dim, generator=generator)
            mentions = torch.randn(1, k, 1, generator=generator)
            expected = RelationExtractor._compute_relation_scores(
                head, RelationExtractor._compute_span_pair_embeddings(embeddings), mentions)
            whole = decoding.blockwise_relation_scores(head, embeddings, mentions, 10**9)
            assert torch.equal(whole, expected)  # one block: the package's computation, bit for bit
            for rows in (1, 2, 5):  # candidate rows per block
                got = decoding.blockwise_relation_scores(head, embeddings, mentions, rows * k * 3 * dim * 4)
                assert got.shape == expected.shape == (1, k, k, 4)
                # smaller matrix products may round differently in the last bit (BLAS kernels depend on shape)
                torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_annotator_options_are_checked(tiny_radgraph):
    from medheval.radiology.radgraph_model import RadGraphAnnotator, RadGraphError

    with pytest.raises(RadGraphError, match="decoding must be one of linear, package"):
        RadGraphAnnotator(tiny_radgraph, device="cpu", decoding="fast")
    with pytest.raises(RadGraphError, match="pair_block_bytes"):
        RadGraphAnnotator(tiny_radgraph, device="cpu", pair_block_bytes=0)

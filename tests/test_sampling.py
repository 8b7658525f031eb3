"""Per-row sampling (medheval.decoding.sampling): seeded, reproducible, and independent of the batch."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch

from medheval.backends.hf import HFBackend
from medheval.backends.tiny import build_tiny_llava
from medheval.decoding.sampling import RowSampler, next_tokens, row_seed
from medheval.mitigations import get_mitigation

sys.path.insert(0, str(Path(__file__).parent))
from test_backends import make_records  # noqa: E402

SAMPLING = dict(max_new_tokens=10, do_sample=True, temperature=1.5, top_p=0.95)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_llava(seed=0)


@pytest.fixture(scope="module")
def data():
    return make_records(8, seed=4)


def _sample(tiny, records, images, batch_size, seed=11, **kwargs):
    model, processor = tiny
    settings = {**SAMPLING, **kwargs}
    return HFBackend(model, processor, batch_size=batch_size, seed=seed, **settings).generate(records, images)


# -- the sampler unit ----------------------------------------------------------------------------------
def test_row_seed_is_a_stable_hash_of_seed_and_key():
    digest = hashlib.sha256(b"3\x00medheval/knowledge/7").digest()
    assert row_seed(3, "medheval/knowledge/7") == int.from_bytes(digest[:8], "big") & (2**63 - 1)
    assert row_seed(3, "a") != row_seed(4, "a") and row_seed(3, "a") != row_seed(3, "b")
    assert 0 <= row_seed(0, "x") < 2**63


def test_a_row_draws_the_same_alone_or_beside_other_rows():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(5, 50), dim=-1)
    keys = [f"r{i}" for i in range(5)]
    together = RowSampler.for_keys(7, keys)
    drawn = torch.stack([together.draw(probs) for _ in range(6)], dim=1)  # 6 steps, rows advance together
    for b in range(5):
        alone = RowSampler.for_keys(7, [keys[b]])
        assert [int(alone.draw(probs[b : b + 1])[0]) for _ in range(6)] == drawn[b].tolist()
    # the global RNG plays no part
    torch.manual_seed(123)
    again = RowSampler.for_keys(7, keys)
    assert torch.equal(torch.stack([again.draw(probs) for _ in range(6)], dim=1), drawn)


def test_draw_follows_the_probabilities_and_checks_rows():
    probs = torch.zeros(3, 4)
    probs[0, 2] = probs[1, 0] = probs[2, 3] = 1.0  # one-hot rows: the draw is known
    assert RowSampler.for_keys(0, "abc").draw(probs).tolist() == [2, 0, 3]
    with pytest.raises(ValueError, match="2 row generators.*one sampler per batch"):
        RowSampler.for_keys(0, ["a", "b"]).draw(probs)


def test_next_tokens_greedy_is_argmax_and_ignores_the_sampler():
    scores = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.9]])
    assert next_tokens(scores, False, RowSampler([1, 2])).tolist() == [1, 0]
    assert next_tokens(torch.tensor([[0.0, 80.0, 0.0]]), True, RowSampler([5])).tolist() == [1]


# -- the HF backend ------------------------------------------------------------------------------------
def test_same_seed_same_samples_and_batch_size_never_changes_them(tiny, data):
    records, images = data
    reference = _sample(tiny, records, images, batch_size=1)
    assert _sample(tiny, records, images, batch_size=1) == reference
    for batch_size in (4, 8):
        assert _sample(tiny, records, images, batch_size=batch_size) == reference, batch_size
    # any position, other neighbours and other padding
    assert _sample(tiny, records[::-1], images[::-1], batch_size=8) == reference[::-1]
    assert _sample(tiny, records[3:5], images[3:5], batch_size=2) == reference[3:5]


def test_other_seeds_sample_other_answers(tiny, data):
    records, images = data
    first, second = _sample(tiny, records, images, 8, seed=11), _sample(tiny, records, images, 8, seed=12)
    assert sum(a != b for a, b in zip(first, second)) >= 6  # 8 of 8 differ at T=1.5 on this tiny model


def test_sampling_goes_through_the_warpers(tiny, data):
    """top_k=1 leaves one token: sampling must then give the greedy answer (the warpers ran before the draw)."""
    records, images = data
    model, processor = tiny
    greedy = HFBackend(model, processor, batch_size=4, max_new_tokens=10).generate(records, images)
    assert _sample(tiny, records, images, 4, generate_kwargs={"top_k": 1}) == greedy
    assert _sample(tiny, records, images, 4) != greedy


def test_prefix_cache_backend_samples_through_the_loop(tiny, data):
    records, images = data
    shared = [images[0]] * len(records)  # same image: the prefix cache would apply when greedy
    reference = _sample(tiny, records, shared, batch_size=1)
    assert _sample(tiny, records, shared, batch_size=8, prefix_cache=True) == reference


@pytest.mark.parametrize("spec", ["vcd:alpha=1,beta=0.1", "m3id"])
def test_sampling_mitigations_are_batch_invariant(tiny, data, spec):
    records, images = data[0][:6], data[1][:6]
    method = get_mitigation(spec)
    kwargs = dict(generate_kwargs={"custom_generate": method}, temperature=1.0, top_p=None, max_new_tokens=8)
    reference = _sample(tiny, records, images, 1, **kwargs)
    assert _sample(tiny, records, images, 6, **kwargs) == reference
    assert _sample(tiny, records[::-1], images[::-1], 3, **kwargs) == reference[::-1]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "idefics3"])
def test_other_families_sample_batch_invariantly(family, data):
    """Flattened patches + M-RoPE (Qwen), token types + sliding window (Gemma 3), pixel masks (Idefics3)."""
    from medheval.backends import tiny_families

    model, processor = getattr(tiny_families, f"build_tiny_{family}")(seed=0)
    records, images = data[0][:3], data[1][:3]
    alone = _sample((model, processor), records, images, 1, max_new_tokens=5)
    assert _sample((model, processor), records, images, 3, max_new_tokens=5) == alone


def test_sampled_runs_record_the_per_row_sampler(tiny):
    """A folder sampled with the global RNG (before per-row generators) must not resume as if it matched."""
    model, processor = tiny
    assert HFBackend(model, processor, **SAMPLING).settings()["sampler"] == "per_row"
    assert "sampler" not in HFBackend(model, processor).settings()  # greedy folders resume as before

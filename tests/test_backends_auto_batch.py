"""``--batch-size auto``: the largest batch that fits, halved on out-of-memory, never losing or repeating a record."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from PIL import Image

from medheval.backends.hf import HFBackend
from medheval.backends.tiny import build_tiny_llava
from medheval.cli import main
from medheval.mitigations.vcd import VCD
from medheval.run.predictions_log import read_log


def out_of_memory_above(monkeypatch, rows: int) -> list[int]:
    """Every LLaVA forward over more than ``rows`` rows raises ``torch.OutOfMemoryError``; returns the rows seen."""
    from transformers import LlavaForConditionalGeneration

    seen: list[int] = []
    forward = LlavaForConditionalGeneration.forward

    @functools.wraps(forward)  # generate checks its kwargs against forward's signature
    def limited(self, *args, **kwargs):
        batch = int((kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[0])
        seen.append(batch)
        if batch > rows:
            raise torch.OutOfMemoryError(f"simulated: {batch} rows > {rows}")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LlavaForConditionalGeneration, "forward", limited)
    return seen


RECORDS = [{"id": f"r{i}", "question": q, "answer": "", "answer_type": "open", "choices": []}
           for i, q in enumerate(["is there an effusion ?", "lung", "heart size ?", "any fracture ?", "edema ?"])]


def test_auto_backs_off_on_out_of_memory_and_keeps_every_record(monkeypatch):
    model, processor = build_tiny_llava(seed=0)
    images = [[Image.fromarray(np.random.RandomState(i).randint(0, 255, (30, 30, 3), dtype=np.uint8))]
              for i in range(len(RECORDS))]
    auto = HFBackend(model, processor, batch_size="auto", max_new_tokens=4, compile=False,
                     generate_kwargs={"custom_generate": VCD(alpha=1.0)})
    monkeypatch.setattr(HFBackend, "estimate_batch_size", lambda self, *a, **k: 8)
    seen = out_of_memory_above(monkeypatch, rows=5)  # VCD: 2 rows per record, so 2 records fit
    vcd_single = HFBackend(model, processor, batch_size=1, max_new_tokens=4, compile=False,
                           generate_kwargs={"custom_generate": VCD(alpha=1.0)})
    assert auto.generate(RECORDS, images) == vcd_single.generate(RECORDS, images)
    assert auto.take_auto_batch_size() == 2 and auto.take_auto_batch_size() is None
    assert max(seen) == 10 and 4 in seen  # tried 5 records (10 rows), then halved to 2 (4 rows)
    assert auto.settings()["batch_size"] == "auto"
    # a record that does not fit alone is an error, not a silent drop
    out_of_memory_above(monkeypatch, rows=0)
    with pytest.raises(torch.OutOfMemoryError):
        HFBackend(model, processor, batch_size="auto", max_new_tokens=4, compile=False).generate(RECORDS[:1], images[:1])


def test_chat_requests_back_off_too_and_keep_every_reply(monkeypatch):
    """``generate_chat`` (ClinHallu's traces) under ``--batch-size auto``: the same estimate and halving on
    out-of-memory as ``generate``, the replies of a batch of one; sampled requests with their own seeds too."""
    model, processor = build_tiny_llava(seed=0)
    requests = [{"id": f"q{i}", "system": "You answer briefly.", "user": f"Question {i}: what is seen?",
                 "assistant_prefix": "", "seed": 10 + i} for i in range(5)]
    images = [[Image.fromarray(np.random.RandomState(i).randint(0, 255, (30, 30, 3), dtype=np.uint8))]
              for i in range(len(requests))]
    sampled = {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    single = HFBackend(model, processor, batch_size=1, max_new_tokens=4, compile=False)
    expected = [single.generate_chat(requests, images), single.generate_chat(requests, images, overrides=sampled)]
    auto = HFBackend(model, processor, batch_size="auto", max_new_tokens=4, compile=False)
    estimated = []
    monkeypatch.setattr(HFBackend, "estimate_batch_size",
                        lambda self, records, imgs, overrides=None, first_text=None: estimated.append(first_text) or 8)
    seen = out_of_memory_above(monkeypatch, rows=2)
    assert [auto.generate_chat(requests, images), auto.generate_chat(requests, images, overrides=sampled)] == expected
    assert max(seen) == 5 and 3 not in seen and 2 in seen  # 5 rows refused, then 2 at a time (2, 2, 1)
    assert auto.take_auto_batch_size() == 2  # the batch size it settled on
    assert len(estimated) == 2 and all("Question 0" in text for text in estimated)  # one estimate per settings


def test_estimate_counts_streams():
    model, processor = build_tiny_llava(seed=0)
    plain = HFBackend(model, processor, batch_size="auto", max_new_tokens=4, compile=False)
    vcd = HFBackend(model, processor, batch_size="auto", max_new_tokens=4, compile=False,
                    generate_kwargs={"custom_generate": VCD()})
    import medheval.backends.hf as hf

    original = hf._free_memory
    try:
        hf._free_memory = lambda device: 2**22  # 4 MiB: a handful of tiny records
        one, two = plain.estimate_batch_size(RECORDS, [[]]), vcd.estimate_batch_size(RECORDS, [[]])
    finally:
        hf._free_memory = original
    assert 1 <= two < one and abs(one - 2 * two) <= 1


@pytest.mark.slow
def test_run_with_auto_batch_backs_off_records_the_batch_and_resumes(fixture_benchmark, tmp_path, monkeypatch):
    seen = out_of_memory_above(monkeypatch, rows=2)
    monkeypatch.setattr(HFBackend, "estimate_batch_size", lambda self, *a, **k: 8)
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]

    def run(output, batch: str) -> int:
        return main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(output),
                     "--data-dir", fixture_benchmark["data_dir"], "--limit", "7", "--max-new-tokens", "4",
                     "--batch-size", batch, "--no-compile", *roots])

    assert run(tmp_path / "one", "1") == 0
    expected = {e["id"]: e["prediction"] for e in read_log(tmp_path / "one" / "predictions.jsonl")}
    assert run(tmp_path / "auto", "auto") == 0
    log = read_log(tmp_path / "auto" / "predictions.jsonl")
    assert sorted(e["id"] for e in log) == sorted(expected) and len(log) == len(expected)  # none lost or repeated
    assert {e["id"]: e["prediction"] for e in log} == expected
    assert max(seen) > 2
    results = json.loads((tmp_path / "auto" / "results.json").read_text())
    assert [entry["batch_size_chosen"] for entry in results["benchmarks"].values()] == [2]
    assert json.loads((tmp_path / "auto" / "run.json").read_text())["backend"]["batch_size"] == "auto"
    # resume after losing the last three predictions: the same predictions, each once
    path = tmp_path / "auto" / "predictions.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-3]))
    assert run(tmp_path / "auto", "auto") == 0
    resumed = read_log(path)
    assert len(resumed) == len(expected) and {e["id"]: e["prediction"] for e in resumed} == expected

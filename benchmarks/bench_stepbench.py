"""Med-StepBench at scale: building 1,000,000 statements, scoring 1,000,000 answers, prefix caching.

    python benchmarks/bench_stepbench.py [--rows 1000000] [--studies 6] [--repeats 3] [--skip-build]

1. Build: writes a synthetic ``statements.jsonl`` (``--rows`` statements, 20 per study, all twelve
   view variants per row, knowledge and rationale fields filled), then times
   ``prepare_benchmark("med_stepbench", "all")`` on a cold Arrow cache (sha256 of the file, read,
   every check, canonical mapping, Arrow write) and the warm reload. Target: < 30 s cold.
2. Score: the ``stepbench`` metric on ``--rows`` answers (mixed phrasings, 1% unparseable, many
   distinct strings). Target: < 10 s.
3. Prefix caching: the tiny random LLaVA on the fixture (``--studies`` studies, 20 statements each:
   10 English + 10 Vietnamese, sharing the study's three views), greedy, 4 new tokens (a verdict
   is one word). Statements/s of the naive path (one prompt per statement; and batched, 20 per
   batch) against the prefix-cached path (20 per batch); best of ``--repeats`` runs, interleaved.
   Target: >= 5x.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

PLANES = ("axial", "coronal", "sagittal")


class Timer:
    """Wall-clock and CPU seconds (all threads of this process) of a block, with the load average.

    On a shared machine the wall time grows with other processes' load; the CPU time does not."""

    def __enter__(self) -> "Timer":
        self.load = os.getloadavg()[0]
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.load = max(self.load, os.getloadavg()[0])

    def __str__(self) -> str:
        return f"{self.wall:.1f} s wall, {self.cpu:.1f} s CPU (load average {self.load:.1f} on {os.cpu_count()} cores)"


def write_statements(path: Path, rows: int, per_study: int = 20) -> None:
    """A synthetic statements.jsonl in the documented layout (made-up text)."""
    rng = random.Random(0)
    steps = ("The lesion lies in the right upper lobe.", "There is one FDG-avid nodule.",
             "The nodule measures 18 mm with SUVmax 7.2.", "The findings suggest a primary lung cancer.")
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(rows):
            study = f"s{index // per_study:06d}"
            step = index % 4 + 1
            views = {plane: {"ct": {"lung": f"v/{study}/{plane[0]}_cl.png", "mediastinal": f"v/{study}/{plane[0]}_cm.png"},
                             "pet": f"v/{study}/{plane[0]}_p.png", "fused": f"v/{study}/{plane[0]}_f.png"}
                     for plane in PLANES}
            row = {"statement_id": f"{study}-{index % per_study:02d}", "study_id": study, "step": step,
                   "statement": steps[step - 1], "label": rng.choice(("ground_truth", "hallucination")),
                   "subtype": None, "language": "en" if index % 2 else "vi", "pair_id": f"{study}-{index % per_study // 2}",
                   "views": views, "volume": f"vol/{study}/ct.nii.gz",
                   "prior_knowledge": steps[step - 2] if step > 1 else None,
                   "external_knowledge": "FDG uptake above the mediastinal blood pool is abnormal.",
                   "rationale_llm": "Matches the fused axial view.", "rationale_clinician": "Checked on PET."}
            handle.write(json.dumps(row) + "\n")


def bench_build(rows: int, tmp: Path) -> None:
    from medheval.data.benchmarks import prepare_benchmark

    data = tmp / "data"
    data.mkdir()
    began = time.perf_counter()
    write_statements(data / "statements.jsonl", rows)
    size = (data / "statements.jsonl").stat().st_size
    print(f"wrote {rows:,} statements ({size / 1e6:.0f} MB) in {time.perf_counter() - began:.1f} s")
    with Timer() as cold:
        loaded = prepare_benchmark("med_stepbench", "all", data_dir=data, cache_dir=tmp / "cache")
    with Timer() as warm:
        again = prepare_benchmark("med_stepbench", "all", data_dir=data, cache_dir=tmp / "cache")
    assert len(loaded.dataset) == len(again.dataset) == rows
    print(f"build {rows:,} rows (cold cache): {cold}; target < 30 s")
    print(f"reload (warm cache): {warm}")


def bench_score(rows: int) -> None:
    import evaluate

    from medheval.data.registry import metric_path

    rng = random.Random(1)
    phrasings = ["Consistent", "Inconsistent", "Consistent.", "Inconsistent.", "The statement is consistent with the images.",
                 "No, this is a hallucination.", "Yes", "True", "False", "Không nhất quán", "Nhất quán"]
    predictions = [rng.choice(phrasings) if rng.random() > 0.01 else f"unclear answer {i}" for i in range(rows)]
    references = [rng.choice(("ground_truth", "hallucination")) for _ in range(rows)]
    steps = [i % 4 + 1 for i in range(rows)]
    languages = ["en" if i % 2 else "vi" for i in range(rows)]
    metric = evaluate.load(metric_path("stepbench"))
    with Timer() as took:
        out = metric.compute(predictions=predictions, references=references, steps=steps, languages=languages)
    print(f"score {rows:,} answers: {took}; target < 10 s  (macro_f1 {out['macro_f1']:.3f}, "
          f"n_unparsed {out['n_unparsed']:,})")


def bench_prefix(studies: int, repeats: int, tmp: Path) -> None:
    import torch

    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava
    from medheval.data.benchmarks import prepare_benchmark
    from medheval.families.stepbench.fixtures import write_stepbench_fixture

    info = write_stepbench_fixture(tmp / "fixture", studies=studies, per_study=10)  # 20 statements per study
    loaded = prepare_benchmark("med_stepbench", "all", data_dir=info["data_dir"], cache_dir=tmp / "cache",
                               image_roots={"med_stepbench": info["data_dir"]}, run_options={"knowledge": "prior"})
    records = loaded.dataset.to_list()
    images = [loaded.resolver.load_record_images(r) for r in records]
    model, processor = build_tiny_llava(seed=0)
    backends = {
        "naive, one prompt per statement": HFBackend(model, processor, batch_size=1, max_new_tokens=4),
        "naive, batched 20": HFBackend(model, processor, batch_size=20, max_new_tokens=4),
        "prefix-cached, batched 20": HFBackend(model, processor, batch_size=20, max_new_tokens=4, prefix_cache=True),
    }
    best = {name: float("inf") for name in backends}
    answers = {}
    backends["naive, batched 20"].generate(records[:20], images[:20])  # warm-up
    for _ in range(repeats):
        for name, backend in backends.items():
            if hasattr(backend, "_prefix_cache") and backend._prefix_cache is not None:
                backend._prefix_cache = None  # no prefix carried over between repeats
            began = time.perf_counter()
            answers[name] = backend.generate(records, images)
            best[name] = min(best[name], time.perf_counter() - began)
    same = answers["prefix-cached, batched 20"] == answers["naive, one prompt per statement"] == answers["naive, batched 20"]
    n = len(records)
    print(f"prefix caching: tiny random LLaVA, {studies} studies x 20 statements = {n}, 3 views each, "
          f"4 new tokens, torch threads {torch.get_num_threads()}, best of {repeats}")
    cached = n / best["prefix-cached, batched 20"]
    for name, seconds in best.items():
        print(f"  {name:34s} {n / seconds:8.1f} statements/s   cached/this = {cached / (n / seconds):.2f}x")
    print(f"  identical answers on all paths: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--studies", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-score", action="store_true")
    parser.add_argument("--skip-prefix", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_build:
            bench_build(args.rows, Path(tmp))
        if not args.skip_score:
            bench_score(args.rows)
        if not args.skip_prefix:
            bench_prefix(args.studies, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()

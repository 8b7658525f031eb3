"""Time CheXbert (``medheval.labelers.chexbert``) on random-weight models with the real file layout.

    python benchmarks/bench_chexbert.py [--data-dir ../shared/data/upstream/medheval] [--full-size]
                                        [--device cpu] [--threads N]

Reports are the ``vishal_report`` references (490 with MedHEval's released files, else the
embedded fixtures repeated to 490). Prints reports/s of ``embed`` (one encoder pass; ``label`` costs
the same plus 14 tiny heads) at batch size 1 and 32, and the load time, for the tiny test model
(hidden 32, 2 layers) and, with ``--full-size``, a bert-base-sized one (hidden 768, 12 layers,
12 heads; small vocabulary, so the file is ~350 MB instead of 1.3 GB but the compute is the real
model's). Random weights: only the speed means anything.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from medheval.labelers.chexbert import CheXbertLabeler, build_random_chexbert

DEFAULT_UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream" / "medheval"
N_REPORTS = 490


def load_reports(data_dir: Path | None, tmp: Path) -> tuple[list[str], str]:
    from medheval.data.benchmarks import prepare_benchmark

    source = "MedHEval vishal_report references"
    if data_dir is None:
        from medheval.families.medheval.fixtures import write_fixture_benchmark

        data_dir = Path(write_fixture_benchmark(tmp / "fixture", with_images=False)["data_dir"])
        source = "fixture vishal_report references, repeated"
    reports = list(prepare_benchmark("vishal_report", "default", data_dir=data_dir, cache_dir=tmp / "cache")
                   .dataset["answer"])
    while len(reports) < N_REPORTS:
        reports = reports + reports
    return reports[:N_REPORTS], source


def time_model(name: str, checkpoint: Path, reports: list[str], device: str, quick_b1: int | None) -> None:
    began = time.perf_counter()
    labeler = CheXbertLabeler(checkpoint, device=device, progress=False)
    load = time.perf_counter() - began
    labeler.embed(reports[:8])  # warm-up
    lengths = [len(ids) for ids in labeler.encode(reports)]
    print(f"{name}: loaded in {load:.2f} s; {len(reports)} reports, {sum(lengths) / len(lengths):.0f} tokens on "
          f"average (max {max(lengths)})")
    for batch_size in (1, 32):
        sample = reports if batch_size != 1 or quick_b1 is None else reports[:quick_b1]
        began = time.perf_counter()
        labeler.embed(sample, batch_size=batch_size)
        seconds = time.perf_counter() - began
        print(f"  batch {batch_size:2d}: {len(sample) / seconds:8.1f} reports/s  "
              f"({len(sample)} reports, {seconds:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_UPSTREAM if DEFAULT_UPSTREAM.is_dir() else None)
    parser.add_argument("--full-size", action="store_true", help="also time a bert-base-sized random model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} CPU threads")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        reports, source = load_reports(args.data_dir, tmp)
        print(f"reports: {source}")
        time_model("tiny (hidden 32, 2 layers)", build_random_chexbert(tmp / "tiny"), reports, args.device, None)
        if args.full_size:
            checkpoint = build_random_chexbert(tmp / "base", hidden_size=768, layers=12, heads=12)
            time_model("bert-base size (hidden 768, 12 layers)", checkpoint, reports, args.device,
                       quick_b1=None if args.device != "cpu" else 100)


if __name__ == "__main__":
    main()

"""Time building every MedHEval split from a local ``benchmark_data/`` copy (cold Arrow cache).

    python benchmarks/bench_build.py [--data-dir ../shared/data/upstream/medheval]

Without the upstream copy it builds the embedded fixtures (tiny: measures overhead only).
Prints seconds for the cold build (every split generated) and the warm reload (cache hit).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from medheval.data.benchmarks import benchmark_configs, list_benchmarks, prepare_benchmark

DEFAULT_UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "upstream" / "medheval"


def build_all(data_dir: Path, cache_dir: Path) -> dict[str, int]:
    return {
        f"{name}:{config}": len(prepare_benchmark(name, config, data_dir=data_dir, cache_dir=cache_dir).dataset)
        for name in list_benchmarks() if name != "med_stepbench"  # its own folder: bench_stepbench.py
        for config in benchmark_configs(name)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_UPSTREAM if DEFAULT_UPSTREAM.is_dir() else None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir
        if data_dir is None:
            from medheval.families.medheval.fixtures import write_fixture_benchmark

            data_dir = Path(write_fixture_benchmark(Path(tmp) / "fixture", with_images=False)["data_dir"])
        cache = Path(tmp) / "cache"
        began = time.perf_counter()
        counts = build_all(data_dir, cache)
        cold = time.perf_counter() - began
        began = time.perf_counter()
        build_all(data_dir, cache)
        warm = time.perf_counter() - began
    for split, n in counts.items():
        print(f"{split:24s} {n:6d} records")
    print(f"data_dir: {data_dir}")
    print(f"cold build of all {len(counts)} splits ({sum(counts.values())} records): {cold:.2f} s")
    print(f"warm reload (Arrow cache hit): {warm:.2f} s   cold/warm = {cold / warm:.1f}x")


if __name__ == "__main__":
    main()

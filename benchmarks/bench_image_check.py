"""Serial vs pooled up-front image check (``ImageResolver.check_records``: stat + header of each local file).

    python benchmarks/bench_image_check.py [--count 2000] [--workers 8] [--repeats 5] [--latency-ms 0]

Writes ``--count`` small PNGs to a temp folder and times ``check_records`` with ``workers=1`` (inline) and
``--workers`` threads (the pool forced on: ``POOL_MIN_LOCAL = 0``), alternating, best of ``--repeats``; then the
same for a few small counts, to see where the pool starts to pay (``POOL_MIN_LOCAL``). ``--latency-ms`` adds a
sleep before every ``stat`` and header read, a stand-in for network storage (simulated: say so when quoting it).
Prints seconds and serial/pooled ratios measured in this one run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

import medheval.data.images as images
from medheval.data.images import ImageResolver, LocalFolderSource


def write_images(folder: Path, count: int) -> list[dict[str, Any]]:
    """``count`` 32x32 grayscale PNGs and one record per image."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("L", (32, 32), i % 256).save(folder / f"{i:05d}.png")
    return [{"id": f"r{i}", "source": "slake", "images": [f"{i:05d}.png"]} for i in range(count)]


def best_of(repeats: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best wall time of each run, the runs alternating so that caches and load treat them alike."""
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def with_latency(seconds: float) -> None:
    """Make every local path lookup sleep ``seconds`` first (simulated network storage): the check of a file
    looks its path up twice, for the ``stat`` and for the header read."""
    path_for = LocalFolderSource.path_for

    def slow_path_for(self: LocalFolderSource, ref: str) -> Path:
        time.sleep(seconds)
        return path_for(self, ref)

    LocalFolderSource.path_for = slow_path_for  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--small", type=int, nargs="*", default=[8, 32, 64, 128, 256])
    args = parser.parse_args()
    if args.latency_ms:
        with_latency(args.latency_ms / 1000)
    rule = images.POOL_MIN_LOCAL
    images.POOL_MIN_LOCAL = 0  # measure the pool itself, at every count
    with tempfile.TemporaryDirectory() as tmp:
        records = write_images(Path(tmp) / "imgs", args.count)
        serial = ImageResolver({"slake": str(Path(tmp) / "imgs")}, workers=1)
        pooled = ImageResolver({"slake": str(Path(tmp) / "imgs")}, workers=args.workers)
        assert serial.check_records(records, progress=False) == pooled.check_records(records, progress=False)
        latency = f", simulated latency {args.latency_ms:g} ms per stat/open" if args.latency_ms else ""
        print(f"check_records on local PNGs, best of {args.repeats}{latency}; pool = {args.workers} threads")
        print(f"{'images':>7s} {'serial s':>10s} {'pooled s':>10s} {'serial/pooled':>14s}")
        for count in sorted({*args.small, args.count}):
            if count > args.count:
                continue
            subset = records[:count]
            best = best_of(args.repeats, {
                "serial": lambda: serial.check_records(subset, progress=False),
                "pooled": lambda: pooled.check_records(subset, progress=False),
            })
            print(f"{count:7d} {best['serial']:10.4f} {best['pooled']:10.4f} {best['serial'] / best['pooled']:13.2f}x")
    print(f"(the resolver pools local checks from POOL_MIN_LOCAL = {rule} images)")


if __name__ == "__main__":
    main()

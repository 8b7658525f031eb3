"""RadGraph extraction on long, degenerate reports: radgraph 0.1.18's own decoding against the linear one.

    python benchmarks/bench_radgraph_long.py [--chars 500 2000 4000 13000] [--package-up-to 4000]
                                             [--widths tiny|real] [--repeat 1]

The report is one sentence repeated up to N characters (a generation stuck in a loop; 13,000
characters is about 2,000 words). Each (decoding, length) runs in a fresh process on CPU with a
random-weight RadGraph model built by ``build_random_radgraph`` (``--widths real`` gives it the real
models' head widths, 768 / 20 / 150, with a one-layer encoder): wall time of ``annotate`` and the
process's peak resident memory. Random weights predict a relation for almost every candidate pair,
so the graphs are about as large as RadGraph allows (R ~ (W / 2)**2 relations for W words): a worst
case. ``package`` (cubic) is run only up to ``--package-up-to`` characters; the two decodings'
graphs are compared where both ran. Ratios are from one run, on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SENTENCE = "Small left pleural effusion with mild basilar atelectasis. "


def report(chars: int) -> str:
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def child(model_dir: str, decoding: str, chars: int, repeat: int) -> None:
    """Annotate one report, print one JSON line (seconds is the best of ``repeat``)."""
    import hashlib
    import warnings

    from medheval.radiology.radgraph_model import RadGraphAnnotator

    warnings.simplefilter("ignore")
    annotator = RadGraphAnnotator(model_dir, device="cpu", decoding=decoding)
    annotator.annotate([SENTENCE])  # warm up
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        graph = annotator.annotate([report(chars)])[0]
        times.append(time.perf_counter() - began)
    digest = hashlib.sha256(json.dumps(graph, sort_keys=True).encode()).hexdigest()[:16]
    print(json.dumps({"decoding": decoding, "chars": chars, "seconds": min(times), "loaded_mb": loaded_mb,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "words": len(graph["text"].split()), "entities": len(graph["entities"]),
                      "relations": sum(len(e["relations"]) for e in graph["entities"].values()), "graph": digest}))


def run(model_dir: Path, decoding: str, chars: int, repeat: int) -> dict:
    command = [sys.executable, __file__, "--child", str(model_dir), decoding, str(chars), str(repeat)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"decoding": decoding, "chars": chars, "error": f"exit {done.returncode}: {done.stderr[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[500, 2000, 4000, 13000])
    parser.add_argument("--package-up-to", type=int, default=4000, help="longest report for the cubic decoding")
    parser.add_argument("--widths", choices=["tiny", "real"], default="tiny")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    from medheval.radiology.tiny_models import build_random_radgraph

    widths = {"tiny": {}, "real": {"hidden_size": 768, "feature_size": 20, "hidden_dims": 150}}[args.widths]
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_random_radgraph(Path(scratch) / "radgraph", seed=0, **widths)
        print(f"{'chars':>7} {'words':>6} {'entities':>8} {'relations':>10} | {'decoding':>8} {'seconds':>8} "
              f"{'peak MB':>8} {'(loaded)':>8} | package/linear time, memory above load")
        for chars in args.chars:
            rows = [run(model_dir, "linear", chars, args.repeat)]
            if chars <= args.package_up_to:
                rows.append(run(model_dir, "package", chars, args.repeat))
            for row in rows:
                if "error" in row:
                    print(f"{chars:>7} {row['decoding']:>8} failed: {row['error']}")
                    continue
                print(f"{row['chars']:>7} {row['words']:>6} {row['entities']:>8} {row['relations']:>10} | "
                      f"{row['decoding']:>8} {row['seconds']:>8.2f} {row['peak_mb']:>8.0f} {row['loaded_mb']:>8.0f} |")
            if len(rows) == 2 and not any("error" in row for row in rows):
                linear, package = rows
                same = "same graph" if linear["graph"] == package["graph"] else "GRAPHS DIFFER"
                above_load = {row["decoding"]: max(1.0, row["peak_mb"] - row["loaded_mb"]) for row in rows}
                memory = above_load["package"] / above_load["linear"]
                print(f"{'':>36} ratio: time x{package['seconds'] / linear['seconds']:.1f}, memory x{memory:.1f}, {same}")


if __name__ == "__main__":
    main()

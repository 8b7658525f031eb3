"""``make demo``: the whole pipeline on the embedded fixtures with a tiny random-weight LLaVA.

Writes synthetic items in MedHEval's real file formats plus generated images
(:mod:`medheval.families.medheval.fixtures`), builds a 2-layer LLaVA with random weights in-process, and runs
every split through ``run`` → predictions → metrics → ``results.md``. The numbers are
meaningless by construction and labelled so; point ``--model`` at a real checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medheval.run.options import RANDOM_WEIGHTS_LABEL, TINY_MODEL

DEMO_BENCHMARKS = ("mm_vishal", "cxr_vishal", "vishal_report", "knowledge:closed", "knowledge:open", "context")


def run_demo(output: str | Path = "runs/demo", batch_size: int = 8, max_new_tokens: int = 12) -> dict[str, Any]:
    """Run the demo into ``output``; returns the results dict."""
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava
    from medheval.families.medheval.fixtures import write_fixture_benchmark
    from medheval.run.runner import RunSpec, run

    output = Path(output)
    fixture = write_fixture_benchmark(output / "fixture_data")
    model, processor = build_tiny_llava(seed=0)
    backend = HFBackend(model, processor, batch_size=batch_size, max_new_tokens=max_new_tokens, seed=0)
    backend.name = TINY_MODEL
    spec = RunSpec(benchmarks=DEMO_BENCHMARKS, output=output / "run", data_dir=fixture["data_dir"],
                   image_roots=fixture["image_roots"], labels={"random_weights": RANDOM_WEIGHTS_LABEL})
    results = run(spec, backend, batch_size=batch_size)
    print((output / "run" / "results.md").read_text())
    run_stepbench_demo(output / "stepbench", model, processor, max_new_tokens=4)
    print(f"demo results: {output / 'run' / 'results.json'}")
    print(f"open the report: {output / 'run' / 'report.html'}")
    print(f"next: {medheval_command()} report {output / 'run'} {output / 'stepbench'} --output {output / 'report'}  "
          "(or run a real model: README, 'Run your own model')")
    return results


def medheval_command() -> str:
    """How to call ``medheval`` from the user's shell now: the bare name when it is on ``PATH`` (an activated
    venv), else the entry point beside this interpreter (``.venv/bin/medheval`` after ``make demo``)."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "medheval"
    on_path = shutil.which("medheval")
    if on_path and (not beside.exists() or Path(on_path).resolve() == beside.resolve()):
        return "medheval"
    if beside.exists():
        try:
            return str(beside.relative_to(Path.cwd()))
        except ValueError:
            return str(beside)
    return f"{sys.executable} -m medheval.cli"


STEPBENCH_KNOWLEDGE = ("none", "both")


def run_stepbench_demo(output: str | Path, model: Any, processor: Any, max_new_tokens: int = 4) -> list[dict[str, Any]]:
    """Med-StepBench on its synthetic fixture (PET/CT volumes, tri-planar views, EN + VI statements),
    without and with knowledge, through the prefix-cached HF backend; writes ``table3.md``."""
    from medheval.backends.hf import HFBackend
    from medheval.report.tables import stepbench_table
    from medheval.run.runner import RunSpec, run
    from medheval.families.stepbench.fixtures import write_stepbench_fixture

    output = Path(output)
    fixture = write_stepbench_fixture(output / "fixture_data", studies=3, per_study=8)
    backend = HFBackend(model, processor, batch_size=16, max_new_tokens=max_new_tokens, seed=0, prefix_cache=True)
    backend.name = TINY_MODEL
    runs = []
    for knowledge in STEPBENCH_KNOWLEDGE:
        spec = RunSpec(benchmarks=["med_stepbench:all"], output=output / f"knowledge_{knowledge}",
                       data_dir=fixture["data_dir"], image_roots={"med_stepbench": fixture["data_dir"]},
                       labels={"random_weights": RANDOM_WEIGHTS_LABEL},
                       benchmark_options={"med_stepbench": {"knowledge": knowledge}})
        runs.append(run(spec, backend, batch_size=16))
    table = ("# Med-StepBench demo (Table 3 shape): recall and F1 (%) per step, hallucination = positive class\n\n"
             f"> **{RANDOM_WEIGHTS_LABEL}**\n\n{stepbench_table(runs)}\n")
    from medheval.run.outputs import atomic_write_text

    atomic_write_text(output / "table3.md", table)  # replaces a planted link, never writes through it
    print(table)
    return runs

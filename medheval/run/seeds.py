"""Several sampling seeds: one pass per seed (``--seeds 0,1,2``, or ``seeds: [0, 1, 2]`` in a grid config).

A sampled answer depends on the seed; one seed's figure hides that variation. With ``--seeds``, every
grid cell (mitigation × control) runs once per seed, each pass a complete run in its own sub-folder::

    <output>/seeds.json                  {"seeds": [0, 1, 2]}: a resumed run must ask for the same seeds
    <output>/<cell>__seed-<s>/           one pass: run.json (settings.seed = s), predictions.jsonl,
                                         scored.jsonl, results.json (settings.seed = s), results.md
    <output>/results.json                {"runs": [...every pass...], "seeds": [0, 1, 2],
                                          "over_seeds": the "over seeds" table (medheval.report.seeds)}

``<cell>`` is the folder a grid cell has without seeds (``none``, ``vcd_alpha-1``, ``none__no_image``).
Without ``--seeds`` nothing changes: one run writes straight into ``<output>``. A killed run, run again
with the same flags, resumes the pass it was in (the passes done are re-scored, not regenerated; records
already in a pass's ``predictions.jsonl`` are not generated again).

Each record samples from its own generator seeded from ``(seed, record id)``
(:mod:`medheval.decoding.sampling`), so a pass gives the same answers at any batch size. ``--seeds`` varies
only the sampling seed: ``--seed`` still seeds the ``noise`` image control, and VCD's noise has its own
``noise_seed``. Seeds with greedy decoding are refused: every pass would repeat the same answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from medheval.run.protocol import RunError

SEEDS_FILE = "seeds.json"
MAX_SEED = 2**63 - 1  # the largest seed every generator seeded from it takes (torch, numpy, the row hash)


def seed_problem(value: Any) -> str | None:
    """What keeps ``value`` from being a seed (``--seed``, an entry of ``--seeds``, a grid's ``seed``), or ``None``:
    a whole number from 0 to :data:`MAX_SEED` (a negative one failed at the noise control's first image with
    numpy's "expected non-negative integer", a huge one with "Overflow when unpacking long long")."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r} is not a whole number"
    if not 0 <= value <= MAX_SEED:
        return f"{value} is out of range (0 to {MAX_SEED})"
    return None


def parse_seeds(text: str | Sequence[Any] | None, where: str = "--seeds") -> list[int] | None:
    """``"0,1,2"`` (or ``[0, 1, 2]``) -> ``[0, 1, 2]``; ``None`` when not given. Non-integers, negative
    values, repeats and an empty list are errors naming ``where``."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()] if isinstance(text, str) else list(text)
    seeds: list[int] = []
    for part in parts:
        if isinstance(part, bool) or not (isinstance(part, int) or (isinstance(part, str) and part.isdecimal())) \
                or seed_problem(int(part)):
            raise RunError(f"{where}: {part!r} is not a seed; give non-negative integers up to {MAX_SEED}, e.g. "
                           f"--seeds 0,1,2")
        seeds.append(int(part))
    if not seeds:
        raise RunError(f"{where} names no seed; give e.g. --seeds 0,1,2, or leave it out for one pass")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise RunError(f"{where}: seed {repeated[0]} is listed twice (each seed is one pass)")
    return seeds


def samples(backend: Any, plan: Any) -> bool:
    """Whether some record is sampled: the backend's ``do_sample``, or any layer of the generation plan
    (:class:`medheval.run.generation.GenerationPlan`; its command-line layer beats the others)."""
    backend_sampling = bool((backend.settings() if callable(getattr(backend, "settings", None)) else {})
                            .get("do_sample"))
    if plan is None:
        return backend_sampling
    if "do_sample" in plan.fixed:
        return bool(plan.fixed["do_sample"])
    layers = [plan.defaults, *plan.answer_types.values(), *plan.benchmarks.values()]
    return backend_sampling or any(bool(layer.get("do_sample")) for layer in layers)


def check_seeds(backend: Any, plan: Any, seeds: Sequence[int]) -> None:
    """Refuse passes that cannot differ: a predictions file or an API-less backend without a seed, or greedy decoding."""
    if not getattr(backend, "needs_images", True) or not hasattr(backend, "seed"):
        raise RunError(f"--seeds runs the model once per seed; {getattr(backend, 'name', 'this backend')} does not "
                       "generate with a seed (a predictions file was decoded elsewhere)")
    if not samples(backend, plan):
        raise RunError(f"--seeds {','.join(map(str, seeds))}: this run decodes greedily (no --do-sample, and no "
                       "generation setting or protocol samples), so every seed would give the same answers. Add "
                       "--do-sample (with --temperature / --top-p), or leave --seeds out")


def record_seeds(output: Path, seeds: Sequence[int] | None) -> None:
    """Write ``<output>/seeds.json`` for a new seeded folder; refuse a folder holding other seeds, or seeds
    when none are asked for (and the reverse)."""
    path = Path(output) / SEEDS_FILE
    recorded = json.loads(path.read_text())["seeds"] if path.exists() else None
    if recorded is None and seeds:
        from medheval.run.outputs import atomic_write_text

        Path(output).mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"seeds": list(seeds)}))
    elif recorded is not None and list(recorded) != list(seeds or []):
        asked = f"--seeds {','.join(map(str, seeds))}" if seeds else "no --seeds"
        raise RunError(f"{output} holds passes for --seeds {','.join(map(str, recorded))} ({SEEDS_FILE}); this run "
                       f"asks for {asked}. Resume with the same seeds, or choose another --output folder")


def seed_folder(cell: str, seed: int | None) -> str:
    """A pass's folder: the cell's own, with ``__seed-<s>`` when the run has seeds."""
    return cell if seed is None else f"{cell}__seed-{seed}"


__all__ = ["MAX_SEED", "SEEDS_FILE", "check_seeds", "parse_seeds", "record_seeds", "samples", "seed_folder", "seed_problem"]

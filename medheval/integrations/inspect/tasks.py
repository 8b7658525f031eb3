"""inspect_ai tasks: one per benchmark that is one generation per item (``medheval/<benchmark>``).

    inspect eval medheval/cxr_vishal -T config=mimic_cxr -T image_root=mimic_cxr=/data/mimic-cxr-jpg/files \\
        -T allow_credentialed=true --no-log-images --model openai-api/vllm/llava-hf/llava-1.5-7b-hf

Each task takes ``config`` (default: the benchmark's default config, as ``medheval run``), ``data_dir`` (else
``$MEDHEVAL_DATA_DIR``) and ``image_root`` (``"source=root,source=root"``, else ``$MEDHEVAL_IMAGE_ROOTS``);
a credentialed (MIMIC) split needs ``-T allow_credentialed=true`` (else ``$MEDHEVAL_ALLOW_CREDENTIALED``).
Its samples come from :func:`medheval.integrations.splits.load_items`: id = our record id, one user
message = the record's images (PNG data URLs, as our API backend sends them) then the prompt ``medheval
run`` builds; target = the reference answer. The solver is ``generate()`` with the split's generation
settings (greedy: ``temperature=0``; ``max_tokens`` = ``medheval run``'s ``max_new_tokens``). The scorer
and split metric are in :mod:`medheval.integrations.inspect.scorers`. ClinHallu has no task
(:data:`~medheval.integrations.splits.EXCLUDED`).
"""

from __future__ import annotations

from typing import Callable

from inspect_ai import Task, task
from inspect_ai._util.registry import registry_name  # the name inspect will give a task (no public API)
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageUser, ContentImage, ContentText, GenerateConfig
from inspect_ai.solver import generate

from medheval.integrations.inspect.scorers import medheval_scorer, split_metrics
from medheval.integrations.splits import (HARNESS_BENCHMARKS, HarnessItem, default_config, generation_settings,
                                          load_items, split_is_fixture)
from medheval.data.schema import record_credentialed
from medheval.judges.media import to_judge_image


def inspect_config(settings: dict) -> GenerateConfig:
    """inspect's ``GenerateConfig`` for our generation settings: greedy (``temperature=0``) with
    ``max_tokens`` = ``max_new_tokens``, as ``medheval run`` decodes (and as our API backend asks a server)."""
    if settings.get("do_sample"):
        raise ValueError(f"generation settings {settings}: the harness tasks decode greedily, as medheval run does")
    return GenerateConfig(max_tokens=settings["max_new_tokens"], temperature=0.0)


def to_sample(item: HarnessItem, benchmark: str, config: str, marks: dict | None = None) -> Sample:
    """One inspect sample: the record's images, then our prompt, in one user message; ``marks``: provenance
    for its metadata (``{"fixture": True}`` on the embedded fixture, which ``publish --results`` refuses)."""
    content: list[ContentImage | ContentText] = [ContentImage(image=to_judge_image(image).data_url)
                                                 for image in item.images]
    content.append(ContentText(text=item.prompt))
    return Sample(input=[ChatMessageUser(content=content)], target=item.target, id=item.id,
                  metadata={"benchmark": benchmark, "config": config, "record_id": item.id,
                            "answer_type": item.record.get("answer_type"), "source": item.record.get("source"),
                            **(marks or {})})


def split_task(benchmark: str, config: str | None = None, data_dir: str | None = None,
               image_root: str | list[str] | None = None, allow_credentialed: bool | str | None = None) -> Task:
    """The inspect task of one split (``benchmark:config``). ``image_root`` is ``"source=root,..."``; inspect's
    CLI hands ``-T image_root=a=x,b=y`` over as a list, joined back here. A split of credentialed records
    (MIMIC) is refused unless ``allow_credentialed`` (``-T allow_credentialed=true``, else
    ``$MEDHEVAL_ALLOW_CREDENTIALED``) opts in: inspect sends the images to any ``--model`` and logs them."""
    config = config or default_config(benchmark)
    if isinstance(image_root, (list, tuple)):
        image_root = ",".join(str(part) for part in image_root)
    items = load_items(benchmark, config, data_dir=data_dir, image_roots=image_root,
                       allow_credentialed=allow_credentialed)
    fixture = {"fixture": True} if split_is_fixture(benchmark, config, data_dir, image_root) else {}
    dataset = MemoryDataset([to_sample(item, benchmark, config, fixture) for item in items], name=f"{benchmark}:{config}")
    return Task(dataset=dataset, solver=generate(), config=inspect_config(generation_settings(benchmark, config)),
                scorer=medheval_scorer(benchmark, config, data_dir, image_root),
                metrics=[split_metrics(benchmark, config, data_dir, image_root)],
                metadata={"benchmark": benchmark, "config": config, **fixture,
                          **({"allow_credentialed": True} if any(record_credentialed(i.record) for i in items) else {})})


def _task_for(benchmark: str) -> Callable[..., Task]:
    """The registered ``@task`` ``medheval/<benchmark>`` (task args ``config``, ``data_dir``, ``image_root``,
    ``allow_credentialed``)."""

    def run_split(config: str | None = None, data_dir: str | None = None,
                  image_root: str | list[str] | None = None, allow_credentialed: bool | str | None = None) -> Task:
        return split_task(benchmark, config, data_dir, image_root, allow_credentialed)

    run_split.__name__ = run_split.__qualname__ = benchmark
    run_split.__doc__ = (f"{benchmark}: the split `medheval run --benchmark {benchmark}:<config>` runs, scored with "
                         "its metrics (config, data_dir, image_root, allow_credentialed as task args).")
    # inspect prefixes a task's name with its package only when it sees that package installed (site-packages, or
    # an editable install whose metadata it finds first); from a checkout on sys.path, or with the checkout's own
    # medheval.egg-info ahead of the venv's metadata, it would register a bare `<benchmark>`. Name it in full then.
    full = f"medheval/{benchmark}"
    return task(name=benchmark if registry_name(run_split, benchmark) == full else full)(run_split)


TASKS: dict[str, Callable[..., Task]] = {benchmark: _task_for(benchmark) for benchmark in HARNESS_BENCHMARKS}
globals().update(TASKS)  # medheval.integrations.inspect.tasks.cxr_vishal, ... (importable by name)

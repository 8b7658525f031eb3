"""Write the lmms-eval task yamls (one per harness split, plus the groups: ``medheval`` for the public
benchmarks, ``medheval_med_stepbench`` for Med-StepBench, whose data is not public):
``python -m medheval.integrations.lmms_eval.write_tasks [FOLDER]`` (default: the package's ``tasks``).
tests/test_integrations_lmms_eval.py checks that the shipped files equal what this writes."""

from __future__ import annotations

import sys
from pathlib import Path

from medheval.integrations import splits
from medheval.integrations.lmms_eval import TASKS_DIR

HEADER = "# written by `python -m medheval.integrations.lmms_eval.write_tasks`: edit that, not this file\n"
GROUP = "medheval"


def task_name(benchmark: str, config: str) -> str:
    return f"medheval_{benchmark}_{config}"


def task_yaml(benchmark: str, config: str) -> str:
    """One split's task: our docs, prompt, images, generation settings and split-wide scores."""
    settings = splits.generation_settings(benchmark, config)
    metrics = "".join(f"  - metric: {number}\n    aggregation: !function utils.aggregate\n"
                      f"    higher_is_better: {'true' if better else 'false'}\n"
                      for number, better in splits.split_numbers(benchmark, config))
    return (f"{HEADER}task: {task_name(benchmark, config)}\n"
            "dataset_path: json\n"
            "dataset_kwargs: !function utils.STUB_DATASET\n"
            "test_split: test\n"
            f"process_docs: !function utils.docs__{benchmark}__{config}\n"
            "output_type: generate_until\n"
            "doc_to_visual: !function utils.doc_to_visual\n"
            "doc_to_text: !function utils.doc_to_text\n"
            "doc_to_target: !function utils.doc_to_target\n"
            "process_results: !function utils.process_results\n"
            "generation_kwargs:\n"
            f"  max_new_tokens: {settings['max_new_tokens']}\n"
            f"  do_sample: {'true' if settings['do_sample'] else 'false'}\n"
            "  temperature: 0\n"
            "  num_beams: 1\n"
            "  until: []\n"
            f"metric_list:\n{metrics}"
            f"metadata:\n  version: 1\n  benchmark: {benchmark}\n  config: {config}\n")


def group_of(benchmark: str) -> str:
    """The group of a benchmark's tasks: ``medheval`` for the public benchmarks; a benchmark whose data is not
    public (its builder's ``NOT_PUBLISHED``, Med-StepBench) gets a group of its own, ``medheval_<benchmark>``,
    so ``--tasks medheval`` runs without data nobody can download."""
    from medheval.data.benchmarks import builder_class

    return GROUP if getattr(builder_class(benchmark), "NOT_PUBLISHED", None) is None else f"{GROUP}_{benchmark}"


def groups() -> dict[str, list[str]]:
    """``{group: [task names]}`` in :func:`splits.harness_splits` order. A config its builder lists in
    ``OUTSIDE_GROUP`` (an earlier revision of a file, e.g. ``vishal_report:ba4586e``) keeps its task but joins no
    group, so ``--tasks medheval`` answers each item set once."""
    from medheval.data.benchmarks import builder_class

    found: dict[str, list[str]] = {}
    for benchmark, config in splits.harness_splits():
        if config in getattr(builder_class(benchmark), "OUTSIDE_GROUP", ()):
            continue
        found.setdefault(group_of(benchmark), []).append(task_name(benchmark, config))
    return found


def group_yaml(group: str = GROUP) -> str:
    tasks = "".join(f"  - {name}\n" for name in groups()[group])
    return f"{HEADER}group: {group}\ntask:\n{tasks}"


def expected_files() -> dict[str, str]:
    """{file name: content} of every yaml the tasks folder holds."""
    files = {f"{task_name(b, c)}.yaml": task_yaml(b, c) for b, c in splits.harness_splits()}
    files.update({f"{group}.yaml": group_yaml(group) for group in groups()})
    return files


def write(folder: Path = TASKS_DIR) -> list[Path]:
    """Write every yaml into ``folder`` and remove yamls that no split has any more."""
    folder.mkdir(parents=True, exist_ok=True)
    files = expected_files()
    for stale in sorted(set(p.name for p in folder.glob("*.yaml")) - set(files)):
        (folder / stale).unlink()
    written = []
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else TASKS_DIR):
        print(path)

"""The Hub's benchmark registration file, ``eval.yaml``, for an exported benchmark dataset repo.

A dataset repo with an ``eval.yaml`` at its root (and on the Hub's allow-list) is shown as a Benchmark with a
leaderboard that gathers the models' ``.eval_results/*.yaml``. The file names the harness that runs it
(``evaluation_framework``, a registered id: ``inspect-ai`` is one, lmms-eval is not) and its tasks, each a
leaderboard. A model's ``.eval_results`` entry shows on a task's leaderboard when its ``task_id`` is the task's
``id``, so there is one task per headline number of each split, with the ``task_id`` that
:func:`medheval.publish.hub.eval_results_entries` gives that number (``<config>/<metric>/<key>``)::

    name: MedHEval CXR-VisHal
    description: ...
    evaluation_framework: inspect-ai
    tasks:
    - id: iu_xray/chair/chair_s
      config: iu_xray
      split: test
      field_spec: {input: question, target: answer}
      solvers: [{name: generate}]
      scorers: [{name: f1}]

    reproduce:
      inspect_task: medheval/cxr_vishal
      task_args: {config: <task config>}
      scorer: medheval.integrations.inspect.scorers.medheval_scorer
      metric: <task id after the config>

The splits are those our inspect tasks run (``inspect eval medheval/<benchmark> -T config=<config>``,
:func:`medheval.integrations.splits.harness_splits`) that the repo holds, and the numbers are each split's
headline numbers (:mod:`medheval.scoring.headline`). ``field_spec``, ``solvers`` and ``scorers`` are required
with ``inspect-ai`` (hf.co/docs/hub eval.yaml specification), and inspect's own reader of the file (``inspect
eval hf/<repo>``, inspect_ai ``_eval/task/hf.py``) accepts only its built-in solvers and scorers there and no
other key in a task entry: a name of ours would make the file unreadable to it. So the task entries name
inspect's generic ``generate`` with ``match`` (close-ended) or ``f1`` (free text), which cannot compute CHAIR or
our split-level ratios, and the top-level ``reproduce`` block (ignored by inspect's reader) names the inspect
task and scorer that give the published value: ``inspect eval medheval/<benchmark> -T config=<config>``, whose
metric ``<metric>/<key>`` is the task id after the config (:func:`reproduction`;
tests/test_interop_inspect_tasks.py runs a written file that way). :func:`read_eval_yaml` parses the file back
and checks every task against the repo's card (``configs`` with their ``data_files`` splits) and the files on disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

EVAL_YAML = "eval.yaml"
REPRODUCE = "reproduce"  # top-level: inspect's eval.yaml reader ignores it (its task entries forbid extra keys)
SCORER = "medheval.integrations.inspect.scorers.medheval_scorer"
FRAMEWORK = "inspect-ai"
SPLIT = "test"  # every exported config has this one split (medheval.publish.hub.export_dataset)
TASK_KEYS = ("id", "config", "split")
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
FIELD_SPEC = {"input": "question", "target": "answer"}  # columns of the exported rows (medheval.data.schema)


class EvalYamlError(ValueError):
    """An ``eval.yaml`` that does not parse, lacks a field, or names a config/split its repo does not hold."""


def harness_configs(benchmark: str, configs: Iterable[str]) -> list[str]:
    """The exported ``configs`` of ``benchmark`` that an inspect task runs, in the order given."""
    from medheval.integrations.splits import harness_splits

    runnable = {config for name, config in harness_splits() if name == benchmark}
    return [config for config in configs if config in runnable]


def eval_yaml(benchmark: str, configs: Iterable[str], pretty_name: str | None = None) -> dict[str, Any]:
    """The ``eval.yaml`` content for ``benchmark``'s repo: one ``inspect-ai`` task (leaderboard) per config and
    headline number, its id the ``.eval_results`` ``task_id`` of that number; split ``test``."""
    from medheval.integrations.splits import split_numbers

    tasks = [{"id": f"{config}/{number.replace('.', '/')}", "config": config, "split": SPLIT,
              "field_spec": dict(FIELD_SPEC), "solvers": [{"name": "generate"}],
              "scorers": [{"name": "match" if number.startswith("close_ended_accuracy.") else "f1"}]}
             for config in configs for number, _ in split_numbers(benchmark, config)]
    description = (f"{pretty_name or benchmark}: hallucination evaluation of medical vision-language models. "
                   f"Reproduce a task's number with `pip install medheval[interop]` and "
                   f"`inspect eval medheval/{benchmark} -T config=<task config>` (scorer {SCORER}); its inspect "
                   "metric `<metric>/<key>` (the task id after the config) is the published value. Prompts, images, "
                   "generation settings and scorers are those of `medheval run`. A config holding MIMIC-CXR records "
                   "runs only with `-T allow_credentialed=true`, for users with PhysioNet access.")
    return {"name": pretty_name or benchmark, "description": description, "evaluation_framework": FRAMEWORK,
            "tasks": tasks, REPRODUCE: {"inspect_task": f"medheval/{benchmark}", "task_args": {"config": "<task config>"},
                                        "scorer": SCORER, "metric": "<task id after the config>",
                                        "install": 'pip install "medheval[interop]"'}}


def reproduction(data: Mapping[str, Any], task_id: str) -> dict[str, Any]:
    """How to reproduce one task's published value from a written ``eval.yaml``: ``{"task": "medheval/<benchmark>",
    "task_args": {"config": ...}, "metric": "<metric>/<key>"}`` (run the task, read that inspect metric)."""
    recipe = data.get(REPRODUCE) or {}
    task = next((task for task in data.get("tasks") or [] if task.get("id") == task_id), None)
    if task is None or not recipe.get("inspect_task"):
        raise EvalYamlError(f"eval.yaml has no task {task_id!r} or no {REPRODUCE}.inspect_task (its tasks: "
                            f"{[t.get('id') for t in data.get('tasks') or []]})")
    config, _, metric = task_id.partition("/")
    return {"task": recipe["inspect_task"], "task_args": {"config": task["config"]}, "metric": metric}


def write_eval_yaml(folder: str | Path, benchmark: str, configs: Iterable[str],
                    pretty_name: str | None = None) -> Path | None:
    """Write ``<folder>/eval.yaml`` for the configs an inspect task runs; ``None`` (no file) when there is none."""
    runnable = harness_configs(benchmark, configs)
    if not runnable:
        return None
    path = Path(folder) / EVAL_YAML
    path.write_text(yaml.safe_dump(eval_yaml(benchmark, runnable, pretty_name), sort_keys=False, allow_unicode=True,
                                   width=100))
    read_eval_yaml(folder)  # what we write must pass our own check
    return path


def card_section(benchmark: str, configs: Iterable[str], excluded: Mapping[str, str] | None = None) -> str:
    """The dataset card's paragraph on ``eval.yaml`` and the inspect tasks (empty without tasks)."""
    configs = list(configs)
    if not configs:
        return ""
    text = ("\n\n## Benchmark on the Hub (`eval.yaml`)\n\n"
            f"`eval.yaml` registers this repo as a Hub benchmark run with inspect-ai: one task (leaderboard) per "
            f"headline number of each config ({', '.join(f'`{config}`' for config in configs)}; split `test`), "
            "its id the `task_id` under which `medheval publish --results` files that number. Run a config with "
            f"`pip install medheval[interop]` and `inspect eval medheval/{benchmark} -T config={configs[0]} "
            f"--model <provider/model>` (images: `-T image_root=<source>=<folder>`; a config holding MIMIC-CXR "
            "records also needs `-T allow_credentialed=true`, for users with PhysioNet access: the task refuses it "
            "otherwise); its metric `<metric>/<key>` "
            "(the task id after the config) is the published value, and the split metrics equal "
            "`medheval run --predictions` on the same outputs. The task entries' generic `generate`/`match`/`f1` "
            "are what the Hub's format requires; they do not compute our numbers (the `reproduce` block names the "
            "task that does).")
    if excluded:
        text += " Not run by inspect tasks: " + "; ".join(f"{name} ({why})" for name, why in sorted(excluded.items())) + "."
    return text


def _card_splits(folder: Path) -> dict[str, dict[str, list[str]]]:
    """``{config: {split: [data file patterns]}}`` from the repo card's ``configs`` YAML."""
    from huggingface_hub import DatasetCard

    card = folder / "README.md"
    if not card.is_file():
        raise EvalYamlError(f"{card} not found: eval.yaml is checked against the dataset card's configs")
    meta = DatasetCard.load(card).data.to_dict()
    found: dict[str, dict[str, list[str]]] = {}
    for entry in meta.get("configs") or []:
        files = entry.get("data_files") or []
        splits = found.setdefault(str(entry.get("config_name")), {})
        for item in files if isinstance(files, list) else [files]:
            if isinstance(item, Mapping):
                splits.setdefault(str(item.get("split")), []).extend(
                    [item["path"]] if isinstance(item.get("path"), str) else list(item.get("path") or []))
    return found


def read_eval_yaml(folder: str | Path) -> dict[str, Any]:
    """Parse ``<folder>/eval.yaml`` and check it: the four fields, ``evaluation_framework: inspect-ai``, and
    each task's ``config``/``split`` a config and split of the repo's card with its data files present."""
    folder = Path(folder)
    path = folder / EVAL_YAML
    fix = "rewrite it with `medheval publish --kind datasets`"
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise EvalYamlError(f"{path} not found: {fix}") from None
    except yaml.YAMLError as error:
        raise EvalYamlError(f"{path} is not valid YAML ({str(error).splitlines()[0]}): {fix}") from None
    if not isinstance(data, dict):
        raise EvalYamlError(f"{path}: expected a mapping with name, description, evaluation_framework, tasks: {fix}")
    missing = [key for key in ("name", "description", "evaluation_framework", "tasks") if not data.get(key)]
    if missing:
        raise EvalYamlError(f"{path}: missing or empty field(s) {missing}: {fix}")
    if data["evaluation_framework"] != FRAMEWORK:
        raise EvalYamlError(f"{path}: evaluation_framework is {data['evaluation_framework']!r}; our tasks run with "
                            f"{FRAMEWORK!r} (a framework id the Hub has registered): {fix}")
    recipe = data.get(REPRODUCE)
    if not (isinstance(recipe, dict) and isinstance(recipe.get("inspect_task"), str)
            and recipe["inspect_task"].startswith("medheval/")):
        raise EvalYamlError(f"{path}: {REPRODUCE}.inspect_task (medheval/<benchmark>, the inspect task that gives the "
                            f"published values) is missing: {fix}")
    if not isinstance(data["tasks"], list):
        raise EvalYamlError(f"{path}: tasks must be a list of {{id, config, split}}: {fix}")
    available = _card_splits(folder)
    seen: set[str] = set()
    for index, task in enumerate(data["tasks"]):
        where = f"{path}: tasks[{index}]"
        if not isinstance(task, dict) or any(not isinstance(task.get(key), str) for key in TASK_KEYS):
            raise EvalYamlError(f"{where} is {task!r}; each task needs string fields {list(TASK_KEYS)}: {fix}")
        task_id, config, split = (task[key] for key in TASK_KEYS)
        if not TASK_ID.fullmatch(task_id) or task_id in seen:
            raise EvalYamlError(f"{where}: task id {task_id!r} is {'repeated' if task_id in seen else 'not a name'}: {fix}")
        seen.add(task_id)
        inspect_fields = (isinstance(task.get("field_spec"), dict)
                          and all(isinstance(task["field_spec"].get(key), str) for key in ("input", "target"))
                          and all(isinstance(task.get(key), list) and task[key]
                                  and all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in task[key])
                                  for key in ("solvers", "scorers")))
        if not inspect_fields:
            raise EvalYamlError(f"{where} (id {task_id!r}) lacks what the Hub requires with inspect-ai: field_spec "
                                "{input, target} and non-empty solvers/scorers lists of {name}: " + fix)
        if config not in available:
            raise EvalYamlError(f"{where} (id {task_id!r}) names config {config!r}, which this repo does not hold "
                                f"(its configs: {sorted(available)}): {fix}")
        if split not in available[config]:
            raise EvalYamlError(f"{where} (id {task_id!r}) names split {split!r} of config {config!r}, which has "
                                f"only {sorted(available[config])}: {fix}")
        if not any(any(folder.glob(pattern)) for pattern in available[config][split]):
            raise EvalYamlError(f"{where} (id {task_id!r}): no data file for {config}/{split} "
                                f"({available[config][split]} under {folder}): {fix}")
    return data

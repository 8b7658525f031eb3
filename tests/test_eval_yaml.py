"""``eval.yaml``, the Hub's benchmark registration file, in every exported benchmark dataset repo.

Written by ``medheval publish --kind datasets`` (:func:`medheval.publish.hub.export_dataset`), parsed back by
:func:`medheval.publish.eval_yaml.read_eval_yaml`: ``evaluation_framework: inspect-ai`` and one task (one
leaderboard) per headline number of each config that an inspect task runs, its id the ``task_id`` that
``publish --results`` files that number under, each pointing at a config and split the repo really holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import SHARED_UPSTREAM

from medheval.data.benchmarks import benchmark_configs
from medheval.integrations.splits import EXCLUDED, HARNESS_BENCHMARKS, harness_splits, split_numbers
from medheval.publish import hub
from medheval.publish.eval_yaml import EvalYamlError, read_eval_yaml, reproduction

MEDHEVAL_SPLITS = ("mm_vishal", "cxr_vishal", "vishal_report", "knowledge", "context")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, fixture_benchmark, dataset_cache) -> dict[str, Path]:
    """MedHEval's five benchmark repos from the fixture, plus Med-HallMark's from the real upstream files
    when ``../shared`` is there."""
    out = tmp_path_factory.mktemp("publish")
    repos = hub.export_all(out, kinds=["datasets"], names=MEDHEVAL_SPLITS, data_dir=fixture_benchmark["data_dir"],
                           cache_dir=dataset_cache)
    if (SHARED_UPSTREAM / "med-hallmark").is_dir():
        repos += hub.export_all(out, kinds=["datasets"], names=["med_hallmark"],
                                data_dir=SHARED_UPSTREAM / "med-hallmark", cache_dir=dataset_cache)
    return {Path(repo.folder).name: Path(repo.folder) for repo in repos}


def test_every_published_benchmark_has_an_eval_yaml_that_parses_back(exported):
    """Each repo's tasks are its configs that ``inspect eval medheval/<benchmark>`` runs (all of them for these
    one-generation-per-item benchmarks) times their headline numbers, split ``test``, id
    ``<config>/<metric>/<key>``; framework ``inspect-ai`` with the fields the Hub requires for it."""
    assert set(MEDHEVAL_SPLITS) <= set(exported)
    for name, folder in exported.items():
        data = read_eval_yaml(folder)
        assert data["evaluation_framework"] == "inspect-ai"
        assert data["name"] and f"inspect eval medheval/{name}" in data["description"]
        expected = [config for config in benchmark_configs(name) if (name, config) in set(harness_splits())]
        assert expected == benchmark_configs(name), name  # no exported config is left without a task
        ids = [f"{config}/{number.replace('.', '/')}" for config in expected for number, _ in split_numbers(name, config)]
        assert [task["id"] for task in data["tasks"]] == ids and len(ids) >= len(expected), name
        for task in data["tasks"]:
            assert task["id"].split("/")[0] == task["config"] and task["split"] == "test"
            assert task["field_spec"] == {"input": "question", "target": "answer"} and task["solvers"] == [{"name": "generate"}]
        # the reproduce block names our inspect task and scorer (issue 32, point 4)
        assert data["reproduce"]["inspect_task"] == f"medheval/{name}"
        assert data["reproduce"]["scorer"] == "medheval.integrations.inspect.scorers.medheval_scorer"
        for task in data["tasks"]:
            assert reproduction(data, task["id"]) == {"task": f"medheval/{name}", "task_args": {"config": task["config"]},
                                                      "metric": task["id"].split("/", 1)[1]}
        # every task points at a config of the card and a Parquet file on disk
        meta, body = hub.split_card((folder / "README.md").read_text())
        card_configs = {entry["config_name"]: entry["data_files"] for entry in meta["configs"]}
        for task in data["tasks"]:
            assert {"split": "test", "path": f"{task['config']}/test-*"} in card_configs[task["config"]]
            assert (folder / task["config"] / "test-00000-of-00001.parquet").is_file()
        assert "## Benchmark on the Hub (`eval.yaml`)" in body and f"medheval/{name} -T config=" in body


def test_med_hallmark_gets_its_four_splits(exported):
    if "med_hallmark" not in exported:
        pytest.skip("../shared/data/upstream/med-hallmark is absent")
    configs = [task["config"] for task in read_eval_yaml(exported["med_hallmark"])["tasks"]]
    assert list(dict.fromkeys(configs)) == ["conventional", "counterfactual", "confidence_weakening", "irg"]


def test_published_results_land_on_the_eval_yaml_leaderboards(exported):
    """The Hub puts a model's ``.eval_results`` entry on the leaderboard whose task id is its ``task_id``: a
    results.json holding every headline number of a split gives entries for exactly its eval.yaml tasks."""
    data = read_eval_yaml(exported["cxr_vishal"])
    metrics: dict[str, dict[str, float]] = {}
    for config in benchmark_configs("cxr_vishal"):
        for number, _ in split_numbers("cxr_vishal", config):
            metric, key = number.split(".")
            metrics.setdefault(f"cxr_vishal:{config}", {}).setdefault(metric, {})[key] = 0.5
    results = {"settings": {}, "benchmarks": {split: {"metrics": {metric: {**values, "n": 9}
                                                                  for metric, values in block.items()}, "n_scored": 9}
                                              for split, block in metrics.items()}}
    task_ids = {entry["dataset"]["task_id"] for entries in hub.eval_results_entries(results, date="2026-11-26").values()
                for entry in entries}
    assert task_ids == {task["id"] for task in data["tasks"]}


def test_clinhallu_has_no_task_and_no_repo():
    """ClinHallu's protocol needs several generations per item: no inspect task, so no eval.yaml either."""
    assert "clinhallu" in EXCLUDED and "clinhallu" not in HARNESS_BENCHMARKS
    assert not [split for split in harness_splits() if split[0] == "clinhallu"]


def _corrupt(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of the repo's card and eval.yaml (and its Parquet files) with ``edit`` applied to eval.yaml."""
    import shutil

    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    path = copy / "eval.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(edit(data) if callable(edit) else edit)
    return copy


@pytest.mark.parametrize("edit, message", [
    (lambda d: yaml.safe_dump({**d, "tasks": d["tasks"] + [{**d["tasks"][0], "id": "nope", "config": "nope"}]}),
     r"tasks\[3\] \(id 'nope'\) names config 'nope', which this repo does not hold \(its configs: \['all', "
     r"'iu_xray', 'mimic_cxr'\]\)"),
    (lambda d: yaml.safe_dump({**d, "tasks": [{**d["tasks"][0], "split": "validation"}]}),
     r"tasks\[0\] \(id 'all/close_ended_accuracy/accuracy'\) names split 'validation' of config 'all', which has "
     r"only \['test'\]"),
    (lambda d: yaml.safe_dump({**d, "evaluation_framework": "lmms-eval"}), r"evaluation_framework is 'lmms-eval'"),
    (lambda d: yaml.safe_dump({k: v for k, v in d.items() if k != "tasks"}), r"missing or empty field\(s\) \['tasks'\]"),
    (lambda d: yaml.safe_dump({**d, "tasks": [{"id": "all", "config": "all"}]}), r"tasks\[0\] is .*string fields"),
    (lambda d: yaml.safe_dump({**d, "tasks": [d["tasks"][0], d["tasks"][0]]}),
     r"task id 'all/close_ended_accuracy/accuracy' is repeated"),
    (lambda d: yaml.safe_dump({**d, "tasks": [{k: v for k, v in d["tasks"][0].items() if k != "scorers"}]}),
     r"tasks\[0\] \(id 'all/close_ended_accuracy/accuracy'\) lacks what the Hub requires with inspect-ai"),
    ("tasks: [id: all\n", r"not valid YAML"),
    (lambda d: yaml.safe_dump({k: v for k, v in d.items() if k != "reproduce"}), r"reproduce.inspect_task .* is missing"),
])
def test_a_corrupted_eval_yaml_is_refused_with_the_task_and_the_fix(exported, tmp_path, edit, message):
    copy = _corrupt(exported["cxr_vishal"], tmp_path, edit)
    with pytest.raises(EvalYamlError, match=message) as caught:
        read_eval_yaml(copy)
    assert str(copy / "eval.yaml") in str(caught.value) and "medheval publish --kind datasets" in str(caught.value)


def test_a_task_whose_data_files_are_gone_is_refused(exported, tmp_path):
    copy = _corrupt(exported["cxr_vishal"], tmp_path, lambda d: yaml.safe_dump(d))
    (copy / "iu_xray" / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(EvalYamlError, match=r"tasks\[1\] \(id 'iu_xray/close_ended_accuracy/accuracy'\): no data file for iu_xray/test"):
        read_eval_yaml(copy)

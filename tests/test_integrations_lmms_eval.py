"""The lmms-eval task folder (issue 24, part 1), checked without lmms-eval (main venv): the shipped yamls are
exactly what write_tasks writes for harness_splits() (so they cannot drift), they parse as lmms-eval reads
them (``!function`` tags naming functions of tasks/utils.py), the folder is what ``medheval integrations
lmms-eval-path`` prints, the plugin layout lmms-eval's LMMS_EVAL_PLUGINS expects exists, and the task
functions (docs, prompts, images, per-sample results, split aggregation) equal the splits contract.
tests/test_interop_lmms_eval.py runs the tasks in lmms-eval itself."""

from __future__ import annotations

import importlib
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from medheval.integrations import splits
from medheval.integrations.lmms_eval import TASKS_DIR, write_tasks



@pytest.fixture(autouse=True)
def _credentialed_allowed(monkeypatch):
    """The fixture's MIMIC splits load here (no model is run); the refusal is tested with it unset."""
    monkeypatch.setenv("MEDHEVAL_ALLOW_CREDENTIALED", "1")

def test_shipped_yamls_are_the_written_ones_one_per_harness_split(tmp_path):
    shipped = {path.name: path.read_text(encoding="utf-8") for path in TASKS_DIR.glob("*.yaml")}
    assert shipped == write_tasks.expected_files(), "run: python -m medheval.integrations.lmms_eval.write_tasks"
    tasks = {name[:-len(".yaml")] for name in shipped} - {"medheval", "medheval_med_stepbench"}
    assert tasks == {f"medheval_{b}_{c}" for b, c in splits.harness_splits()}
    assert not any("clinhallu" in name for name in shipped)
    write_tasks.write(tmp_path)
    (tmp_path / "medheval_old_split.yaml").write_text("task: gone\n")
    write_tasks.write(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == sorted(shipped)


def _load(path: Path) -> dict:
    """A task yaml as lmms-eval's loader reads it: ``!function utils.name`` -> that attribute of tasks/utils.py."""
    spec = importlib.util.spec_from_file_location("utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: getattr(utils, loader.construct_scalar(node).split(".")[1]))
    return yaml.load(path.read_text(), Loader=Loader)


@pytest.mark.parametrize("benchmark, config", [("cxr_vishal", "mimic_cxr"), ("vishal_report", "default"),
                                               ("med_stepbench", "vi")])
def test_task_yaml_settings_come_from_the_splits_contract(benchmark, config):
    task = _load(TASKS_DIR / f"medheval_{benchmark}_{config}.yaml")
    assert task["task"] == f"medheval_{benchmark}_{config}" and task["output_type"] == "generate_until"
    assert task["generation_kwargs"]["max_new_tokens"] == splits.generation_settings(benchmark, config)["max_new_tokens"]
    assert task["generation_kwargs"]["do_sample"] is False and task["generation_kwargs"]["until"] == []
    assert [(m["metric"], m["higher_is_better"]) for m in task["metric_list"]] == splits.split_numbers(benchmark, config)
    assert all(m["aggregation"].__name__ == "aggregate" for m in task["metric_list"])
    assert task["process_docs"].__name__ == f"docs__{benchmark}__{config}"
    assert Path(task["dataset_kwargs"]["data_files"]["test"]).is_file() and task["dataset_path"] == "json"
    group = "medheval_med_stepbench" if benchmark == "med_stepbench" else "medheval"
    listed = yaml.safe_load((TASKS_DIR / f"{group}.yaml").read_text())
    assert listed["group"] == group and task["task"] in listed["task"]


def test_the_medheval_group_holds_the_public_benchmarks_only():
    """Issue 32, point 6: ``--tasks medheval`` stopped on Med-StepBench's missing folder (its data is not public),
    so none of the tasks ran; Med-StepBench has a group of its own."""
    groups = {name: yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text())["task"]
              for name in ("medheval", "medheval_med_stepbench")}
    assert groups["medheval_med_stepbench"] == ["medheval_med_stepbench_en", "medheval_med_stepbench_vi",
                                                "medheval_med_stepbench_all"]
    assert not any("stepbench" in name for name in groups["medheval"])
    everything = {f"medheval_{b}_{c}" for b, c in splits.harness_splits()}
    outside = {"medheval_vishal_report_ba4586e"}  # an earlier revision of the report file: a task, in no group
    assert set(groups["medheval"]) | set(groups["medheval_med_stepbench"]) == everything - outside
    assert len(groups["medheval"]) == len(everything) - 3 - len(outside) == 14


def test_cli_prints_the_task_folder_and_the_plugin_layout_exists(capsys):
    from medheval.cli.main import main

    assert main(["integrations", "lmms-eval-path"]) == 0
    assert Path(capsys.readouterr().out.strip()) == TASKS_DIR
    # LMMS_EVAL_PLUGINS=<pkg>: lmms-eval takes find_spec("<pkg>.tasks")'s folder and <pkg>.models.AVAILABLE_MODELS
    spec = importlib.util.find_spec("medheval.integrations.lmms_eval.tasks")
    assert Path(spec.submodule_search_locations[0]) == TASKS_DIR
    assert importlib.import_module("medheval.integrations.lmms_eval.models").AVAILABLE_MODELS == {}


def test_task_functions_give_the_contract_s_docs_prompts_images_and_scores(fixture_benchmark, monkeypatch):
    """Docs, prompt, images equal load_items; process_results keeps (id, prediction) per reported number, and
    ``aggregate`` over all samples equals score_split's number (CHAIR_i is a ratio over the split's findings,
    not a mean of per-report values, so averaging per-sample numbers would differ)."""
    from medheval.integrations.lmms_eval import functions

    monkeypatch.setenv("MEDHEVAL_DATA_DIR", fixture_benchmark["data_dir"])
    monkeypatch.setenv("MEDHEVAL_IMAGE_ROOTS", ",".join(f"{s}={r}" for s, r in fixture_benchmark["image_roots"].items()))
    docs = functions.docs__vishal_report__default(None)
    items = splits.load_items("vishal_report", "default")
    assert docs["id"] == [item.id for item in items]
    for doc, item in zip(docs, items):
        assert functions.doc_to_text(doc, {}) == item.prompt and functions.doc_to_target(doc) == item.target
        assert [np.asarray(im).tobytes() for im in functions.doc_to_visual(doc)] == \
               [np.asarray(im).tobytes() for im in item.images]
    # two samples (a harness run with --limit 2): report 0 is its reference (findings: pneumonia, opacity; none
    # hallucinated), report 1 names 3 findings of which cardiomegaly and pneumothorax are not in its reference.
    # CHAIR_i = hallucinated / generated over the split = 2 / 5 = 0.4 (MedHEval, CHAIR on CheXpert findings);
    # averaging the per-report values would give (0 + 2/3) / 2 = 1/3. CHAIR_s = reports with one: 1 / 2.
    outputs = [docs[0]["target"], "Small left pleural effusion. Cardiomegaly. Pneumothorax."]
    results = [functions.process_results(doc, [text]) for doc, text in zip(docs, outputs)]
    assert set(results[0]) == {name for name, _ in splits.split_numbers("vishal_report", "default")}
    assert results[1]["chair.chair"] == {"id": docs[1]["id"], "prediction": outputs[1],
                                         "benchmark": "vishal_report", "config": "default", "number": "chair.chair"}
    metrics, rows = splits.score_split("vishal_report", "default", {d["id"]: t for d, t in zip(docs, outputs)})
    for number, _ in splits.split_numbers("vishal_report", "default"):
        expected = splits.number_value(metrics, number)
        got = functions.aggregate([result[number] for result in results])
        assert (math.isnan(got) and expected is None) or got == pytest.approx(expected), number
    assert functions.aggregate([result["chair.chair"] for result in results]) == pytest.approx(0.4)
    assert functions.aggregate([result["chair.chair_s"] for result in results]) == pytest.approx(0.5)
    assert [row["report_chair"] for row in rows] == pytest.approx([0.0, 2 / 3])

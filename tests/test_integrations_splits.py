"""medheval.integrations.splits (issue 24): the one contract the lmms-eval and inspect tasks call. Checked
against the runner itself on the embedded fixtures: the records and images a model gets from ``medheval
run`` (a recording backend), the metrics ``medheval run --predictions`` writes to results.json, the
generation lengths of medheval.run.generation, and the settings read from the environment."""

from __future__ import annotations

import json

import numpy as np
import pytest

from medheval.data.benchmarks import benchmark_configs, list_benchmarks, prepare_benchmark
from medheval.integrations import splits


@pytest.fixture(scope="module")
def stepbench(tmp_path_factory) -> dict:
    from medheval.families.stepbench.fixtures import write_stepbench_fixture

    return write_stepbench_fixture(tmp_path_factory.mktemp("stepbench"), studies=2, per_study=4)


def _roots(fixture_benchmark: dict) -> str:
    return ",".join(f"{source}={root}" for source, root in fixture_benchmark["image_roots"].items())



@pytest.fixture(autouse=True)
def _credentialed_allowed(monkeypatch):
    """The fixture's MIMIC splits load here (no model is run); the refusal is tested with it unset."""
    monkeypatch.setenv("MEDHEVAL_ALLOW_CREDENTIALED", "1")

def test_harness_splits_are_every_config_of_every_one_generation_benchmark():
    """Every benchmark but ClinHallu (several generations per item) is exposed with all of its configs."""
    assert set(splits.HARNESS_BENCHMARKS) == set(list_benchmarks()) - set(splits.EXCLUDED)
    assert set(splits.EXCLUDED) == {"clinhallu"}
    pairs = splits.harness_splits()
    assert len(pairs) == len(set(pairs))
    assert pairs == [(name, config) for name in splits.HARNESS_BENCHMARKS for config in benchmark_configs(name)]
    assert ("med_hallmark", "irg") in pairs and ("knowledge", "open") in pairs
    assert splits.default_config("cxr_vishal") == "all" and splits.default_config("knowledge") == "closed"
    with pytest.raises(ValueError, match="clinhallu.*several generations"):
        splits.load_items("clinhallu", "all")
    with pytest.raises(ValueError, match="unknown harness benchmark 'nope'"):
        splits.generation_settings("nope")


class _RecordingModel:
    """A backend that keeps what the runner hands it: records (their prompts) and decoded images."""

    name = "recorder"
    needs_images = True

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, list[bytes]]] = {}

    def settings(self) -> dict:
        return {}

    def generate(self, records: list[dict], images: list[list], overrides: dict | None = None) -> list[str]:
        from medheval.run.prompts import build_prompt

        for record, record_images in zip(records, images):
            self.seen[record["id"]] = (build_prompt(record), [np.asarray(im).tobytes() for im in record_images])
        return ["Yes" for _ in records]


@pytest.mark.parametrize("split", ["cxr_vishal:all", "knowledge:open"])
def test_load_items_gives_the_runner_s_records_prompts_and_images(split, fixture_benchmark, tmp_path):
    """The ids, prompt texts and pixels of load_items equal what ``medheval run`` gives a model."""
    from medheval.run.runner import RunSpec, run

    benchmark, config = split.split(":")
    model = _RecordingModel()
    run(RunSpec(benchmarks=[split], output=tmp_path / "run", data_dir=fixture_benchmark["data_dir"],
                image_roots=fixture_benchmark["image_roots"]), model)
    items = splits.load_items(benchmark, config, data_dir=fixture_benchmark["data_dir"],
                              image_roots=_roots(fixture_benchmark))
    assert [item.id for item in items] == list(model.seen)
    for item in items:
        prompt, pixels = model.seen[item.id]
        assert item.prompt == prompt
        assert [np.asarray(im).tobytes() for im in item.images] == pixels and item.images
        assert item.target == item.record["answer"] and item.record["id"] == item.id
    limited = splits.load_items(benchmark, config, data_dir=fixture_benchmark["data_dir"],
                                image_roots=_roots(fixture_benchmark), limit=2)
    assert [item.id for item in limited] == [item.id for item in items[:2]]


def test_prompt_known_answer(fixture_benchmark):
    """A multiple-choice fixture item gets the template of medheval.run.prompts with lettered options."""
    item = splits.load_items("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"],
                             image_roots=_roots(fixture_benchmark), limit=1)[0]
    assert item.id == "cxr_vishal/mimic_cxr/0" and item.target == "B. Pneumonia"
    assert item.prompt.startswith("What does the focal airspace opacity most likely represent? Please choose from "
                                  "the following options: A. ")
    assert ", B. Pneumonia, " in item.prompt and item.prompt.endswith(". Answer with the option's letter.")


def test_credentialed_splits_are_refused_without_an_opt_in(fixture_benchmark, monkeypatch):
    """A harness hands a split's images to whatever model it runs (possibly a remote API): MIMIC records are
    refused, naming the split, records, data use agreement and opt-in, unless the argument or variable says yes."""
    from medheval.judges.endpoints import CredentialedDataError

    monkeypatch.delenv("MEDHEVAL_ALLOW_CREDENTIALED")
    args = {"data_dir": fixture_benchmark["data_dir"], "image_roots": _roots(fixture_benchmark), "limit": 2}
    with pytest.raises(CredentialedDataError, match=r"(?s)cxr_vishal:mimic_cxr: refusing to load 2 credentialed "
                       r"record\(s\) \(cxr_vishal/mimic_cxr/0, cxr_vishal/mimic_cxr/1\).*data use agreement.*"
                       r"-T allow_credentialed=true.*MEDHEVAL_ALLOW_CREDENTIALED=1"):
        splits.load_items("cxr_vishal", "mimic_cxr", **args)
    with pytest.raises(CredentialedDataError, match="vishal_report:default"):
        splits.load_items("vishal_report", "default", decode_images=False, **args)
    assert len(splits.load_items("mm_vishal", "slake", **args)) == 2  # no credentialed record: no opt-in needed
    assert len(splits.load_items("cxr_vishal", "mimic_cxr", allow_credentialed=True, **args)) == 2
    monkeypatch.setenv("MEDHEVAL_ALLOW_CREDENTIALED", "true")
    assert len(splits.load_items("cxr_vishal", "mimic_cxr", **args)) == 2
    with pytest.raises(CredentialedDataError):  # the argument wins over the variable
        splits.load_items("cxr_vishal", "mimic_cxr", allow_credentialed="false", **args)
    monkeypatch.setenv("MEDHEVAL_ALLOW_CREDENTIALED", "maybe")
    with pytest.raises(ValueError, match=r"MEDHEVAL_ALLOW_CREDENTIALED='maybe': expected true or false"):
        splits.load_items("cxr_vishal", "mimic_cxr", **args)
    monkeypatch.delenv("MEDHEVAL_ALLOW_CREDENTIALED")
    # lmms-eval decodes per sample (doc_to_visual -> record_images): a MIMIC doc is refused there too
    doc = {"id": "cxr_vishal/mimic_cxr/0", "benchmark": "cxr_vishal", "config": "mimic_cxr", "source": "mimic_cxr",
           "images": ["p19/p19999901/s59999901/x.jpg"]}
    with pytest.raises(CredentialedDataError, match=r"cxr_vishal:mimic_cxr: refusing .*cxr_vishal/mimic_cxr/0"):
        splits.record_images(doc, image_roots=_roots(fixture_benchmark))


def test_missing_image_root_or_file_is_the_runner_s_clear_error(fixture_benchmark, tmp_path):
    from medheval.data.images import ImageError
    from medheval.run.runner import RunError

    with pytest.raises(RunError, match=r"cxr_vishal:mimic_cxr: no image root for source\(s\) mimic_cxr"):
        splits.load_items("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"],
                          image_roots={"slake": fixture_benchmark["image_roots"]["slake"]})
    with pytest.raises(ImageError, match=r"(?s)9 image\(s\) missing.*cxr_vishal/mimic_cxr/0: p19/.*Image roots in use"):
        splits.load_items("cxr_vishal", "mimic_cxr", data_dir=fixture_benchmark["data_dir"],
                          image_roots=f"mimic_cxr={tmp_path}")


def _predictions(fixture_benchmark: dict, split: str) -> dict[str, str]:
    """The reference answer for the first five records, an unparseable reply for the rest."""
    name, config = split.split(":")
    ids_answers = prepare_benchmark(name, config, data_dir=fixture_benchmark["data_dir"]).dataset
    return {rid: answer if index < 5 else "I am not sure about this one"
            for index, (rid, answer) in enumerate(zip(ids_answers["id"], ids_answers["answer"]))}


SCORED = ["cxr_vishal:mimic_cxr", "vishal_report:default", "knowledge:open"]


def test_score_split_equals_medheval_run_predictions(fixture_benchmark, tmp_path):
    """Split metrics and per-item values equal what ``medheval run --predictions`` writes (results.json
    ``metrics``, scored.jsonl) for the same predictions. Known answer (close-ended accuracy, MedHEval's
    definition: share of items answered correctly, an unparsed answer counting as wrong): cxr_vishal:mimic_cxr
    has 9 fixture items and the first 5 are answered with the reference, so accuracy = 5/9."""
    from medheval.cli.main import main

    every = {rid: text for split in SCORED for rid, text in _predictions(fixture_benchmark, split).items()}
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"id": rid, "prediction": text}) + "\n" for rid, text in every.items()))
    assert main(["run", "--predictions", str(path), "--benchmark", ",".join(SCORED), "--data-dir",
                 fixture_benchmark["data_dir"], "--output", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    scored = [json.loads(line) for line in (tmp_path / "out" / "scored.jsonl").read_text().splitlines()]
    for split in SCORED:
        name, config = split.split(":")
        metrics, rows = splits.score_split(name, config, _predictions(fixture_benchmark, split),
                                           data_dir=fixture_benchmark["data_dir"])
        assert json.loads(json.dumps(metrics)) == results["benchmarks"][split]["metrics"], split
        cli_rows = {row["id"]: row for row in scored if row["split"] == split}
        assert [row["id"] for row in rows] == list(cli_rows)
        assert [splits.item_value(row) for row in rows] == [splits.item_value(row) for row in cli_rows.values()]
    metrics, rows = splits.score_split("cxr_vishal", "mimic_cxr", _predictions(fixture_benchmark,
                                       "cxr_vishal:mimic_cxr"), data_dir=fixture_benchmark["data_dir"])
    assert metrics["close_ended_accuracy"]["accuracy"] == pytest.approx(5 / 9)
    assert [splits.item_value(row) for row in rows] == [1.0] * 5 + [0.0] * 4


def test_score_split_of_a_subset_and_unknown_ids(fixture_benchmark):
    """A harness run with --limit 2 scores those 2 records only; an id of no record raises, naming it."""
    predictions = dict(list(_predictions(fixture_benchmark, "cxr_vishal:mimic_cxr").items())[:2])
    metrics, rows = splits.score_split("cxr_vishal", "mimic_cxr", predictions, data_dir=fixture_benchmark["data_dir"])
    assert metrics["close_ended_accuracy"]["n"] == 2 and len(rows) == 2
    with pytest.raises(ValueError, match=r"1 prediction id\(s\) are no record of cxr_vishal:mimic_cxr.*cxr_vishal/mimic_cxr/99"):
        splits.score_split("cxr_vishal", "mimic_cxr", {"cxr_vishal/mimic_cxr/99": "Yes"},
                           data_dir=fixture_benchmark["data_dir"])


def test_item_value_known_answers():
    """One number per sample: MediHall item score, else correctness, else the judge's score, else the
    report's CHAIR, else ROUGE-L; a metric that failed on the item (None) gives None, never 0."""
    assert splits.item_value({"correct": True}) == 1.0
    assert splits.item_value({"correct": False, "parsed": False}) == 0.0
    assert splits.item_value({"correct": None}) is None
    assert splits.item_value({"item_scores": 0.6, "correct": False}) == 0.6
    assert splits.item_value({"scores": 3}) == 3.0
    assert splits.item_value({"report_chair": 0.25, "rougeL_per_item": 0.5}) == 0.25
    assert splits.item_value({"rougeL_per_item": 0.5, "bleu_per_item": 0.1}) == 0.5
    assert splits.item_value({"id": "x", "prediction": "y"}) is None


def test_generation_settings_are_the_runner_s_lengths():
    """medheval.run.generation's table: yes/no 16, multiple choice 32, statement 16, open 256, report 512
    tokens; a split mixing yes/no and multiple choice gets the longer (32); always greedy."""
    assert splits.generation_settings("cxr_vishal", "mimic_cxr") == {"max_new_tokens": 32, "do_sample": False}
    assert splits.generation_settings("knowledge", "closed")["max_new_tokens"] == 16
    assert splits.generation_settings("knowledge", "open")["max_new_tokens"] == 256
    assert splits.generation_settings("vishal_report")["max_new_tokens"] == 512
    assert splits.generation_settings("med_hallmark", "irg")["max_new_tokens"] == 512
    assert splits.generation_settings("med_hallmark", "conventional")["max_new_tokens"] == 256
    assert splits.generation_settings("med_stepbench", "vi")["max_new_tokens"] == 16


def test_answer_type_table_matches_the_fixture_splits(fixture_benchmark, stepbench, tmp_path):
    """ANSWER_TYPES (the static lengths' source) names each fixture split's answer types."""
    from test_med_hallmark import _write_fixtures

    hallmark = _write_fixtures(tmp_path / "hallmark")
    for name, config in splits.harness_splits():
        data_dir = {"med_stepbench": stepbench["data_dir"], "med_hallmark": hallmark}.get(name,
                                                                                           fixture_benchmark["data_dir"])
        found = set(prepare_benchmark(name, config, data_dir=data_dir).dataset.unique("answer_type"))
        declared = set(splits.ANSWER_TYPES.get(f"{name}:{config}") or splits.ANSWER_TYPES[name])
        assert found <= declared, (name, config, found)


def test_harness_settings_from_arguments_and_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MEDHEVAL_DATA_DIR", raising=False)
    monkeypatch.delenv("MEDHEVAL_IMAGE_ROOTS", raising=False)
    monkeypatch.delenv("MEDHEVAL_DATA_DIR_MED_STEPBENCH", raising=False)
    assert splits.harness_settings() == (None, None)
    monkeypatch.setenv("MEDHEVAL_DATA_DIR", "/data/medheval")
    monkeypatch.setenv("MEDHEVAL_DATA_DIR_MED_STEPBENCH", "/data/stepbench")
    monkeypatch.setenv("MEDHEVAL_IMAGE_ROOTS", " slake=/img/slake, mimic_cxr=https://h/{ref}?a=b ,/img/all")
    assert splits.harness_settings() == ("/data/medheval", {"slake": "/img/slake", "mimic_cxr": "https://h/{ref}?a=b",
                                                            "*": "/img/all"})
    assert splits.harness_settings(benchmark="med_stepbench")[0] == "/data/stepbench"
    assert splits.harness_settings(benchmark="cxr_vishal")[0] == "/data/medheval"
    assert splits.harness_settings(tmp_path, "iu_xray=/x") == (str(tmp_path), {"iu_xray": "/x"})
    assert splits.harness_settings(image_roots={"vqa_rad": "/v"})[1] == {"vqa_rad": "/v"}


@pytest.mark.parametrize("value, why", [("slake=", "empty root"), ("slake=/a,slake=/b", "given twice for 'slake'")])
def test_bad_image_roots_variable_names_the_variable_and_the_format(monkeypatch, value, why):
    monkeypatch.setenv("MEDHEVAL_IMAGE_ROOTS", value)
    with pytest.raises(ValueError, match=rf"MEDHEVAL_IMAGE_ROOTS='{value}': .*{why}.*Expected 'source=PATH_OR_URL"):
        splits.harness_settings()


def test_default_metric_names_are_the_ones_medheval_run_computes(fixture_benchmark, stepbench):
    """The static metric names (the harness tasks' reported numbers come from them) equal what score_split
    (the runner) computes on the loaded fixture split."""
    for name, config in [("cxr_vishal", "all"), ("vishal_report", "default"), ("knowledge", "open"),
                         ("knowledge", "closed"), ("context", "default"), ("med_stepbench", "all")]:
        data_dir = stepbench["data_dir"] if name == "med_stepbench" else fixture_benchmark["data_dir"]
        loaded = prepare_benchmark(name, config, data_dir=data_dir, run_options={})
        metrics, _ = splits.score_split(name, config, {loaded.dataset["id"][0]: "Yes"}, data_dir=data_dir)
        assert list(metrics) == splits.default_metric_names(name, config), (name, config)
        for number, _ in splits.split_numbers(name, config):
            assert number.split(".")[0] in metrics
    assert splits.default_metric_names("med_hallmark", "irg") == ["medihall_score", "text_generation"]


def test_number_value_known_answers():
    metrics = {"chair": {"chair": 0.4, "chair_s": None}, "close_ended_accuracy": {"accuracy": 1, "n": 3}}
    assert splits.number_value(metrics, "chair.chair") == 0.4
    assert splits.number_value(metrics, "chair.chair_s") is None
    assert splits.number_value(metrics, "close_ended_accuracy.accuracy") == 1.0
    assert splits.number_value(metrics, "text_generation.bleu") is None


def test_record_images_decode_through_the_environment_s_roots(fixture_benchmark, monkeypatch):
    item = splits.load_items("knowledge", "closed", data_dir=fixture_benchmark["data_dir"],
                             image_roots=_roots(fixture_benchmark), limit=1)[0]
    lazy = splits.load_items("knowledge", "closed", data_dir=fixture_benchmark["data_dir"],
                             image_roots=_roots(fixture_benchmark), limit=1, decode_images=False)[0]
    assert lazy.images == [] and lazy.prompt == item.prompt
    monkeypatch.setenv("MEDHEVAL_IMAGE_ROOTS", _roots(fixture_benchmark))
    assert [np.asarray(im).tobytes() for im in splits.record_images(item.record)] == \
           [np.asarray(im).tobytes() for im in item.images]
    assert splits.record_images({"id": "x", "source": "mimic_cxr", "images": []}) == []


def test_score_split_equals_medheval_run_on_med_stepbench(stepbench, tmp_path):
    """Med-StepBench (its own data folder, statement verdicts): the same equality as above, known answer: the
    right verdict (Consistent for a true statement, Inconsistent for a hallucinated one) for the first 4
    statements and no verdict for the other 4 (unparsed counts as wrong), so accuracy = 4/8."""
    from medheval.cli.main import main

    loaded = prepare_benchmark("med_stepbench", "en", data_dir=stepbench["data_dir"], run_options={})
    items = splits.load_items("med_stepbench", "en", data_dir=stepbench["data_dir"], decode_images=False,
                              image_roots={"med_stepbench": stepbench["data_dir"]})
    assert [item.id for item in items] == loaded.dataset["id"]
    verdict = {"ground_truth": "Consistent", "hallucination": "Inconsistent"}  # the reference label -> its verdict word
    predictions = {item.id: (verdict[item.target] if index < 4 else "Cannot say")
                   for index, item in enumerate(items)}
    metrics, rows = splits.score_split("med_stepbench", "en", predictions, data_dir=stepbench["data_dir"])
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"id": rid, "prediction": text}) + "\n" for rid, text in predictions.items()))
    assert main(["run", "--predictions", str(path), "--benchmark", "med_stepbench:en", "--data-dir",
                 stepbench["data_dir"], "--output", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert json.loads(json.dumps(metrics)) == results["benchmarks"]["med_stepbench:en"]["metrics"]
    assert [splits.item_value(row) for row in rows] == [1.0] * 4 + [0.0] * 4
    assert metrics["stepbench"]["accuracy"] == pytest.approx(0.5)


def test_score_split_loads_the_split_once_per_settings(fixture_benchmark, monkeypatch):
    """inspect scores every sample by calling score_split on that one item: the split is prepared once per
    (split, data folder, image roots, options), and per-item scores equal those of one call over all items."""
    loads = []
    prepare = splits._prepare
    monkeypatch.setattr(splits, "_SCORING_SPLITS", {})
    monkeypatch.setattr(splits, "_prepare", lambda *args, **kwargs: loads.append(args[:2]) or prepare(*args, **kwargs))
    predictions = _predictions(fixture_benchmark, "cxr_vishal:mimic_cxr")
    one_by_one = [splits.item_value(splits.score_split("cxr_vishal", "mimic_cxr", {rid: text},
                                                       data_dir=fixture_benchmark["data_dir"])[1][0])
                  for rid, text in predictions.items()]
    _, rows = splits.score_split("cxr_vishal", "mimic_cxr", predictions, data_dir=fixture_benchmark["data_dir"])
    assert one_by_one == [splits.item_value(row) for row in rows] == [1.0] * 5 + [0.0] * 4
    assert loads == [("cxr_vishal", "mimic_cxr")]
    splits.score_split("cxr_vishal", "mimic_cxr", predictions, data_dir=fixture_benchmark["data_dir"],
                       metric_options={"close_ended_accuracy": {"upstream_compat": True}})
    assert loads == [("cxr_vishal", "mimic_cxr")] * 2  # other options: prepared again


def test_the_unused_image_root_note_is_said_once_per_run_and_never_by_a_harness(fixture_benchmark, tmp_path, capsys,
                                                                                 monkeypatch):
    """Issue 32, point 7: one MEDHEVAL_IMAGE_ROOTS for all splits printed a note per unused source, twice per split."""
    from medheval.cli import main
    from medheval.run import runner

    monkeypatch.setattr(runner, "_NOTED", set())  # once per process: forget the notes of earlier tests
    roots = fixture_benchmark["image_roots"]
    monkeypatch.setenv("MEDHEVAL_IMAGE_ROOTS", ",".join(f"{source}={root}" for source, root in roots.items()))
    for name, config in [("context", "default"), ("cxr_vishal", "iu_xray")]:
        items = splits.load_items(name, config, data_dir=fixture_benchmark["data_dir"], decode_images=False)
        splits.score_split(name, config, {items[0].id: "Yes"}, data_dir=fixture_benchmark["data_dir"])
    assert "not used" not in capsys.readouterr().err
    records = prepare_benchmark("context", "default", data_dir=fixture_benchmark["data_dir"]).dataset.to_list()
    records += prepare_benchmark("knowledge", "closed", data_dir=fixture_benchmark["data_dir"]).dataset.to_list()
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": r["id"], "prediction": "Yes"}) + "\n" for r in records))
    arguments = [arg for source, root in roots.items() for arg in ("--image-root", f"{source}={root}")]
    assert main(["run", "--benchmark", "context,knowledge:closed", "--predictions", str(answers), "--output",
                 str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"], *arguments]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "not used" in line]
    assert notes == ["note: --image-root slake, vqa_rad, iu_xray: no split of this run has images from these sources "
                     "(its image sources: mimic_cxr); not used"]

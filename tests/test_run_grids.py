"""Run grids from YAML (``medheval run --config``), generation settings per benchmark / answer type,
and the prompt + settings recorded per sample. Every shipped ``configs/*.yaml`` validates and runs on
the tiny random LLaVA with ``--limit 2`` offline (fixture data; ClinHallu with a loopback judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

from medheval.cli import main
from medheval.run.generation import BUILTIN_BY_ANSWER_TYPE, GenerationPlan
from medheval.run.grids import (GridConfigError, apply_cli, given_options, load_grid_config, model_slug,
                                  parse_grid_config, run_config, run_spec)
from medheval.run.predictions_log import read_log

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
TINY = "tiny-random-llava"


def _write(tmp_path: Path, text: str, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _roots(roots: dict) -> list[str]:
    return [arg for source, root in roots.items() for arg in ("--image-root", f"{source}={root}")]


# -- validation ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates_and_names_its_paper_table(path):
    config = load_grid_config(path)
    first = path.read_text().splitlines()[0]  # the first comment says which table (or figure) it reproduces
    assert "Table" in first or "Figure" in first
    # Hub ids, or the folder the LLaVA-Med converter writes (medheval.backends.convert_llava_med)
    assert config.models and all(model.count("/") == 1 or model.startswith("./models/") for model in config.models)
    assert config.output.startswith("runs/")


def test_the_shipped_configs_cover_the_papers_tables():
    text = " ".join(path.read_text().splitlines()[0] for path in CONFIGS)
    for table in ("MedHEval (arXiv 2503.02157) Table 3", "Table 4", "Table 5", "Table 7", "Med-HallMark",
                  "ClinHallu (arXiv 2606.14697) Tables 2-3", "Med-StepBench (arXiv 2605.10002) Table 3"):
        assert table in text
    benchmarks = {b for path in CONFIGS for b in load_grid_config(path).benchmarks}
    assert {"mm_vishal", "cxr_vishal", "vishal_report", "knowledge:closed", "knowledge:open", "context",
            "clinhallu:all", "med_stepbench:all"} <= benchmarks


@pytest.mark.parametrize("text, key, fragment", [
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nmodel: m/y\n", "model", "unknown key"),
    ("output: o\nmodels: m/x\nbenchmarks: [context]\n", "models", "expected a list"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nlimit: two\n", "limit", "expected an integer"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nupstream_compat: 1\n", "upstream_compat", "true or false"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nlimit: true\n", "limit", "expected an integer"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [contxt]\n", "benchmarks[0]", "unknown benchmark 'contxt'"),
    ("models: [m/x]\nbenchmarks: [context]\n", "output", "required"),
    ("output: o\nmodels: []\nbenchmarks: [context]\n", "models", "required"),
    ("output: o\nmodels: [m/x, 3]\nbenchmarks: [context]\n", "models", "non-empty string"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nmitigations: [vcdd]\n", "mitigations[0]", "unknown mitigation"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {default: {}}\n", "generation.default", "unknown key"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {answer_types: {reports: {max_new_tokens: 9}}}\n",
     "generation.answer_types.reports", "unknown"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {benchmarks: {context: {max_tokens: 9}}}\n",
     "generation.benchmarks.context", "unknown generation setting 'max_tokens'"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {defaults: {max_new_tokens: '9'}}\n",
     "generation.defaults.max_new_tokens", "expected int"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {defaults: {max_new_tokens: 0}}\n",
     "generation.defaults.max_new_tokens", ">= 1"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nmetric_options: {chair: paper}\n", "metric_options.chair",
     "expected a mapping"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\non_missing: ignore\n", "on_missing", "error or skip"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ncompare_published: 1\n", "compare_published", "true or false"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {defaults: {top_p: 2}}\n",
     "generation.defaults.top_p", "must be between 0 and 1, got 2"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {defaults: {do_sample: true, temperature: 0}}\n",
     "generation.defaults.temperature", "must be > 0 where do_sample is true"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {defaults: {temperature: .nan}}\n",
     "generation.defaults.temperature", "must be a finite number"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {answer_types: {open: {repetition_penalty: 0}}}\n",
     "generation.answer_types.open.repetition_penalty", "must be > 0, got 0"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nseed: -1\n", "seed", "-1 is out of range"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nseeds: [0, -1]\n", "seeds", "-1 is not a seed"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nlock_timeout: .nan\n", "lock_timeout", "seconds >= 0"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nmitigations: ['vcd:alpha=nan']\n", "mitigations[0]",
     "option alpha=nan must be a finite number"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\nmitigation: [vcd]\n", "mitigation",
     "unknown key (did you mean 'mitigations'?)"),
    ("output: o\nmodels: [m/x]\nbenchmarks: [context]\ngeneration: {default: {}}\n", "generation.default",
     "unknown key (did you mean 'defaults'?)"),
    ("- output: o\n", "", "expected a mapping of settings at the top"),
    ("output: o\nmodels: [m/x, m/x]\nbenchmarks: [context]\n", "models", "listed twice: 'm__x'"),
])
def test_a_malformed_config_is_an_error_naming_the_file_and_key(tmp_path, text, key, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(GridConfigError) as caught:
        load_grid_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}") and fragment in message


def test_a_grid_refuses_a_predictions_file(tmp_path, capsys):
    path = _write(tmp_path, f"output: {tmp_path / 'o'}\nmodels: [{TINY}]\nbenchmarks: [context]\n")
    assert main(["run", "--config", str(path), "--predictions", str(tmp_path / "p.jsonl")]) == 2
    assert f"{path}: --predictions scores one file" in capsys.readouterr().err


def test_missing_file_and_invalid_yaml_are_clear_errors(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["run", "--config", str(_write(tmp_path, "output: [unclosed\n"))]) == 2
    assert "not valid YAML" in capsys.readouterr().err


# -- generation settings ---------------------------------------------------------------------------------------


def test_generation_layers_later_wins():
    plan = GenerationPlan(defaults={"max_new_tokens": 100}, answer_types={"report": {"max_new_tokens": 300}},
                          benchmarks={"knowledge": {"max_new_tokens": 50}, "knowledge:open": {"top_p": 0.5}})
    assert plan.for_record("mm_vishal", "all", "yes_no") == {"max_new_tokens": 100}
    assert plan.for_record("vishal_report", "default", "report") == {"max_new_tokens": 300}
    assert plan.for_record("knowledge", "open", "open") == {"max_new_tokens": 50, "top_p": 0.5}
    assert GenerationPlan().for_record("vishal_report", "default", "report") == {"max_new_tokens": 512}
    assert GenerationPlan().for_record("clinhallu", "all", "yes_no") == {"max_new_tokens": 4096}  # benchmark > type
    assert GenerationPlan().for_record("mm_vishal", "all", "yes_no") == BUILTIN_BY_ANSWER_TYPE["yes_no"]
    assert GenerationPlan(builtin=False).for_record("mm_vishal", "all", "yes_no") == {}
    assert GenerationPlan(fixed={"max_new_tokens": 4}, benchmarks={"clinhallu": {"max_new_tokens": 9}}).for_record(
        "clinhallu", "all", None) == {"max_new_tokens": 4}


def test_cli_flags_override_the_config(tmp_path):
    config = parse_grid_config({
        "output": "runs/x", "models": ["a/b", "c/d"], "benchmarks": ["context"], "limit": 5,
        "image_roots": {"mimic_cxr": "/data/mimic", "iu_xray": "/data/iu"},
        "metric_options": {"chair": {"variant": "paper"}},
        "generation": {"answer_types": {"report": {"max_new_tokens": 300}}}}, "grid.yaml")
    argv = ["--model", TINY, "--limit", "2", "--image-root", "mimic_cxr=/tmp/m", "--metric-option",
            "chair.synonyms=x", "--max-new-tokens", "4", "--output", str(tmp_path)]
    from medheval.cli import build_parser

    args = build_parser().parse_args(["run", "--config", "grid.yaml", *argv])
    given = given_options(argv)
    assert given == {"model", "limit", "image_root", "metric_option", "max_new_tokens", "output"}
    merged = apply_cli(config, args, given)
    assert merged.models == [TINY] and merged.output == str(tmp_path) and merged.options["limit"] == 2
    assert merged.options["image_roots"] == {"mimic_cxr": "/tmp/m", "iu_xray": "/data/iu"}
    assert merged.options["metric_options"] == {"chair": {"variant": "paper", "synonyms": "x"}}
    assert merged.generation.for_record("vishal_report", "default", "report") == {"max_new_tokens": 4}
    assert config.models == ["a/b", "c/d"] and config.options["limit"] == 5  # the loaded config is untouched
    # a flag left at its default does not count as given
    assert given_options(["--batch-size", "8"]) == {"batch_size"} and given_options([]) == set()
    # report.html's Reproduction table: the config's key, or the flag over it, reaches each model's run
    assert run_spec(config, TINY, {}).compare_published is False
    wanted = parse_grid_config({"output": "o", "models": [TINY], "benchmarks": ["context"], "compare_published": True},
                               "grid.yaml")
    assert run_spec(wanted, TINY, {}).compare_published is True
    flagged = apply_cli(config, build_parser().parse_args(["run", "--config", "grid.yaml", "--compare-published"]),
                        given_options(["--compare-published"]))
    assert run_spec(flagged, TINY, {}).compare_published is True


class _RecordingBackend:
    """A backend whose ``generate`` takes per-call overrides; answers the settings it got."""

    name = "recording"
    needs_images = False

    def __init__(self):
        self.calls: list[tuple[list[str], dict]] = []

    def generate(self, records, images, overrides=None):
        self.calls.append(([r["answer_type"] for r in records], dict(overrides or {})))
        return [f"n={(overrides or {}).get('max_new_tokens')}" for _ in records]

    def format_prompt(self, record, num_images):
        return f"<{num_images}>{record['question']}"

    def settings(self):
        return {"backend": "recording", "max_new_tokens": 64, "do_sample": False}


class _PlainBackend(_RecordingBackend):
    """An older backend: ``generate(records, images)`` only, no prompt hook."""

    name = "plain"
    format_prompt = None

    def generate(self, records, images):
        self.calls.append(([r["answer_type"] for r in records], {}))
        return ["plain" for _ in records]


def test_batches_are_grouped_by_setting_and_each_sample_records_prompt_and_settings(fixture_benchmark, tmp_path):
    from medheval.run.runner import RunSpec, run

    plan = GenerationPlan(answer_types={"yes_no": {"max_new_tokens": 3}, "multiple_choice": {"max_new_tokens": 5}})
    backend = _RecordingBackend()
    spec = RunSpec(benchmarks=["mm_vishal"], output=tmp_path / "a", data_dir=fixture_benchmark["data_dir"],
                   generation=plan)
    run(spec, backend, batch_size=4)
    types = {"yes_no": 3, "multiple_choice": 5}
    assert all(len(set(kinds)) == 1 and overrides == {"max_new_tokens": types[kinds[0]]}
               for kinds, overrides in backend.calls)
    # grouped: all records of one setting are generated before the other's (the type changes once)
    sequence = [kind for kinds, _ in backend.calls for kind in kinds]
    assert sum(a != b for a, b in zip(sequence, sequence[1:])) == 1
    from medheval.data.benchmarks import load_benchmark

    rows = {r["id"]: r for r in load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"]).to_list()}
    entries = read_log(tmp_path / "a" / "predictions.jsonl")
    assert len(entries) == len(rows)
    for entry in entries:
        wanted = types[rows[entry["id"]]["answer_type"]]
        assert entry["generation"] == {"max_new_tokens": wanted, "do_sample": False}
        assert entry["prediction"] == f"n={wanted}" and entry["prompt"] == f"<0>{rows[entry['id']]['question']}"
    assert json.loads((tmp_path / "a" / "run.json").read_text())["generation"]["answer_types"]["yes_no"] == {
        "max_new_tokens": 3}

    plain = _PlainBackend()  # no overrides keyword: the plain call, its own settings recorded, no prompt
    run(RunSpec(benchmarks=["mm_vishal"], output=tmp_path / "b", data_dir=fixture_benchmark["data_dir"],
                generation=plan), plain, batch_size=4)
    entries = read_log(tmp_path / "b" / "predictions.jsonl")
    assert all(e["generation"] == {"max_new_tokens": 64, "do_sample": False} and "prompt" not in e for e in entries)


def test_hf_backend_honours_per_call_max_new_tokens_also_with_the_prefix_cache(llava):
    from medheval.backends.hf import HFBackend
    from medheval.families.medheval.fixtures import synthetic_scan

    model, processor = llava
    records = [{"id": f"r{i}", "question": f"Is there an effusion {i}?", "answer_type": "yes_no", "choices": [],
                "meta": {}} for i in range(3)]
    images = [[synthetic_scan("a")] for _ in records]
    for prefix_cache in (False, True):
        backend = HFBackend(model, processor, max_new_tokens=9, prefix_cache=prefix_cache)
        long = backend.generate(records, images)
        short = backend.generate(records, images, overrides={"max_new_tokens": 2})
        count = [len(backend.tokenizer(text, add_special_tokens=False).input_ids) for text in short]
        assert max(count) <= 3 and all(text.startswith(s) or not s for s, text in zip(short, long))
        assert sum(len(t) for t in long) > sum(len(t) for t in short)


# -- whole grids on the tiny model -----------------------------------------------------------------------------


def _images_for(benchmarks: list[str], data_dir: str, root: Path) -> dict[str, str]:
    """A small image at every path the records of ``benchmarks`` name, one folder per source."""
    from PIL import Image

    from medheval.data.benchmarks import parse_benchmark_spec, prepare_benchmark

    roots: dict[str, str] = {}
    for spec in benchmarks:
        loaded = prepare_benchmark(*parse_benchmark_spec(spec), data_dir=data_dir)
        for record in loaded.dataset.to_list():
            for ref in record["images"]:
                target = root / record["source"] / ref
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    Image.new("RGB", (16, 16), (90, 90, 90)).save(target, format="JPEG")
            roots[record["source"]] = str(root / record["source"])
    return roots


def _data_for(path: Path, config, fixture_benchmark, tmp_path: Path) -> tuple[list[str], object]:
    """(``--data-dir``/``--image-root`` arguments, a judge server or None) for one shipped config."""
    name = path.name
    if name.startswith("medheval_"):
        args = ["--data-dir", fixture_benchmark["data_dir"], *_roots(fixture_benchmark["image_roots"])]
        if {"chexbert_similarity", "radgraph_f1", "ratescore"} & set(config.get("metrics", [])):
            # model-backed metrics need downloaded weights (their own tests build tiny ones): the offline ones here
            args += ["--metrics", ",".join(m for m in config.get("metrics") if m in ("chair", "text_generation"))]
        return args, None
    if name.startswith("med_hallmark"):
        from test_med_hallmark import _write_fixtures

        data = str(_write_fixtures(tmp_path / "hallmark"))
        return ["--data-dir", data, *_roots(_images_for(config.benchmarks, data, tmp_path / "images"))], None
    if name.startswith("med_stepbench"):
        from medheval.families.stepbench.fixtures import write_stepbench_fixture

        data = write_stepbench_fixture(tmp_path / "stepbench", studies=2, per_study=4)["data_dir"]
        return ["--data-dir", data, "--image-root", f"med_stepbench={data}"], None
    if name.startswith("clinhallu"):
        from clinhallu_fixture import write_snapshot
        from judge_servers import JudgeServer

        snapshot = write_snapshot(tmp_path / "clinhallu")
        server = JudgeServer("openai", reply=lambda request: json.dumps(
            {"hallucinated": 0, "reason": "ok", "answer_correct": 1, "answer_reasoning": "same"}))
        # the grid's clinhallu protocol asks for ClinHallu's own prompt files (a download) and 51 attempts: this
        # project's prompts and 2 attempts here (the user's --benchmark-option beats the protocol's)
        return ["--data-dir", snapshot["data_dir"], *_roots(snapshot["image_roots"]), "--benchmark-option",
                "clinhallu.prompts=own", "--benchmark-option", "clinhallu.max_attempts=2"], server
    raise AssertionError(f"no offline data for {name}: add it here")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_runs_on_the_tiny_model_and_resumes(path, fixture_benchmark, tmp_path):
    config = load_grid_config(path)
    out = tmp_path / "out"
    data_args, server = _data_for(path, config, fixture_benchmark, tmp_path)
    # --chat-template model: the tiny model's own template (a paper protocol's upstream one needs a download)
    args = ["run", "--config", str(path), "--model", TINY, "--limit", "2", "--max-new-tokens", "4",
            "--chat-template", "model", "--output", str(out), *data_args]
    if server is not None:
        server.__enter__()
        args += ["--judge", f"openai:fake-judge@{server.base_url}"]
    try:
        assert main(args) == 0
        combined = json.loads((out / "results.json").read_text())
        assert [run["settings"]["model"] for run in combined["runs"]] == [TINY] * len(config.mitigations)
        assert [p.name for p in out.iterdir() if p.is_dir()] == [model_slug(TINY)]  # --model replaced the list
        assert "| tiny-random-llava |" in (out / "results.md").read_text()
        html = (out / "report.html").read_text()  # the whole grid's report, every cell in it
        assert all(f"{run['settings']['mitigation']}" in html for run in combined["runs"])
        for run in combined["runs"]:
            assert run["settings"]["limit"] == 2 and len(run["benchmarks"]) == len(config.benchmarks)
            assert all(entry["generated_this_run"] > 0 for entry in run["benchmarks"].values())
            assert run["settings"]["generation"]["fixed"] == {"max_new_tokens": 4}
        logs = list(out.rglob("predictions.jsonl"))
        for log in logs:  # per sample: the rendered prompt and the settings (the CLI's length beats the config)
            assert all(e["prompt"].startswith("USER: <image>") and e["generation"]["max_new_tokens"] == 4
                       for e in read_log(log))
        for run in combined["runs"]:
            for entry in run["benchmarks"].values():
                if "clinhallu_run" in entry:
                    assert entry["clinhallu_run"]["protocol"]["max_new_tokens"] == 4
        assert main(args) == 0  # the same config again resumes every cell: nothing new generated
        again = json.loads((out / "results.json").read_text())
        assert all(entry["generated_this_run"] == 0 for run in again["runs"] for entry in run["benchmarks"].values())
    finally:
        if server is not None:
            server.__exit__(None, None, None)


def test_a_model_that_cannot_be_loaded_stops_the_grid_before_anything_runs(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "out"
    path = _write(tmp_path, f"output: {out}\nmodels: [{TINY}, no-such-org/no-such-model, {tmp_path}/missing]\n"
                            "benchmarks: [context]\n")
    assert main(["run", "--config", str(path), "--data-dir", fixture_benchmark["data_dir"]]) == 2
    err = capsys.readouterr().err
    assert f"{path}: models: cannot be loaded, nothing was run" in err
    assert "'no-such-org/no-such-model'" in err and f"{tmp_path}/missing" in err and TINY + "'" not in err
    assert not out.exists()


def test_default_lengths_apply_without_max_new_tokens_and_old_logs_still_resume(fixture_benchmark, tmp_path):
    out = tmp_path / "grid"
    path = _write(tmp_path, f"output: {out}\nmodels: [{TINY}]\nbenchmarks: [mm_vishal, vishal_report]\nlimit: 3\n"
                            "generation:\n  answer_types: {report: {max_new_tokens: 7}, yes_no: {max_new_tokens: 3}}\n")
    args = ["run", "--config", str(path), "--data-dir", fixture_benchmark["data_dir"],
            *_roots(fixture_benchmark["image_roots"])]
    assert main(args) == 0
    log = out / model_slug(TINY) / "predictions.jsonl"
    lengths = {e["id"].split("/")[0] + ":" + str(e["generation"]["max_new_tokens"]) for e in read_log(log)}
    # the first 3 mm_vishal items: 2 yes/no (config: 3), 1 multiple choice (built-in 32); reports: config 7
    assert lengths == {"mm_vishal:3", "mm_vishal:32", "vishal_report:7"}
    # a log written before prompts/settings were recorded resumes as it is
    entries = read_log(log)
    log.write_text("".join(json.dumps({k: v for k, v in e.items() if k not in ("prompt", "generation")}) + "\n"
                           for e in entries))
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert all(entry["generated_this_run"] == 0 for run in results["runs"] for entry in run["benchmarks"].values())


def test_clinhallu_traces_take_their_length_from_the_plan_not_the_backend(tmp_path):
    """Without --max-new-tokens the protocol's traces get the plan's length (built-in 4096; here the
    config's 6), not the backend's fallback of 64 (issue 11: traces need far more than 64)."""
    from clinhallu_fixture import write_snapshot
    from judge_servers import JudgeServer

    snapshot = write_snapshot(tmp_path / "clinhallu")
    out = tmp_path / "out"
    path = _write(tmp_path, f"output: {out}\nmodels: [{TINY}]\nbenchmarks: [clinhallu:vqa_rad]\nlimit: 1\n"
                            "generation: {benchmarks: {clinhallu: {max_new_tokens: 6}}}\n")
    reply = json.dumps({"hallucinated": 0, "reason": "ok", "answer_correct": 1, "answer_reasoning": "same"})
    with JudgeServer("openai", reply=lambda request: reply) as server:
        assert main(["run", "--config", str(path), "--data-dir", snapshot["data_dir"],
                     *_roots(snapshot["image_roots"]), "--judge", f"openai:j@{server.base_url}"]) == 0
    entry = json.loads((out / "results.json").read_text())["runs"][0]["benchmarks"]["clinhallu:vqa_rad"]
    assert entry["clinhallu_run"]["protocol"]["max_new_tokens"] == 6
    assert entry["clinhallu_run"]["backend"]["max_new_tokens"] == 64  # the backend's own length, unused here


def test_a_plain_run_without_max_new_tokens_uses_the_table_and_with_it_one_length():
    from medheval.cli.main import _generation_plan, build_parser

    base = ["run", "--benchmark", "clinhallu", "--model", TINY, "--output", "o"]
    plan = _generation_plan(build_parser().parse_args(base))
    assert plan.for_record("clinhallu", "all", "yes_no") == {"max_new_tokens": 4096}  # issue 11: traces need room
    assert plan.for_record("vishal_report", "default", "report") == {"max_new_tokens": 512}
    assert _generation_plan(build_parser().parse_args([*base, "--max-new-tokens", "64"])) is None  # as before
    assert _generation_plan(build_parser().parse_args(["run", "--benchmark", "context", "--predictions", "p",
                                                       "--output", "o"])) is None


def test_check_model_and_the_model_type_read_one_config_json(tmp_path):
    """A grid's model check and the pre-load template choice find a model's config.json the same way
    (:func:`medheval.run.options.model_config_file`), without loading weights."""
    from medheval.run.grids import check_model
    from medheval.run.options import model_type_before_loading

    empty, folder = tmp_path / "empty", tmp_path / "model"
    empty.mkdir()
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    assert check_model(str(empty)) == f"{empty} is not a model folder (no config.json)"
    assert check_model("no hub id") == "not a Hub id (ORG/NAME), a local folder or tiny-random-llava"
    assert check_model(str(folder)) is None and check_model("tiny-random-llava") is None
    assert model_type_before_loading(str(folder)) == "qwen2_5_vl"
    assert model_type_before_loading(str(empty)) is None and model_type_before_loading("openai:gpt-4o") is None
    assert model_type_before_loading("tiny-random-llava") == "llava"


def test_run_config_given_a_plain_mapping_says_how_to_build_a_config():
    """From Python, ``run_config({...})`` failed with ``'dict' object has no attribute 'models'``."""
    with pytest.raises(TypeError, match=r"run_config takes a GridConfig, got dict: build it with parse_grid_config"):
        run_config({"models": ["tiny-llava"], "benchmarks": ["mm_vishal"]})


@pytest.mark.parametrize("model", ["..", ".", "..é", "./"])
def test_a_model_named_like_the_parent_folder_writes_its_cell_inside_the_grid_folder(model, tmp_path):
    """A grid config naming the local model folder ``..`` (the folder above, holding config.json) or ``.``: its
    cell folder must be a sub-folder of ``output``, never ``output/..`` (the run's files written beside the grid
    folder, into the user's own folder) nor the grid folder itself."""
    config = parse_grid_config({"output": str(tmp_path / "grid"), "models": [model], "benchmarks": ["mm_vishal"]})
    cell = run_spec(config, model, {}).output
    assert Path(cell).resolve().parent == (tmp_path / "grid").resolve(), cell
    assert model_slug(model) not in (".", "..")

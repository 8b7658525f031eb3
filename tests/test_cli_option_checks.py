"""``medheval run`` refuses a mistyped option before the model loads and before the output folder is written,
so the corrected command runs into the same folder (docs/running.md: every check before the first generation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medheval.cli import main

SPLIT = "mm_vishal:slake"


def _fixture_flags(fixture_benchmark: dict) -> list[str]:
    return ["--data-dir", fixture_benchmark["data_dir"], "--image-root",
            f"slake={fixture_benchmark['image_roots']['slake']}"]


@pytest.mark.parametrize("mitigation,named", [
    ("pai:alpha=x", "pai: option alpha='x' must be a number (float)"),
    ("dola:layers=abc", "dola: option layers='abc' must be 'medheval', 'low', 'high'"),
    ("vcd:alpha=abc", "vcd: option alpha='abc' must be a number (float)"),
])
def test_a_mistyped_mitigation_option_is_refused_before_the_model_loads(mitigation, named, fixture_benchmark,
                                                                        tmp_path, capsys):
    """The model path does not exist: had the model loaded first, the error would name the model. Was: the
    run started, wrote run.json and an empty predictions.jsonl, then failed, and the corrected command was
    refused as 'different settings'."""
    output = tmp_path / "run"
    code = main(["run", "--benchmark", SPLIT, "--model", str(tmp_path / "no-such-model"), "--output", str(output),
                 *_fixture_flags(fixture_benchmark), "--mitigation", mitigation])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and named in err and "no-such-model" not in err
    assert not output.exists()


def test_the_corrected_command_runs_into_the_folder_a_refused_one_named(fixture_benchmark, tmp_path, capsys):
    output = tmp_path / "run"
    common = ["run", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--output", str(output), "--limit", "1",
              "--max-new-tokens", "2", *_fixture_flags(fixture_benchmark)]
    assert main([*common, "--mitigation", "pai:alpha=x"]) == 2
    assert main([*common, "--mitigation", "pai:alpha=0.5"]) == 0
    assert (output / "results.json").exists()


def test_the_api_option_help_lists_every_key_the_error_accepts(capsys):
    """The help listed 10 of the 15 keys (not backoff_base, backoff_max, name, api_key, api_key_env)."""
    from medheval.run.options import API_OPTIONS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    start = help_text.index("--api-option KEY=VALUE --model")
    listed = help_text[help_text.index(": ", start) + 2:help_text.index(" (values read as JSON", start)]
    docs = (Path(__file__).resolve().parents[1] / "docs" / "api-models.md").read_text()
    for key in API_OPTIONS:
        assert key in listed.replace(" only)", "").replace(" (", ", ").split(", ") and f"`{key}`" in docs, key
    assert main(["run", "--model", "openai:m@http://127.0.0.1:9/v1", "--benchmark", SPLIT, "--output", "/tmp/unused",
                 "--api-option", "deadlne=5"]) == 2
    assert "api_version (azure only)" in listed and "api_version (azure only)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "inputs"])
@pytest.mark.parametrize("limit", ["0", "-1", "two"])
def test_a_limit_below_one_is_refused_while_the_arguments_are_parsed(command, limit, tmp_path, capsys):
    """``run --limit 0`` used to write a run, then say 'nothing was scored ... check the predictions' ids'."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--benchmark", SPLIT, "--model", "tiny-random-llava", "--limit", limit,
              *(["--output", str(tmp_path / "run")] if command == "run" else [])])
    assert exited.value.code == 2
    assert f"--limit: expected a whole number >= 1, got '{limit}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command,flag", [("run", "--max-new-tokens"), ("run", "--api-concurrency"),
                                          ("inputs", "--max-new-tokens")])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_length_or_concurrency_below_one_is_refused_while_the_arguments_are_parsed(command, flag, value, tmp_path,
                                                                                     capsys):
    """Both were plain ints: ``--max-new-tokens 0`` fell back to the default length (or went on to the backend),
    ``--api-concurrency 0`` reached the API backend after the run had started. ``inputs --max-new-tokens 0``
    was refused by `run`'s parser, printing `run`'s usage under the name ``medheval``."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--benchmark", SPLIT, "--model", "tiny-random-llava", flag, value,
              *(["--output", str(tmp_path / "run")] if command == "run" else [])])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"medheval {command}: error: argument {flag}: expected a whole number >= 1, got '{value}'" in err
    assert command == "run" or "--output" not in err  # the usage of the command typed, not of `run`
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command,flag,value,said", [
    ("run", "--top-p", "2", "must be between 0 and 1"),
    ("run", "--top-p", "nan", "must be a finite number"),
    ("run", "--temperature", "nan", "must be a finite number"),
    ("run", "--temperature", "-0.5", "must be >= 0"),
    ("inputs", "--top-p", "1.5", "must be between 0 and 1"),
    ("run", "--seed", "-1", "expected a whole number from 0 to 9223372036854775807"),
    ("run", "--seed", "99999999999999999999999", "expected a whole number from 0 to 9223372036854775807"),
    ("inputs", "--seed", "-1", "expected a whole number from 0 to 9223372036854775807"),
    ("run", "--lock-timeout", "nan", "expected a number of seconds >= 0"),
    ("run", "--lock-timeout", "-5", "expected a number of seconds >= 0"),
    ("report", "--lock-timeout", "nan", "expected a number of seconds >= 0"),
])
def test_an_out_of_range_number_is_refused_while_the_arguments_are_parsed(command, flag, value, said, tmp_path,
                                                                          capsys):
    """Were plain floats/ints: ``--top-p 2`` was recorded and ignored by the decoder, ``--temperature nan`` failed at
    the first batch in transformers' words, ``--seed -1 --control noise`` stopped at the first image with numpy's
    "expected non-negative integer" (a huge seed: "Overflow when unpacking long long"), ``--lock-timeout nan``
    waited forever on a held folder."""
    args = {"run": ["run", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--do-sample",
                    "--output", str(tmp_path / "run")],
            "inputs": ["inputs", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--do-sample"],
            "report": ["report", str(tmp_path / "runs"), "--output", str(tmp_path / "run")]}[command]
    with pytest.raises(SystemExit) as exited:
        main([*args, flag, value])
    assert exited.value.code == 2
    assert f"medheval {command}: error: argument {flag}: {said}, got '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags,said", [
    (["--temperature", "0.7"], "--temperature 0.7 has no effect without --do-sample (decoding is greedy); add "
                               "--do-sample, or drop --temperature"),
    (["--temperature", "0.7", "--top-p", "0.9"], "--temperature 0.7 and --top-p 0.9 have no effect without "
                                                 "--do-sample"),
    (["--do-sample", "--temperature", "0"], "--temperature 0 with --do-sample: sampling needs a temperature > 0; "
                                            "for greedy decoding drop --do-sample and --temperature"),
])
def test_sampling_values_without_do_sample_are_refused_before_anything_runs(flags, said, tmp_path, capsys):
    """Was: a greedy run recording temperature 0.7 and do_sample false, silently; and a sampled run at
    temperature 0 stopped in transformers' words at its first batch, once the model had loaded."""
    output = tmp_path / "run"
    code = main(["run", "--benchmark", SPLIT, "--model", str(tmp_path / "no-such-model"), "--output", str(output),
                 *flags])
    assert code == 2 and said in capsys.readouterr().err and not output.exists()


def test_inputs_refuses_the_sampling_values_run_refuses(fixture_benchmark, capsys):
    """``medheval inputs`` shows what ``run`` sends: it showed ``temperature 0.5`` beside greedy decoding for a
    command that ``run`` refuses."""
    common = ["inputs", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--limit", "1",
              *_fixture_flags(fixture_benchmark)]
    assert main([*common, "--temperature", "0.5"]) == 2
    assert "--temperature 0.5 has no effect without --do-sample" in capsys.readouterr().err
    assert main([*common, "--temperature", "0.5", "--do-sample", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["generation"]["do_sample"] is True and shown["generation"]["temperature"] == 0.5


def test_sampling_values_are_left_to_a_protocol_that_samples(fixture_benchmark, tmp_path, capsys):
    """medheval-mitigation samples its 'none' row at its temperature 0.7: a typed --temperature replaces it."""
    output = tmp_path / "run"
    assert main(["run", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--output", str(output), "--limit", "1",
                 "--max-new-tokens", "2", "--protocol", "medheval-mitigation", "--chat-template", "model",
                 "--temperature", "0.3", *_fixture_flags(fixture_benchmark)]) == 0
    assert "no effect without --do-sample" not in capsys.readouterr().err
    (entry,) = map(json.loads, (output / "predictions.jsonl").read_text().splitlines())
    assert entry["generation"]["do_sample"] is True and entry["generation"]["temperature"] == 0.3


@pytest.mark.parametrize("flags,said", [
    (["--metric-option", 'sh_judge.judge={"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", '
                         '"bogus": 1}'], "metric option sh_judge.judge: unknown option(s) ['bogus'] for the openai judge"),
    (["--judge", "vllmx:m@http://127.0.0.1:9/v1"], "unknown judge backend 'vllmx'"),
    (["--metric-option", 'sh_judge.judge={"model": "m"}'], "a judge dict needs 'backend' and 'model'"),
])
def test_a_judge_the_scorer_would_refuse_is_refused_before_the_first_generation(flags, said, fixture_benchmark,
                                                                                  tmp_path, capsys):
    """A judge dict's unknown option (or an unknown backend) was refused when the judge was built, at scoring:
    after every answer had been generated."""
    output = tmp_path / "run"
    code = main(["run", "--benchmark", "knowledge:open", "--model", "tiny-random-llava", "--metrics", "sh_judge",
                 "--output", str(output), "--limit", "1", "--max-new-tokens", "2", "--data-dir",
                 fixture_benchmark["data_dir"], "--image-root", f"mimic_cxr={fixture_benchmark['image_roots']['mimic_cxr']}",
                 *flags])
    assert code == 2 and said in capsys.readouterr().err
    assert not (output / "predictions.jsonl").exists()  # nothing was generated


def test_an_api_model_may_still_sample_at_temperature_zero():
    """An API takes ``temperature: 0`` with --do-sample's seed and top_p (docs/api-models.md: sent as such), as it
    did before temperature 0 with sampling was refused for transformers' sake; a local model is still refused, on
    the command line and in a grid config's generation layer."""
    import argparse

    from medheval.run.grids import GridConfigError, parse_grid_config
    from medheval.run.options import check_sampling_flags
    from medheval.run.protocol import RunError

    def flags(model: str) -> argparse.Namespace:
        return argparse.Namespace(do_sample=True, temperature=0.0, top_p=None, protocol="clean", model=model)

    check_sampling_flags(flags("openai:gpt-4o@http://127.0.0.1:9/v1"))  # no error
    with pytest.raises(RunError, match="--temperature 0 with --do-sample"):
        check_sampling_flags(flags("llava-hf/llava-1.5-7b-hf"))
    layer = {"generation": {"defaults": {"do_sample": True, "temperature": 0.0}}, "output": "o",
             "benchmarks": ["mm_vishal"]}
    config = parse_grid_config({**layer, "models": ["openai:gpt-4o@http://127.0.0.1:9/v1", "anthropic:claude-x"]})
    assert config.generation.defaults == {"do_sample": True, "temperature": 0.0}
    with pytest.raises(GridConfigError, match="temperature: must be > 0 where do_sample is true"):
        parse_grid_config({**layer, "models": ["openai:gpt-4o@http://127.0.0.1:9/v1", "llava-hf/llava-1.5-7b-hf"]})

"""``medheval run`` refuses a start before it writes anything (docs/running.md: every check before the first
generation): what the model does not decide is checked before it loads (a paper protocol's upstream conversation
template, a QA split's annotation files), what the loaded model decides (a mitigation's layers) before run.json,
predictions.jsonl or a grid's plan are written. A refused start exits 2 with one ``error:`` line and leaves
``--output`` as it was, so the corrected command runs into the same folder."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import pytest

from medheval.cli import main

cli_main = importlib.import_module("medheval.cli.main")  # the module (medheval.cli.main is also the function)

SPLIT = "mm_vishal:slake"


def _flags(fixture_benchmark: dict, output: Path) -> list[str]:
    return ["--benchmark", SPLIT, "--output", str(output), "--limit", "1", "--max-new-tokens", "2",
            "--data-dir", fixture_benchmark["data_dir"], "--image-root",
            f"slake={fixture_benchmark['image_roots']['slake']}"]


def _files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Loading a model fails the test: a refusal must come first."""
    def refuse(args):
        raise AssertionError(f"model {args.model} loaded before the refusal")

    monkeypatch.setattr(cli_main, "build_backend", refuse)


def test_a_missing_upstream_conversation_template_is_named_before_the_model_loads(fixture_benchmark, tmp_path,
                                                                                  monkeypatch, capsys,
                                                                                  no_model_loads):
    """medheval-mitigation renders a LLaVA model with LLaVA-Med's vicuna_v1 from the pinned conversation.py. Was:
    the model loaded, run.json and an empty predictions.jsonl were written, then the fetch failed offline."""
    monkeypatch.setenv("MEDHEVAL_UPSTREAM_CODE", str(tmp_path / "no-copy"))
    output = tmp_path / "run"
    flags = [*_flags(fixture_benchmark, output), "--model", "tiny-random-llava", "--protocol", "medheval-mitigation"]
    assert main(["run", *flags]) == 2
    error = _error_line(capsys)
    assert "llava-med-1.5/llava/conversation.py" in error and "not available" in error
    assert not output.exists()


def test_the_corrected_protocol_run_goes_into_the_refused_folder(fixture_benchmark, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDHEVAL_UPSTREAM_CODE", str(tmp_path / "no-copy"))
    output = tmp_path / "run"
    flags = [*_flags(fixture_benchmark, output), "--model", "tiny-random-llava", "--protocol", "medheval-mitigation"]
    assert main(["run", *flags]) == 2
    assert not output.exists()
    assert main(["run", *flags, "--chat-template", "model"]) == 0
    assert (output / "results.json").is_file()


def test_a_missing_annotation_file_is_named_before_the_model_loads(fixture_benchmark, tmp_path, capsys,
                                                                   no_model_loads):
    """Was: the model loaded (minutes for a 7B one), then the split's file was found missing."""
    output = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    flags = _flags(fixture_benchmark, output)
    flags[flags.index("--data-dir") + 1] = str(empty)
    assert main(["run", *flags, "--model", "tiny-random-llava"]) == 2
    error = _error_line(capsys)
    assert f"data_dir='{empty}' has no file" in error and "slake_qa_pairs.json" in error
    assert not output.exists()


def test_another_configs_file_in_data_dir_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys,
                                                                            no_model_loads):
    """vishal_report's two configs read one relative path: a --data-dir file pinned for `default` under
    `ba4586e` (AnotherConfigsFile) is refused before the model loads."""
    from medheval.data.fetch import PinnedFile
    from medheval.families.medheval import source

    payload = b"[]"
    pinned = source.FILES["report"]
    monkeypatch.setitem(source.FILES, "report", PinnedFile(pinned.relpath, pinned.url,
                                                           hashlib.sha256(payload).hexdigest()))
    data_dir = tmp_path / "benchmark_data"
    (data_dir / pinned.relpath).parent.mkdir(parents=True)
    (data_dir / pinned.relpath).write_bytes(payload)
    output = tmp_path / "run"
    assert main(["run", "--benchmark", "vishal_report:ba4586e", "--model", "tiny-random-llava", "--output",
                 str(output), "--data-dir", str(data_dir)]) == 2
    assert "is the file of config `default`" in _error_line(capsys)
    assert not output.exists()


@pytest.mark.parametrize("bad,named", [
    ("dola:layers=40/", "--mitigation dola:layers=40/ on model tiny-random-llava: DoLa candidate layers [40] are "
                        "not in [0, 2) for a 2-layer language model"),
    ("pai:start_layer=1,end_layer=50", "PAI layers [1, 50) do not fit a language model with 2 layers"),
])
def test_a_mitigation_option_the_model_refuses_leaves_the_folder_as_it_was(bad, named, fixture_benchmark,
                                                                           tmp_path, capsys):
    """Was: run.json and an empty predictions.jsonl were written before the first generation refused the
    layers, and the corrected command was refused as 'holds predictions made with different settings'."""
    output = tmp_path / "run"
    flags = [*_flags(fixture_benchmark, output), "--model", "tiny-random-llava"]
    assert main(["run", *flags, "--mitigation", bad]) == 2
    assert named in _error_line(capsys)
    assert not output.exists()
    good = bad.replace("40/", "1/").replace("end_layer=50", "end_layer=2")
    assert main(["run", *flags, "--mitigation", good]) == 0
    before = _files(output)
    assert main(["run", *flags, "--mitigation", bad]) == 2  # an existing run folder: left byte-identical
    assert _files(output) == before


def test_a_grid_refused_by_its_first_model_leaves_no_plan(fixture_benchmark, tmp_path, capsys):
    """A config grid writes grid.json before the first model loads; a mitigation that model refuses puts it back,
    so the corrected grid (other mitigation axes) runs into the same folder."""
    output = tmp_path / "grid"
    config = tmp_path / "grid.yaml"

    def write(mitigation: str) -> None:
        config.write_text(
            f"output: {output}\nmodels: [tiny-random-llava]\nbenchmarks: [{SPLIT}]\nlimit: 1\n"
            f"mitigations: [none, '{mitigation}']\ndata_dir: {fixture_benchmark['data_dir']}\n"
            f"image_roots: {{slake: {fixture_benchmark['image_roots']['slake']}}}\n"
            "generation: {defaults: {max_new_tokens: 2}}\n")

    write("dola:layers=40/")
    assert main(["run", "--config", str(config)]) == 2
    assert "DoLa candidate layers [40]" in _error_line(capsys)
    assert sorted(_files(output)) == [".medheval.lock"]
    write("dola:layers=1/")
    assert main(["run", "--config", str(config)]) == 0
    assert (output / "results.json").is_file()


@pytest.fixture()
def builds(monkeypatch) -> list[str]:
    """Every split build of the command (the runner's ``prepare_benchmark``, which the pre-check and the run share)."""
    from medheval.run import runner

    real, built = runner.prepare_benchmark, []

    def counting(name, config=None, **kwargs):
        built.append(f"{name}:{config}")
        return real(name, config, **kwargs)

    monkeypatch.setattr(runner, "prepare_benchmark", counting)
    return built


def test_a_run_builds_each_split_once(fixture_benchmark, tmp_path, builds):
    """Was: the pre-check built each split, and the run built it again once the model had loaded (twice per
    command, one more per cell of a grid)."""
    flags = [*_flags(fixture_benchmark, tmp_path / "run"), "--model", "tiny-random-llava"]
    assert main(["run", *flags]) == 0
    assert builds == [SPLIT]
    builds.clear()
    two = [*_flags(fixture_benchmark, tmp_path / "two"), "--benchmark", "mm_vishal:vqa_rad", "--image-root",
           f"vqa_rad={fixture_benchmark['image_roots']['vqa_rad']}", "--model", "tiny-random-llava",
           "--control", "none", "--control", "no_image"]  # two splits, two cells
    assert main(["run", *two]) == 0
    assert builds == [SPLIT, "mm_vishal:vqa_rad"]
    assert sorted(path.name for path in (tmp_path / "two").iterdir() if path.is_dir()) == ["none", "none__no_image"]


def test_a_launchs_other_process_leaves_the_builds_to_the_main_one(fixture_benchmark, builds, monkeypatch):
    """In a data-parallel launch every process runs the pre-check at once; several processes building one Arrow
    cache collide, so only the main process (RANK 0) builds there, and the others build in the run after it
    (``Group.main_first``)."""
    from medheval.run.runner import RunSpec, check_before_model

    spec = RunSpec(benchmarks=[SPLIT], output="unused", data_dir=fixture_benchmark["data_dir"], limit=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert check_before_model(spec)._built == {} and builds == []
    monkeypatch.setenv("RANK", "0")
    assert len(check_before_model(spec)._built) == 1 and builds == [SPLIT]
    monkeypatch.setenv("RANK", "1")  # a RANK left in the environment of a process that was not launched
    monkeypatch.delenv("WORLD_SIZE")
    assert len(check_before_model(spec)._built) == 1


def test_each_run_gets_its_own_copy_of_a_built_split(fixture_benchmark, builds):
    from medheval.run.runner import BuiltSplits, RunSpec

    spec = RunSpec(benchmarks=[SPLIT], output="unused", data_dir=fixture_benchmark["data_dir"], limit=2)
    splits = BuiltSplits()
    first, second = splits.load(SPLIT, spec), splits.load(SPLIT, spec)
    assert builds == [SPLIT] and first is not second and first.dataset["id"] == second.dataset["id"]
    first.quality["missing_predictions"] = 1  # what one run does to its split ...
    first.skipped_undecodable_images.append(("x", "y.png"))
    first.dataset = first.dataset.select([0])
    assert "missing_predictions" not in second.quality and second.skipped_undecodable_images == []  # ... not another's
    assert len(splits.load(SPLIT, spec).dataset) == 2
    import dataclasses

    splits.load(SPLIT, dataclasses.replace(spec, limit=1))  # other arguments: another build
    assert builds == [SPLIT, SPLIT]


def test_a_source_without_an_image_root_is_named_before_the_model_loads(fixture_benchmark, tmp_path, capsys,
                                                                        no_model_loads):
    """Was: the model loaded (minutes for a 7B one), then the run found no image root for the split's images."""
    output = tmp_path / "run"
    flags = _flags(fixture_benchmark, output)[:-2]  # no --image-root at all
    assert main(["run", *flags, "--model", "tiny-random-llava"]) == 2
    err = capsys.readouterr().err
    assert "error: image roots (model tiny-random-llava reads images):" in err
    assert f"{SPLIT}: no image root for source(s) slake" in err and "Pass --image-root slake=PATH_OR_URL." in err
    assert not output.exists()
    with pytest.raises(AssertionError, match="loaded before the refusal"):  # no image read: the check lets it load
        main(["run", *flags, "--model", "tiny-random-llava", "--control", "no_image"])


def test_a_rescore_needs_no_image_root(fixture_benchmark, tmp_path):
    from medheval.data.benchmarks import prepare_benchmark

    ids = prepare_benchmark("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"], limit=1).dataset["id"]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(f'{{"id": "{rid}", "prediction": "yes"}}\n' for rid in ids))
    output = tmp_path / "run"
    flags = _flags(fixture_benchmark, output)[:-2]
    assert main(["run", *[flag for flag in flags if flag not in ("--max-new-tokens", "2")], "--predictions",
                 str(answers)]) == 0
    assert (output / "results.json").is_file()


def test_a_grid_without_an_image_root_is_refused_before_any_model_loads(fixture_benchmark, tmp_path, capsys,
                                                                        monkeypatch):
    from medheval.run import options

    monkeypatch.setattr(options, "build_backend", lambda args: pytest.fail(f"model {args.model} loaded"))
    output = tmp_path / "grid"
    config = tmp_path / "grid.yaml"
    config.write_text(f"output: {output}\nmodels: [tiny-random-llava]\nbenchmarks: [{SPLIT}]\nlimit: 1\n"
                      f"mitigations: [none, 'vcd:alpha=0']\ndata_dir: {fixture_benchmark['data_dir']}\n")
    assert main(["run", "--config", str(config)]) == 2
    assert "error: image roots (model tiny-random-llava reads images):" in capsys.readouterr().err
    assert not output.exists()


def test_a_split_given_twice_is_refused_before_the_model_loads(fixture_benchmark, tmp_path, capsys, no_model_loads):
    """Was: --benchmark X --benchmark X,Y answered X twice into one log, then refused it as edited."""
    output = tmp_path / "run"
    flags = [*_flags(fixture_benchmark, output), "--benchmark", f"mm_vishal:vqa_rad,{SPLIT}", "--model",
             "tiny-random-llava"]
    assert main(["run", *flags]) == 2
    assert _error_line(capsys) == (f"error: --benchmark {SPLIT} is given twice (benchmarks: {SPLIT}, mm_vishal:vqa_rad, "
                                   f"{SPLIT}); each record is answered once: name each split once")
    assert not output.exists()


@pytest.mark.parametrize("first, second", [("mm_vishal:all", SPLIT), ("mm_vishal", "mm_vishal:all")])
def test_two_names_of_one_record_are_refused_before_the_model_loads(first, second, fixture_benchmark, tmp_path,
                                                                    capsys, no_model_loads):
    """``mm_vishal:all`` gathers slake's records under their own ids (mm_vishal/slake/…), and ``mm_vishal`` is its
    default config: either pair would answer one record twice into one log."""
    output = tmp_path / "run"
    flags = [*_flags(fixture_benchmark, output)[2:], "--benchmark", f"{first},{second}", "--model", "tiny-random-llava",
             "--image-root", f"vqa_rad={fixture_benchmark['image_roots']['vqa_rad']}"]
    assert main(["run", *flags]) == 2
    error = _error_line(capsys)
    assert error.startswith(f"error: --benchmark {first} and --benchmark {second} hold the same records (e.g. "
                            f"'mm_vishal/"), error
    assert error.endswith(f"(benchmarks: {first}, {second}); each record is answered once: name each split once")
    assert not output.exists()

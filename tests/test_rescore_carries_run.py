"""Audit D: a re-score (`run --predictions`) keeps what made its answers (mitigation, image-blind control,
protocol, generation settings, seed, versions); publish refuses a part of a split and says what a failed
push needs in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from medheval.cli import main
from medheval.publish import hub

SPLIT = "context"
ALLOW = ["--allow-random-weights", "--allow-fixture"]


def _roots(fixture: dict) -> list[str]:
    return [arg for source, root in fixture["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _published(folder: Path, out: Path, *flags: str) -> dict[str, list[dict]]:
    assert main(["publish", "--results", str(folder), "--model-repo", "org/model", "--to", str(out), *ALLOW,
                 *flags]) == 0
    files = out / "results" / "org--model" / ".eval_results"
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(files.iterdir())}


@pytest.fixture(scope="module")
def runs(fixture_benchmark, tmp_path_factory) -> dict[str, Path]:
    """Three source runs of the tiny random model (VCD, no image, the MedHEval paper protocol sampled with
    --seed 3), each re-scored from a copy of its answers (no results.json beside) and from its own folder."""
    root = tmp_path_factory.mktemp("rescore")
    data = ["--data-dir", fixture_benchmark["data_dir"]]
    sources = {"vcd": ["--mitigation", "vcd"], "blind": ["--control", "no_image"],
               "proto": ["--protocol", "medheval-baseline", "--chat-template", "model", "--seed", "3"]}
    folders: dict[str, Path] = {"root": root, "data": Path(fixture_benchmark["data_dir"])}
    for name, flags in sources.items():
        folders[name] = root / name
        assert main(["run", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--output", str(folders[name]),
                     "--max-new-tokens", "3", *data, *_roots(fixture_benchmark), *flags]) == 0
        copy = root / "elsewhere" / name / "answers.jsonl"
        copy.parent.mkdir(parents=True)
        shutil.copy(folders[name] / "predictions.jsonl", copy)
        folders[f"{name}_copy"] = copy
        for kind, answers in (("rs", copy), ("own", folders[name] / "predictions.jsonl")):
            folders[f"{name}_{kind}"] = root / f"{name}_{kind}"
            assert main(["run", "--benchmark", SPLIT, "--predictions", str(answers),
                         "--output", str(folders[f"{name}_{kind}"]), *data]) == 0
    return folders


@pytest.mark.parametrize("kind", ["rs", "own"])
def test_a_rescore_keeps_the_mitigation_and_publishes_under_its_name(runs, kind):
    source, rescore = _results(runs["vcd"]), _results(runs[f"vcd_{kind}"])
    assert source["settings"]["mitigation"].startswith("vcd:")
    assert rescore["settings"]["mitigation"] == source["settings"]["mitigation"]
    lines = [json.loads(line) for line in (runs[f"vcd_{kind}"] / "predictions.jsonl").read_text().splitlines()]
    assert {line["mitigation"] for line in lines} == {source["settings"]["mitigation"]}  # a re-score of it too
    a = _published(runs["vcd"], runs["root"] / f"pub_vcd_{kind}")
    b = _published(runs[f"vcd_{kind}"], runs["root"] / f"pub_vcdrs_{kind}")
    assert list(a) == list(b) and all(name.startswith("context_default_vcd_") for name in b)
    assert all("mitigation=vcd:" in entry["notes"] for entries in b.values() for entry in entries)


@pytest.mark.parametrize("kind", ["rs", "own"])
def test_a_rescore_keeps_the_image_blind_control(runs, kind):
    rescore = _results(runs[f"blind_{kind}"])
    assert rescore["settings"]["control"] == _results(runs["blind"])["settings"]["control"]
    assert rescore["settings"]["control"]["kind"] == "no_image"
    files = _published(runs[f"blind_{kind}"], runs["root"] / f"pub_blind_{kind}")
    assert list(files) == ["context_default_no_image.yaml"]  # never the with-image file
    assert all("control=no_image" in entry["notes"] for entry in files["context_default_no_image.yaml"])


def test_a_file_mixing_mitigations_or_controls_is_refused_by_name(runs, capsys):
    mixed = runs["root"] / "mixed.jsonl"
    vcd = runs["vcd_copy"].read_text().splitlines()
    blind = runs["blind_copy"].read_text().splitlines()
    mixed.write_text("\n".join(vcd[:1] + blind[1:]) + "\n")
    code = main(["run", "--benchmark", SPLIT, "--predictions", str(mixed), "--output", str(runs["root"] / "mixed"),
                 "--data-dir", str(runs["data"])])
    err = capsys.readouterr().err
    assert code == 2
    assert "mixes answers of several mitigations (none, vcd:" in err and "Split the file by its 'mitigation'" in err
    one_mitigation = [json.loads(line) for line in vcd[:1] + blind[1:]]
    one_mitigation[0]["mitigation"] = "none"
    mixed.write_text("".join(json.dumps(line) + "\n" for line in one_mitigation))
    code = main(["run", "--benchmark", SPLIT, "--predictions", str(mixed), "--output", str(runs["root"] / "mixed"),
                 "--data-dir", str(runs["data"])])
    assert code == 2 and "mixes answers of several controls (no_image, none)" in capsys.readouterr().err


def _accuracy(results: dict) -> float:
    return results["benchmarks"]["context:default"]["metrics"]["close_ended_accuracy"]["accuracy"]


def test_a_rescore_adopts_the_protocol_of_its_answers_and_says_so(runs):
    source, rescore = _results(runs["proto"]), _results(runs["proto_rs"])
    assert rescore["protocol"]["name"] == "medheval-baseline" and rescore["scoring"]["upstream_compat"] is True
    assert _accuracy(rescore) == _accuracy(source)
    assert any("scored under protocol 'medheval-baseline', the one these answers were made under" in warning
               for warning in rescore["warnings"])


def test_a_rescore_is_checked_before_scoring_under_the_protocol_of_its_answers(runs, monkeypatch):
    """The pre-run check of the splits' files uses the protocol the run will score under (the answers'), not the
    default clean one."""
    from medheval.run import runner

    checked, check = [], runner.QAProtocol.check_inputs
    monkeypatch.setattr(runner.QAProtocol, "check_inputs",
                        lambda self, name, spec: checked.append(spec.protocol) or check(self, name, spec))
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(runs["proto_copy"]),
                 "--output", str(runs["root"] / "proto_checked"), "--data-dir", str(runs["data"])]) == 0
    assert checked and set(checked) == {"medheval-baseline"}


def test_another_protocol_given_on_a_rescore_is_warned_and_named_in_the_notes(runs, capsys):
    out = runs["root"] / "proto_clean"
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(runs["proto_copy"]), "--output", str(out),
                 "--data-dir", str(runs["data"]), "--protocol", "clean"]) == 0
    warning = ("these answers were made under protocol 'medheval-baseline' and are scored under --protocol clean")
    assert warning in capsys.readouterr().err
    results = _results(out)
    assert results["protocol"]["name"] == "clean" and any(warning in text for text in results["warnings"])
    files = _published(out, runs["root"] / "pub_proto_clean")
    assert all(entry["notes"].endswith("protocol=medheval-baseline, scored under protocol=clean")
               for entries in files.values() for entry in entries)


def test_a_rescore_keeps_the_generation_seed_and_versions_of_its_answers(runs):
    source = _results(runs["proto"])
    assert source["settings"]["backend"]["seed"] == 3
    assert source["protocol"]["seeds"] == [3]  # the seed the run used, not the protocol's default 0
    made = _results(runs["proto_own"])["provenance"]["made_with"]
    assert made["generation"]["do_sample"] is True and made["generation"]["temperature"] == 0.2
    assert made["seed"] == 3 and made["versions"] == source["versions"]
    copied = _results(runs["proto_rs"])["provenance"]["made_with"]  # the lines alone: their generation settings
    assert copied["generation"] == made["generation"]


def test_a_rescore_reads_the_results_beside_its_answers_once(runs, monkeypatch):
    """The answers' results.json is read once per re-score (not once per protocol check, split and cell), and
    what it says is still inherited: protocol, seed, versions and the answers' annotation files."""
    from medheval.run import provenance

    reads, read = [], provenance._runs_beside
    monkeypatch.setattr(provenance, "_runs_beside", lambda path: reads.append(path) or read(path))
    out = runs["root"] / "proto_once"
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(runs["proto"] / "predictions.jsonl"),
                 "--output", str(out), "--data-dir", str(runs["data"])]) == 0
    assert reads == [runs["proto"] / "predictions.jsonl"]
    source, carried = _results(runs["proto"]), _results(out)["provenance"]
    assert _results(out)["protocol"]["name"] == carried["protocol"] == "medheval-baseline"
    assert carried["made_with"]["seed"] == 3 and carried["made_with"]["versions"] == source["versions"]
    assert carried["dataset_revision"] == source["provenance"]["dataset_revision"]
    assert "scoring_dataset_revision" not in carried  # the same files: nothing re-scored against other ones


def test_inherited_provenance_is_a_fresh_copy_each_time(runs):
    from medheval.backends.predictions import PredictionsFileBackend
    from medheval.run import provenance

    backend = PredictionsFileBackend(runs["proto"] / "predictions.jsonl")
    first = provenance.inherited(backend)
    first["made_with"]["seed"] = 99  # a caller changing its copy changes no later one
    assert provenance.inherited(backend)["made_with"]["seed"] == 3


def test_is_rescore_reads_a_run_its_settings_a_run_json_and_a_backend(runs):
    from medheval.backends.predictions import PredictionsFileBackend
    from medheval.run.provenance import is_rescore

    rescore, generated = _results(runs["vcd_rs"]), _results(runs["vcd"])
    assert is_rescore(rescore) and is_rescore(rescore["settings"]) and is_rescore(rescore["settings"]["backend"])
    assert is_rescore(json.loads((runs["vcd_rs"] / "run.json").read_text()))
    assert not any(is_rescore(part) for part in (generated, generated["settings"], generated["settings"]["backend"],
                                                 json.loads((runs["vcd"] / "run.json").read_text()), {}))
    assert is_rescore(PredictionsFileBackend(runs["vcd_copy"])) and not is_rescore(SimpleNamespace(name="m"))


def test_a_part_of_a_split_is_refused_without_allow_limit(runs, capsys):
    part = runs["root"] / "part.jsonl"
    part.write_text("".join(runs["vcd_copy"].read_text().splitlines(keepends=True)[:2]))
    out = runs["root"] / "part"
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(part), "--output", str(out),
                 "--data-dir", str(runs["data"]), "--allow-missing-predictions"]) == 0
    total = _results(out)["benchmarks"]["context:default"]["data_quality"]["n_records"]
    code = main(["publish", "--results", str(out), "--model-repo", "org/model", "--to", str(runs["root"] / "pp"),
                 *ALLOW])
    err = capsys.readouterr().err
    assert code == 2 and f"context:default scored 2 of its {total} records" in err and "--allow-limit" in err
    files = _published(out, runs["root"] / "pp", "--allow-limit")
    assert all(f"n=2/{total} (part of the split, published with --allow-limit)" in entry["notes"]
               for entries in files.values() for entry in entries)


def test_an_inspect_eval_of_chosen_samples_is_refused_without_allow_limit():
    from medheval.integrations.inspect.logs import _chosen_samples

    log = SimpleNamespace(eval=SimpleNamespace(config=SimpleNamespace(sample_id=["a", "b"])))
    assert _chosen_samples(log) == {"n_chosen_samples": 2}
    assert _chosen_samples(SimpleNamespace(eval=SimpleNamespace(config=SimpleNamespace(sample_id=None)))) == {}
    run = {"settings": {"model": "org/model", "mitigation": "none"}, "benchmarks": {"cxr_vishal:mimic_cxr": {
        "n_scored": 2, "n_chosen_samples": 2, "metrics": {"close_ended_accuracy": {"accuracy": 0.5}}}}}
    with pytest.raises(hub.PublishError, match="ran only the 2 sample.s. chosen by inspect's sample_id.*--allow-limit"):
        hub.eval_results_entries(run)
    [entry] = hub.eval_results_entries(run, allow=["limit"])["cxr_vishal_mimic_cxr.yaml"]
    assert entry["notes"] == "n=2 (part of the split, published with --allow-limit), unit=fraction (0-1)"


def _push(runs: dict, hub_url: str, token: str, repo: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update({"HF_ENDPOINT": hub_url, "HF_TOKEN": token, "HF_HUB_DISABLE_XET": "1",
                "HF_HOME": str(runs["root"] / "hf_home"),
                "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])})
    return subprocess.run([sys.executable, "-m", "medheval.cli", "publish", "--results", str(runs["vcd"]),
                           "--model-repo", repo, "--to", str(runs["root"] / "pushed"), "--push", *ALLOW],
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_failed_push_says_what_to_do_in_one_line_without_the_token(runs):
    from hub_server import HubServer, Repo

    with HubServer(tokens={"hf_secret_owner_token": "org"}) as fake:
        missing = _push(runs, fake.url, "hf_secret_owner_token", "org/missing")
        fake.repos[("model", "org/model")] = Repo("org/model", "model")  # exists: the wrong token is refused
        refused = _push(runs, fake.url, "hf_wrong_secret_token", "org/model")
    for done in (missing, refused):
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "secret" not in done.stderr
        assert len([line for line in done.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "error: the Hub has no model repo 'org/missing'" in missing.stderr
    assert "create the repo on the Hub first" in missing.stderr
    assert "error: the Hub refused the token (HTTP 401) pushing to model repo 'org/model'" in refused.stderr
    assert "HF_TOKEN to a valid token with write access; nothing was pushed" in refused.stderr


def test_an_unknown_protocol_in_the_answers_asks_for_protocol(runs, capsys):
    lines = [json.loads(line) for line in runs["proto_copy"].read_text().splitlines()]
    for line in lines:
        line["provenance"]["protocol"] = "someone-elses"
    answers = runs["root"] / "unknown_protocol.jsonl"
    answers.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code = main(["run", "--benchmark", SPLIT, "--predictions", str(answers), "--output", str(runs["root"] / "unknown"),
                 "--data-dir", str(runs["data"])])
    assert code == 2
    assert "made under protocol 'someone-elses' (their provenance)" in capsys.readouterr().err

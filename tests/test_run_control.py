"""Image-blind controls (``--control no_image|blank|noise``, :mod:`medheval.run.control`): what the model
really receives (processor inputs of the tiny LLaVA, requests to a loopback OpenAI-compatible server), the
run's identity (a blind run never mixes with the with-image run), the grid axis resuming, and the report's
Δ image on a hand-made pair of runs."""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from judge_servers import JudgeServer, image_parts, user_text
from report_runs import write_run
from medheval.backends.hf import HFBackend
from medheval.cli import main
from medheval.data.benchmarks import prepare_benchmark
from medheval.report.build import write_report
from medheval.report.collect import find_runs
from medheval.report.paper import build_tables, comparisons, image_deltas
from medheval.run.control import Control, ControlError, noise_like
from medheval.run.predictions_log import log_key, read_log
from medheval.run.prompts import build_prompt
from medheval.run.runner import RunError, RunSpec, run, run_grid

SPLIT = "mm_vishal:slake"


class SpyProcessor:
    """The tiny LLaVA's processor, recording every call's keyword arguments and its ``input_ids``."""

    def __init__(self, processor):
        self._processor = processor
        self.calls: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._processor, name)

    def __call__(self, **kwargs):
        out = self._processor(**kwargs)
        self.calls.append({**kwargs, "input_ids": out["input_ids"].tolist(), "has_pixels": "pixel_values" in out})
        return out


def _spied_backend(llava) -> tuple[HFBackend, SpyProcessor]:
    model, processor = llava
    backend = HFBackend(model, processor, max_new_tokens=2, batch_size=2, name="tiny")
    spy = SpyProcessor(backend.processor)
    backend.processor = spy
    return backend, spy


def _file_images(fixture: dict, limit: int) -> list[list[Image.Image]]:
    loaded = prepare_benchmark("mm_vishal", "slake", data_dir=fixture["data_dir"], image_roots=fixture["image_roots"],
                               limit=limit)
    return [loaded.resolver.load_record_images(record) for record in loaded.dataset.to_list()]


def test_no_image_run_carries_no_pixels_and_no_image_token(llava, fixture_benchmark, tmp_path):
    """No root is given and none is needed: no processor call gets ``images`` or returns ``pixel_values``,
    no prompt holds the image token, and the run records the control in run.json and in every log line."""
    backend, spy = _spied_backend(llava)
    spec = RunSpec(benchmarks=[SPLIT], output=tmp_path / "blind", data_dir=fixture_benchmark["data_dir"], limit=3,
                   control="no_image")
    results = run(spec, backend, batch_size=2)
    assert spy.calls and all("images" not in call and not call["has_pixels"] for call in spy.calls)
    image_token_id = backend.tokenizer.convert_tokens_to_ids(backend._image_token)
    assert all(image_token_id not in row for call in spy.calls for row in call["input_ids"])
    entries = read_log(tmp_path / "blind" / "predictions.jsonl")
    assert len(entries) == 3 and {e["control"] for e in entries} == {"no_image"}
    assert all("<image>" not in e["prompt"] and e["prompt"].startswith("USER: ") for e in entries)
    assert results["settings"]["control"] == {"kind": "no_image"}
    assert json.loads((tmp_path / "blind" / "run.json").read_text())["control"] == {"kind": "no_image"}
    assert "image control: `no_image`" in (tmp_path / "blind" / "results.md").read_text()


def test_blank_and_noise_replace_the_pixels_at_the_files_sizes(llava, fixture_benchmark, tmp_path):
    """``blank``: every image the processor gets is all zeros, at its file's size. ``noise``: same sizes, not
    the file's pixels, and the same noise again in a fresh run (seeded per record and image index)."""
    files = _file_images(fixture_benchmark, 2)
    seen: dict[str, list] = {}
    for kind in ("blank", "noise", "noise"):
        backend, spy = _spied_backend(llava)
        out = tmp_path / f"{kind}{len(seen)}"
        run(RunSpec(benchmarks=[SPLIT], output=out, data_dir=fixture_benchmark["data_dir"], limit=2,
                    image_roots=fixture_benchmark["image_roots"], control=kind, control_seed=7), backend, batch_size=2)
        (call,) = spy.calls
        got = call["images"]
        assert [[image.size for image in row] for row in got] == [[image.size for image in row] for row in files]
        arrays = [np.asarray(image) for row in got for image in row]
        if kind == "blank":
            assert all(not array.any() for array in arrays)
        else:
            originals = [np.asarray(image.convert("RGB")) for row in files for image in row]
            assert all(a.std() > 50 and not np.array_equal(a, o) for a, o in zip(arrays, originals))
        seen[f"{kind}{len(seen)}"] = arrays
        if kind == "noise":
            assert json.loads((out / "run.json").read_text())["control"] == {"kind": "noise", "seed": 7}
    assert all(np.array_equal(a, b) for a, b in zip(seen["noise1"], seen["noise2"]))


def test_noise_depends_on_seed_record_and_index_only():
    image = Image.new("RGB", (5, 4), (200, 10, 10))
    first = np.asarray(noise_like(image, 0, "r/1", 0))
    assert first.shape == (4, 5, 3)
    assert np.array_equal(first, np.asarray(noise_like(Image.new("RGB", (5, 4)), 0, "r/1", 0)))  # pixels ignored
    for other in (noise_like(image, 1, "r/1", 0), noise_like(image, 0, "r/2", 0), noise_like(image, 0, "r/1", 1)):
        assert not np.array_equal(first, np.asarray(other))
    assert noise_like(Image.new("L", (3, 2)), 0, "x", 0).mode == "L"
    assert Control("no_image").images({"id": "x"}, [image]) == []


def test_api_requests_of_blind_runs(fixture_benchmark, monkeypatch, tmp_path):
    """Through the loopback OpenAI-compatible server: ``no_image`` requests hold the same prompt text and no
    image part; ``blank`` requests hold black PNGs of the files' sizes."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    loaded = prepare_benchmark("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"], limit=2)
    prompts = sorted(build_prompt(record) for record in loaded.dataset.to_list())
    sizes = sorted(image.size for row in _file_images(fixture_benchmark, 2) for image in row)
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    with JudgeServer("openai", reply=lambda body: "Yes") as server:
        model = f"openai:served@{server.base_url}"
        base = ["run", "--benchmark", SPLIT, "--model", model, "--data-dir", fixture_benchmark["data_dir"],
                "--limit", "2", "--max-new-tokens", "4"]
        assert main([*base, "--output", str(tmp_path / "none"), "--control", "no_image"]) == 0
        texts = sorted(user_text(r.json) for r in server.requests)
        assert texts == prompts and all(not image_parts(r.json) for r in server.requests)
        server.requests.clear()
        assert main([*base, "--output", str(tmp_path / "blank"), "--control", "blank", *roots]) == 0
        got = []
        for request in server.requests:
            for part in image_parts(request.json):
                image = Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
                assert not np.asarray(image).any()
                got.append(image.size)
        assert sorted(got) == sizes


def test_blind_and_with_image_runs_never_mix(llava, fixture_benchmark, tmp_path):
    """The folder's run.json refuses another control; log keys differ by control; old lines read as none."""
    backend, _ = _spied_backend(llava)
    spec = RunSpec(benchmarks=[SPLIT], output=tmp_path / "run", data_dir=fixture_benchmark["data_dir"], limit=2,
                   image_roots=fixture_benchmark["image_roots"])
    run(spec, backend)
    with pytest.raises(RunError, match=r'changed: control.kind "<unset>" → "no_image"'):
        run(RunSpec(**{**spec.__dict__, "control": "no_image"}), backend)
    assert log_key({"id": "a", "model": "m"}) == ("a", "m", "none", "none")
    assert log_key({"id": "a", "model": "m", "control": "blank"}) != log_key({"id": "a", "model": "m"})


def test_no_image_refuses_image_contrasting_mitigations_and_a_predictions_file(llava, fixture_benchmark, tmp_path,
                                                                               capsys):
    backend, _ = _spied_backend(llava)
    spec = RunSpec(benchmarks=[SPLIT], output=tmp_path / "g", data_dir=fixture_benchmark["data_dir"], limit=1)
    with pytest.raises(RunError, match=r"--control no_image with --mitigation vcd.*Use --control blank or noise"):
        run_grid(spec, backend, ["none", "vcd"], controls=["none", "no_image"])
    assert not (tmp_path / "g").exists()
    with pytest.raises(ControlError, match="--control 'dark': unknown control; choose one of none, no_image, blank, noise"):
        Control("dark")
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "x", "prediction": "yes"}) + "\n")
    code = main(["run", "--benchmark", SPLIT, "--predictions", str(path), "--output", str(tmp_path / "p"),
                 "--data-dir", fixture_benchmark["data_dir"], "--control", "blank", "--allow-missing-predictions"])
    assert code == 2 and "--control needs a model (--model)" in capsys.readouterr().err


def test_the_control_grid_axis_resumes(fixture_benchmark, tmp_path):
    """A grid with ``controls: [none, no_image]`` × mitigations [none, dola] writes four cells (the with-image
    folders named as before controls existed), and the same command again generates nothing."""
    out = tmp_path / "grid"
    config = tmp_path / "grid.yaml"
    config.write_text(f"output: {out}\nmodels: [tiny-random-llava]\nbenchmarks: [{SPLIT}]\nlimit: 2\n"
                      "mitigations: [none, dola]\ncontrols: [none, no_image]\n")
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    args = ["run", "--config", str(config), "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "2",
            *roots]
    assert main(args) == 0
    model = out / "tiny-random-llava"
    dola = next(p.name for p in model.iterdir() if p.name.startswith("dola") and "__" not in p.name)
    assert sorted(p.name for p in model.iterdir() if p.is_dir()) == [dola, f"{dola}__no_image", "none",
                                                                      "none__no_image"]
    assert {e.get("control", "none") for e in read_log(model / "none" / "predictions.jsonl")} == {"none"}
    assert {e["control"] for e in read_log(model / f"{dola}__no_image" / "predictions.jsonl")} == {"no_image"}
    combined = json.loads((out / "results.json").read_text())
    assert combined["controls"] == ["none", "no_image"] and len(combined["runs"]) == 4
    assert "| tiny-random-llava | none · no_image |" in (out / "results.md").read_text()
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert all(entry["generated_this_run"] == 0 for r in again["runs"] for entry in r["benchmarks"].values())
    assert all(len(read_log(log)) == 2 for log in model.rglob("predictions.jsonl"))


def _blind_pair(folder: Path, with_image: list[bool], blind: list[bool], images: list[str]) -> Path:
    write_run(folder / "none", "none", with_image, images=images)
    write_run(folder / "none__no_image", "none", blind, images=images)
    results = json.loads((folder / "none__no_image" / "results.json").read_text())
    results["settings"]["control"] = {"kind": "no_image"}
    (folder / "none__no_image" / "results.json").write_text(json.dumps(results))
    return folder


def test_delta_image_on_a_hand_made_pair(tmp_path):
    """Twelve items on six images (two each). With image 10/12 right (83.3 %), blind 4/12 (33.3 %): Δ image =
    100·(10 − 4)/12 = 50 points. Per image the paired differences are (1, 0) or (0, 1): every image adds +1
    over two items, so only the identity and the all-flipped sign vector reach |T| = 6, p = 2/2^6 = 0.03125 over
    the images; over the 12 items (b = 0, c = 6) McNemar's 2·2^-6 is the same. The with-image column holds the
    with-image run (83.3) and the blind column the blind one (33.3), in report.md, tables.csv and report.json."""
    images = [name for name in "abcdef" for _ in range(2)]
    _blind_pair(tmp_path / "grid", [True, True, True, False, True, True] * 2,
                [False, True, False, False, True, False] * 2, images)
    runs = find_runs([tmp_path / "grid"])
    table, (record,) = image_deltas(runs)
    assert record["with_image"] == pytest.approx(1000 / 12) and record["blind"] == pytest.approx(400 / 12)
    assert record["diff"] == pytest.approx(50.0) and record["p_value"] == pytest.approx(0.03125)
    assert 0 < record["low"] <= 50.0 <= record["high"] and record["significant"]
    assert record["n"] == 12 and record["control"] == "no_image"
    assert record["resampled"] == "mm_vishal:all by image" and record["n_clusters"] == 6
    assert table.rows[0][0] == ["m", "none", "no_image", "mm_vishal:all", "Acc"]
    with_image, blind, delta = table.rows[0][1][:3]
    assert (with_image.value, blind.value, delta.value) == (pytest.approx(1000 / 12), pytest.approx(400 / 12), 50.0)
    assert comparisons(runs)[0] is None  # the blind run is no mitigation of the with-image run
    tables = {t.key: t for t in build_tables(runs)}
    assert "image_vs_blind" in tables
    close = tables["medheval_close_ended"]
    assert sorted(labels[1] for labels, _ in close.rows) == ["none", "none · no_image"]  # the blind rows
    _, (by_item,) = image_deltas(find_runs([tmp_path / "grid"], cluster="none"))
    assert by_item["diff"] == pytest.approx(50.0) and by_item["p_value"] == pytest.approx(0.03125)
    written = write_report([tmp_path / "grid"], tmp_path / "report", plots=False)
    assert "| m | none | no_image | mm_vishal:all | Acc | 83.3 | 33.3 | +50.0* [" in written["markdown"].read_text()
    cells = {row["column"]: row["value"] for row in csv.DictReader(io.StringIO(written["csv"].read_text()))
             if row["table"] == "image_vs_blind"}
    assert float(cells["with image"]) == pytest.approx(1000 / 12) and float(cells["blind"]) == pytest.approx(400 / 12)
    page = written["html"].read_text()
    row = page.split('data-table="image_vs_blind"')[1].split("</tr>")[1]
    assert row.index(">83.3<") < row.index(">33.3<") < row.index(">+50.0* [")
    assert page.count("Δ image: with image − image-blind control") == 1  # its section has its own heading


def test_clinhallu_traces_see_the_blind_images(tmp_path, monkeypatch):
    """ClinHallu's own protocol through the API backend with ``--control blank``: every trace request of the
    model holds only black images (the judge's requests are not the model's and are left alone)."""
    from clinhallu_fixture import write_snapshot
    from test_backends_api import clinhallu_reply

    snapshot = write_snapshot(tmp_path / "snap")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model_bodies: list[dict] = []
    reply = clinhallu_reply(model_bodies)

    roots = [a for key, path in snapshot["image_roots"].items() for a in ("--image-root", f"{key}={path}")]
    with JudgeServer("openai", reply=reply) as server:
        assert main(["run", "--benchmark", "clinhallu:vqa_rad", "--data-dir", snapshot["data_dir"], *roots,
                     "--output", str(tmp_path / "out"), "--max-new-tokens", "64", "--control", "blank",
                     "--model", f"openai:vlm@{server.base_url}", "--judge", f"openai:judge@{server.base_url}"]) == 0
    parts = [part for body in model_bodies for part in image_parts(body)]
    assert parts and all(not np.asarray(Image.open(io.BytesIO(base64.b64decode(
        part["image_url"]["url"].split(",", 1)[1])))).any() for part in parts)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["settings"]["control"] == {"kind": "blank"}
    # the protocol log says which images its traces saw
    info = json.loads((Path(results["benchmarks"]["clinhallu:vqa_rad"]["logs"]) / "clinhallu_run.json").read_text())
    assert info["control"] == {"kind": "blank"}


def test_published_results_keep_a_blind_run_apart():
    """A with-image and a blind run of one grid become two eval-results files; the blind one says its control."""
    from medheval.publish.hub import eval_results_entries

    def one(control: dict | None) -> dict:
        settings = {"model": "m", "mitigation": "none", **({"control": control} if control else {})}
        return {"settings": settings, "benchmarks": {"mm_vishal:slake": {
            "n_scored": 4, "metrics": {"close_ended_accuracy": {"accuracy": 0.5, "n": 4}}}}}

    files = eval_results_entries({"runs": [one(None), one({"kind": "no_image"})]})
    assert sorted(files) == ["mm_vishal_slake.yaml", "mm_vishal_slake_no_image.yaml"]
    assert files["mm_vishal_slake_no_image.yaml"][0]["notes"] == "control=no_image, n=4, unit=fraction (0-1)"
    assert files["mm_vishal_slake.yaml"][0]["notes"] == "n=4, unit=fraction (0-1)"


def test_a_contrastive_mitigation_works_on_the_blank_image(llava, fixture_benchmark, tmp_path):
    """VCD with ``--control blank``: the processor (hence VCD's clean and noised streams) gets only black images,
    and the cell records both the mitigation and the control."""
    backend, spy = _spied_backend(llava)
    spec = RunSpec(benchmarks=[SPLIT], output=tmp_path / "vcd", data_dir=fixture_benchmark["data_dir"], limit=2,
                   image_roots=fixture_benchmark["image_roots"])
    results = run_grid(spec, backend, ["vcd"], controls=["blank"])
    assert results["settings"]["mitigation"].startswith("vcd") and results["settings"]["control"] == {"kind": "blank"}
    images = [image for call in spy.calls for row in call["images"] for image in row]
    assert images and all(not np.asarray(image).any() for image in images)
    entries = read_log(tmp_path / "vcd" / "predictions.jsonl")
    assert len(entries) == 2 and {(e["mitigation"][:3], e["control"]) for e in entries} == {("vcd", "blank")}


def test_grid_markdown_names_a_blind_cell_with_its_control(tmp_path):
    """Warnings and caveats of a grid name each cell by mitigation *and* control: a with-image run and its
    blind control share a mitigation (``none``), so without the control the two cells' lines would merge."""
    from medheval.report.tables import write_grid_markdown

    def run(control: str | None, missing: int) -> dict:
        settings = {"model": "m", "mitigation": "none", **({"control": {"kind": control}} if control else {})}
        return {"settings": settings, "warnings": [f"w-{control}"],
                "benchmarks": {"s": {"n_records": 4, "n_scored": 4 - missing, "metrics": {}}}}

    write_grid_markdown([run(None, 1), run("no_image", 2)], tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "- `m` · `none`: w-None" in text and "- `m` · `none` · `no_image`: w-no_image" in text
    assert "- `none`: `s`: 1 of 4 record(s) have no prediction" in text
    assert "- `none` · `no_image`: `s`: 2 of 4 record(s) have no prediction" in text


def test_clinhallu_delta_image_from_the_protocol_logs(tmp_path):
    """A blind ClinHallu run gets its Δ image on ORG accuracy from the protocol logs, paired by item id
    (its logs hold no image ids, so exact sign-flip over items: McNemar). With the images the hand table's ORG answers are
    1, 0, None, 1, 0, 0 (2/6 right = 33.3 %); blind all six are 0 (0 %): Δ image = 100·2/6 = 33.3 points; the
    discordant pairs are 2 (right with the image, wrong blind) and 0 the other way, so p = 2·(1/2)² = 0.5."""
    from clinhallu_fixture import HAND_TABLE
    from report_runs import write_clinhallu_run

    write_clinhallu_run(tmp_path / "grid" / "none", HAND_TABLE)
    blind = write_clinhallu_run(tmp_path / "grid" / "none__blank", [(row[0], 0, *row[2:]) for row in HAND_TABLE])
    results = json.loads((blind / "results.json").read_text())
    results["settings"]["control"] = {"kind": "blank"}
    (blind / "results.json").write_text(json.dumps(results))
    runs = find_runs([tmp_path / "grid"])
    table, (record,) = image_deltas(runs)
    assert (record["metric"], record["split"], record["control"], record["n"]) == ("Acc (ORG)", "clinhallu:all",
                                                                                  "blank", 6)
    assert (record["with_image"], record["blind"]) == pytest.approx((100 / 3, 0.0))
    assert record["diff"] == pytest.approx(100 / 3) and record["p_value"] == pytest.approx(0.5)
    assert record["test"] == "exact sign-flip over items"  # a run without recorded images: items, and it says so
    assert record["resampled"].startswith("clinhallu:all by item, not by image")
    assert record["low"] <= record["diff"] <= record["high"]
    assert table.rows[0][0] == ["m", "none", "blank", "clinhallu:all", "Acc (ORG)"]
    assert comparisons(runs)[0] is None  # the blind run is no mitigation of the with-image run

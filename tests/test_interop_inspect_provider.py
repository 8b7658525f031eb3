"""The ``medheval`` inspect model provider (issue 24 part 3) and inspect ``.eval`` logs in
``medheval publish --results`` (part 4b), offline on a tiny random LLaVA and the fixture benchmark.

Runs in the interop venv (inspect_ai installed); skipped elsewhere unless ``MEDHEVAL_REQUIRE_INTEROP=1``.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from interop_support import require_harness

require_harness("inspect_ai")

from inspect_ai import Task, eval as inspect_eval, task  # noqa: E402
from inspect_ai.dataset import MemoryDataset, Sample  # noqa: E402
from inspect_ai.log import read_eval_log, write_eval_log  # noqa: E402
from inspect_ai.model import (  # noqa: E402
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    ContentImage,
    ContentText,
    GenerateConfig,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import Score, Target, mean, metric, scorer  # noqa: E402
from inspect_ai.solver import TaskState, generate  # noqa: E402
from PIL import Image  # noqa: E402

from medheval.backends.base import BackendError  # noqa: E402
from medheval.backends.hf import HFBackend  # noqa: E402
from medheval.backends.tiny import build_tiny_llava  # noqa: E402
from medheval.cli.main import main  # noqa: E402
from medheval.data.benchmarks import prepare_benchmark  # noqa: E402
from medheval.integrations.inspect.logs import split_metric_name  # noqa: E402
from medheval.integrations.inspect.provider import (  # noqa: E402
    CallBatcher,
    ProviderError,
    chat_request,
    decode_image,
    greedy_overrides,
)
from medheval.mitigations import MitigationError, get_mitigation  # noqa: E402
from medheval.publish import hub  # noqa: E402
from medheval.scoring.headline import headline_values  # noqa: E402
from medheval.run.predictions_log import read_log  # noqa: E402
from medheval.run.prompts import build_prompt  # noqa: E402

SPLIT = ("cxr_vishal", "mimic_cxr")
NEW_TOKENS = 6


def data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(seed=0, save_dir=str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def split_items(fixture_benchmark) -> list[tuple[dict, list[Image.Image]]]:
    """The fixture split's records with their images, loaded as ``medheval run`` loads them."""
    loaded = prepare_benchmark(*SPLIT, data_dir=fixture_benchmark["data_dir"],
                               image_roots=fixture_benchmark["image_roots"])
    records = loaded.dataset.to_list()
    return [(record, loaded.resolver.load_record_images(record)) for record in records]


def samples_of(items: list[tuple[dict, list[Image.Image]]]) -> list[Sample]:
    """Samples as a medheval inspect task builds them: the record's images, then its prompt, one user turn."""
    return [Sample(id=record["id"], target=str(record["answer"]),
                   input=[ChatMessageUser(content=[*(ContentImage(image=data_uri(img)) for img in images),
                                                   ContentText(text=build_prompt(record))])])
            for record, images in items]


def run_inspect(samples: list[Sample], model, log_dir: Path, max_tokens: int = NEW_TOKENS, **model_args):
    """One inline task through ``inspect_ai.eval``; returns the log and ``{sample id: completion}``."""
    job = Task(dataset=MemoryDataset(samples), solver=generate(), config=GenerateConfig(max_tokens=max_tokens))
    [log] = inspect_eval(job, model=model, model_args=model_args, log_dir=str(log_dir), display="none",
                         max_tasks=1)
    assert log.status == "success", log.error
    return log, {sample.id: sample.output.completion for sample in log.samples}


# -- the provider ----------------------------------------------------------------------------------


def test_the_inspect_input_is_the_medheval_run_input(tiny_dir, split_items):
    """A user turn of the record's images then ``build_prompt(record)`` renders to the text ``medheval run``
    gives the model (``HFBackend.format_prompt``), for every record of the split."""
    backend = HFBackend(tiny_dir, batch_size=1, max_new_tokens=NEW_TOKENS)
    for record, images in split_items:
        request, decoded = chat_request(samples_of([(record, images)])[0].input)
        assert request == {"system": "", "user": build_prompt(record)}
        assert backend.format_chat(request["system"], request["user"], "", len(decoded)) == \
            backend.format_prompt(record, len(images))
        assert [img.tobytes() for img in decoded] == [img.convert("RGB").tobytes() for img in images]


@pytest.fixture(scope="module")
def run_folder(tiny_dir, fixture_benchmark, tmp_path_factory) -> Path:
    """``medheval run --model <tiny folder>`` on the fixture split, ``--max-new-tokens 6``."""
    out = tmp_path_factory.mktemp("medheval-run")
    roots = [arg for source, root in fixture_benchmark["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]
    assert main(["run", "--benchmark", ":".join(SPLIT), "--model", tiny_dir, "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu",
                 *roots]) == 0
    return out


def test_provider_gives_the_predictions_of_medheval_run(tiny_dir, split_items, run_folder, tmp_path):
    """``--model medheval/<folder>`` on the split's samples == ``medheval run --model <folder>`` on the same
    split (same prompts, images, greedy decoding, max new tokens), prediction for prediction."""
    expected = {entry["id"]: entry["prediction"] for entry in read_log(run_folder / "predictions.jsonl")}
    _, got = run_inspect(samples_of(split_items), f"medheval/{tiny_dir}", tmp_path / "logs", device="cpu")
    assert got == expected
    assert len(set(got.values())) > 1  # the images and prompts reach the model


def test_the_demo_model_by_name_is_the_saved_tiny_model(tiny_dir, split_items, tmp_path):
    """``--model medheval/tiny-random-llava`` builds the demo model in-process, as ``medheval run --model
    tiny-random-llava`` does (it was looked up on the Hub, an offline error): the completions of the same model
    saved to a folder, and outputs marked ``random_weights``."""
    samples = samples_of(split_items[:4])
    _, saved = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "saved", device="cpu")
    log, named = run_inspect(samples, "medheval/tiny-random-llava", tmp_path / "named", device="cpu")
    assert named == saved
    assert {sample.output.metadata.get("random_weights") for sample in log.samples} == {True}


def test_the_medheval_task_run_by_the_provider_matches_medheval_run(tiny_dir, run_folder, fixture_benchmark, tmp_path):
    """Our task ``medheval/cxr_vishal`` (its own samples, settings and scorer) run by the provider with
    ``max_tokens=6``: the predictions of ``medheval run --model`` with ``--max-new-tokens 6``, and the split
    metrics that ``publish`` reads from the log equal the run's ``results.json``; the log of this random-weight
    model is refused by ``publish`` as the run folder is."""
    from medheval.integrations.inspect.logs import results_from_log
    from medheval.integrations.inspect.tasks import TASKS

    roots = ",".join(f"{source}={root}" for source, root in fixture_benchmark["image_roots"].items())
    job = TASKS[SPLIT[0]](config=SPLIT[1], data_dir=fixture_benchmark["data_dir"], image_root=roots,
                          allow_credentialed=True)  # a local model: the opt-in docs/interop.md names
    [log] = inspect_eval(job, model=f"medheval/{tiny_dir}", model_args={"device": "cpu", "batch_size": 4},
                         max_tokens=NEW_TOKENS, log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    expected = {entry["id"]: entry["prediction"] for entry in read_log(run_folder / "predictions.jsonl")}
    assert {sample.id: sample.output.completion for sample in log.samples} == expected
    run, unmapped = results_from_log(log.location)
    split = json.loads((run_folder / "results.json").read_text())["benchmarks"][":".join(SPLIT)]
    assert unmapped == []
    assert headline_values(run["benchmarks"][":".join(SPLIT)]["metrics"]) == headline_values(split["metrics"])
    empty = sum(1 for text in expected.values() if not text.strip())
    assert run["benchmarks"][":".join(SPLIT)]["n_empty_predictions"] == split["n_empty_predictions"] == empty
    with pytest.raises(hub.PublishError, match="random-weight"):
        hub.export_results(log.location, tmp_path / "out", "org/model")


def test_batching_gives_the_completions_of_batch_size_one(tiny_dir, split_items, tmp_path):
    """inspect calls ``generate`` once per sample, concurrently; the provider runs them in batches (the
    batcher records batches of more than one) and the completions equal those of ``batch_size=1``."""
    samples = samples_of(split_items)
    one = get_model(f"medheval/{tiny_dir}", batch_size=1, device="cpu", memoize=False)
    four = get_model(f"medheval/{tiny_dir}", batch_size=4, device="cpu", memoize=False)
    _, alone = run_inspect(samples, one, tmp_path / "one")
    _, batched = run_inspect(samples, four, tmp_path / "four")
    assert batched == alone
    assert set(one.api.batcher.batches) == {1}
    assert max(four.api.batcher.batches) > 1 and sum(four.api.batcher.batches) == len(samples)
    assert all(size <= 4 for size in four.api.batcher.batches)


def test_vcd_alpha0_equals_no_mitigation_token_for_token(tiny_dir, split_items, tmp_path):
    """VCD (Leng et al. 2024, eq. 3): logits (1+alpha)·l(v) − alpha·l(v'); alpha=0 leaves l(v), and the
    plausibility cut keeps the argmax, so greedy completions equal plain decoding. alpha=1 runs the
    contrastive pass for real: it is recorded and changes some completion of this split."""
    samples = samples_of(split_items)
    _, plain = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "plain", device="cpu")
    log, vcd0 = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "vcd0", device="cpu", mitigation="vcd:alpha=0")
    assert vcd0 == plain
    assert {s.output.metadata["mitigation"] for s in log.samples} == {get_mitigation("vcd:alpha=0").spec()}
    assert log.eval.model_args["mitigation"] == "vcd:alpha=0"
    _, vcd3 = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "vcd3", device="cpu", mitigation="vcd:alpha=3")
    assert vcd3 != plain


def test_max_tokens_is_honoured(tiny_dir, split_items, tmp_path):
    """``GenerateConfig.max_tokens`` is the number of new tokens: 1 token gives a prefix of the 6-token answer."""
    samples = samples_of(split_items[:3])
    _, six = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "six", device="cpu")
    _, one = run_inspect(samples, f"medheval/{tiny_dir}", tmp_path / "one", device="cpu", max_tokens=1)
    assert all(six[key].startswith(one[key]) and len(one[key].split()) <= 1 for key in six)


TASK_FILE = """
import json
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageUser, ContentImage, ContentText
from inspect_ai.solver import generate

@task
def samples():
    rows = json.load(open({path!r}))
    return Task(dataset=[Sample(id=r["id"], input=[ChatMessageUser(content=[*(ContentImage(image=u) for u in r["images"]),
                                                                            ContentText(text=r["prompt"])])])
                         for r in rows], solver=generate())
"""


def test_the_inspect_cli_finds_the_provider_by_its_entry_point(tiny_dir, split_items, tmp_path):
    """``inspect eval FILE --model medheval/<folder> -M mitigation=vcd:alpha=0,beta=0.1 -M batch_size=3`` in a
    fresh process (the provider found through setup.cfg's ``inspect_ai`` entry point, ``-M`` values parsed by
    inspect's CLI, which splits the mitigation at its comma: issue 32, point 2) gives the completions of the
    in-process provider without a mitigation (alpha=0: VCD's contrast is off; greedy keeps the top token)."""
    import os
    import subprocess
    import sys

    items = split_items[:4]
    (tmp_path / "rows.json").write_text(json.dumps([
        {"id": record["id"], "prompt": build_prompt(record), "images": [data_uri(img) for img in images]}
        for record, images in items]))
    (tmp_path / "task.py").write_text(TASK_FILE.format(path=str(tmp_path / "rows.json")))
    _, expected = run_inspect(samples_of(items), f"medheval/{tiny_dir}", tmp_path / "in-process", device="cpu")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "inspect_ai", "eval", "task.py", "--model",
                           f"medheval/{tiny_dir}", "-M", "mitigation=vcd:alpha=0,beta=0.1", "-M", "batch_size=3", "-M",
                           "device=cpu", "--max-tokens", str(NEW_TOKENS), "--log-dir", str(tmp_path / "cli"),
                           "--display", "none"], capture_output=True, text=True, env=env, timeout=600,
                          cwd=tmp_path)  # inspect globs the task file relative to the working folder
    assert done.returncode == 0, done.stderr[-3000:]
    [log_file] = (tmp_path / "cli").glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success" and log.eval.model_args == {"mitigation": ["vcd:alpha=0", "beta=0.1"],
                                                                 "batch_size": 3, "device": "cpu"}
    assert {sample.id: sample.output.completion for sample in log.samples} == expected
    spec = get_mitigation("vcd:alpha=0,beta=0.1").spec()
    assert {sample.output.metadata["mitigation"] for sample in log.samples} == {spec}


@pytest.mark.parametrize("arg", ["mitigation=vcd:alpha=1,beta=0.1", "mitigation=vcd:alpha=1, beta=0.1",
                                 "mitigation={name: vcd, alpha: 1, beta: 0.1}"])
def test_mitigation_model_args_survive_inspect_s_cli_parsing(arg):
    """inspect's own ``-M`` parser turns a comma spec into a list (and a YAML mapping into a dict): each gives the
    mitigation of ``--mitigation vcd:alpha=1,beta=0.1``, in the provider and in ``publish`` (the log reader)."""
    from inspect_ai._cli.util import parse_cli_args

    from medheval.integrations.inspect.logs import _mitigation
    from medheval.integrations.inspect.model_args import resolve_mitigation

    value = parse_cli_args((arg,))["mitigation"]
    assert not isinstance(value, str)  # what inspect makes of it: a list or a dict, never our string
    spec = get_mitigation("vcd:alpha=1,beta=0.1").spec()
    assert resolve_mitigation(value).spec() == spec == _mitigation(Path("x.eval"), {"mitigation": value})


def test_bad_model_args_give_clear_errors(tiny_dir, tmp_path):
    with pytest.raises(MitigationError, match="unknown mitigation 'vcdd'; available: none, avisc"):
        get_model(f"medheval/{tiny_dir}", mitigation="vcdd", memoize=False)
    with pytest.raises(MitigationError, match=r"received \['vcdd:alpha=1', 'beta=0.1'\] \(read as "
                                              r"'vcdd:alpha=1,beta=0.1'\): unknown mitigation 'vcdd'.*; expected -M"):
        get_model(f"medheval/{tiny_dir}", mitigation=["vcdd:alpha=1", "beta=0.1"], memoize=False)
    with pytest.raises(MitigationError, match=r"vcd has no option\(s\) \['gamma'\]"):
        get_model(f"medheval/{tiny_dir}", mitigation="vcd:gamma=2", memoize=False)
    with pytest.raises(BackendError, match=str(tmp_path / "no-such-model")):
        get_model(f"medheval/{tmp_path / 'no-such-model'}", memoize=False)
    with pytest.raises(ProviderError, match=r"unknown model arg\(s\) \['batchsize'\]"):
        get_model(f"medheval/{tiny_dir}", batchsize=2, memoize=False)


def test_requests_it_cannot_serve_are_refused():
    assert greedy_overrides(GenerateConfig(max_tokens=16, temperature=0.0), 64) == {"max_new_tokens": 16}
    assert greedy_overrides(GenerateConfig(), 64) == {"max_new_tokens": 64}
    with pytest.raises(ProviderError, match=r"decodes greedily.*\['temperature', 'top_p'\]"):
        greedy_overrides(GenerateConfig(temperature=0.7, top_p=0.9), 64)
    with pytest.raises(ProviderError, match="multi-turn"):
        chat_request([ChatMessageUser(content="a"), ChatMessageAssistant(content="b"), ChatMessageUser(content="c")])
    with pytest.raises(ProviderError, match="no user text"):
        chat_request([ChatMessageSystem(content="be brief")])
    assert chat_request([ChatMessageSystem(content="be brief"), ChatMessageUser(content="Is it?")])[0] == \
        {"system": "be brief", "user": "Is it?"}


def test_images_decode_from_data_uris_and_paths(tmp_path):
    """RGBA and grey images come back as RGB with the same pixels (our image loader's convention)."""
    image = Image.new("RGBA", (7, 5), (10, 20, 30, 255))
    image.save(tmp_path / "x.png")
    for source in (data_uri(image), str(tmp_path / "x.png")):
        decoded = decode_image(source)
        assert decoded.mode == "RGB" and decoded.size == (7, 5) and decoded.getpixel((3, 2)) == (10, 20, 30)
    with pytest.raises(ProviderError, match="does not exist"):
        decode_image(str(tmp_path / "missing.png"))
    with pytest.raises(ProviderError, match="data URIs and local files only"):
        decode_image("https://example.org/x.png")


def test_the_batcher_groups_calls_by_settings_and_passes_errors_on():
    """Five concurrent calls, two settings, batch size 2: batches [2, 1] for the first setting and [2] for the
    second, never mixed; a failing batch fails its calls only."""
    import asyncio

    seen: list[tuple[list[str], dict]] = []

    def run(requests, images, overrides):
        seen.append(([r["user"] for r in requests], overrides))
        if "boom" in [r["user"] for r in requests]:
            raise RuntimeError("model failed")
        return [r["user"].upper() for r in requests]

    batcher = CallBatcher(run, batch_size=2, wait=0.01)

    async def calls():
        jobs = [batcher.submit({"user": u}, [], {"max_new_tokens": n})
                for u, n in (("a", 1), ("b", 2), ("c", 1), ("d", 2), ("e", 1))]
        return await asyncio.gather(*jobs)

    assert asyncio.run(calls()) == ["A", "B", "C", "D", "E"]
    assert seen == [(["a", "c"], {"max_new_tokens": 1}), (["b", "d"], {"max_new_tokens": 2}),
                    (["e"], {"max_new_tokens": 1})]

    async def failing():
        return await asyncio.gather(batcher.submit({"user": "boom"}, [], {}), return_exceptions=True)

    [error] = asyncio.run(failing())
    assert isinstance(error, RuntimeError) and str(error) == "model failed"


def test_the_provider_is_found_through_the_entry_point():
    """``medheval/<model>`` resolves to our provider by the ``inspect_ai`` entry point (setup.cfg)."""
    from inspect_ai._util.registry import registry_find, registry_unqualified_name

    from medheval.integrations.inspect import _registry  # noqa: F401  (what the entry point imports)

    found = registry_find(lambda info: info.type == "modelapi" and registry_unqualified_name(info) == "medheval")
    assert len(found) == 1


# -- inspect logs in `publish --results` ---------------------------------------------------------


def headline(metrics: dict) -> dict[str, float]:
    """The split metrics as a medheval scorer reports them: one inspect metric per ``<metric>/<key>``."""
    return {f"{name}/{key}": value for name, values in metrics.items() for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def inline_task(name: str, records: list[dict], metrics: dict):
    """A task named like ours whose scorer reports ``metrics`` (what the real scorer computes through
    ``score_split``) plus a per-sample mean, which is not one of our metrics."""

    @metric(name="medheval_split")
    def split_metric():
        def compute(scores):
            return headline(metrics)
        return compute

    @scorer(metrics=[split_metric(), mean()])
    def split_scorer():
        async def score(state: TaskState, target: Target) -> Score:
            return Score(value=float(state.output.completion == target.text), answer=state.output.completion,
                         metadata={"id": state.sample_id})
        return score

    @task(name=name)
    def split_task(config: str = SPLIT[1]):
        samples = [Sample(id=r["id"], input=build_prompt(r), target=str(r["answer"]), metadata={"fixture": True})
                   for r in records]  # the fixture split, marked as our tasks mark it
        return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=split_scorer())

    return split_task


@pytest.fixture(scope="module")
def scored_split(fixture_benchmark, tmp_path_factory) -> dict:
    """``medheval run --predictions`` on the fixture split (half right, half wrong) and an inspect log of a
    ``medheval/cxr_vishal`` task whose scorer reports the same split metrics for the same predictions."""
    folder = tmp_path_factory.mktemp("scored")
    records = prepare_benchmark(*SPLIT, data_dir=fixture_benchmark["data_dir"]).dataset.to_list()
    predictions = {r["id"]: (str(r["answer"]) if i % 2 == 0 else "I cannot tell") for i, r in enumerate(records)}
    path = folder / "predictions.jsonl"
    path.write_text("".join(json.dumps({"id": k, "prediction": v}) + "\n" for k, v in predictions.items()))
    assert main(["run", "--benchmark", ":".join(SPLIT), "--predictions", str(path), "--output", str(folder / "run"),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    results = json.loads((folder / "run" / "results.json").read_text())
    metrics = results["benchmarks"][":".join(SPLIT)]["metrics"]
    by_prompt = {build_prompt(r): predictions[r["id"]] for r in records}

    def reply(messages, *_):  # usage given: mockllm would count tokens with tiktoken, which downloads
        output = ModelOutput.from_content("mockllm/model", by_prompt[messages[-1].text])
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    model = get_model("mockllm/model", memoize=False, custom_outputs=reply)
    [log] = inspect_eval(inline_task("medheval/cxr_vishal", records, metrics)(), model=model,
                         log_dir=str(folder / "logs"), display="none")
    assert log.status == "success", log.error
    return {"run": folder / "run", "log": Path(log.location), "metrics": metrics, "records": records,
            "folder": folder}


def eval_results(repo) -> dict[str, list]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(Path(repo.folder, ".eval_results").iterdir())}


RESCORED_NOTE = re.compile(r", rescored against annotation files sha256=[0-9a-f]{12} \(answers generated from unknown "
                           r"annotation files\)")


def as_generated(files: dict[str, list]) -> dict[str, list]:
    """``files`` of the run folder (a re-score of a bare predictions file: its notes say the answers' annotation
    files are unknown, provenance.scoring_dataset_revision) as the inspect log's, which generated its answers on
    the files it scored against: every entry has that note, then it is dropped."""
    entries = [entry for listed in files.values() for entry in listed]
    assert entries and all(RESCORED_NOTE.search(entry["notes"]) for entry in entries)
    return {name: [{**entry, "notes": RESCORED_NOTE.sub("", entry["notes"])} for entry in listed]
            for name, listed in files.items()}


def test_an_inspect_log_publishes_the_files_of_the_run_folder(scored_split, tmp_path):
    """The log (file or folder) gives the same ``.eval_results`` files, entries and values as the run
    folder scored from the same predictions; the per-sample mean is named as not published."""
    from_run = eval_results(hub.export_results(scored_split["run"], tmp_path / "a", "org/model", allow=["fixture"]))
    from_log = hub.export_results(scored_split["log"], tmp_path / "b", "org/model", allow=["fixture"])
    from_folder = hub.export_results(scored_split["log"].parent, tmp_path / "c", "org/model", allow=["fixture"])
    assert list(from_run) == ["cxr_vishal_mimic_cxr.yaml"]
    from_run = as_generated(from_run)
    assert eval_results(from_log) == from_run == eval_results(from_folder)
    accuracy = {e["dataset"]["task_id"]: e["value"] for e in from_run["cxr_vishal_mimic_cxr.yaml"]}
    assert accuracy["mimic_cxr/close_ended_accuracy/accuracy"] == scored_split["metrics"]["close_ended_accuracy"]["accuracy"]
    assert from_log.warnings == [f"{scored_split['log'].name}: inspect metrics not published (not ours): split_scorer/mean"]
    assert main(["publish", "--results", str(scored_split["log"]), "--model-repo", "org/model",
                 "--to", str(tmp_path / "cli")]) == 2  # fixture data: refused without the flag (issue 32, point 5)
    assert main(["publish", "--results", str(scored_split["log"]), "--model-repo", "org/model",
                 "--to", str(tmp_path / "cli"), "--allow-fixture"]) == 0
    assert eval_results(hub.RepoFolder(str(tmp_path / "cli" / "results" / "org--model"), "", "", "")) == from_run


def test_a_mitigation_in_the_log_names_the_file_as_a_run_folder_does(scored_split, tmp_path):
    """``-M mitigation=vcd:alpha=1`` → the file and notes of a run with ``--mitigation vcd:alpha=1``."""
    log = read_eval_log(str(scored_split["log"]))
    log.eval.model_args = {"mitigation": "vcd:alpha=1"}
    write_eval_log(log, str(tmp_path / "vcd.eval"))
    results = json.loads((scored_split["run"] / "results.json").read_text())
    results["settings"]["mitigation"] = get_mitigation("vcd:alpha=1").spec()  # what `medheval run` records
    expected = as_generated(hub.eval_results_entries(results, allow=["fixture"]))
    got = eval_results(hub.export_results(tmp_path / "vcd.eval", tmp_path / "out", "org/model", allow=["fixture"]))
    assert got == expected and list(got) == ["cxr_vishal_mimic_cxr_vcd_preset_medheval_alpha_1_beta_0_1_noise_step_500_"
                                             "noise_seed_0.yaml"]


def test_logs_that_cannot_be_published_are_refused_by_name(scored_split, tmp_path, monkeypatch):
    log = read_eval_log(str(scored_split["log"]))
    bad = {}
    for label, change in {"foreign": ("task", "inspect_evals/mmmu"), "unfinished": ("status", "error"),
                          "unknown_config": ("config", "nope")}.items():
        copy = log.model_copy(deep=True)
        if change[0] == "task":
            copy.eval.task = change[1]
        elif change[0] == "status":
            copy.status = change[1]
        else:
            copy.eval.task_args = {"config": change[1]}
        bad[label] = tmp_path / f"{label}.eval"
        write_eval_log(copy, str(bad[label]))
    with pytest.raises(hub.PublishError, match=rf"{bad['foreign']}: task 'inspect_evals/mmmu' is not a medheval task"):
        hub.export_results(bad["foreign"], tmp_path / "o", "org/model")
    with pytest.raises(hub.PublishError, match=rf"{bad['unfinished']}: the eval did not finish \(status 'error'"):
        hub.export_results(bad["unfinished"], tmp_path / "o", "org/model")
    with pytest.raises(hub.PublishError, match=r"unknown_config.eval: benchmark 'cxr_vishal' has no config 'nope'"):
        hub.export_results(bad["unknown_config"], tmp_path / "o", "org/model")
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.eval", "b.eval"):
        (twice / name).write_bytes(scored_split["log"].read_bytes())
    with pytest.raises(hub.PublishError, match=r"a.eval and .*b.eval both hold cxr_vishal:mimic_cxr"):
        hub.export_results(twice, tmp_path / "o", "org/model")
    (tmp_path / "junk.eval").write_text("not a log")
    with pytest.raises(hub.PublishError, match=r"junk.eval is not a readable inspect log"):
        hub.export_results(tmp_path / "junk.eval", tmp_path / "o", "org/model")
    monkeypatch.setitem(__import__("sys").modules, "inspect_ai.log", None)
    with pytest.raises(hub.PublishError, match=r'pip install "medheval\[interop\]"'):
        hub.export_results(scored_split["log"], tmp_path / "o", "org/model")


def test_a_log_of_the_random_tiny_model_is_refused(tiny_dir, scored_split, tmp_path):
    """The provider marks outputs of a random-weight model; publishing them is refused as for run folders."""
    model = get_model(f"medheval/{tiny_dir}", device="cpu", memoize=False)
    [log] = inspect_eval(inline_task("medheval/cxr_vishal", scored_split["records"][:2], scored_split["metrics"])(),
                         model=model, log_dir=str(tmp_path), display="none", limit=2,
                         max_tokens=2)
    assert log.status == "success", log.error
    with pytest.raises(hub.PublishError, match="random-weight"):
        hub.export_results(log.location, tmp_path / "o", "org/model")


def test_metric_names_map_to_ours():
    ours = ["chair", "close_ended_accuracy", "text_generation"]
    assert split_metric_name("close_ended_accuracy/accuracy", ours) == ("close_ended_accuracy", "accuracy")
    assert split_metric_name("medheval_split_chair/CHAIR_i", ours) == ("chair", "CHAIR_i")
    assert split_metric_name("text_generation.rougeL", ours) == ("text_generation", "rougeL")
    assert split_metric_name("mean", ours) is None and split_metric_name("accuracy", ours) is None

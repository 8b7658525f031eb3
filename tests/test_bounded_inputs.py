"""Bounded inputs, clean errors (issue 31, class 6), each tried from the attacker's side.

- a grid YAML "billion laughs" (aliases of aliases) anywhere in the file is refused at once, with a short error;
- a predictions line or prediction past the documented maximum is refused naming the line, in bounded memory;
- ``usage`` numbers that are not counts (``-1e308``, ``"12"``, ``true``, ``1.5``) are never summed;
- ``--org`` is validated like ``--model-repo``: no markup in a card, no invalid repo id in ``publish.json``;
- a full disk (``OSError(ENOSPC)`` at the write call) prints one line naming the file and the free space;
- bidirectional control characters in a reply never reach ``report.html`` raw.
"""

from __future__ import annotations

import errno
import json
import time
import tracemalloc
from pathlib import Path

import pytest

from judge_servers import JudgeServer, openai_body
from medheval.cli import main
from medheval.data.benchmarks import load_benchmark

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def _laughs(levels: int) -> str:
    """A YAML flow sequence holding 9**levels strings through nested aliases, in a few hundred bytes."""
    parts = ["&x0 [" + ", ".join(["lol"] * 9) + "]"]
    parts += [f"&x{n} [" + ", ".join([f"*x{n - 1}"] * 9) + "]" for n in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


@pytest.mark.parametrize("where", ["limit: {bomb}", "benchmark_options:\n  mm_vishal: {{deep: {bomb}}}",
                                   "metric_options:\n  close_ended_accuracy:\n    threshold: {bomb}",
                                   "limit: &self [*self]"])
def test_a_billion_laughs_grid_is_refused_quickly_with_a_short_error(where, tmp_path, capsys):
    config = tmp_path / "grid.yaml"
    config.write_text("models: [tiny-random-llava]\nbenchmarks: [mm_vishal:slake]\noutput: out\n"
                      + where.format(bomb=_laughs(7)) + "\n")  # 4.8 million strings once expanded
    assert config.stat().st_size < 1000
    began = time.monotonic()
    assert main(["run", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert time.monotonic() - began < 30
    assert len(error) < 2000 and str(config) in error
    assert "alias" in error


def test_grid_error_messages_quote_a_bounded_value(tmp_path, capsys):
    config = tmp_path / "grid.yaml"
    config.write_text("models: [tiny-random-llava]\nbenchmarks: [mm_vishal:slake]\noutput: out\n"
                      f"limit: {json.dumps(['x' * 1000] * 90)}\n")  # 90 kB, no aliases: within the limits
    assert main(["run", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert "limit" in error and "more characters not shown" in error and len(error) < 2000


# -- predictions ------------------------------------------------------------------------------------------
def _ids(fixture: dict) -> list[str]:
    return list(load_benchmark("mm_vishal", "slake", data_dir=fixture["data_dir"])["id"])


def test_an_oversized_predictions_line_is_refused_in_bounded_memory(fixture_benchmark, tmp_path, capsys):
    from medheval.backends.predictions import MAX_LINE_BYTES, MAX_PREDICTION_CHARS, PredictionsFileBackend
    from medheval.backends.base import BackendError

    assert (MAX_LINE_BYTES, MAX_PREDICTION_CHARS) == (1_000_000, 100_000)  # documented in docs/running.md
    ids = _ids(fixture_benchmark)
    path = tmp_path / "predictions.jsonl"
    with path.open("w") as handle:
        handle.write(json.dumps({"id": ids[0], "prediction": "yes"}) + "\n")
        handle.write('{"id": "%s", "prediction": "' % ids[1] + "A" * 30_000_000 + '"}\n')  # 30 MB
        handle.write(json.dumps({"id": ids[2], "prediction": "B" * (MAX_PREDICTION_CHARS + 1)}) + "\n")
        handle.write(json.dumps({"id": "C" * 100_000, "prediction": "no"}) + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(BackendError) as caught:
            PredictionsFileBackend(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "line 2: 30000" in message and "at most 1000000 bytes" in message
    assert "line 3" in message and f"at most {MAX_PREDICTION_CHARS}" in message
    assert "line 4" in message and len(message) < 3000
    assert peak < 8 * 2**20  # the 30 MB line was never held whole
    # the CLI says the same in one error, exit 2
    assert main(["run", "--benchmark", "mm_vishal:slake", "--predictions", str(path), "--output",
                 str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"]]) == 2
    assert "line 2" in capsys.readouterr().err


def test_an_oversized_line_in_a_runs_log_is_refused(tmp_path):
    from medheval.run.predictions_log import CorruptLogError, read_log

    log = tmp_path / "predictions.jsonl"
    log.write_text(json.dumps({"id": "a", "prediction": "x"}) + "\n" + json.dumps({"id": "b", "prediction": "y" * 2_000_000}) + "\n")
    with pytest.raises(CorruptLogError, match="line 2 holds 2000"):
        read_log(log)


# -- usage ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("usage", [{"prompt_tokens": -1e308, "completion_tokens": 5},
                                   {"prompt_tokens": 10, "completion_tokens": "12"},
                                   {"prompt_tokens": True, "completion_tokens": 1.5},
                                   {"prompt_tokens": -3, "completion_tokens": 10**12},
                                   "lots"])
def test_usage_numbers_that_are_not_counts_are_never_summed(usage):
    from medheval.backends.api import APIBackend

    def reply(body: dict) -> dict:
        return {**openai_body("yes", prompt_tokens=11, completion_tokens=7), "usage": usage}

    with JudgeServer("openai", reply=reply) as server:
        backend = APIBackend(f"openai:m@{server.base_url}", cache_dir=False, max_retries=0)
        record = {"id": "r1", "question": "Q?", "answer_type": "open", "choices": [], "source": "slake", "meta": {}}
        assert backend.generate([record, {**record, "id": "r2"}]) == ["yes", "yes"]
    totals = backend.usage()
    assert (totals["input_tokens"], totals["output_tokens"], totals["invalid_usage"]) == (0, 0, 2)
    assert all(type(totals[key]) is int for key in totals)


# -- --org ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("org", ["<img src=x onerror=alert(1)>", "my org", "a/b", "..", "-x", "x" * 97, "a--b"])
def test_an_invalid_org_is_refused_before_anything_is_written(org, tmp_path, capsys):
    out = tmp_path / "hub"
    assert main(["publish", "--to", str(out), f"--org={org}", "--kind", "metrics", "--name", "close_ended_accuracy"]) == 2
    assert "--org" in capsys.readouterr().err
    assert not out.exists() or not any(out.rglob("*"))


# -- a full disk, bidi controls ------------------------------------------------------------------------
def _predictions_run(fixture: dict, tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "preds.jsonl"
    path.write_text("".join(json.dumps({"id": rid, "prediction": text, "model": f"m{BIDI}x"}) + "\n"
                            for rid in _ids(fixture)))
    return ["run", "--benchmark", "mm_vishal:slake", "--predictions", str(path), "--output", str(tmp_path / "run"),
            "--data-dir", fixture["data_dir"]]


def test_a_full_disk_prints_one_line_naming_the_file_and_the_free_space(fixture_benchmark, tmp_path, capsys,
                                                                        monkeypatch):
    import tempfile

    from medheval.run import outputs

    args = _predictions_run(fixture_benchmark, tmp_path, "yes")
    assert main(args) == 0
    before = (tmp_path / "run" / "results.json").read_bytes()
    capsys.readouterr()
    real = tempfile.NamedTemporaryFile

    def full_disk(*a, **k):
        handle = real(*a, **k)

        def write(data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")
        handle.write = write
        return handle

    monkeypatch.setattr(outputs.tempfile, "NamedTemporaryFile", full_disk)
    assert main(args) == 1
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in error
    assert "no space left writing" in lines[0] and str(tmp_path / "run") in lines[0] and "MiB free on" in lines[0]
    assert (tmp_path / "run" / "results.json").read_bytes() == before
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_while_logging_predictions_names_the_log(fixture_benchmark, tmp_path, capsys, monkeypatch):
    from medheval.run.predictions_log import LogWriter

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.handle, name)

    setup = LogWriter.__init__

    def init(self, *a, **k):
        setup(self, *a, **k)
        self._handle = Full(self._handle)

    monkeypatch.setattr(LogWriter, "__init__", init)
    assert main(_predictions_run(fixture_benchmark, tmp_path, "yes")) == 1
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert [line for line in error.splitlines() if line.startswith("error:")] == [
        line for line in error.splitlines() if "predictions.jsonl" in line and "MiB free on" in line]


def test_bidi_controls_never_reach_the_report_raw(fixture_benchmark, tmp_path):
    assert main(_predictions_run(fixture_benchmark, tmp_path, f"yes{BIDI}evil.exe")) == 0
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert not set(BIDI) & set(page)
    assert "yes[U+202A][U+202B]" in page and "[U+061C]evil.exe" in page


def test_bidi_controls_never_reach_the_markdown_or_csv_raw(tmp_path):
    """A model name holding bidi controls: report.md, tables.csv (and report.html) show them as [U+XXXX]."""
    from report_runs import write_run
    from medheval.report.build import write_report

    run = write_run(tmp_path / "run", "none", [True, False, True, True], model=f"m{BIDI}x")
    written = write_report([run], tmp_path / "report", plots=False)
    for kind in ("markdown", "csv", "html"):
        text = Path(written[kind]).read_text(encoding="utf-8")
        assert not set(BIDI) & set(text), kind
        assert "[U+202E]" in text, kind

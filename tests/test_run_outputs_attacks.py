"""Issue 31, class 4: an output folder someone else can write into cannot be turned against the user.

Each test plants what an attacker with write access to the folder (a shared server's runs/ folder) would
plant before the victim's run: symbolic links, hard links and FIFOs named like the files a run owns, a
linked sub-folder, other tools' temporary files. The run must refuse with a clear error naming the file,
leave every target byte-for-byte as it was, and delete nothing it did not write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from medheval.cli import main
from medheval.data.benchmarks import load_benchmark
from medheval.run.outputs import (OutputLock, UnsafeOutputPath, atomic_write_text, open_owned, remove_orphans)
from medheval.run.predictions_log import LogWriter, read_log

PRECIOUS = b"# the victim's file\nexport PATH=/usr/bin\n"


def _run_args(fixture: dict, tmp_path: Path, out: Path) -> list[str]:
    ids = load_benchmark("context", data_dir=fixture["data_dir"])["id"]
    predictions = tmp_path / "p.jsonl"
    predictions.write_text("".join(json.dumps({"id": rid, "prediction": "no"}) + "\n" for rid in ids))
    return ["run", "--benchmark", "context", "--predictions", str(predictions), "--data-dir", fixture["data_dir"],
            "--output", str(out)]


@pytest.mark.parametrize("owned", [".medheval.lock", "predictions.jsonl"])
def test_a_planted_symlink_is_refused_and_its_target_untouched(fixture_benchmark, tmp_path, capsys, owned):
    victim = tmp_path / "victim" / ".bashrc"
    victim.parent.mkdir()
    victim.write_bytes(PRECIOUS)
    out = tmp_path / "shared_runs"
    out.mkdir()
    (out / owned).symlink_to(victim)
    assert main(_run_args(fixture_benchmark, tmp_path, out)) == 2
    err = capsys.readouterr().err
    assert f"{out / owned} is a symbolic link (to {victim})" in err and "Traceback" not in err
    assert victim.read_bytes() == PRECIOUS  # not truncated, nothing appended
    assert not (out / "results.json").exists()


def test_a_dangling_symlink_does_not_create_its_target(fixture_benchmark, tmp_path, capsys):
    target = tmp_path / "elsewhere" / "planted.jsonl"
    target.parent.mkdir()
    out = tmp_path / "runs"
    out.mkdir()
    (out / "predictions.jsonl").symlink_to(target)
    assert main(_run_args(fixture_benchmark, tmp_path, out)) == 2
    assert "predictions.jsonl is a symbolic link" in capsys.readouterr().err
    assert not target.exists()


def test_a_hard_link_or_fifo_named_like_a_run_file_is_refused(fixture_benchmark, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(PRECIOUS)
    out = tmp_path / "runs"
    out.mkdir()
    os.link(victim, out / "predictions.jsonl")
    assert main(_run_args(fixture_benchmark, tmp_path, out)) == 2
    assert "predictions.jsonl has 2 hard links" in capsys.readouterr().err
    assert victim.read_bytes() == PRECIOUS
    (out / "predictions.jsonl").unlink()
    (out / ".medheval.lock").unlink()  # the refused run had taken the lock
    os.mkfifo(out / ".medheval.lock")  # opening a FIFO would block the run forever
    assert main(_run_args(fixture_benchmark, tmp_path, out)) == 2
    assert ".medheval.lock is not a regular file" in capsys.readouterr().err


def test_a_linked_sub_folder_of_a_locked_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "victim_dir"
    elsewhere.mkdir()
    out = tmp_path / "runs"
    out.mkdir()
    (out / "clinhallu").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "judgments.jsonl").write_bytes(b'{"id": "x", "prediction": "torn')  # would be truncated
    with OutputLock(out):
        for write in (lambda: atomic_write_text(out / "clinhallu" / "default" / "clinhallu_run.json", "{}"),
                      lambda: LogWriter(out / "clinhallu" / "generations.jsonl"),
                      lambda: read_log(out / "clinhallu" / "judgments.jsonl")):
            with pytest.raises(UnsafeOutputPath, match="clinhallu is a symbolic link"):
                write()
    assert [p.name for p in elsewhere.iterdir()] == ["judgments.jsonl"]
    assert (elsewhere / "judgments.jsonl").read_bytes() == b'{"id": "x", "prediction": "torn'
    # the folder the user named may itself be a link (runs/latest -> runs/2026-11-27): that is their choice
    (tmp_path / "latest").symlink_to(out, target_is_directory=True)
    with OutputLock(tmp_path / "latest"):
        atomic_write_text(tmp_path / "latest" / "results.json", "{}")
        with LogWriter(tmp_path / "latest" / "predictions.jsonl") as log:
            log.write({"id": "a", "prediction": "b"})
    assert (out / "results.json").read_text() == "{}" and read_log(out / "predictions.jsonl")[0]["id"] == "a"
    with pytest.raises(UnsafeOutputPath):
        os.close(open_owned(out / "clinhallu", os.O_RDONLY))


def test_only_our_own_leftovers_are_removed(fixture_benchmark, tmp_path):
    out = tmp_path / "runs"
    foreign = [out / "deep" / "a" / "b" / ".x.tmp", out / ".results.json.tmp", out / ".results.json.k3j2x.tmp",
               out / "editor" / ".report.md.swp.tmp", out / ".cache" / ".index.12345678.tmp"]
    ours = [out / ".results.json.abcd1234.medheval.tmp", out / "sub" / ".run.json.z9y8x7w6.medheval.tmp"]
    for path in foreign + ours:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"work in progress")
    victim = tmp_path / "victim.bin"
    victim.write_bytes(PRECIOUS)
    (out / ".scored.jsonl.q1w2e3r4.medheval.tmp").symlink_to(victim)  # a link named as ours: not a file we wrote
    assert main(_run_args(fixture_benchmark, tmp_path, out)) == 0
    assert all(path.read_bytes() == b"work in progress" for path in foreign), [p for p in foreign if not p.exists()]
    assert not any(path.exists() for path in ours)
    assert victim.read_bytes() == PRECIOUS
    # the run's own atomic writes use the recognisable name and leave nothing behind
    assert not [p for p in out.iterdir() if p.name.endswith(".medheval.tmp") and not p.is_symlink()]
    assert remove_orphans(out) == []

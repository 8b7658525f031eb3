"""Issue 31, class 5: publish and report are atomic and locked.

A subprocess runs ``medheval publish`` / ``medheval report`` with one function paused (a harness wraps it:
it touches a marker file, then waits); the test SIGKILLs it at that point and checks what is left: every
repo ``publish.json`` lists is complete (it passes the push guard and holds what was recorded), a report
folder is the old report or the new one, never a mix. Two publishes into one ``--to``: the second refuses
with a clear message (or, with ``--lock-timeout``, waits and succeeds), never a ``FileExistsError``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from report_runs import write_run

from medheval.cli import main
from medheval.publish import hub

HARNESS = """
import importlib, os, sys, time
module_name, attr = os.environ["PAUSE_AT"].rsplit(":", 1)
nth, marker, release = int(os.environ["PAUSE_CALL"]), os.environ["PAUSE_MARKER"], os.environ["PAUSE_RELEASE"]
module = importlib.import_module(module_name)
original, calls = getattr(module, attr), [0]
def paused(*args, **kwargs):
    calls[0] += 1
    if calls[0] == nth:
        open(marker, "w").close()
        while not os.path.exists(release):
            time.sleep(0.05)
    return original(*args, **kwargs)
setattr(module, attr, paused)
from medheval.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def _paused(tmp_path: Path, point: str, call: int, args: list[str]) -> tuple[subprocess.Popen, Path, Path]:
    """Start ``medheval ARGS`` paused at the ``call``-th call of ``point`` (``module:function``); returns the
    process once it is there, with the marker and release paths."""
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    marker, release = tmp_path / f"paused-{time.monotonic_ns()}", tmp_path / f"release-{time.monotonic_ns()}"
    process = subprocess.Popen([sys.executable, str(harness), *args], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**_env(), "PAUSE_AT": point, "PAUSE_CALL": str(call),
                                    "PAUSE_MARKER": str(marker), "PAUSE_RELEASE": str(release)})
    deadline = time.monotonic() + 300
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"never reached {point} #{call} (exit {process.returncode}): {err[-2000:]}")
        time.sleep(0.05)
    return process, marker, release


def _kill(process: subprocess.Popen) -> None:
    process.kill()  # SIGKILL: no cleanup runs
    process.communicate()


def _state(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` except the lock (which a run rewrites)."""
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != ".medheval.lock"}


def _guard_holds(out: Path) -> list[str]:
    """Every listed repo is complete: passes the push guard and holds exactly its recorded files, with a card."""
    repos = hub.read_manifest(out)
    for repo in repos:
        hub.check_recorded_files(repo)
        hub.check_no_credentialed_bytes(repo)
        assert (Path(repo.folder) / "README.md").is_file(), repo.folder
        if repo.kind == "datasets":
            assert (Path(repo.folder) / "eval.yaml").is_file(), repo.folder
    return sorted(repo.repo_id for repo in repos)


# -- publish ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(tmp_path_factory, fixture_benchmark) -> Path:
    """An earlier publish (org "old") of a gated dataset and a metric."""
    out = tmp_path_factory.mktemp("published") / "hub_out"
    assert main(["publish", "--to", str(out), "--org", "old", "--name", "cxr_vishal,medihall_score",
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    return out


def _publish_args(out: Path, fixture: dict, org: str = "new", *extra: str) -> list[str]:
    return ["publish", "--to", str(out), "--org", org, "--name", "cxr_vishal,medihall_score",
            "--data-dir", fixture["data_dir"], *extra]


def _copy(published: Path, out: Path) -> None:
    shutil.copytree(published, out)
    entries = json.loads((out / "publish.json").read_text())
    for entry in entries:
        entry["folder"] = str(out / Path(entry["folder"]).relative_to(published))
    (out / "publish.json").write_text(json.dumps(entries))


KILL_POINTS = {
    "mid-export (first config's Parquet written)": ("medheval.publish.hub:refuse_credentialed_images", 2),
    "between replacing the two repo folders": ("medheval.publish.hub:replace_folder", 2),
    "after both replaced, before publish.json lists them": ("medheval.publish.hub:write_manifest", 1),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_publish_killed_at_any_point_lists_only_complete_repos(published, fixture_benchmark, tmp_path, point):
    out = tmp_path / "hub_out"
    _copy(published, out)
    before = _state(out)
    where, call = KILL_POINTS[point]
    process, _, _ = _paused(tmp_path, where, call, _publish_args(out, fixture_benchmark))
    _kill(process)
    listed = _guard_holds(out)  # whatever is listed is complete and passes the guard
    assert set(listed) <= {"old/cxr_vishal", "old/medihall_score", "new/cxr_vishal", "new/medihall_score"}
    for repo in hub.read_manifest(out):  # and is the old repo or the new one, never the old one's name on new files
        pages = "".join(page.read_text() for page in Path(repo.folder).glob("*.*") if page.suffix in (".md", ".html"))
        assert f'"{repo.repo_id}"' in pages, (repo.repo_id, point)  # load_dataset("org/name") / evaluate.load(...)
    if "mid-export" in point:
        assert {k: v for k, v in _state(out).items() if ".medheval-staging" not in k} == before
    # the next publish finishes the job and leaves nothing of the killed one behind
    assert main(_publish_args(out, fixture_benchmark)) == 0
    assert _guard_holds(out) == ["new/cxr_vishal", "new/medihall_score"]
    assert not [p for p in out.rglob("*") if ".medheval-staging" in p.name or p.name.endswith(".medheval.tmp")]


def test_two_publishes_into_one_folder(published, fixture_benchmark, tmp_path):
    out = tmp_path / "hub_out"
    _copy(published, out)
    first, _, release = _paused(tmp_path, "medheval.publish.hub:replace_folder", 1,
                                _publish_args(out, fixture_benchmark, "first"))
    second = subprocess.run([sys.executable, "-m", "medheval.cli", *_publish_args(out, fixture_benchmark, "second")],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"error: {out} is in use by another publish (pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr and "FileExistsError" not in second.stderr
    waiting = subprocess.Popen([sys.executable, "-m", "medheval.cli",
                                *_publish_args(out, fixture_benchmark, "third", "--lock-timeout", "300")],
                               cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    assert waiting.poll() is None  # waits for the first
    release.touch()
    assert first.wait(timeout=300) == 0, first.communicate()[1][-2000:]
    assert waiting.wait(timeout=600) == 0, waiting.communicate()[1][-2000:]
    assert _guard_holds(out) == ["third/cxr_vishal", "third/medihall_score"]


# -- report -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["medheval.report.html:write_html", "medheval.run.outputs:replace_folder"])
def test_a_report_killed_midway_leaves_the_old_report(tmp_path, point):
    old_run = write_run(tmp_path / "runs" / "old", "none", [True, False, True, True])
    new_run = write_run(tmp_path / "runs" / "new", "vcd", [False, False, True, False], model="other")
    report = tmp_path / "report"
    assert main(["report", str(old_run), "--output", str(report), "--no-plots"]) == 0
    before = _state(report)
    assert {"report.md", "report.json", "tables.csv", "report.html"} <= set(before)
    process, _, _ = _paused(tmp_path, point, 1, ["report", str(old_run), str(new_run), "--output", str(report),
                                                  "--no-plots"])
    _kill(process)
    assert _state(report) == before  # the old report, whole: no new tables beside the old report.html
    assert main(["report", str(old_run), str(new_run), "--output", str(report), "--no-plots"]) == 0
    after = _state(report)
    assert set(after) == set(before) and all(after[name] != before[name] for name in
                                             ("report.md", "report.json", "tables.csv", "report.html"))
    assert "other" in (report / "report.html").read_text() and "other" in (report / "report.md").read_text()
    assert not [p for p in tmp_path.iterdir() if ".medheval-staging" in p.name]  # the killed one's leftovers went


def test_a_report_refuses_a_folder_that_is_not_a_report_and_a_concurrent_report(tmp_path, capsys):
    run = write_run(tmp_path / "runs" / "a", "none", [True, False, True])
    assert main(["report", str(run), "--output", str(run), "--no-plots"]) == 2  # would replace the run itself
    assert "holds files that are not a report's (predictions.jsonl, results.json, scored.jsonl)" in capsys.readouterr().err
    assert (run / "results.json").is_file() and not (run / "report.md").exists()
    report = tmp_path / "report"
    holder, _, release = _paused(tmp_path, "medheval.report.html:write_html", 1,
                                 ["report", str(run), "--output", str(report), "--no-plots"])
    try:
        assert main(["report", str(run), "--output", str(report), "--no-plots"]) == 2
        assert f"{report} is in use by another report (pid {holder.pid}" in capsys.readouterr().err
    finally:
        release.touch()
    assert holder.wait(timeout=300) == 0
    assert (report / "report.html").is_file() and (report / "report.md").is_file()


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_folder_swaps_whole_folders(tmp_path, monkeypatch, exchange):
    """With RENAME_EXCHANGE (Linux) and without it (rename aside, then in): the new folder in place, the old
    one gone, a planted link at the target refused."""
    from medheval.run import outputs

    if not exchange:
        monkeypatch.setattr(outputs, "_exchange", lambda first, second: False)
    target = tmp_path / "report"
    target.mkdir()
    (target / "report.html").write_text("old")
    staged = outputs.staging_folder(target)
    (staged / "report.md").write_text("new")
    outputs.replace_folder(staged, target)
    assert sorted(p.name for p in target.iterdir()) == ["report.md"] and (target / "report.md").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["report"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "linked"
    link.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(outputs.UnsafeOutputPath, match="linked is a symbolic link"):
        outputs.replace_folder(outputs.staging_folder(link), link)
    assert list(elsewhere.iterdir()) == []

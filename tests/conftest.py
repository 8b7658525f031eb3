"""Shared fixtures: the fixture benchmark on disk, the upstream data folder when present."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

# Under pytest-xdist (`make test` runs `-n auto`) every worker gets an equal share of the cores for torch's
# (and its subprocesses') threads, so N workers do not oversubscribe N cores. Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _THREADS = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = str(_THREADS)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(_THREADS)

REPO = Path(__file__).resolve().parents[1]
# ``../shared`` beside the checkout; ``$MEDHEVAL_SHARED`` names it elsewhere (e.g. from a git worktree)
SHARED_UPSTREAM = Path(os.environ.get("MEDHEVAL_SHARED") or REPO.parent / "shared") / "data" / "upstream"
UPSTREAM_MEDHEVAL = SHARED_UPSTREAM / "medheval"



def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say up front why some tests will skip on a user's clone, and how the run is spread over the cores
    (printed once: xdist's workers have no header)."""
    if SHARED_UPSTREAM.is_dir():
        lines = [f"upstream annotation files: {SHARED_UPSTREAM} (cross-checks against them run)"]
    else:
        lines = [f"upstream annotation files: absent ({SHARED_UPSTREAM}); the tests that cross-check against the "
                 "real upstream files skip (they run where ../shared sits beside the checkout: CI and developers)"]
    workers = getattr(config.option, "numprocesses", None)
    if workers:
        lines.append(f"pytest-xdist: -n {workers} --dist {config.option.dist} (each worker's torch threads: the "
                     "cores / the workers); `-n 0` runs in one process")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The header is hidden under ``-q`` (``make test``): say why tests skipped at the end as well, once."""
    skipped = len(terminalreporter.stats.get("skipped", []))
    if skipped and not SHARED_UPSTREAM.is_dir() and not hasattr(config, "workerinput"):
        terminalreporter.write_line(
            f"{skipped} test(s) skipped; most need the upstream annotation files, absent here ({SHARED_UPSTREAM}): "
            "they run where ../shared sits beside the checkout (CI and developers); each reason is listed below")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use (xdist's own count is psutil's physical cores,
    1 on a 2-vCPU machine with hyper-threading); ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides it."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or len(os.sched_getaffinity(0)))


os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def fixture_benchmark(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The embedded fixture benchmark (synthetic items in MedHEval's real schemas) with images."""
    from medheval.families.medheval.fixtures import write_fixture_benchmark

    return write_fixture_benchmark(tmp_path_factory.mktemp("fixture"))


@pytest.fixture(scope="session")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Arrow cache folder private to this test session."""
    return tmp_path_factory.mktemp("datasets_cache")


@pytest.fixture(autouse=True)
def _isolated_medheval_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never read or write the user's ~/.cache/medheval from tests."""
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path_factory.getbasetemp() / "medheval_cache"))


requires_upstream = pytest.mark.skipif(
    not UPSTREAM_MEDHEVAL.is_dir(), reason="../shared/data/upstream/medheval is absent (only CI and devs have it)"
)


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the scripts are not a package): the tests run their ``main`` or read
    what they keep (the code a rewrite replaced, the coverage figures)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_metric_offline(path: str | Path):
    """An evaluate module loaded from a local folder with evaluate's offline switch on (the variable and
    the value evaluate parsed from it at import), so no test can reach the Hub."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_EVALUATE_OFFLINE", "1")
    mp.setenv("HF_UPDATE_DOWNLOAD_COUNTS", "0")
    import evaluate

    mp.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    try:
        return evaluate.load(str(path), keep_in_memory=True)
    finally:
        mp.undo()


# Tiny random-weight LLaVA and LLaVA-NeXT for the decoding tests (built once per test module);
# ``tiny`` runs a test on both.
@pytest.fixture(scope="module")
def llava():
    from medheval.backends.tiny import build_tiny_llava

    return build_tiny_llava(seed=0)


@pytest.fixture(scope="module")
def llava_next():
    from medheval.backends.tiny_families import build_tiny_llava_next

    return build_tiny_llava_next(seed=0)


@pytest.fixture(scope="module", params=["llava", "llava_next"])
def tiny(request):
    model, processor = request.getfixturevalue(request.param)
    return request.param, model, processor


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A ClinHallu Hub snapshot in the real layout (``clinhallu_fixture.write_snapshot``), one per test module."""
    from clinhallu_fixture import write_snapshot

    return write_snapshot(tmp_path_factory.mktemp("clinhallu_snapshot"))


@pytest.fixture(scope="module")
def loaded(snapshot: dict, tmp_path_factory: pytest.TempPathFactory):
    """Every ClinHallu config of :func:`snapshot`, prepared (``prepare_benchmark("clinhallu", "all")``)."""
    from medheval.data.benchmarks import prepare_benchmark

    return prepare_benchmark("clinhallu", "all", data_dir=snapshot["data_dir"], image_roots=snapshot["image_roots"],
                             cache_dir=tmp_path_factory.mktemp("dcache"))


# The radgraph package and a random-weight RadGraph model folder (test_metric_radgraph_f1, test_radgraph_decoding).
@pytest.fixture(scope="module")
def radgraph_pkg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("radgraph", reason="the radgraph package (model code) is not installed",
                                   exc_type=ImportError)


@pytest.fixture(scope="module")
def tiny_radgraph(radgraph_pkg, tmp_path_factory):
    from medheval.radiology.tiny_models import build_random_radgraph

    return build_random_radgraph(tmp_path_factory.mktemp("radgraph") / "radgraph", seed=0)

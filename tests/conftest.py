"""Shared fixtures: the fixture benchmark on disk, the upstream data folder when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ``../shared`` beside the checkout; ``$MEDHEVAL_SHARED`` names it elsewhere (e.g. from a git worktree)
SHARED_UPSTREAM = Path(os.environ.get("MEDHEVAL_SHARED") or REPO.parent / "shared") / "data" / "upstream"
UPSTREAM_MEDHEVAL = SHARED_UPSTREAM / "medheval"



def pytest_report_header(config: pytest.Config) -> str:
    """Say up front why some tests will skip on a user's clone."""
    if SHARED_UPSTREAM.is_dir():
        return f"upstream annotation files: {SHARED_UPSTREAM} (cross-checks against them run)"
    return (f"upstream annotation files: absent ({SHARED_UPSTREAM}); the tests that cross-check against the real "
            "upstream files skip (they run where ../shared sits beside the checkout: CI and developers)")


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

"""The tested stack: the lock, the lower bounds and medheval.versions agree; version comparisons."""

from __future__ import annotations

import configparser
import io
import re
from pathlib import Path

import pytest

from medheval import versions

REPO = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file, names normalised (``huggingface-hub`` -> ``huggingface_hub``)."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if match:
            pins[match.group(1).lower().replace("-", "_")] = match.group(2)
    return pins


def _install_requires() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
    return {re.split(r"[<>=!]", line, maxsplit=1)[0].lower().replace("-", "_"): line for line in lines}


def test_tested_stack_is_the_lock():
    lock = _pins(REPO / "requirements" / "lock.txt")
    assert {package: lock[package] for package in versions.TESTED} == versions.TESTED
    assert "+" not in lock["torch"], "the lock names the public torch release, not a local build label"
    required = _install_requires()
    assert set(required) <= set(lock), f"unlocked dependencies: {sorted(set(required) - set(lock))}"
    test_extra = configparser.ConfigParser()
    test_extra.read(REPO / "setup.cfg")
    for line in test_extra["options.extras_require"]["test"].split():
        name = re.split(r"[<>=!\[]", line, maxsplit=1)[0].lower().replace("-", "_")
        assert name in lock, f"test extra {name} is not in the lock"


def test_interop_lock_holds_the_tested_stack():
    """The harness venv (`make test-interop`) runs our code on the stack the main suite tests: the interop lock
    may differ from requirements/lock.txt only where a harness forces it (its header says why)."""
    lock = _pins(REPO / "requirements" / "lock.txt")
    interop = _pins(REPO / "requirements" / "interop-lock.txt")
    assert {package: interop.get(package) for package in versions.TESTED} == versions.TESTED
    assert "+" not in interop["torch"], "the interop lock names the public torch release, not a local build label"
    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    for line in extras["options.extras_require"]["interop"].split():
        name, low = re.match(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", line).groups()
        assert interop[name.lower().replace("-", "_")] == low, f"the interop lock tests {name} at its lower bound"
    differing = sorted(name for name in lock if name in interop and lock[name] != interop[name])
    assert differing == ["filelock", "fsspec", "python_dateutil"], f"update the interop lock's header: {differing}"


def test_lower_bounds_are_the_oldest_tested_stack():
    """Every install_requires entry: lower bound = requirements/oldest.txt's pin, upper bound below the next major."""
    oldest = _pins(REPO / "requirements" / "oldest.txt")
    required = _install_requires()
    assert set(oldest) == set(required)
    for name, spec in required.items():
        lower = re.search(r">=\s*([0-9][^,\s]*)", spec)
        upper = re.search(r"<\s*([0-9][^,\s]*)", spec)
        assert lower and lower.group(1) == oldest[name], f"{spec}: lower bound should be {oldest[name]}"
        assert upper, f"{spec} has no upper bound"
        first, *rest = versions.release(upper.group(1))
        assert not rest or (first == 0 and len(rest) == 1), f"{spec}: the ceiling should be the next major release"
    assert {package: oldest[package] for package in versions.OLDEST_TESTED} == versions.OLDEST_TESTED


def test_urllib3_is_required_at_a_version_that_bounds_decompression():
    """medheval.net.transport imports urllib3 and caps a reply at max_bytes read in 64 KiB chunks: that cap holds
    on a compressed body only from urllib3 2.6 (CVE-2025-66471: one chunk decompressed in full; CVE-2025-66418:
    an unbounded chain of Content-Encodings), 2.6.3 (CVE-2026-21441: a redirect's body decompressed in full)
    and 2.7.0 (CVE-2026-44432: drain_conn after a partial decode), so urllib3 is a direct requirement with
    that floor."""
    spec = _install_requires().get("urllib3")
    assert spec is not None, "urllib3 is imported by medheval.net.transport: list it in install_requires"
    lower = re.search(r">=\s*([0-9][^,\s]*)", spec)
    assert lower and versions.release(lower.group(1)) >= (2, 7), spec
    lock = _pins(REPO / "requirements" / "lock.txt")
    assert versions.release(lock["urllib3"]) >= versions.release(lower.group(1))


def test_release_ignores_local_labels_and_trailing_zeros():
    assert versions.release("2.13.0+cpu") == versions.release("2.13") == (2, 13)
    assert versions.release("5.24.0") > versions.release("5.23.9")
    assert versions.release("5.24.0rc1") == (5, 24)
    with pytest.raises(ValueError, match="not a version"):
        versions.release("latest")


def test_newer_than_tested_and_changed_packages():
    tested = versions.TESTED
    same = {**tested, "torch": tested["torch"] + "+cu124"}
    assert versions.newer_than_tested(same) == []
    newer = {**tested, "transformers": "9.0.0", "evaluate": "9.9"}  # evaluate is not watched
    assert versions.newer_than_tested(newer) == [("transformers", "9.0.0", tested["transformers"])]
    assert versions.changed_output_packages({"transformers": "5.23.0", "torch": "2.13.0", "datasets": "1"},
                                            {"transformers": "5.24.0", "torch": "2.13.0", "datasets": "2"}) == [
        ("transformers", "5.23.0", "5.24.0")]
    assert versions.changed_output_packages({}, {"transformers": "5.24.0"}) == []


def test_newer_than_tested_warns_once(monkeypatch):
    monkeypatch.setattr(versions, "_warned_newer", False)
    newer = {**versions.TESTED, "torch": "3.1.0"}
    first, second = io.StringIO(), io.StringIO()
    text = versions.warn_if_newer_than_tested(newer, stream=first)
    assert text and "torch 3.1.0 (tested up to" in text and "medheval selftest" in text
    assert first.getvalue() == f"warning: {text}\n"
    assert versions.warn_if_newer_than_tested(newer, stream=second) is None and second.getvalue() == ""


def test_stack_versions_names_every_package():
    stack = versions.stack_versions()
    assert set(stack) == {"medheval", "python", *versions.STACK_PACKAGES}
    assert all(stack[k] for k in stack)


def test_interop_constraints_are_the_interop_lock_without_torch():
    """`pip install "medheval[interop]" -c requirements/interop-constraints.txt` gets the tested versions of every
    package but torch, which stays the one the user installed (a CUDA build, or the lock's CPU build)."""
    lock = _pins(REPO / "requirements" / "interop-lock.txt")
    constraints = _pins(REPO / "requirements" / "interop-constraints.txt")
    assert "torch" in lock and "torch" not in constraints
    assert constraints == {name: version for name, version in lock.items() if name != "torch"}
    assert constraints["filelock"].split(".")[0] == "3" and constraints["decord"] == "0.6.0"


def _metric_packages(metric: str) -> set[str]:
    """The packages a metric folder's requirements.txt lists, beyond evaluate's git pin and medheval itself."""
    lines = (REPO / "metrics" / metric / "requirements.txt").read_text().splitlines()
    names = {re.split(r"[<>=!\[;\s]", line.strip(), maxsplit=1)[0].lower().replace("-", "_") for line in lines}
    return {name for name in names if name and not name.startswith(("#", "git+")) and name != "medheval"}


def test_default_metrics_need_only_the_core_install():
    """`pip install medheval` alone runs the demo and the default metrics of every split (text_generation's
    nltk, rouge-score and sacrebleu are core dependencies, not an extra's)."""
    from medheval.data.registry import list_units
    from medheval.run.protocol import benchmark_default_metrics
    from medheval.run.runner import DEFAULT_METRICS

    defaults = {name for names in DEFAULT_METRICS.values() for name in names}
    defaults |= {name for unit in list_units("datasets") for name in benchmark_default_metrics(unit) or ()}
    core = set(_install_requires())
    for metric in sorted(defaults):
        assert _metric_packages(metric) <= core, f"{metric} needs {sorted(_metric_packages(metric) - core)}"


def test_each_metric_package_outside_the_core_comes_with_the_extra_the_runner_names():
    """A metric's other packages are in setup.cfg's extra that ``METRIC_EXTRAS`` (the runner's install hint) names."""
    from medheval.run.protocol import METRIC_EXTRAS

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    extras = {extra: {re.split(r"[<>=!\[;]", line, maxsplit=1)[0].lower().replace("-", "_")
                      for line in lines.split()} for extra, lines in config["options.extras_require"].items()}
    core = set(_install_requires())
    for metric in sorted(path.name for path in (REPO / "metrics").iterdir() if (path / "requirements.txt").is_file()):
        beyond = _metric_packages(metric) - core
        extra = METRIC_EXTRAS.get(metric)
        assert beyond <= extras.get(extra, set()), f"{metric}: {sorted(beyond)} not in extra {extra!r}"
        assert extra is None or beyond, f"{metric}: METRIC_EXTRAS names {extra!r} but it needs nothing beyond the core"


def test_a_missing_package_is_named_and_a_version_mismatch_is_not_called_missing():
    """``from os import nonexistent`` sets ``error.name`` to ``os``: an installed module, not a missing one."""
    import importlib

    from medheval.run.protocol import missing_packages

    with pytest.raises(ImportError) as missing:
        importlib.import_module("medheval_no_such_package")
    assert missing_packages(missing.value) == "medheval_no_such_package"
    with pytest.raises(ImportError) as mismatch:
        exec("from os import medheval_no_such_name", {})
    assert missing_packages(mismatch.value) is None
    listed = ImportError("To be able to use x, you need to install the following dependencies['nltk', 'rouge_score']")
    assert missing_packages(listed) == "nltk, rouge_score"

"""Where the registry finds the units: an installed wheel, a checkout, or $MEDHEVAL_HOME; never nothing silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medheval.data import registry
from medheval.cli import main


def _unit(root: Path, kind: str, name: str) -> None:
    (root / kind / name).mkdir(parents=True)
    if kind == "mitigations":
        (root / kind / name / "custom_generate").mkdir()
        (root / kind / name / "custom_generate" / "generate.py").write_text("def generate(model, **kw): ...\n")
    else:
        (root / kind / name / f"{name}.py").write_text("# unit\n")


def test_checkout_lists_the_real_units():
    assert "cxr_vishal" in registry.list_units("datasets")
    assert "medihall_score" in registry.list_units("metrics") and "vcd" in registry.list_units("mitigations")


def test_packaged_units_win_over_the_folder_above(tmp_path, monkeypatch):
    packaged = tmp_path / "site-packages" / "medheval" / "units"
    for kind, name in (("datasets", "toy"), ("metrics", "toy_metric"), ("mitigations", "toy_mit")):
        _unit(packaged, kind, name)
    monkeypatch.delenv("MEDHEVAL_HOME", raising=False)
    monkeypatch.setattr(registry, "PACKAGED_UNITS", packaged)
    assert registry.list_units("datasets") == ["toy"] and registry.list_units("mitigations") == ["toy_mit"]
    assert registry.unit_dir("metrics", "toy_metric") == packaged / "metrics" / "toy_metric"


def test_site_packages_is_not_a_checkout(tmp_path, monkeypatch):
    # a non-editable install without units: the folder above medheval/ is site-packages, holding HF's
    # `datasets` package whose subpackages look like units (datasets/io/io.py ...). Never list them.
    site = tmp_path / "site-packages"
    _unit(site, "datasets", "io")
    (site / "metrics").mkdir()
    (site / "mitigations").mkdir()
    monkeypatch.delenv("MEDHEVAL_HOME", raising=False)
    monkeypatch.setattr(registry, "PACKAGED_UNITS", site / "medheval" / "units")
    monkeypatch.setattr(registry, "SOURCE_CHECKOUT", site)
    with pytest.raises(registry.NoUnitsError, match="MEDHEVAL_HOME"):
        registry.list_units("datasets")


def test_empty_home_fails_loudly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEDHEVAL_HOME", str(tmp_path))
    with pytest.raises(registry.NoUnitsError, match=r"no metrics units in .*metrics"):
        registry.list_units("metrics")
    assert main(["list"]) == 2
    assert "no datasets units" in capsys.readouterr().err


def test_list_prints_one_line_per_unit_and_json_for_scripts(fixture_benchmark, capsys):
    """Issue 23, point 17: `medheval list` is a table (configs with item counts from local files, one line per
    benchmark, metric and mitigation); `--json` keeps the machine-readable listing."""
    from medheval.data.benchmarks import load_benchmark

    assert main(["list", "--data-dir", fixture_benchmark["data_dir"]]) == 0
    out = capsys.readouterr().out
    n_slake = len(load_benchmark("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"]))
    line = next(text for text in out.splitlines() if text.strip().startswith("mm_vishal "))
    assert f"slake {n_slake}" in line
    assert any(text.split()[:1] == ["med_hallmark"] and "conventional –" in text for text in out.splitlines())
    assert any(text.split()[:1] == ["vcd"] and "Visual Contrastive Decoding" in text for text in out.splitlines())
    assert not out.lstrip().startswith("{")

    assert main(["list", "--json", "--data-dir", fixture_benchmark["data_dir"]]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "slake" in listing["benchmarks"]["mm_vishal"] and "vcd" in listing["mitigations"]
    assert listing["item_counts"]["mm_vishal"]["slake"] == n_slake
    assert listing["item_counts"]["med_hallmark"]["conventional"] is None  # not on this machine: never fetched

"""``medheval selftest``: passes on the installed stack, and names the method and family when an invariant breaks."""

from __future__ import annotations

import pytest

from medheval.cli import main as cli_main
from medheval.decoding import hooks_installed, internals
from medheval.mitigations import selftest


def test_selftest_passes_on_the_installed_stack(capsys):
    code = cli_main(["selftest", "--family", "llava,gemma3", "--method", "vcd", "--method", "opera,damro"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("stack: medheval ")
    assert "transformers " in out.splitlines()[0]
    lines = [line.split() for line in out.splitlines()]
    assert ["llava", "vcd", "ok", "ok", "ok", "ok"] in lines
    assert ["llava", "opera", "ok", "-", "ok", "ok"] in lines  # no contrast stream: no one=two pass check
    assert ["gemma3", "vcd", "ok", "ok", "ok", "ok"] in lines
    assert not any(line[:2] == ["gemma3", "damro"] for line in lines)  # DAMRO needs a [CLS] token: not on SigLIP
    assert out.strip().splitlines()[-1].startswith("selftest PASS: 5 method x family combinations on transformers ")


def test_selftest_names_the_broken_method_and_family(monkeypatch, capsys):
    """The transformers 5.24 failure: code that knows only the other release's cache name (under 5.24, the
    cache generate prepared under its new name reached every stream as a common input: one cache for all)."""
    other = "past_key_values" if internals.cache_argument() == "cache" else "cache"
    monkeypatch.setattr(internals, "cache_argument", lambda: other)
    monkeypatch.setattr(internals, "_CACHE_NAMES", (other,))
    results = selftest.run_selftest(["llava"], ["m3id"])
    assert [(r.family, r.method, r.ok) for r in results] == [("llava", "m3id", False)]
    assert results[0].failures()
    code = selftest.main(["llava"], ["m3id"], quiet=True)
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 1
    assert verdict.startswith("selftest FAIL on transformers ") and "m3id on llava: " in verdict


def test_a_check_that_fails_is_reported_and_hooks_are_checked(monkeypatch):
    """A method whose two-pass reference differs fails "one=two pass" only; hooks left on the model fail "hooks gone"."""
    model, processor = selftest._build("llava")
    vcd = selftest.METHODS["vcd"]

    class Drifting(type(vcd.moving())):
        def two_pass(self):
            return type(self)(alpha=0.5, beta=0.0)  # another setting: other tokens than the one-pass run

    monkeypatch.setitem(selftest.METHODS, "vcd", selftest.MethodCase(vcd.neutral, lambda: Drifting(alpha=3.0, beta=0.0)))
    result = selftest.check_method(model, processor, "llava", "vcd")
    assert result.checks == {"neutral": True, "one=two pass": False, "batch=single": True, "hooks gone": True}
    assert not result.ok and result.failures() == ["one=two pass"]

    from medheval.decoding.hooks import _HOOKS_ATTR, attention_modules

    module = attention_modules(model)[0]
    setattr(module, _HOOKS_ATTR, ())
    try:
        assert hooks_installed(model)
        result = selftest.check_method(model, processor, "llava", "dola")
        assert result.checks["hooks gone"] is False and result.checks["neutral"] is True
    finally:
        delattr(module, _HOOKS_ATTR)


def test_families_the_installed_transformers_cannot_build_are_skipped(monkeypatch):
    def missing(family):
        raise ImportError(f"cannot import name 'Tiny{family}' from 'transformers'")

    monkeypatch.setattr(selftest, "_build", missing)
    results = selftest.run_selftest(["qwen3_vl"], ["vcd", "dola"])
    assert [(r.method, r.ok) for r in results] == [("vcd", True), ("dola", True)]
    assert all("cannot build it (ImportError" in r.skipped for r in results)
    assert "skipped: the installed transformers cannot build it" in selftest.format_results(results)


def test_unknown_names_are_a_user_error(capsys):
    assert cli_main(["selftest", "--family", "llama9"]) == 2
    assert "unknown family or method ['llama9']" in capsys.readouterr().err
    with pytest.raises(ValueError, match="methods: .*'opera'"):
        selftest.run_selftest(methods=["beam"])

"""Issue 32, point 1: the startup check of the harness dependencies names each missing or wrong-version one in
one line (decord, filelock._api, rouge_score, lmms-eval and inspect-ai versions), through a faked environment."""

from __future__ import annotations

import pytest

from medheval.cli import main
from medheval.integrations import stack

SPECS = {"lmms-eval": "<0.8,>=0.7.3", "inspect-ai": "<0.4,>=0.3.285", "decord": "<0.7,>=0.6.0",
         "filelock": "<4,>=3.32.7", "rouge-score": "<0.2,>=0.1.2", "nltk": "<4,>=3.10.4", "sacrebleu": "<3,>=2.6.0"}
GOOD = {"lmms-eval": "0.7.3", "inspect-ai": "0.3.285", "decord": "0.6.0", "filelock": "3.32.7", "rouge-score": "0.1.2",
        "nltk": "3.10.4", "sacrebleu": "2.6.0"}
MODULES = {"lmms_eval", "inspect_ai", "decord", "filelock._api", "rouge_score", "nltk", "sacrebleu"}


@pytest.fixture
def environment(monkeypatch):
    """A fake installed stack: ``versions`` (distribution -> version) and ``modules`` (importable names)."""
    state = {"versions": dict(GOOD), "modules": set(MODULES)}

    monkeypatch.setattr(stack, "_extra_specs", lambda: dict(SPECS))
    monkeypatch.setattr(stack, "_version", lambda name: state["versions"].get(name))
    monkeypatch.setattr(stack, "_importable", lambda name: name in state["modules"])
    return state


def test_a_complete_stack_has_no_problem(environment, capsys):
    assert stack.problems("lmms_eval") == [] and stack.problems("inspect_ai") == []
    assert main(["integrations", "check"]) == 0
    assert capsys.readouterr().out.startswith("medheval integrations: OK (lmms-eval 0.7.3, inspect-ai 0.3.285")


def test_what_the_issue_met_is_named_one_line_each(environment, capsys):
    """decord missing, filelock 4 (no filelock._api), rouge_score missing: lmms-eval hears of all three, inspect of
    rouge-score only; the CLI exits 1 with one line per problem, each with the fix."""
    del environment["versions"]["decord"], environment["versions"]["rouge-score"]
    environment["versions"]["filelock"] = "4.3.1"
    environment["modules"] -= {"decord", "rouge_score", "filelock._api"}
    assert stack.problems("lmms_eval") == [
        "decord is missing (lmms-eval's llava_hf imports it and lmms-eval does not declare it); medheval[interop] "
        "needs decord<0.7,>=0.6.0",
        "filelock 4.3.1 has no filelock._api (lmms-eval 0.7.3 imports filelock._api, gone in filelock 4); "
        "medheval[interop] needs filelock<4,>=3.32.7",
        "rouge-score is missing (report and open splits score ROUGE); medheval[interop] needs rouge-score<0.2,>=0.1.2"]
    assert [line.split(" ")[0] for line in stack.problems("inspect_ai")] == ["rouge-score"]
    assert main(["integrations", "check"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("medheval: ") and line.endswith(stack.FIX) for line in lines)


def test_a_harness_at_another_version_is_named_with_the_range(environment):
    environment["versions"].update({"lmms-eval": "0.8.1", "inspect-ai": "0.3.200"})
    assert stack.problems("lmms_eval") == ["lmms-eval 0.8.1 is installed; medheval[interop] needs lmms-eval<0.8,>=0.7.3 "
                                           "(our lmms-eval tasks are tested with it)"]
    assert stack.problems("inspect_ai")[0].startswith("inspect-ai 0.3.200 is installed; medheval[interop] needs")


def test_the_extra_s_ranges_are_setup_cfg_s():
    """The check reads the installed medheval's interop extra; in a checkout it must list what setup.cfg lists."""
    import configparser

    from conftest import REPO

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    declared = {line.split(">=")[0].lower() for line in config["options.extras_require"]["interop"].split()}
    assert declared == {distribution for distribution, *_ in stack.NEEDS}

"""The commands the README and docs/ show exist as written: users copy them.

* every ``medheval <command>`` / ``run_eval.py`` / ``python -m medheval.cli`` command, in a fenced block or an inline
  code span, names a sub-command of ``medheval`` and only options of that sub-command, with a value among the
  option's choices where it has any (placeholders such as ``<vlm>``, ``…`` and ``NAME`` are not checked);
* every ``--option`` named anywhere in the pages is an option of a ``medheval`` command, or of the other tool the
  page runs it with (:data:`OTHER_TOOLS`);
* every dotted ``medheval.…`` name and ``from medheval… import name`` in the pages imports.

What runs as written on the embedded fixture is run elsewhere (``tests/test_cli_demo.py``: the demo and the docs'
tiny-model grid block); the links between the pages are ``tests/test_docs_links.py``.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from medheval.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")

# Options the pages name for tools other than `medheval` (the tool, for the reader of a failure).
OTHER_TOOLS = {
    "--multi_gpu": "accelerate launch", "--num_processes": "accelerate launch", "--cpu": "accelerate launch",
    "--nproc_per_node": "torchrun",
    "--tensor-parallel-size": "vllm serve", "--served-model-name": "vllm serve", "--port": "vllm serve",
    "--max-model-len": "vllm serve",
    "--index-url": "pip install",
    "--model_args": "lmms-eval", "--include_path": "lmms-eval", "--tasks": "lmms-eval", "--log_samples": "lmms-eval",
    "--output_path": "lmms-eval",
    "--max-connections": "inspect eval", "--epochs": "inspect eval", "--no-log-images": "inspect eval",
    "--vision-tower": "python -m medheval.backends.convert_llava_med",
    "--both": "benchmarks/bench_mitigations.py", "--sets": "benchmarks/interval_coverage.py",
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


PARSER = build_parser()
COMMANDS = _subcommands(PARSER)


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    found = {o for action in parser._actions for o in action.option_strings}
    for sub in _subcommands(parser).values():
        found |= _all_options(sub)
    return found


def _placeholder(value: str) -> bool:
    return bool(re.search(r"[<>…{}\[\]]|\.\.\.|\$", value)) or value.isupper()


def _commands(page: Path) -> list[tuple[str, list[str]]]:
    """(where, argv after `medheval`) for each medheval command of the page."""
    text = page.read_text(encoding="utf-8")
    lines = []
    for match in FENCE.finditer(text):
        if match.group(1) in ("bash", "sh", "console", ""):
            lines += [("block", line) for line in match.group(2).replace("\\\n", " ").splitlines()]
    lines += [("inline", m.group(1)) for m in INLINE.finditer(FENCE.sub("", text))]
    found = []
    for where, line in lines:
        line = line.split(" #")[0].strip()
        try:
            tokens = shlex.split(line)
        except ValueError:
            tokens = line.split()
        for i, token in enumerate(tokens):
            if token.endswith("run_eval.py"):
                found.append((f"{where}: {line}", ["run", *tokens[i + 1:]]))
                break
            if token in ("medheval", "medheval.cli") and i + 1 < len(tokens) and re.fullmatch(r"[a-z][\w-]*",
                                                                                          tokens[i + 1]):
                if token == "medheval" and i > 0 and tokens[i - 1] not in ("python", "-m", "$", "then", ";", "&&"):
                    continue  # prose like "the `medheval` command"
                found.append((f"{where}: {line}", tokens[i + 1:]))
                break
    return found


def _problems(argv: list[str]) -> list[str]:
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return [f"no command 'medheval {name}' (commands: {', '.join(COMMANDS)})"]
    parser = COMMANDS[name]
    nested = _subcommands(parser)
    if nested and rest and not rest[0].startswith("-"):
        if rest[0] not in nested and not _placeholder(rest[0]):
            return [f"no command 'medheval {name} {rest[0]}'"]
        parser = nested.get(rest[0], parser)
    actions = {o: action for action in parser._actions for o in action.option_strings}
    problems = []
    for i, token in enumerate(rest):
        if not token.startswith("--"):
            continue
        option, _, inline_value = token.partition("=")
        if option not in actions:
            problems.append(f"medheval {name} has no option {option}")
            continue
        choices = actions[option].choices
        value = inline_value or (rest[i + 1] if i + 1 < len(rest) else "")
        if choices and value and not value.startswith("-") and not _placeholder(value) and value not in choices:
            problems.append(f"medheval {name} {option} {value}: not one of {sorted(choices)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_names_existing_options(page: Path):
    broken = [f"{where} -> {problem}" for where, argv in _commands(page) for problem in _problems(argv)]
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_pages_show_commands():
    """The extraction finds the README's and the docs' commands (a parser change cannot silence the test)."""
    readme = {argv[0] for _, argv in _commands(ROOT / "README.md")}
    assert {"list", "run", "report", "publish"} <= readme
    assert sum(len(_commands(page)) for page in PAGES) > 60


def test_problems_are_found():
    assert _problems(["run", "--benchmark", "x", "--batchsize", "8"]) == ["medheval run has no option --batchsize"]
    assert _problems(["report", "r", "--output", "o", "--p-adjust", "bonferroni"]) == [
        "medheval report --p-adjust bonferroni: not one of ['bh', 'holm', 'none']"]
    assert _problems(["run", "--control=<kind>"]) == []
    assert _problems(["lists"])[0].startswith("no command 'medheval lists'")
    assert _problems(["integrations", "chek"]) == ["no command 'medheval integrations chek'"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_option_named_is_an_option(page: Path):
    ours = _all_options(PARSER)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", page.read_text(encoding="utf-8")))
    unknown = sorted(named - ours - set(OTHER_TOOLS))
    assert not unknown, (f"{page.relative_to(ROOT)} names {unknown}: no medheval command has them (a tool's own "
                         "option goes into OTHER_TOOLS)")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_dotted_medheval_name_imports():
    names: dict[str, set[str]] = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"(?<![\w/.-])(medheval(?:\.\w+)+)", text):
            names.setdefault(match.group(1), set()).add(page.name)
        for match in re.finditer(r"from (medheval(?:\.\w+)*) import ([\w, ]+)", text):
            for name in match.group(2).split(","):
                names.setdefault(f"{match.group(1)}.{name.strip()}", set()).add(page.name)
    assert len(names) > 20
    missing = {name: sorted(pages) for name, pages in names.items() if not _resolves(name)}
    assert not missing, f"names in the docs that do not import: {missing}"

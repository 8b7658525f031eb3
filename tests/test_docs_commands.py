"""The commands the README and docs/ show exist as written: users copy them.

* every ``medheval <command>`` / ``run_eval.py`` / ``python -m medheval.cli`` command, in a fenced block or an inline
  code span, names a sub-command of ``medheval`` and only options of that sub-command, with a value among the
  option's choices where it has any (placeholders such as ``<vlm>``, ``…`` and ``NAME`` are not checked);
* every ``--option`` named anywhere in the pages is an option of a ``medheval`` command, or of the other tool the
  page runs it with (:data:`OTHER_TOOLS`);
* every dotted ``medheval.…`` name and ``from medheval… import name`` in the pages imports;
* every ``medheval run`` with a model names an ``--image-root`` for each image source of its splits (the
  benchmarks the embedded fixture holds), as the run's own check before the first generation requires.

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


# -- every option documented, and the defaults the pages and the help give are the parser's -----------------------


def _command_parsers(parser: argparse.ArgumentParser = PARSER, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by name: 'run', 'integrations check', ..."""
    found = {}
    for name, sub in _subcommands(parser).items():
        found[f"{prefix}{name}"] = sub
        found.update(_command_parsers(sub, f"{prefix}{name} "))
    return found


COMMAND_PARSERS = _command_parsers()


def _has_default(action: argparse.Action) -> bool:
    """A value the parser fills in (None, False, [] mean "not given": the code decides, e.g. --control's none)."""
    return not (action.default is None or action.default is False or action.default == []
                or action.default == argparse.SUPPRESS)


def _defaults(option: str) -> dict[str, object] | None:
    """{command: default} of each command that has ``option`` with a default; None when no command has the
    option."""
    found, known = {}, False
    for command, parser in COMMAND_PARSERS.items():
        for action in parser._actions:
            if option in action.option_strings:
                known = True
                if _has_default(action):
                    found[command] = action.default
    return found if known else None


def _same(said: str, default: object) -> bool:
    said = said.strip("`'\"").rstrip(".")
    try:
        return float(said) == float(default)  # '0' for 0.0
    except (TypeError, ValueError):
        return said == str(default)


OPTION_SPAN = re.compile(r"`(?:[^`\n]*\s)?(--[a-z][\w-]*)(?:[ =]([^`\s]+))?[^`]*`")
SAID_DEFAULT = re.compile(r"(?:\(|, )default:?\s+(`?[\w./-]+`?)")
VALUE_IS_DEFAULT = re.compile(r"^\s*\(default\b")
COMMAND_NAMED = re.compile(r"(?:medheval|medheval\.cli) ([a-z][\w-]*)|run_eval\.py")


def _documented_defaults(text: str) -> list[tuple[str, str, str, str]]:
    """(option, value said to be its default, command named before it in its paragraph or '', the words) for
    "`--opt` ... (default V" (no other code span between), "`--opt N`, default V", "`--opt V` (default" and a
    table row "| `V` (default) |" under a header naming `--opt`."""
    found = []
    for span in OPTION_SPAN.finditer(text):
        option, value = span.group(1), span.group(2)
        after = text[span.end():span.end() + 120]
        after = re.split(r"`[^`]*--[a-z]|\.\s|\n\n", after)[0]  # up to the next option, the sentence's or paragraph's end
        paragraph = text[:span.start()].rsplit("\n\n", 1)[-1]
        named = [m.group(1) or "run" for m in COMMAND_NAMED.finditer(paragraph + span.group(0))]
        command = named[-1] if named else ""
        if value and not _placeholder(value) and VALUE_IS_DEFAULT.match(after):
            found.append((option, value, command, span.group(0) + after[:20]))
        elif (said := SAID_DEFAULT.search(after)) and "`" not in after[:said.start()]:  # said of this option
            found.append((option, said.group(1), command, span.group(0) + after[:said.end()]))
    for table in re.finditer(r"^\| `(--[a-z][\w-]*)` \|.*\n\|[-| ]+\|\n((?:\|.*\n)+)", text, re.M):
        for row in re.finditer(r"^\| `([^`]+)` \(default\) \|", table.group(2), re.M):
            found.append((table.group(1), row.group(1), "", row.group(0)))
    return found


def test_every_option_of_every_command_is_documented():
    """Each option `medheval <command> --help` lists is named in the README or docs/ (was: `selftest --quiet`,
    `report --no-plots` and `report --no-html` were in no page)."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    missing = [f"medheval {command} {option}" for command, parser in COMMAND_PARSERS.items()
               for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"
               and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)]
    assert not missing, f"options no page names: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_defaults_are_the_parsers(page: Path):
    wrong = []
    for option, said, command, words in _documented_defaults(page.read_text(encoding="utf-8")):
        defaults = _defaults(option)
        if defaults is None and option in OTHER_TOOLS:
            continue  # another tool's option (its defaults are its own)
        if defaults is None:
            wrong.append(f"{words!r}: no command has {option}")
            continue
        if command in defaults:
            defaults = {command: defaults[command]}
        if not defaults:
            continue  # the parser leaves it None: the code decides (e.g. --control none), nothing to compare
        if len({str(d) for d in defaults.values()}) > 1:
            wrong.append(f"{words!r}: {option}'s default differs by command {defaults}: name the command before it")
        elif not _same(said, next(iter(defaults.values()))):
            wrong.append(f"{words!r}: the parser's default is {defaults}")
    assert not wrong, f"{page.relative_to(ROOT)}:\n" + "\n".join(wrong)


def test_the_documented_defaults_are_found():
    """The extraction sees the defaults the pages give (a change to it cannot silence the test above)."""
    found = {(option, said.strip("`")) for page in PAGES
             for option, said, _, _ in _documented_defaults(page.read_text(encoding="utf-8"))}
    assert {("--api-concurrency", "16"), ("--p-adjust", "holm"), ("--control", "none"), ("--batch-size", "8"),
            ("--seed", "0"), ("--limit", "3")} <= found
    assert _documented_defaults("`medheval inputs --limit N`, default 4") == [
        ("--limit", "4", "inputs", "`medheval inputs --limit N`, default 4")]
    assert _documented_defaults("`--seed`), not the protocol's default.") == []


def test_the_defaults_the_help_gives_are_the_parsers():
    """`--help` says "(default V" or "V (default" (V one of the choices) only for the parser's default."""
    wrong = []
    for command, parser in COMMAND_PARSERS.items():
        for action in parser._actions:
            if not action.help or not _has_default(action):
                continue
            said = [m.group(1) for m in re.finditer(r"\bdefault:?\s+([\w./-]+)", action.help)]
            said += [m.group(1) for m in re.finditer(r"([\w./-]+) \(default\b", action.help)
                     if action.choices and m.group(1) in action.choices]
            wrong += [f"medheval {command} {action.option_strings[-1]}: help says default {value}, parser {action.default!r}"
                      for value in said if not _same(value, action.default)]
    assert not wrong, "\n".join(wrong)


# -- a documented run whose model reads images names a root for every image source of its splits -------------------
# (was: docs/api-models.md's vLLM example ran mm_vishal,cxr_vishal with roots for slake and mimic_cxr alone, which
# `medheval run` refuses before the first request: no root for vqa_rad, iu_xray)

FIXTURE_BENCHMARKS = ("mm_vishal", "cxr_vishal", "vishal_report", "knowledge", "context")  # the embedded fixture's


@pytest.fixture(scope="module")
def image_sources(tmp_path_factory):
    """``sources(benchmark, config)``: the image sources of a split of the embedded fixture (the real splits' own
    sources, in their file formats), or None for a benchmark the fixture does not hold."""
    from medheval import load_benchmark
    from medheval.families.medheval.fixtures import write_fixture_benchmark

    data_dir = write_fixture_benchmark(tmp_path_factory.mktemp("fixture"), with_images=False)["data_dir"]
    found: dict[tuple[str, str | None], set[str]] = {}

    def sources(benchmark: str, config: str | None) -> set[str] | None:
        if benchmark not in FIXTURE_BENCHMARKS:
            return None
        if (benchmark, config) not in found:
            found[benchmark, config] = set(load_benchmark(benchmark, config=config, data_dir=data_dir).unique("source"))
        return found[benchmark, config]
    return sources


def _option_values(argv: list[str], option: str) -> list[str]:
    values = []
    for i, token in enumerate(argv):
        if token == option and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif token.startswith(option + "="):
            values.append(token.partition("=")[2])
    return values


def _missing_image_roots(argv: list[str], sources) -> dict[str, list[str]] | None:
    """{split: image sources no ``--image-root`` names} of a ``medheval run`` argv (after ``run``), or None when it
    cannot be told: no ``--model`` (a predictions file needs no image), a ``--config`` (its roots are in the file),
    every ``--control`` ``no_image``, an elided part (``...``, which may hold the roots) or a placeholder root, or no
    benchmark the fixture holds."""
    models = _option_values(argv, "--model")
    controls = _option_values(argv, "--control")
    roots = _option_values(argv, "--image-root")
    if (not models or "--config" in argv or (controls and set(controls) == {"no_image"})
            or "..." in argv or "…" in argv or any(_placeholder(root) for root in roots)):
        return None
    named = {root.partition("=")[0] for root in roots}
    missing, told = {}, False
    for spec in (s for value in _option_values(argv, "--benchmark") for s in value.split(",") if s):
        benchmark, _, config = spec.partition(":")
        found = sources(benchmark, config or None)
        if found is None:
            continue
        told = True
        if found - named:
            missing[spec] = sorted(found - named)
    return missing if told else None


def test_the_image_root_check_finds_a_missing_root(image_sources):
    old = shlex.split("--benchmark mm_vishal,cxr_vishal --model openai:llava-1.5-7b@http://127.0.0.1:8000/v1 "
                      "--image-root slake=/data/slake/imgs --image-root mimic_cxr=/data/mimic-cxr-jpg/2.1.0/files")
    assert _missing_image_roots(old, image_sources) == {"mm_vishal": ["vqa_rad"], "cxr_vishal": ["iu_xray"]}
    assert _missing_image_roots(old + ["--image-root", "vqa_rad=/v", "--image-root=iu_xray=/i"], image_sources) == {}
    assert _missing_image_roots(["--benchmark", "knowledge:open", "--model", "m"], image_sources) == {
        "knowledge:open": ["mimic_cxr"]}
    assert _missing_image_roots(["--benchmark", "mm_vishal", "--predictions", "p.jsonl"], image_sources) is None
    assert _missing_image_roots(["--benchmark", "mm_vishal", "--model", "m", "--control", "no_image"],
                                image_sources) is None
    assert _missing_image_roots(["--benchmark", "cxr_vishal", "--model", "m", "--image-root", "..."],
                                image_sources) is None


def test_every_documented_run_with_a_model_names_its_image_roots(image_sources):
    checked, broken = 0, []
    for page in PAGES:
        for where, argv in _commands(page):
            if argv[0] != "run" or (missing := _missing_image_roots(argv[1:], image_sources)) is None:
                continue
            checked += 1
            broken += [f"{page.relative_to(ROOT)}: {where} -> {split}: no --image-root for {', '.join(gap)}"
                       for split, gap in missing.items()]
    assert not broken, "\n".join(broken)
    assert checked >= 3  # README's own-model run, running.md's, api-models.md's vLLM run (at least)

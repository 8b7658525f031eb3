"""What our lmms-eval tasks and inspect tasks/provider need beyond our core, checked at their startup.

A harness run that lacks one of these fails late and far from the cause (issue 32: lmms-eval's ``llava_hf``
stopped on ``No module named 'decord'``, then on ``filelock._api`` with filelock 4, and exited 0 both times;
``inspect eval medheval/vishal_report`` stopped on a missing ``rouge_score``). :func:`problems` names each
missing or wrong-version dependency in one line; :func:`check` prints them when lmms-eval imports our task
functions or inspect imports our entry point, and ``medheval integrations check`` exits 1 on any.

The versions come from the ``interop`` extra of the installed ``medheval`` (setup.cfg), so there is one list.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata

FIX = ('fix: `make interop` (a venv from requirements/interop-lock.txt), or pip install "medheval[interop]" '
       "-c requirements/interop-constraints.txt (docs/interop.md)")
# (distribution, import name, which harness needs it, why)
NEEDS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("lmms-eval", "lmms_eval", ("lmms_eval",), "our lmms-eval tasks are tested with it"),
    ("inspect-ai", "inspect_ai", ("inspect_ai",), "our inspect tasks and provider are tested with it"),
    ("decord", "decord", ("lmms_eval",), "lmms-eval's llava_hf imports it and lmms-eval does not declare it"),
    ("filelock", "filelock._api", ("lmms_eval",), "lmms-eval 0.7.3 imports filelock._api, gone in filelock 4"),
    ("rouge-score", "rouge_score", ("lmms_eval", "inspect_ai"), "report and open splits score ROUGE"),
    ("nltk", "nltk", ("lmms_eval", "inspect_ai"), "report and open splits score METEOR and tokenise"),
    ("sacrebleu", "sacrebleu", ("lmms_eval", "inspect_ai"), "report and open splits score BLEU"),
)


def _extra_specs() -> dict[str, str]:
    """``{distribution: specifier}`` of the installed medheval's ``interop`` extra (empty when not installed)."""
    from packaging.requirements import Requirement

    try:
        requires = metadata.requires("medheval") or []
    except metadata.PackageNotFoundError:
        return {}
    specs = {}
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "interop"}) \
                and not requirement.marker.evaluate({"extra": ""}):
            specs[requirement.name.lower().replace("_", "-")] = str(requirement.specifier)
    return specs


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def problems(harness: str) -> list[str]:
    """One line per missing or wrong-version dependency of ``harness`` (``lmms_eval`` or ``inspect_ai``)."""
    from packaging.specifiers import SpecifierSet

    specs = _extra_specs()
    found = []
    for distribution, module, harnesses, why in NEEDS:
        if harness not in harnesses:
            continue
        spec = specs.get(distribution, "")
        version, importable = _version(distribution), _importable(module)
        if version is None or not importable:
            state = "is missing" if version is None else f"{version} has no {module}"
            found.append(f"{distribution} {state} ({why}); medheval[interop] needs {distribution}{spec}")
        elif spec and not SpecifierSet(spec).contains(version, prereleases=True):
            found.append(f"{distribution} {version} is installed; medheval[interop] needs {distribution}{spec} ({why})")
    return found


def check(harness: str) -> list[str]:
    """Print each problem of ``harness`` on one line to stderr (the harness goes on: it may not need them all)."""
    found = problems(harness)
    for line in found:
        print(f"medheval: {line}; {FIX}", file=sys.stderr)
    return found


def main(harnesses: tuple[str, ...] = ("lmms_eval", "inspect_ai")) -> int:
    """``medheval integrations check``: every problem, one line each; exit 1 on any, else 0 and one OK line."""
    found = [line for harness in harnesses for line in check(harness)]
    if not found:
        versions = ", ".join(f"{d} {_version(d)}" for d, *_ in NEEDS[:2])
        print(f"medheval integrations: OK ({versions}; decord, filelock<4, rouge-score, nltk, sacrebleu present)")
    return 1 if found else 0

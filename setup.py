"""Packaging glue: the metadata is in setup.cfg. This file only makes the wheel carry the unit
folders. The repository keeps ``datasets/``, ``metrics/`` and ``mitigations/`` at the top level (a
top-level package named ``datasets`` would shadow HF's library); a built wheel holds copies under
``medheval/units/``, where ``medheval.data.registry`` finds them. Editable installs read the checkout."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

UNIT_KINDS = ("datasets", "metrics", "mitigations")
HERE = Path(__file__).resolve().parent


class BuildPyWithUnits(build_py):
    """``build_py`` plus a copy of the three unit folders into ``<build>/medheval/units/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "medheval" / "units"
        for kind in UNIT_KINDS:
            source = HERE / kind
            if not source.is_dir():
                raise FileNotFoundError(f"{source} is missing: the sdist or checkout is incomplete")
            shutil.rmtree(target / kind, ignore_errors=True)  # a stale build/ never resurrects a removed unit
            shutil.copytree(source, target / kind,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithUnits})

"""Helpers for the harness interop tests (tests/test_interop_*.py)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_harness(name: str) -> ModuleType:
    """Import harness ``name`` (``lmms_eval``, ``inspect_ai``); skip when absent, but fail when
    ``MEDHEVAL_REQUIRE_INTEROP=1`` (CI's interop venv, where a missing harness is a broken install)."""
    if os.environ.get("MEDHEVAL_REQUIRE_INTEROP") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)

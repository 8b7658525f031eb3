"""``python tests/lmms_eval_launch.py ARGS``: lmms-eval's command line, after working around three defects of
the interop venv (``apply_workarounds()``: the same in a test process that imports transformers' image code) that are not ours (each applied only when detected, and said on stderr):

- filelock 4 (our lock's pin) has no ``filelock._api``, which lmms-eval 0.7.3's ``simple_evaluate`` imports:
  the module is aliased to ``filelock._core`` (same ``FileLockMeta`` and ``BaseFileLock``);
- a torchvision build whose C ops do not load against the CPU torch (``operator torchvision::nms does not
  exist``) breaks every ``import transformers`` image path: torchvision is hidden (transformers then uses its
  PIL image processors, as it does when torchvision is not installed);
- lmms-eval's ``llava_hf`` imports ``decord`` (video decoding) at module top: an empty stand-in (no video is read).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import runpy
import subprocess
import sys
import types


def _note(text: str) -> None:
    print(f"lmms_eval_launch: {text}", file=sys.stderr)


def _hide_torchvision() -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        if name == "torchvision" or name.startswith("torchvision."):
            return None
        return real_find_spec(name, package)

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden: broken build)")
            return None

    importlib.util.find_spec = find_spec
    sys.meta_path.insert(0, Hide())


def apply_workarounds() -> None:
    """Each workaround of the module docstring whose defect is present here (idempotent)."""
    if getattr(apply_workarounds, "done", False):
        return
    apply_workarounds.done = True  # type: ignore[attr-defined]
    try:
        importlib.import_module("filelock._api")
    except ModuleNotFoundError:
        core = importlib.import_module("filelock._core")
        shim = types.ModuleType("filelock._api")
        shim.FileLockMeta, shim.BaseFileLock = core.FileLockMeta, core.BaseFileLock
        sys.modules["filelock._api"] = shim
        _note("filelock has no _api module (filelock 4): aliased to filelock._core")
    if importlib.util.find_spec("torchvision") is not None:  # probed in a child: a failed import leaves torch ops half-registered
        probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
        if probe.returncode != 0:
            _hide_torchvision()
            _note(f"torchvision does not load ({probe.stderr.strip().splitlines()[-1]}): hidden")
    if importlib.util.find_spec("decord") is None:
        sys.modules["decord"] = types.SimpleNamespace(VideoReader=None, cpu=None)  # type: ignore[assignment]
        _note("decord is not installed: an empty stand-in for llava_hf's import")


def main() -> None:
    apply_workarounds()
    sys.argv[0] = "lmms_eval"
    runpy.run_module("lmms_eval", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

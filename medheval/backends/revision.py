"""Which weights answered: the model revision a run records (``results.json`` ``provenance.model_revision``).

One small dict, safe to publish (no absolute path, no credential):

- ``{"kind": "hub", "id": "org/name", "commit": "<sha>"}``: a Hub id, with the commit ``from_pretrained`` read
  (the config's ``_commit_hash`` where transformers still sets it, else the snapshot folder of the local
  Hub cache that ``refs/main`` points at; ``None`` when neither says);
- ``{"kind": "local", "name": "<folder name>"}``: a local folder (only its last part: never the path), with
  ``"id"``/``"commit"`` when it is a snapshot of the Hub cache or its config carries a commit;
- ``{"kind": "in_memory", "name": ...}``: a model object built in the process (the tiny random models);
- ``{"kind": "api", "id": "<model asked for>", "reported": [...]}``: an API model and the model names its
  replies gave (``model`` of an OpenAI-compatible or Anthropic reply, e.g. a dated version).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

COMMIT = re.compile(r"[0-9a-f]{7,64}")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
# a local folder's or an in-process model's name (no path separator, no markup, no control character)
SHORT_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_. +@()-]{0,127}")
# an API model name as asked for or reported (``gpt-4o-2024-08-06``, ``llama3:8b``, ``accounts/x/models/y``)
API_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")
MAX_ID_CHARS = 200
REVISION_KEYS = {"hub": {"kind", "id", "commit"}, "local": {"kind", "name", "id", "commit"},
                 "in_memory": {"kind", "name", "commit"}, "api": {"kind", "id", "reported"}}


def config_commit(config: Any) -> str | None:
    """The commit a transformers config says it was loaded from (``_commit_hash``, set by transformers < 5.24),
    or ``None``."""
    value = getattr(config, "_commit_hash", None)
    return value if isinstance(value, str) and COMMIT.fullmatch(value) else None


def snapshot_of(path: str | os.PathLike) -> tuple[str, str] | None:
    """``(repo id, commit)`` when ``path`` is a snapshot folder of the Hub cache
    (``.../models--org--name/snapshots/<commit>``), else ``None``."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--") and COMMIT.fullmatch(parts[-1]):
        return parts[-3][len("models--"):].replace("--", "/"), parts[-1]
    return None


def cached_commit(repo_id: str) -> str | None:
    """The commit of ``repo_id``'s ``config.json`` in the local Hub cache (what an offline or a fresh
    ``from_pretrained`` of its default branch read), or ``None`` when it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id or cache: the commit is unknown, not an error
        return None
    if not isinstance(found, str):
        return None
    snapshot = snapshot_of(Path(found).parent)
    return snapshot[1] if snapshot else None


def hf_revision(source: str | os.PathLike | None, config: Any) -> dict[str, Any]:
    """The revision of a transformers model loaded from ``source`` (a Hub id or a local folder; ``None`` for a
    model object built in the process) whose config is ``config``."""
    commit = config_commit(config)
    text = os.fspath(source) if source is not None else ""
    if text and os.path.isdir(os.path.expanduser(text)):
        folder = Path(os.path.expanduser(text)).resolve()
        snapshot = snapshot_of(folder)
        if snapshot:
            return {"kind": "local", "name": folder.name, "id": snapshot[0], "commit": commit or snapshot[1]}
        return {"kind": "local", "name": folder.name, **({"commit": commit} if commit else {})}
    if text and REPO_ID.fullmatch(text) and not getattr(config, "medheval_random_weights", False):
        return {"kind": "hub", "id": text, "commit": commit or cached_commit(text)}
    name = text if REPO_ID.fullmatch(text or "-") else type(config).__name__
    return {"kind": "in_memory", "name": name, **({"commit": commit} if commit else {})}


def api_revision(model: str, reported: set[str] | list[str]) -> dict[str, Any]:
    """The revision of an API model: the name asked for and the names the replies reported."""
    return {"kind": "api", "id": str(model), "reported": sorted({str(name) for name in reported if name})}


def revision_note(revision: Any) -> str | None:
    """The model revision as an ``.eval_results`` note (``model_revision=org/name@<commit>`` (a Hub id or a
    snapshot folder of the Hub cache), ``model_revision=local folder <name>``, ``model_revision=api <id> (reported <names>)``); ``None`` when nothing is known (a Hub
    id without its commit, a model built in the process)."""
    if not isinstance(revision, dict):
        return None
    kind, commit = revision.get("kind"), revision.get("commit")
    at = f"@{commit}" if commit else ""
    if kind == "hub":
        return f"model_revision={revision.get('id')}{at}" if commit else None
    if kind == "local" and revision.get("id") and commit:  # a snapshot folder of the Hub cache
        return f"model_revision={revision['id']}{at} (local snapshot)"
    if kind == "local":
        return f"model_revision=local folder {revision.get('name')}{at}"
    if kind == "api":
        reported = revision.get("reported") or []
        return f"model_revision=api {revision.get('id')}" + (f" (reported {', '.join(reported)})" if reported else "")
    return None  # a model built in the process (the tiny random models) has no revision to name


def check_revision(revision: Any) -> tuple[str, str] | None:
    """Why ``revision`` is not a model revision this module writes, as ``(field, problem)``, or ``None``:
    a dict of one known kind with only that kind's keys, ``id`` a Hub repo id (an API model name for ``api``),
    ``commit`` hex, ``name`` a short folder or class name, ``reported`` a short list of API model names."""
    if revision is None:
        return None
    if not isinstance(revision, dict) or revision.get("kind") not in REVISION_KEYS:
        return "model_revision", f"expected one of kinds {', '.join(REVISION_KEYS)}, got {shown(revision)}"
    kind = revision["kind"]
    extra = sorted(str(key) for key in set(revision) - REVISION_KEYS[kind])
    if extra:
        return "model_revision", f"unexpected key(s) {', '.join(shown(key) for key in extra)} for kind {kind!r}"
    ident = API_MODEL if kind == "api" else REPO_ID
    checks = {"id": lambda v: isinstance(v, str) and len(v) <= MAX_ID_CHARS and bool(ident.fullmatch(v)),
              "commit": lambda v: v is None or (isinstance(v, str) and bool(COMMIT.fullmatch(v))),
              "name": lambda v: isinstance(v, str) and len(v) <= MAX_ID_CHARS and bool(
                  SHORT_NAME.fullmatch(v) or REPO_ID.fullmatch(v)),
              "reported": lambda v: isinstance(v, list) and len(v) <= 20 and all(
                  isinstance(n, str) and bool(API_MODEL.fullmatch(n)) for n in v)}
    for key, valid in checks.items():
        if key in revision and not valid(revision[key]):
            return f"model_revision.{key}", f"{shown(revision[key])} is not a valid {key} for kind {kind!r}"
    return None


def shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (a hostile value is named, never echoed whole)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


__all__ = ["api_revision", "cached_commit", "check_revision", "config_commit", "hf_revision", "revision_note", "shown",
           "snapshot_of"]

"""What the publish-guard tests scan: a repo folder holding one file, and a Parquet file's bytes."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from medheval.publish import hub


def repo_folder(tmp_path: Path, relpath: str, data: bytes) -> hub.RepoFolder:
    """A dataset repo folder under ``tmp_path`` whose one file ``relpath`` holds ``data``."""
    folder = tmp_path / "repo"
    (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
    (folder / relpath).write_bytes(data)
    return hub.RepoFolder(str(folder), "org/x", "dataset", "datasets")


def parquet_bytes(columns: dict[str, list[str]]) -> bytes:
    """A Parquet file of ``columns``."""
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()

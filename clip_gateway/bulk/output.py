"""The job's output folder, as clip-retrieval's ``inference`` writes it (so autofaiss and
clip-retrieval's index and back-end read it unchanged), plus what makes it resumable:

    img_emb/img_emb_{shard}.npy          [rows, D] float16 or float32, unit length
    text_emb/text_emb_{shard}.npy        the captions, row for row (zeros: no caption)
    metadata/metadata_{shard}.parquet    key, image_path, url, caption, width, height
    failures/failures_{shard}.parquet    key, image_path, url, type, title, detail, status
    _job/plan.json                       the source, its shards and the options, written once
    _job/done/{shard}.json               the shard's commit: written after its files

Every file is written whole or not at all: on a local disk under a hidden temporary name,
then renamed; on object storage by one PUT (an object appears complete or not at all). A shard
counts as done only when its ``done`` file exists, so a shard cut short by a kill is written
again, under the same names: no input is ever in two rows.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PLAN = "_job/plan.json"
DONE = "_job/done"
FOLDERS = ("img_emb", "text_emb", "metadata", "failures")
#: A local file being written: hidden, and without the suffix readers look for.
PARTIAL = ".partial-"

METADATA_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("image_path", pa.string()),
        ("url", pa.string()),
        ("caption", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
    ]
)
FAILURES_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("image_path", pa.string()),
        ("url", pa.string()),
        ("type", pa.string()),
        ("title", pa.string()),
        ("detail", pa.string()),
        ("status", pa.int32()),
    ]
)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


@dataclass(frozen=True)
class Output:
    fs: fsspec.AbstractFileSystem
    root: str

    @classmethod
    def at(cls, url: str, storage_options: dict[str, Any] | None = None) -> Output:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        return cls(fs, str(root).rstrip("/"))

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def write(self, relative: str, data: bytes) -> None:
        """``data`` at ``relative``, atomically."""
        path = self.path(relative)
        if not is_local(self.fs):
            self.fs.pipe_file(path, data)
            return
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        partial = os.path.join(folder, f".{name}{PARTIAL}{uuid.uuid4().hex}")
        with open(partial, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)

    def read_json(self, relative: str) -> Any:
        path = self.path(relative)
        if not self.fs.exists(path):
            return None
        return json.loads(self.fs.cat_file(path))

    def write_json(self, relative: str, data: Any) -> None:
        self.write(relative, json.dumps(data, indent=1).encode())

    def done(self) -> dict[str, dict[str, Any]]:
        """Every committed shard's record, by shard name."""
        folder = self.path(DONE)
        if not self.fs.exists(folder):
            return {}
        found = {}
        for path in self.fs.ls(folder, detail=False):
            name = os.path.basename(str(path))
            if name.endswith(".json") and PARTIAL not in name:
                found[name.removesuffix(".json")] = json.loads(self.fs.cat_file(path))
        return found

    def sweep(self) -> int:
        """Remove what a killed local writer left half-written (its hidden partial files)."""
        if not is_local(self.fs):
            return 0
        removed = 0
        for folder in (*FOLDERS, DONE, "_job"):
            path = self.path(folder)
            if not os.path.isdir(path):
                continue
            for name in os.listdir(path):
                if PARTIAL in name:
                    os.remove(os.path.join(path, name))
                    removed += 1
        return removed


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def parquet(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> bytes:
    table = pa.Table.from_pylist(list(rows), schema=schema)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def commit_shard(
    output: Output,
    name: str,
    *,
    images: np.ndarray | None,
    texts: np.ndarray | None,
    metadata: Sequence[dict[str, Any]],
    failures: Sequence[dict[str, Any]],
    record: dict[str, Any],
) -> None:
    """Write shard ``name``'s files, then its ``done`` record (the commit). A shard with no
    row writes no embedding or metadata file (readers would choke on a [0, D] file)."""
    if images is not None and len(images):
        output.write(f"img_emb/img_emb_{name}.npy", npy(images))
        if texts is not None:
            output.write(f"text_emb/text_emb_{name}.npy", npy(texts))
        output.write(f"metadata/metadata_{name}.parquet", parquet(metadata, METADATA_SCHEMA))
    if failures:
        output.write(f"failures/failures_{name}.parquet", parquet(failures, FAILURES_SCHEMA))
    output.write_json(f"{DONE}/{name}.json", record)

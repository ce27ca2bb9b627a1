"""The inputs: a folder tree, webdataset tar shards or Parquet files, on local disk or object
storage (fsspec: ``s3://...``), cut into shards once, when a job starts, and read one shard at
a time as ``Item``s in a stable order.

A shard is the unit of work and of output: one tar file (img2dataset's layout: ``KEY.jpg``,
``KEY.txt``, ``KEY.json`` side by side), consecutive row groups of one Parquet file, or
``shard_size`` files of a folder in path order. Images are told by their extension here (as
webdataset and clip-retrieval do); what the bytes really are is the gateway's to judge.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec
import pyarrow.parquet as pq

from clip_gateway.bulk.output import is_local
from clip_gateway.client import formats
from clip_gateway.imaging import jpeg

Format = Literal["folder", "webdataset", "parquet"]
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "heic", "heif", "avif", "bmp")
CAPTION_EXTENSIONS = ("txt",)
#: The image column's usual names, tried in order when none is given.
IMAGE_COLUMNS = ("image", "jpg", "png", "webp", "img", "image_bytes", "bytes")
CAPTION_COLUMNS = ("caption", "txt", "text")
KEY_COLUMNS = ("key", "__key__", "id")
URL_COLUMNS = ("url", "image_url")


class SourceError(ValueError):
    """The source cannot be read as asked (nothing found, a column missing); says why."""


@dataclass(frozen=True)
class Item:
    """One input: its key, where it came from, its image bytes (None: a caption or metadata
    without its image) and caption."""

    key: str
    path: str
    data: bytes | None
    caption: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class Shard:
    """What one output shard is made of: ``files`` (one tar, one Parquet file, or a folder's
    files), for Parquet the ``row_groups`` read."""

    name: str
    files: tuple[str, ...]
    row_groups: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "files": list(self.files), "row_groups": list(self.row_groups)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shard:
        return cls(data["name"], tuple(data["files"]), tuple(data.get("row_groups", ())))


@dataclass(frozen=True)
class Columns:
    """Parquet's columns: the image bytes, and optionally the caption, key and URL."""

    image: str | None = None
    caption: str | None = None
    key: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class Source:
    url: str
    format: Format
    columns: Columns = field(default_factory=Columns)
    storage_options: dict[str, Any] = field(default_factory=dict)

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return fs, str(root).rstrip("/") or "/"

    def full(self, fs: fsspec.AbstractFileSystem, path: str) -> str:
        """``path`` as a URL a person can use again (``s3://bucket/key``)."""
        return (
            str(fs.unstrip_protocol(path))
            if fs.protocol not in ("file", ("file", "local"))
            else path
        )


def split_key(path: str) -> tuple[str, str]:
    """(key, extension) of a member or file: ``a/b/0001.jpg`` → (``a/b/0001``, ``jpg``)."""
    folder, name = posixpath.split(path)
    stem, _, ext = name.partition(".")
    return posixpath.join(folder, stem), ext.lower()


def detect(url: str, storage_options: dict[str, Any] | None = None) -> Format:
    """The format of ``url``: Parquet or tar files by name, else a folder of images."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    paths = [root] if fs.isfile(root) else fs.find(root)
    if any(p.endswith(".tar") for p in paths):
        return "webdataset"
    if any(p.endswith(".parquet") for p in paths):
        return "parquet"
    return "folder"


def plan(source: Source, shard_size: int) -> list[Shard]:
    """The shards of ``source``, named ``00000``, ``00001``... in path order."""
    fs, root = source.filesystem()
    paths = [root] if fs.isfile(root) else sorted(fs.find(root))
    if source.format == "webdataset":
        units: list[tuple[tuple[str, ...], tuple[int, ...]]] = [
            ((p,), ()) for p in paths if p.endswith(".tar")
        ]
    elif source.format == "parquet":
        units = [u for p in paths if p.endswith(".parquet") for u in _row_groups(fs, p, shard_size)]
    else:
        wanted = [p for p in paths if _suffix(p) in (*IMAGE_EXTENSIONS, *CAPTION_EXTENSIONS)]
        keys = list(_by_key(wanted))
        units = [
            (tuple(f for _, files in keys[i : i + shard_size] for f in files), ())
            for i in range(0, len(keys), shard_size)
        ]
    if not units:
        raise SourceError(f"no {source.format} input found under {source.url}")
    width = max(5, len(str(len(units) - 1)))
    return [Shard(str(i).zfill(width), files, rows) for i, (files, rows) in enumerate(units)]


def _suffix(path: str) -> str:
    """A folder's file extension (the last one: ``a.final.jpg`` is a ``jpg``), lower case."""
    return posixpath.splitext(path)[1][1:].lower()


def _by_key(paths: list[str]) -> Iterator[tuple[str, list[str]]]:
    """A folder's files grouped by path less extension (an image and the caption beside it
    stay together), in key order."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        groups.setdefault(posixpath.splitext(path)[0], []).append(path)
    for key in sorted(groups):
        yield key, sorted(groups[key])


def _row_groups(
    fs: fsspec.AbstractFileSystem, path: str, shard_size: int
) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    with fs.open(path, "rb") as f:
        metadata = pq.ParquetFile(f).metadata
    group: list[int] = []
    rows = 0
    for index in range(metadata.num_row_groups):
        if group and rows + metadata.row_group(index).num_rows > shard_size:
            yield (path,), tuple(group)
            group, rows = [], 0
        group.append(index)
        rows += metadata.row_group(index).num_rows
    if group:
        yield (path,), tuple(group)


def has_captions(source: Source, first: Shard) -> bool:
    """Whether the job writes text embeddings: a caption column, or a caption in its first
    shard (read up to 1,000 members)."""
    if source.format == "parquet":
        return _parquet_columns(source, first).caption is not None
    for count, item in enumerate(read(source, first)):
        if item.caption is not None:
            return True
        if count >= 1000:
            break
    return False


def read(source: Source, shard: Shard) -> Iterator[Item]:
    """The items of ``shard``, in a stable order, streamed."""
    fs, _ = source.filesystem()
    if source.format == "webdataset":
        yield from _read_tar(source, fs, shard.files[0])
    elif source.format == "parquet":
        yield from _read_parquet(source, fs, shard)
    else:
        yield from _read_folder(source, fs, shard)


def _caption(data: bytes | None) -> str | None:
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace").strip()
    return text or None


def _url(data: bytes | None) -> str | None:
    """img2dataset's ``url`` from the JSON beside an image, when there is one."""
    if data is None:
        return None
    try:
        found = json.loads(data).get("url")
    except (ValueError, AttributeError):
        return None
    return str(found) if found else None


def _sample(key: str, where: str, members: dict[str, bytes]) -> Item | None:
    image = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
    if image is None and not any(e in members for e in (*CAPTION_EXTENSIONS, "json")):
        return None  # no image, no caption: nothing anyone would call an input
    ext = next((e for e in IMAGE_EXTENSIONS if e in members), None)
    path = f"{where}/{key}.{ext}" if ext else f"{where}/{key}"
    return Item(key, path, image, _caption(members.get("txt")), _url(members.get("json")))


def _read_tar(source: Source, fs: fsspec.AbstractFileSystem, path: str) -> Iterator[Item]:
    where = source.full(fs, path)
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
        key: str | None = None
        members: dict[str, bytes] = {}
        for member in tar:
            if not member.isfile():
                continue
            name_key, ext = split_key(member.name)
            if name_key != key and key is not None:
                if (item := _sample(key, where, members)) is not None:
                    yield item
                members = {}
            key = name_key
            extracted = tar.extractfile(member)
            members[ext] = extracted.read() if extracted is not None else b""
        if key is not None and (item := _sample(key, where, members)) is not None:
            yield item


def _read_folder(source: Source, fs: fsspec.AbstractFileSystem, shard: Shard) -> Iterator[Item]:
    _, root = source.filesystem()
    prefix = "" if fs.isfile(root) else root.rstrip("/") + "/"
    cat = _read_local if is_local(fs) else fs.cat_file
    for key, files in _by_key(list(shard.files)):
        images = [p for p in files if _suffix(p) in IMAGE_EXTENSIONS]
        captions = [p for p in files if _suffix(p) in CAPTION_EXTENSIONS]
        data = cat(images[0]) if images else None
        caption = _caption(cat(captions[0])) if captions else None
        where = source.full(fs, images[0] if images else files[0])
        yield Item(key.removeprefix(prefix), where, data, caption)


def _read_local(path: str) -> bytes:
    """A local file's bytes: half of what fsspec's ``cat_file`` spends on a small photo."""
    with open(path, "rb") as f:
        return f.read()


def _parquet_columns(source: Source, shard: Shard) -> Columns:
    fs, _ = source.filesystem()
    with fs.open(shard.files[0], "rb") as f:
        names = pq.ParquetFile(f).schema_arrow.names
    given = source.columns

    def pick(chosen: str | None, usual: tuple[str, ...], what: str) -> str | None:
        if chosen is not None:
            if chosen not in names:
                raise SourceError(f"{shard.files[0]} has no {what} column {chosen!r}: {names}")
            return chosen
        return next((n for n in usual if n in names), None)

    image = pick(given.image, IMAGE_COLUMNS, "image")
    if image is None:
        raise SourceError(f"{shard.files[0]}: no image column (--image-column) among {names}")
    return Columns(
        image,
        pick(given.caption, CAPTION_COLUMNS, "caption"),
        pick(given.key, KEY_COLUMNS, "key"),
        pick(given.url, URL_COLUMNS, "URL"),
    )


def _bytes(value: Any) -> bytes | None:
    """An image cell: bytes, or a Hugging Face ``{"bytes": ..., "path": ...}`` struct."""
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if value is not None else None


def _read_parquet(source: Source, fs: fsspec.AbstractFileSystem, shard: Shard) -> Iterator[Item]:
    columns = _parquet_columns(source, shard)
    path = shard.files[0]
    where = source.full(fs, path)
    wanted = [c for c in (columns.image, columns.caption, columns.key, columns.url) if c]
    with fs.open(path, "rb") as f:
        parquet = pq.ParquetFile(f)
        row = sum(parquet.metadata.row_group(i).num_rows for i in range(shard.row_groups[0]))
        for batch in parquet.iter_batches(64, row_groups=list(shard.row_groups), columns=wanted):
            values = batch.to_pydict()
            for i in range(batch.num_rows):
                key = str(values[columns.key][i]) if columns.key else str(row)
                caption = values[columns.caption][i] if columns.caption else None
                url = values[columns.url][i] if columns.url else None
                yield Item(
                    key,
                    f"{where}#{row}",
                    _bytes(values[columns.image][i]),
                    _caption(caption.encode() if isinstance(caption, str) else caption),
                    str(url) if url else None,
                )
                row += 1


def peek(data: bytes) -> tuple[int | None, int | None]:
    """An image's width and height from its header (libjpeg-turbo's header read for a JPEG, a
    tenth of Pillow's open; Pillow for the others, which reads no pixels for this either), or
    (None, None) when neither can tell."""
    from PIL import Image

    if formats.identify(data[: formats.HEAD_BYTES]) == "jpeg":
        with contextlib.suppress(jpeg.JpegError):
            header = jpeg.read_header(data)
            return header.width, header.height
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # anything Pillow cannot open: the gateway says what is wrong with it
        return None, None

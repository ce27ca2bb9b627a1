"""Collections for the bulk job's tests and bench study: small photos (JPEG mostly, some PNG
and WebP) with captions, and the messy members a real crawl has, written as webdataset tar
shards (img2dataset's layout), Parquet, or a folder tree. Each sample says what the job must
make of it: a row, or a failure of a given type."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.harness.photos import jpeg, photo
from tests import samples

INVALID = "https://clip-gateway.dev/problems/invalid-image"


@dataclass(frozen=True)
class Sample:
    key: str
    ext: str | None  # None: no image (a caption alone)
    data: bytes | None
    caption: str | None
    #: None: a row; else the failure's type
    fails: str | None = None
    url: str | None = None


def collection(count: int, seed: int = 0, messy: bool = True) -> list[Sample]:
    """``count`` samples: photos of 64 to 160 px (compact JPEGs, every 40th a PNG and every
    40th a WebP, every 7th without a caption), and with ``messy`` one of each kind of trouble
    every 250: a truncated JPEG, a text file named .jpg, a caption whose image is missing."""
    found = []
    for i in range(count):
        key = f"{seed:02d}{i:06d}"
        caption = None if i % 7 == 3 else f"photo number {i} of set {seed}"
        url = f"https://example.org/images/{key}.jpg"
        image = photo(64 + (i * 13) % 97, 64 + (i * 29) % 97, seed=seed * 100_000 + i)
        trouble = i % 250 if messy else -1
        if trouble == 11:
            good = jpeg(image, 85)
            found.append(Sample(key, "jpg", good[: len(good) // 2], caption, INVALID, url))
        elif trouble == 12:
            found.append(
                Sample(key, "jpg", b"this is a caption, not a photo\n", caption, INVALID, url)
            )
        elif trouble == 13:
            found.append(Sample(key, None, None, caption or "an orphan caption", "no-image", url))
        elif i % 40 == 5:
            found.append(Sample(key, "png", samples.encode(image, "PNG"), caption, None, url))
        elif i % 40 == 6:
            found.append(
                Sample(key, "webp", samples.encode(image, "WEBP", quality=80), caption, None, url)
            )
        else:
            found.append(Sample(key, "jpg", jpeg(image, 85), caption, None, url))
    return found


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(folder: Path, found: list[Sample], shards: int) -> list[Path]:
    """img2dataset's layout: ``{shard:05d}.tar`` of ``KEY.jpg``/``KEY.txt``/``KEY.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(found) // shards)
    paths = []
    for shard in range(shards):
        path = folder / f"{shard:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for sample in found[shard * per : (shard + 1) * per]:
                if sample.data is not None:
                    _add(tar, f"{sample.key}.{sample.ext}", sample.data)
                if sample.caption is not None:
                    _add(tar, f"{sample.key}.txt", sample.caption.encode())
                meta = {"url": sample.url, "key": sample.key, "caption": sample.caption}
                _add(tar, f"{sample.key}.json", json.dumps(meta).encode())
        paths.append(path)
    return paths


def write_parquet(path: Path, found: list[Sample], row_group: int = 100) -> Path:
    """One Parquet file: key, image (bytes, null for a missing image), caption, url."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "key": [s.key for s in found],
            "image": pa.array([s.data for s in found], pa.binary()),
            "caption": [s.caption for s in found],
            "url": [s.url for s in found],
        }
    )
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_folder(root: Path, found: list[Sample]) -> Path:
    """A folder tree: ``a/KEY.jpg`` with ``a/KEY.txt`` beside it, in a few subfolders."""
    for i, sample in enumerate(found):
        folder = root / f"part{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        if sample.data is not None:
            (folder / f"{sample.key}.{sample.ext}").write_bytes(sample.data)
        if sample.caption is not None:
            (folder / f"{sample.key}.txt").write_text(sample.caption)
    return root

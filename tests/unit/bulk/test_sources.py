"""The bulk job's inputs and outputs on local files (clip_gateway/bulk/sources.py, output.py,
job.load_plan): how each format is cut into shards and read as items, and what a half-written
output leaves behind."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clip_gateway.bulk import output, sources
from clip_gateway.bulk.job import PlanMismatch, load_plan
from clip_gateway.bulk.work import JobSpec


def tar_of(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_is_read_key_by_key_with_its_caption_url_and_missing_images(tmp_path: Path) -> None:
    tar_of(
        tmp_path / "00000.tar",
        [
            ("crawl/0001.txt", b"  a cat \n"),
            ("crawl/0001.jpg", b"JPEG"),
            ("crawl/0001.json", json.dumps({"url": "https://x/1.jpg"}).encode()),
            ("crawl/0002.json", b"{not json"),
            ("crawl/0002.txt", b"an orphan caption"),
            ("crawl/0003.webp", b"WEBP"),
            ("crawl/0003.json", b"{}"),
            ("crawl/0004.cls", b"7"),  # nothing an input is made of: no item
            ("crawl/0005.final.png", b"PNG"),  # webdataset: the extension is after the first dot
        ],
    )
    source = sources.Source(str(tmp_path), "webdataset")
    (shard,) = sources.plan(source, 10)
    assert shard.name == "00000"
    items = list(sources.read(source, shard))
    where = f"{tmp_path}/00000.tar"
    assert items == [
        sources.Item("crawl/0001", f"{where}/crawl/0001.jpg", b"JPEG", "a cat", "https://x/1.jpg"),
        sources.Item("crawl/0002", f"{where}/crawl/0002", None, "an orphan caption", None),
        sources.Item("crawl/0003", f"{where}/crawl/0003.webp", b"WEBP", None, None),
    ]  # 0005's "final.png" is no image extension: it is not an input either
    assert sources.has_captions(source, shard)


def test_a_folder_keeps_an_image_and_its_caption_in_one_shard(tmp_path: Path) -> None:
    for name in (
        "a/1.jpg",
        "a/1.txt",
        "a/2.png",
        "a/3.txt",
        "b/4.JPEG",
        "b/4.txt",
        "b/5.webp",
        "notes.md",
    ):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    source = sources.Source(str(tmp_path), "folder")
    shards = sources.plan(source, 2)
    assert [s.name for s in shards] == ["00000", "00001", "00002"]
    keys = [[item.key for item in sources.read(source, s)] for s in shards]
    assert keys == [["a/1", "a/2"], ["a/3", "b/4"], ["b/5"]]
    first, orphan = (next(iter(sources.read(source, s))) for s in shards[:2])
    assert (first.data, first.caption, first.path) == (b"a/1.jpg", "a/1.txt", f"{tmp_path}/a/1.jpg")
    assert (orphan.data, orphan.caption) == (None, "a/3.txt")
    items = list(sources.read(source, shards[1]))
    assert (items[1].data, items[1].caption) == (b"b/4.JPEG", "b/4.txt")


def test_parquet_is_cut_by_row_groups_and_reads_bytes_or_structs(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": [f"k{i}" for i in range(10)],
            "image": [{"bytes": f"img{i}".encode(), "path": None} for i in range(10)],
            "text": [f"caption {i}" if i % 2 else None for i in range(10)],
        }
    )
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=3)  # 3, 3, 3, 1
    source = sources.Source(str(tmp_path / "part.parquet"), "parquet")
    shards = sources.plan(source, 6)
    assert [s.row_groups for s in shards] == [(0, 1), (2, 3)]
    items = [item for shard in shards for item in sources.read(source, shard)]
    assert [i.key for i in items] == [f"k{i}" for i in range(10)]
    assert items[3] == sources.Item("k3", f"{tmp_path}/part.parquet#3", b"img3", "caption 3")
    assert items[4].caption is None
    missing = sources.Source(str(tmp_path), "parquet", sources.Columns(caption="alt"))
    with pytest.raises(sources.SourceError, match="no caption column 'alt'"):
        list(sources.read(missing, shards[0]))


def test_a_killed_writer_leaves_nothing_a_reader_or_the_next_run_takes(tmp_path: Path) -> None:
    out = output.Output.at(str(tmp_path))
    out.write("img_emb/img_emb_00000.npy", output.npy(np.ones((2, 4), np.float16)))
    partial = tmp_path / "img_emb" / f".img_emb_00001.npy{output.PARTIAL}dead"
    partial.write_bytes(b"half a file")  # what a kill between write and rename leaves
    (tmp_path / "_job" / "done").mkdir(parents=True)
    (tmp_path / "_job" / "done" / f".00001.json{output.PARTIAL}dead").write_text("{")
    assert sorted(p.name for p in (tmp_path / "img_emb").glob("*.npy")) == ["img_emb_00000.npy"]
    assert out.done() == {}
    assert out.sweep() == 2
    assert not partial.exists()
    assert np.load(tmp_path / "img_emb" / "img_emb_00000.npy").shape == (2, 4)


def test_the_plan_is_made_once_and_holds_the_output_to_its_job(tmp_path: Path) -> None:
    tar_of(tmp_path / "in" / "00000.tar", [("1.jpg", b"x")])
    spec = JobSpec(
        sources.Source(str(tmp_path / "in"), "webdataset"), str(tmp_path / "out"), ("http://gw",)
    )
    first = load_plan(spec, 10)
    tar_of(tmp_path / "in" / "00001.tar", [("2.jpg", b"y")])  # after the first run
    assert load_plan(spec, 10) == first  # the job's inputs were fixed by its first run
    other = JobSpec(sources.Source(str(tmp_path), "folder"), str(tmp_path / "out"), ("http://gw",))
    with pytest.raises(PlanMismatch, match=r"holds another job .*source.*format"):
        load_plan(other, 10)
    float32 = JobSpec(spec.source, spec.output, spec.gateways, dtype="float32")
    with pytest.raises(PlanMismatch, match="dtype: 'float16' there, 'float32' here"):
        load_plan(float32, 10)

"""Facts of a photo (seen size, bytes, date) and the rule that picks the one to keep."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from PIL import Image

from clip_gateway.photos.facts import Facts, best, facts, human_size
from tests import samples


def exif(**tags: object) -> bytes:
    block = Image.Exif()
    if "taken" in tags:
        block.get_ifd(0x8769)[0x9003] = tags["taken"]
    if "orientation" in tags:
        block[0x0112] = tags["orientation"]
    return block.tobytes()


def test_facts_from_exif(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    image = samples.small_photo(0, (400, 300))
    path.write_bytes(samples.encode(image, "JPEG", exif=exif(taken="2019:07:14 09:30:00")))
    fact = facts(path)
    assert (fact.width, fact.height, fact.size) == (400, 300, path.stat().st_size)
    assert (fact.date, fact.date_source) == (datetime(2019, 7, 14, 9, 30), "taken")


def test_facts_as_seen_and_from_the_file_time(tmp_path: Path) -> None:
    path = tmp_path / "turned.jpg"
    image = samples.small_photo(0, (400, 300))
    path.write_bytes(samples.encode(image, "JPEG", exif=exif(orientation=6)))
    os.utime(path, (1_600_000_000, 1_600_000_000))
    fact = facts(path)
    assert (fact.width, fact.height) == (300, 400)  # portrait, as a viewer shows it
    assert (fact.date, fact.date_source) == (datetime.fromtimestamp(1_600_000_000), "modified")


def test_unreadable_files_have_no_facts(tmp_path: Path) -> None:
    (tmp_path / "x.jpg").write_bytes(b"junk")
    assert facts(tmp_path / "x.jpg") == Facts() == facts(tmp_path / "missing.jpg")


def test_best_is_the_largest_then_the_biggest_file_then_the_earliest() -> None:
    early, late = datetime(2020, 1, 1), datetime(2021, 1, 1)
    assert best([Facts(640, 480, 10), Facts(1280, 960, 5), Facts(800, 600, 99)]) == 1
    assert best([Facts(640, 480, 10, late), Facts(640, 480, 20, late)]) == 1
    assert best([Facts(640, 480, 10, late), Facts(640, 480, 10, early)]) == 1
    assert best([Facts(640, 480, 10, None), Facts(640, 480, 10, late)]) == 1  # dated wins
    assert best([Facts(640, 480, 10, early), Facts(640, 480, 10, early)]) == 0  # first listed
    assert best([Facts(), Facts(10, 10, 1)]) == 1  # an unreadable photo is never kept


def test_human_size() -> None:
    assert [human_size(n) for n in (0, 999, 1000, 48_250, 3_100_000, 7 * 10**12)] == [
        "0 B", "999 B", "1.0 KB", "48.2 KB", "3.1 MB", "7000.0 GB",
    ]  # fmt: skip

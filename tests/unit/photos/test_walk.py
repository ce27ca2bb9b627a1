"""Walking a photo folder: by content, hidden files left out, symlink loops not followed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clip_gateway.photos.walk import Counts, Photo, Unreadable, walk
from tests import samples

ROOT = Path(__file__).resolve().parents[3]


def found(root: Path, *, hidden: bool = False) -> tuple[list[str], dict[str, str], Counts]:
    counts = Counts()
    photos, problems = [], {}
    for item in walk(root, counts, hidden=hidden):
        name = str(item.path.relative_to(root))
        if isinstance(item, Photo):
            photos.append(name)
        else:
            assert isinstance(item, Unreadable)
            problems[name] = item.reason.split(":")[0] + ("" if item.failed else " (noted)")
    return photos, problems, counts


def write(root: Path, name: str, data: bytes) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(data)


def test_photos_by_content_in_name_order(tmp_path: Path) -> None:
    write(tmp_path, "b/IMG_2.JPG", samples.compact(0))
    write(tmp_path, "a.png", samples.png(0))
    write(tmp_path, "b/no_extension", samples.compact(1))  # a JPEG under any name
    write(tmp_path, "b/c/anim.gif", samples.gif(0))
    write(tmp_path, "notes.txt", b"hello")
    write(tmp_path, "clip.mov", b"\x00\x00\x00\x14ftypqt  ")
    photos, problems, counts = found(tmp_path)
    assert photos == ["a.png", "b/IMG_2.JPG", "b/c/anim.gif", "b/no_extension"]
    assert problems == {}
    assert (counts.other, counts.hidden) == (2, 0)


def test_files_named_like_photos_that_are_not(tmp_path: Path) -> None:
    write(tmp_path, "empty.jpg", b"")
    write(tmp_path, "notes.jpeg", b"shopping list")
    write(tmp_path, "empty.txt", b"")  # not named like a photo: passed over
    photos, problems, counts = found(tmp_path)
    assert photos == []
    assert problems == {"empty.jpg": "empty file", "notes.jpeg": "not an image"}
    assert counts.other == 1


def test_hidden_files_and_folders_only_when_asked(tmp_path: Path) -> None:
    write(tmp_path, ".thumbnails/a.jpg", samples.compact(0))
    write(tmp_path, "._IMG_1.JPG", b"\x00\x05\x16\x07")  # macOS AppleDouble
    write(tmp_path, "IMG_1.JPG", samples.compact(1))
    photos, problems, counts = found(tmp_path)
    assert (photos, problems, counts.hidden) == (["IMG_1.JPG"], {}, 2)
    photos, problems, _ = found(tmp_path, hidden=True)
    assert photos == [".thumbnails/a.jpg", "IMG_1.JPG"]
    assert problems == {"._IMG_1.JPG": "not an image"}


def test_symlinks_followed_once_and_loops_noted(tmp_path: Path) -> None:
    write(tmp_path, "album/a.jpg", samples.compact(0))
    write(tmp_path, "elsewhere/b.jpg", samples.compact(1))
    (tmp_path / "album/up").symlink_to("..", target_is_directory=True)  # a loop
    (tmp_path / "album/other").symlink_to("../elsewhere", target_is_directory=True)
    (tmp_path / "album/self.jpg").symlink_to("self.jpg")
    (tmp_path / "album/gone.jpg").symlink_to("nowhere.jpg")
    photos, problems, _ = found(tmp_path)
    assert photos == ["album/a.jpg", "album/other/b.jpg", "elsewhere/b.jpg"]
    assert problems == {
        "album/up": "symlink loop (noted)",
        "album/self.jpg": "symlink loop (noted)",
        "album/gone.jpg": "broken symlink (noted)",
    }


def test_a_folder_that_cannot_be_listed_is_a_failure(tmp_path: Path) -> None:
    """chmod 000 for real: root walks in a child without CAP_DAC_OVERRIDE/READ_SEARCH."""
    write(tmp_path, "ok.jpg", samples.compact(0))
    write(tmp_path, "locked/a.jpg", samples.compact(1))
    write(tmp_path, "secret.jpg", samples.compact(2))
    os.chmod(tmp_path / "locked", 0)
    os.chmod(tmp_path / "secret.jpg", 0)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without setpriv (util-linux): chmod 000 cannot bite")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    code = (
        "import sys; from pathlib import Path; from clip_gateway.photos.walk import Counts, walk\n"
        "for item in walk(Path(sys.argv[1]), Counts()):\n"
        "    print(item.path.name, getattr(item, 'reason', 'photo'), sep='|')"
    )
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(tmp_path)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    finally:
        os.chmod(tmp_path / "locked", 0o755)
        os.chmod(tmp_path / "secret.jpg", 0o644)
    assert done.stdout.splitlines() == [
        "locked|cannot list folder: Permission denied",
        "ok.jpg|photo",
        "secret.jpg|cannot read: Permission denied",
    ]

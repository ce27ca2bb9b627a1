"""A photo folder as real ones are: nested, phone formats, copies, broken and misnamed files,
hidden files, symlink loops and a folder nobody may read. Client dependencies only (numpy,
Pillow, pillow-heif), so the client-only suite builds it too.

    python -c "from pathlib import Path; from tests.client.messy import build; build(Path('x'))"
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, features


def photo(width: int, height: int, seed: int) -> Image.Image:
    """Smooth colour fields with a few hard-edged shapes: distinct for distinct seeds."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(image).copy()
    for _ in range(6):
        y, x = rng.integers(0, height - height // 4), rng.integers(0, width - width // 4)
        pixels[y : y + height // 5, x : x + width // 5] = rng.integers(0, 256, 3)
    return Image.fromarray(pixels)


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def exif_taken(when: str) -> bytes:
    """An EXIF block with DateTimeOriginal ``when`` (``YYYY:MM:DD HH:MM:SS``)."""
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0x9003] = when
    return exif.tobytes()


@dataclass
class Messy:
    root: Path
    #: Every file that must end up embedded.
    photos: set[Path] = field(default_factory=set)
    #: Files and folders that cannot be embedded → the reason's first words.
    failed: dict[Path, str] = field(default_factory=dict)
    #: Symlink loops: named, not followed, not failures.
    loops: set[Path] = field(default_factory=set)
    hidden: int = 0
    other: int = 0

    def add(self, relative: str, data: bytes) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path


def build(root: Path, *, locked: bool = True) -> Messy:
    """Fill ``root``. ``locked``: also a folder and a file with no read permission (for a
    process that cannot bypass permissions: not root with CAP_DAC_OVERRIDE)."""
    messy = Messy(root)
    good = messy.photos.add
    for i in range(6):
        data = encode(photo(640, 480, seed=i), "JPEG", quality=90)
        good(messy.add(f"2024/01-winter/IMG_{i:04d}.JPG", data))
    big = photo(2400, 1800, seed=10)  # a camera-sized photo: shrunk before upload
    good(messy.add("2024/01-winter/DSC_0100.jpg", encode(big, "JPEG", quality=92)))
    taken = encode(photo(800, 600, seed=11), "JPEG", exif=exif_taken("2019:07:14 09:30:00"))
    good(messy.add("2024/01-winter/dated.jpg", taken))
    # the same photo, twice: an exact copy and a smaller re-encode (near-duplicate)
    shutil.copy(root / "2024/01-winter/IMG_0002.JPG", root / "2024/01-winter/IMG_0002 copy.JPG")
    good(root / "2024/01-winter/IMG_0002 copy.JPG")
    small = encode(photo(640, 480, seed=3).resize((320, 240)), "JPEG", quality=60)
    good(messy.add("2024/02-spring/IMG_0003_small.jpg", small))
    good(messy.add("2024/02-spring/scan.png", encode(photo(500, 700, seed=20), "PNG")))
    good(messy.add("2024/02-spring/web.webp", encode(photo(600, 400, seed=21), "WEBP")))
    frames = [photo(320, 240, seed=22).convert("P"), photo(320, 240, seed=23).convert("P")]
    animated = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    good(messy.add("2024/02-spring/anim.gif", animated))
    heic = _heic(photo(1024, 768, seed=24))
    good(messy.add("phone/IMG_5001.HEIC", heic))
    if features.check("avif"):  # Pillow's own AVIF plugin (stock wheels have it)
        good(messy.add("phone/IMG_5002.avif", encode(photo(800, 600, seed=25), "AVIF")))
    good(messy.add("phone/IMG_5003", encode(photo(640, 480, seed=26), "JPEG")))  # no extension
    messy.failed[messy.add("broken/empty.jpg", b"")] = "empty file"
    messy.failed[messy.add("broken/notes.jpg", b"shopping list\n- milk\n")] = "not an image"
    truncated = encode(photo(640, 480, seed=27), "JPEG")
    messy.failed[messy.add("broken/truncated.jpg", truncated[: len(truncated) // 2])] = (
        "invalid image"
    )
    messy.failed[messy.add("broken/truncated.heic", heic[: len(heic) // 2])] = "unreadable image"
    messy.add("notes.txt", b"not a photo, not named like one\n")
    messy.other += 1
    messy.add(".thumbnails/IMG_0000.jpg", encode(photo(64, 48, seed=0), "JPEG"))
    messy.add("2024/.DS_Store", b"\x00\x00\x00\x01Bud1")
    messy.add("2024/01-winter/._IMG_0000.JPG", b"\x00\x05\x16\x07AppleDouble")
    messy.hidden += 3
    loop = root / "2024/back-to-top"
    loop.symlink_to("..", target_is_directory=True)  # 2024/back-to-top -> 2024: a loop
    self_loop = root / "phone/self.jpg"
    self_loop.symlink_to("self.jpg")  # a link to itself
    messy.loops |= {loop, self_loop}
    if locked:
        private = messy.add("private/IMG_9000.jpg", encode(photo(320, 240, seed=28), "JPEG"))
        os.chmod(private.parent, 0)
        messy.failed[private.parent] = "cannot list folder"
        secret = messy.add("2024/secret.jpg", encode(photo(320, 240, seed=29), "JPEG"))
        os.chmod(secret, 0)
        messy.failed[secret] = "cannot read"
    return messy


def unlock(messy: Messy) -> None:
    """Give back the permissions ``build`` took (so the folder can be deleted)."""
    for path in messy.failed:
        if path.is_dir():
            os.chmod(path, 0o755)
        elif path.exists():
            os.chmod(path, 0o644)


def _heic(image: Image.Image) -> bytes:
    from pillow_heif import register_heif_opener  # what the client reads HEIC with

    register_heif_opener()
    return encode(image, "HEIF", quality=80)

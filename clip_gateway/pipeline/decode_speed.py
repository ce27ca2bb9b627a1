"""This machine's decode speed against imaging/work.py's factors, per coding: measured once per
machine at the HTTP process's start, kept, and what admission prices decodes and the meter
holds them by (pipeline/admission.py).

The factors are CPU seconds measured on one machine; they do not transfer. A 2-core Xeon with
AMX decoded a 300 x 30,000 progressive strip in 0.105 CPU-s that the factors price at 0.042 (here
0.07): 2.5x, close to the meter's 3x, which would then stop legitimate progressive photos
(issue 42). So each coding's reference files, an ordinary photo and a flat image that puts the
per-pixel (per-block and scan) work first, are decoded here as the gateway decodes them (thread
CPU time, best of ``REPEATS``), and the coding's speed is the larger of their measured / priced
ratios: prices hold for photos and for the pixel-heavy classes alike, rounded up rather than
down. PNG, WebP and GIF are made here with Pillow; arithmetic-coded JPEG, which Pillow cannot
write, comes as files (``references/``: libjpeg-turbo 2.1.5's ``jpegtran -arithmetic`` of
Pillow's JPEGs of the same photo and strip). The record holds for one signature (CPU model and
flags, the decoders and their versions, the factors and references): any change measures again.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import struct
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, features

from clip_gateway.config.machine import cpu_flags, cpu_model
from clip_gateway.imaging import paths, work
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from clip_gateway.model.calibration import photo
from clip_gateway.pipeline.cputime import own_cpu_s, watch_collections

log = logging.getLogger(__name__)

RECORD = "decode-speed.json"
#: A coding's speed stays within these multiples of the factors (admission's learned rates do
#: too): a measurement gone wrong cannot make decodes free, nor every photo unaffordable.
BOUNDS = (0.25, 8.0)
#: Decodes of each reference file; the fastest counts (an interrupt or a cold cache is not the
#: file's cost).
REPEATS = 3
#: Bumped when the reference files change (part of the signature, with the factors).
REFERENCES_VERSION = 1
#: The plan the references are decoded and priced under (the default model's).
OPTIONS = DecodeOptions(size=224, max_pixels=100_000_000, max_bytes=64 << 20)
PHOTO = (512, 384)
STRIP = (224, 8000)  # a JPEG strip: no DCT scaling, every scan at full size (issue 31's class)
FLAT = (2000, 1500)  # PNG, WebP, GIF: per-pixel work first
FLAT_COLOUR = (90, 120, 150)


@dataclass(frozen=True)
class DecodeSpeed:
    """Per coding, this machine's decode CPU seconds per second of the factors' price."""

    speeds: dict[str, float]
    #: what the record is valid for (``signature``)
    signature: dict[str, Any]
    #: per coding and reference: bytes, measured and priced milliseconds
    references: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: CPU seconds the measurement took (making the references and decoding them)
    seconds: float = 0.0

    def summary(self) -> str:
        return ", ".join(f"{coding} {speed:.2f}x" for coding, speed in self.speeds.items())


def references() -> dict[str, dict[str, bytes]]:
    """Per coding (every one the factors price), its reference files by name."""
    image = photo(*PHOTO, seed=1)
    strip = Image.new("RGB", STRIP, FLAT_COLOUR)
    flat = Image.new("RGB", FLAT, FLAT_COLOUR)
    pixels = np.asarray(image)
    folder = resources.files(__package__) / "references"
    files = {
        "jpeg-baseline": {"photo": _encode(image, "JPEG", quality=90),
                          "strip": _encode(strip, "JPEG")},
        "jpeg-progressive": {"photo": _encode(image, "JPEG", quality=90, progressive=True),
                             "strip": _encode(strip, "JPEG", progressive=True)},
        "jpeg-arithmetic": {"photo": (folder / "photo-arithmetic.jpg").read_bytes(),
                            "strip": (folder / "strip-arithmetic.jpg").read_bytes()},
        "jpeg-arithmetic-progressive": {
            "photo": (folder / "photo-arithmetic-progressive.jpg").read_bytes(),
            "strip": (folder / "strip-arithmetic-progressive.jpg").read_bytes()},
        "png": {"photo": _encode(image, "PNG"), "flat": _encode(flat, "PNG")},
        "png-16bit": {"photo": png(pixels.astype(np.uint16) * 257)},
        "png-interlaced": {"photo": png(pixels, interlaced=True)},
        "gif": {"photo": _encode(image.convert("P"), "GIF"),
                "flat": _encode(flat.convert("P"), "GIF")},
    }  # fmt: skip
    if "webp-lossy" in codings():
        files["webp-lossy"] = {
            "photo": _encode(image, "WEBP", quality=80),
            "flat": _encode(flat, "WEBP", quality=80),
        }
        files["webp-lossless"] = {
            "photo": _encode(image, "WEBP", lossless=True),
            "flat": _encode(flat, "WEBP", lossless=True),
        }
    return files


def codings() -> set[str]:
    """The codings measured here: every one admission prices, less WebP where this Pillow was
    built without libwebp (pillow-simd built on a host without its headers), which neither
    decodes WebP nor writes the references; admission keeps the factors' price (speed 1.0) for
    a coding not measured."""
    found = set(work.FACTORS)
    return found if paths.pillow_reads("webp") else {c for c in found if not c.startswith("webp")}


def measure() -> DecodeSpeed:
    """Every coding's speed here, from its reference files."""
    started = time.thread_time()
    found: dict[str, dict[str, dict[str, float]]] = {}
    speeds: dict[str, float] = {}
    for coding, files in references().items():
        speeds[coding], found[coding] = speed(coding, files)
    return DecodeSpeed(speeds, signature(), found, round(time.thread_time() - started, 3))


def speed(coding: str, files: dict[str, bytes]) -> tuple[float, dict[str, dict[str, float]]]:
    """One coding's speed here (the largest measured / priced of ``files``, within ``BOUNDS``),
    and each file's bytes, measured and priced milliseconds."""
    found: dict[str, dict[str, float]] = {}
    watch_collections()
    out = np.empty((OPTIONS.size, OPTIONS.size, 3), np.uint8)
    for name, data in files.items():
        priced = work.estimate(data, plan=OPTIONS.plan)
        assert priced.coding == coding, (coding, name, priced.coding)
        measured = math.inf
        for _ in range(REPEATS):  # as a worker decodes it: given the price admission made
            start = own_cpu_s()  # as the meter counts it: no collector's time
            preprocess(data, out, OPTIONS, priced)
            measured = min(measured, own_cpu_s() - start)
        found[name] = {"bytes": len(data), "measured_ms": round(measured * 1e3, 3),
                       "priced_ms": round(priced.seconds * 1e3, 3)}  # fmt: skip
    ratio = max(row["measured_ms"] / row["priced_ms"] for row in found.values())
    return round(min(max(ratio, BOUNDS[0]), BOUNDS[1]), 3), found


def signature() -> dict[str, Any]:
    """What a measurement holds for: the CPU (its flags as a digest: hundreds of them), the
    decoders, the factors and the reference files."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    imaging = paths.current()
    libraries = {name: features.version(name) for name in ("libjpeg_turbo", "webp", "zlib")}
    factors = (sorted(work.FACTORS.items()), work.JPEG_OUTPUT_S_PER_PIXEL,
               work.RESIZE_S_PER_PIXEL, work.STANDARD_SCANS, work.STANDARD_DC_SCANS,
               REFERENCES_VERSION)  # fmt: skip
    return {"cpu": cpu_model(), "flags": flags, "decode": imaging.decode,
            "libraries": libraries,
            "factors": hashlib.sha256(repr(factors).encode()).hexdigest()[:16]}  # fmt: skip


def recorded(records: Sequence[Path], wanted: dict[str, Any]) -> tuple[DecodeSpeed, Path] | None:
    """The first record measured for exactly this signature, and where it is."""
    for record in records:
        try:
            found = DecodeSpeed(**json.loads(record.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if found.signature == wanted and set(found.speeds) == codings():
            return found, record
    return None


def keep(found: DecodeSpeed, records: Sequence[Path]) -> Path | None:
    """Write the measurement to the first of ``records`` that can be written (whole: another
    gateway starting meanwhile reads the old record or the new one); where it went."""
    text = json.dumps(asdict(found), indent=1)
    for record in records:
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=record.parent, prefix=f".{record.name}.",
                                             delete=False) as part:  # fmt: skip
                part.write(text)
            os.chmod(part.name, 0o644)  # as any file written here (a temporary one is 0600)
            os.replace(part.name, record)
            return record
        except OSError as exc:
            log.info("cannot keep the decode speed at %s (%s)", record, exc)
    return None


def for_this_machine(records: Sequence[Path]) -> tuple[DecodeSpeed, str]:
    """The speed recorded for this machine, else measured now and kept; and where it came from."""
    earlier = recorded(records, signature())
    if earlier is not None:
        found, record = earlier
        return found, f"measured here earlier, kept in {record}"
    found = measure()
    kept = keep(found, records)
    where = f"kept in {kept}" if kept else "not kept: the next start measures again"
    return found, f"measured now in {found.seconds:.2f} CPU-s, {where}"


def png(pixels: np.ndarray, *, interlaced: bool = False) -> bytes:
    """An RGB PNG of ``pixels`` (uint8, or uint16 for 16-bit samples), Adam7-interlaced if
    asked: what Pillow cannot write (it writes neither 16-bit colour nor interlaced files)."""
    height, width, _ = pixels.shape
    depth = 16 if pixels.dtype == np.uint16 else 8
    samples = pixels.astype(">u2") if depth == 16 else pixels
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    raw = bytearray()
    for x0, y0, dx, dy in passes:
        part = samples[y0::dy, x0::dx]
        if part.size:  # each row: filter type 0 (none), then its samples
            rows = np.ascontiguousarray(part).reshape(part.shape[0], -1).view(np.uint8)
            raw += np.hstack([np.zeros((len(rows), 1), np.uint8), rows]).tobytes()
    header = struct.pack(">IIBBBBB", width, height, depth, 2, 0, 0, int(interlaced))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw))
            + _chunk(b"IEND", b""))  # fmt: skip


#: Adam7's passes: (first column, first row, column step, row step).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))  # fmt: skip


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()

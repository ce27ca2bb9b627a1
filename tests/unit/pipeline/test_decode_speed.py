"""This machine's decode speed against the factors (pipeline/decode_speed.py): every coding
measured from reference files of its own, recorded for one signature and reused, a record
kept whole wherever it can be written. The verdicts are structural: what the speeds are is this
machine's business (the tests that hold prices to decodes use them: tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clip_gateway.imaging import containers, work
from clip_gateway.pipeline import decode_speed
from clip_gateway.pipeline.decode_speed import DecodeSpeed


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, bytes]]:
    return decode_speed.references()


def test_every_coding_the_factors_price_has_references_priced_as_that_coding(
    references: dict[str, dict[str, bytes]],
) -> None:
    assert set(references) == set(work.FACTORS)
    for coding, files in references.items():
        assert "photo" in files, coding  # an ordinary photo of the class, always
        for name, data in files.items():
            assert work.estimate(data, plan=decode_speed.OPTIONS.plan).coding == coding, name
    # the pixel-heavy member of each JPEG class decodes at full size (issue 31's strips)
    for coding in ("jpeg-baseline", "jpeg-progressive", "jpeg-arithmetic",
                   "jpeg-arithmetic-progressive"):  # fmt: skip
        strip = references[coding]["strip"]
        assert Image.open(io.BytesIO(strip)).size == decode_speed.STRIP
        assert work.scale(*decode_speed.STRIP, decode_speed.OPTIONS.plan) == 1


@pytest.mark.parametrize("interlaced", [False, True], ids=["16bit", "interlaced"])
def test_the_png_pillow_cannot_write_decodes_to_its_pixels(interlaced: bool) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)  # odd sides: every Adam7 pass
    source = pixels if interlaced else pixels.astype(np.uint16) * 257
    data = decode_speed.png(source, interlaced=interlaced)
    assert containers.png_header(data).coding == ("png-interlaced" if interlaced else "png-16bit")
    with Image.open(io.BytesIO(data)) as image:
        assert image.info.get("interlace", 0) == int(interlaced)
        np.testing.assert_array_equal(np.asarray(image.convert("RGB")), pixels)


@pytest.mark.slow
def test_a_codings_speed_is_its_dearest_reference_within_the_bounds(
    references: dict[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = references["gif"]
    speed, rows = decode_speed.speed("gif", files)
    assert set(rows) == set(files)
    ratios = [row["measured_ms"] / row["priced_ms"] for row in rows.values()]
    assert speed == round(min(max(max(ratios), 0.25), 8.0), 3)
    assert all(row["bytes"] == len(files[name]) for name, row in rows.items())
    # factors a thousand times too high or too low: held to the bounds, never 0 or unbounded
    per_pixel, per_byte = work.FACTORS["gif"]
    monkeypatch.setitem(work.FACTORS, "gif", (per_pixel * 1000, per_byte * 1000))
    assert decode_speed.speed("gif", files)[0] == decode_speed.BOUNDS[0]
    monkeypatch.setitem(work.FACTORS, "gif", (per_pixel / 1000, per_byte / 1000))
    assert decode_speed.speed("gif", files)[0] == decode_speed.BOUNDS[1]


def test_the_signature_changes_with_the_factors_the_cpu_and_the_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = decode_speed.signature()
    assert decode_speed.signature() == here
    per_block, per_byte = work.FACTORS["jpeg-progressive"]
    with monkeypatch.context() as patched:
        patched.setitem(work.FACTORS, "jpeg-progressive", (per_block * 2, per_byte))
        assert decode_speed.signature()["factors"] != here["factors"]
    with monkeypatch.context() as patched:
        patched.setattr(decode_speed, "REFERENCES_VERSION", decode_speed.REFERENCES_VERSION + 1)
        assert decode_speed.signature()["factors"] != here["factors"]
    with monkeypatch.context() as patched:
        patched.setattr(decode_speed, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512f"}))
        assert decode_speed.signature()["flags"] != here["flags"]
    monkeypatch.setattr(decode_speed, "cpu_model", lambda: "another CPU")
    assert decode_speed.signature()["cpu"] == "another CPU"


def found(speeds: dict[str, float] | None = None, **signature: str) -> DecodeSpeed:
    every = dict.fromkeys(work.FACTORS, 1.5) | (speeds or {})
    return DecodeSpeed(every, decode_speed.signature() | signature, {}, 0.5)


def test_a_record_is_used_only_for_its_signature_and_whole(tmp_path: Path) -> None:
    record = tmp_path / "decode-speed.json"
    here = decode_speed.signature()
    assert decode_speed.keep(found({"png": 2.0}), [record]) == record
    assert decode_speed.recorded([record], here) == (found({"png": 2.0}), record)
    assert decode_speed.recorded([record], here | {"cpu": "another CPU"}) is None
    partial = json.loads(record.read_text())
    del partial["speeds"]["gif"]  # a coding added since it was measured: measured again
    record.write_text(json.dumps(partial))
    assert decode_speed.recorded([record], here) is None
    for broken in ("", "{", "[]", '{"speeds": {}}'):
        record.write_text(broken)
        assert decode_speed.recorded([record], here) is None
    # the first record that holds for this signature, wherever it is
    elsewhere = tmp_path / "other" / "decode-speed.json"
    decode_speed.keep(found(), [elsewhere])
    assert decode_speed.recorded([record, elsewhere], here) == (found(), elsewhere)


def test_a_pillow_without_webp_measures_the_other_codings_and_reuses_that_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pillow-simd built on the GPU host had no libwebp: the first start wrote WebP references,
    # raised KeyError('WEBP') and every gateway exited before serving
    Image.init()
    monkeypatch.delitem(Image.OPEN, "WEBP")  # what a Pillow without libwebp lacks
    monkeypatch.delitem(Image.SAVE, "WEBP")
    without = set(work.FACTORS) - {"webp-lossy", "webp-lossless"}
    assert decode_speed.codings() == without
    assert set(decode_speed.references()) == without
    record = tmp_path / "decode-speed.json"
    here = decode_speed.signature()
    decode_speed.keep(found(), [record])  # every coding: not what this Pillow measures
    assert decode_speed.recorded([record], here) is None
    measured = DecodeSpeed(dict.fromkeys(without, 1.5), here, {}, 0.5)
    decode_speed.keep(measured, [record])
    assert decode_speed.recorded([record], here) == (measured, record)


def test_a_record_is_kept_in_the_first_place_that_can_be_written(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    wanted = tmp_path / "cache" / "decode-speed.json"
    assert decode_speed.keep(found(), [blocked / "decode-speed.json", wanted]) == wanted
    assert json.loads(wanted.read_text()) == dataclasses.asdict(found())
    assert [p.name for p in wanted.parent.iterdir()] == ["decode-speed.json"]  # no part left
    assert decode_speed.keep(found(), [blocked / "decode-speed.json"]) is None


@pytest.mark.slow
def test_measured_once_then_reused_from_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "decode-speed.json"
    first, source = decode_speed.for_this_machine([record])
    assert source.startswith("measured now in ") and source.endswith(f"kept in {record}")
    assert set(first.speeds) == set(work.FACTORS)
    assert all(decode_speed.BOUNDS[0] <= s <= decode_speed.BOUNDS[1] for s in first.speeds.values())
    assert set(first.references) == set(work.FACTORS) and first.seconds > 0

    def measure() -> DecodeSpeed:
        raise AssertionError("measured again")

    monkeypatch.setattr(decode_speed, "measure", measure)
    again, source = decode_speed.for_this_machine([record])
    assert (again, source) == (first, f"measured here earlier, kept in {record}")
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")
    monkeypatch.setattr(decode_speed, "measure", lambda: found())
    _, source = decode_speed.for_this_machine([unwritable / "decode-speed.json"])
    assert source.endswith("not kept: the next start measures again")

"""The INT8 calibration set is generated; its content decides the INT8 files and the quality gate's
figures, so it is pinned here: a change to the photo generator (shared with the benches,
clip_gateway/model/calibration.py ``photo``) or the captions must be deliberate (then also expect
the export's INT8 section to be quantized again: spec.py ``int8_code_version``)."""

from __future__ import annotations

import hashlib

from bench.harness import photos as bench_photos
from clip_gateway.export.int8 import PHOTOS, SEED, TEXTS
from clip_gateway.model import calibration

#: sha256 of the 48 calibration photos (size, then RGB bytes, in turn) for seed 0, as exported
#: before the generator was shared with bench/harness/photos.py.
PHOTOS_DIGEST = "cb568346b14fdec96153aa42e2ddcb7413f40abd4e0332517fa8a539c1a5caed"
#: sha256 of the 96 captions, newline-terminated.
TEXTS_DIGEST = "4f2ba1bb9bc5588098d792aee4d23ba3671ad11e2ba32a08d661e1feb6dd9620"


def test_the_calibration_photos_are_unchanged() -> None:
    digest = hashlib.sha256()
    for image in calibration.photos(PHOTOS, SEED):
        digest.update(repr(image.size).encode())
        digest.update(image.tobytes())
    assert (PHOTOS, SEED) == (48, 0)
    assert digest.hexdigest() == PHOTOS_DIGEST


def test_the_calibration_captions_are_unchanged() -> None:
    digest = hashlib.sha256()
    for text in calibration.texts(TEXTS, SEED):
        digest.update(text.encode() + b"\n")
    assert TEXTS == 96
    assert digest.hexdigest() == TEXTS_DIGEST


def test_the_benches_draw_from_the_same_generator() -> None:
    assert bench_photos.photo is calibration.photo
    width, height = calibration.PHOTO_SIZES[0]
    assert (
        bench_photos.photo(width, height, 3).tobytes()
        == calibration.photo(width, height, 3).tobytes()
    )

"""What the bulk job's workers send for each image (clip_gateway/bulk/work.py ``_prepare``): the
client SDK's compaction where it shrinks the work, the bytes as they are where it would only
re-encode them."""

from __future__ import annotations

import numpy as np
import simplejpeg

from clip_gateway.bulk import sources
from clip_gateway.bulk.work import Slot, _prepare
from clip_gateway.client.compact import CompactOptions

MODEL = {
    "image_size": 224,
    "preprocessing": {"resize_mode": "shortest", "interpolation": "bicubic"},
}


def noisy_jpeg(width: int, height: int, quality: int) -> bytes:
    pixels = np.random.default_rng(7).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return bytes(simplejpeg.encode_jpeg(pixels, quality=quality, colorsubsampling="444"))


def prepared(data: bytes, options: CompactOptions) -> bytes:
    slot = Slot(sources.Item("k", "p", data, None))
    (sent,) = _prepare([slot], options)
    assert isinstance(sent, bytes)
    return sent


def test_a_256_px_jpeg_goes_as_it_is_and_a_larger_photo_is_still_compacted() -> None:
    options = CompactOptions().for_model(MODEL)
    small = noisy_jpeg(256, 256, 100)
    assert len(small) > options.keep_bytes  # the SDK alone would decode and re-encode it
    assert prepared(small, options) == small
    large = noisy_jpeg(600, 448, 95)  # twice the model's side: decoded at a DCT scale
    height, width = simplejpeg.decode_jpeg_header(prepared(large, options))[:2]
    assert min(height, width) == 224  # shrunk to the model's side on the worker

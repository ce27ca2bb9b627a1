"""The pipeline as a library (pipeline/service.py), without HTTP: its own options, admission
carried by the reservation ``embed`` takes, typed items, and what ``capabilities`` says. On the
in-process fake backend (tests/fakes.py), a real thread pool and the real tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from clip_gateway.errors import InvalidText
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from clip_gateway.pipeline.items import ImageItem, TextItem
from clip_gateway.pipeline.service import EmbeddingService, PipelineOptions
from tests import samples
from tests.fakes import FakeBackend, embed

OPTIONS = PipelineOptions(request_timeout_s=10.0, decode_threads=2, horizon_s=5.0)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor


def test_embed_takes_the_items_admitted_on_its_reservation(
    pool: ThreadPoolExecutor, clip_tokenizer_file: Path
) -> None:
    fake = FakeBackend(tokenizer_file=str(clip_tokenizer_file))
    pipeline = EmbeddingService(fake, pool, OPTIONS)
    items = [ImageItem(samples.compact(0)), TextItem("a photo of a cat")]

    async def scenario() -> None:
        with pipeline.admit(None) as reservation:
            for item in items:
                reservation.add(item)
            assert pipeline.admission.backlog_s == 0  # priced as read, held only once complete
            reservation.body_read()
            assert pipeline.admission.backlog_s > 0
            result = await pipeline.embed(reservation, items, normalize=False)
        assert result.indices == (0, 1) and (result.images, result.texts) == (1, 1)
        pixels = np.empty((1, 224, 224, 3), np.uint8)
        options = DecodeOptions(
            size=224,
            max_pixels=OPTIONS.max_image_pixels,
            max_bytes=OPTIONS.max_image_bytes,
            max_decode_bytes=OPTIONS.max_decode_bytes,
            progressive_dc_only=OPTIONS.progressive_dc_only,
        )
        preprocess(samples.compact(0), pixels[0], options)
        np.testing.assert_allclose(result.vectors[0], embed(pixels, fake.weights)[0], atol=1e-6)
        assert pipeline.admission.backlog_s == 0  # released with the reservation
        assert fake.lent == 0 and fake.batches == 1

    asyncio.run(scenario())


def test_embed_refuses_items_its_reservation_never_admitted(pool: ThreadPoolExecutor) -> None:
    fake = FakeBackend()
    pipeline = EmbeddingService(fake, pool, OPTIONS)
    other = EmbeddingService(fake, pool, OPTIONS)
    items = [ImageItem(samples.compact(0))]

    async def scenario() -> None:
        with pipeline.admit(None) as empty, pytest.raises(RuntimeError, match="admitted"):
            await pipeline.embed(empty, items)
        with other.admit(None) as foreign:
            foreign.add(items[0])
            with pytest.raises(RuntimeError, match="admitted"):
                await pipeline.embed(foreign, items)
        assert fake.calls == []  # nothing reached the model

    asyncio.run(scenario())


def test_capabilities_say_what_the_model_embeds(
    pool: ThreadPoolExecutor, clip_tokenizer_file: Path, tmp_path: Path
) -> None:
    both = EmbeddingService(FakeBackend(tokenizer_file=str(clip_tokenizer_file)), pool, OPTIONS)
    images = EmbeddingService(FakeBackend(embed_dim=256), pool, OPTIONS)
    missing = EmbeddingService(FakeBackend(tokenizer_file=str(tmp_path / "gone.json")), pool,
                               OPTIONS)  # fmt: skip
    served = asyncio.run(both.capabilities())
    assert served.modalities == ("image", "text") and served.text_unavailable is None
    assert (served.model.embed_dim, served.model.image_size) == (512, 224)
    assert served.text is not None and served.text.tokenizer_kind == "clip_bpe"
    alone = asyncio.run(images.capabilities())
    assert alone.modalities == ("image",) and alone.model.embed_dim == 256
    assert alone.text_unavailable == (
        "this model embeds images only: the fake backend has no text model"
    )
    broken = asyncio.run(missing.capabilities())
    assert broken.modalities == ("image",) and broken.text is None
    assert broken.model.text is not None and broken.model.text.context_length == 77
    assert broken.text_unavailable is not None and "gone.json" in broken.text_unavailable


def test_a_text_holding_a_lone_surrogate_is_refused_naming_it_not_a_tokenizer_crash(
    pool: ThreadPoolExecutor, clip_tokenizer_file: Path
) -> None:
    """The edge never makes such a text (its charsets and JSON decoder refuse them), but the
    pipeline is a library too: the tokenizers raise TypeError on lone surrogates."""
    fake = FakeBackend(tokenizer_file=str(clip_tokenizer_file))
    pipeline = EmbeddingService(fake, pool, OPTIONS)
    items = [TextItem("a cat"), TextItem("a \ud800 cat")]

    async def scenario() -> None:
        with pipeline.admit(None) as reservation:
            for item in items:
                reservation.add(item)
            with pytest.raises(InvalidText, match="lone surrogate") as refused:
                await pipeline.embed(reservation, items)
        assert refused.value.index == 1
        skipped = pipeline.admit(None)
        with skipped:
            for item in items:
                skipped.add(item)
            result = await pipeline.embed(skipped, items, skip_invalid=True)
        assert result.indices == (0,)

    asyncio.run(scenario())

"""One contract, two implementations: the fake used by API tests must behave like Triton."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gateway.backend import InferenceBackend
from gateway.errors import BackendUnavailable
from gateway.triton_backend import TritonBackend
from tests.fakes import FakeBackend


@pytest.fixture(params=["fake", "triton"])
def make_backend(request, triton):
    def factory() -> InferenceBackend:
        if request.param == "fake":
            return FakeBackend(max_batch_size=32)
        return TritonBackend(triton.grpc_url, "clip_image")

    return factory


def run(coro):
    return asyncio.run(coro)


def test_model_info(make_backend) -> None:
    async def check():
        backend = make_backend()
        try:
            info = await backend.model_info()
            assert (info.image_size, info.embed_dim, info.max_batch_size) == (224, 512, 32)
            assert await backend.ready()
        finally:
            await backend.close()

    run(check())


def test_infer_shape_determinism_and_row_independence(make_backend) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (5, 224, 224, 3), dtype=np.uint8)

    async def check():
        backend = make_backend()
        try:
            whole = await backend.infer(pixels, deadline=time.monotonic() + 30)
            again = await backend.infer(pixels, deadline=time.monotonic() + 30)
            parts = await asyncio.gather(
                backend.infer(pixels[:2], deadline=time.monotonic() + 30),
                backend.infer(pixels[2:], deadline=time.monotonic() + 30),
            )
        finally:
            await backend.close()
        assert whole.shape == (5, 512) and whole.dtype == np.float32
        np.testing.assert_allclose(whole, again, atol=1e-6)
        np.testing.assert_allclose(whole, np.concatenate(parts), atol=1e-5)
        assert not np.allclose(whole[0], whole[1])  # content decides the row

    run(check())


def test_unreachable_backend_is_unavailable() -> None:
    async def check():
        backend = TritonBackend("127.0.0.1:1", "clip_image", info_timeout=1.0)
        try:
            assert not await backend.ready()
            with pytest.raises(BackendUnavailable):
                await backend.model_info()
            with pytest.raises(BackendUnavailable):
                await backend.infer(
                    np.zeros((1, 224, 224, 3), np.uint8), deadline=time.monotonic() + 1.0
                )
        finally:
            await backend.close()

    fake = FakeBackend()
    fake.is_ready = False
    run(check())

    async def check_fake():
        assert not await fake.ready()
        with pytest.raises(BackendUnavailable):
            await fake.model_info()

    run(check_fake())

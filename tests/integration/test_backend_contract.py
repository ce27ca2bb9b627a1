"""One contract, two implementations: the in-process fake the API tests use must behave like the
Triton backend, failures included. "triton" here is the real TritonBackend talking gRPC to a
real tritonserver that serves the control model (the same function and knobs as the fake);
"triton-shm" the same with shared-memory regions to lend, so every image batch it lends lies in
one and is sent by name."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from clip_gateway.backend.protocol import ImageBatch, InferenceBackend
from clip_gateway.backend.triton import TritonBackend
from clip_gateway.config.processes import reserve_port
from clip_gateway.errors import BackendFailed, BackendTimeout, BackendUnavailable
from tests.controlled import Control
from tests.fakes import FakeBackend

PIXELS = np.random.default_rng(0).integers(0, 256, (5, 224, 224, 3), dtype=np.uint8)
TOKENS = np.random.default_rng(1).integers(0, 49408, (5, 77), dtype=np.int32)


@dataclass
class Subject:
    """A backend and the knobs that make it misbehave, whichever kind it is."""

    make: Callable[[], InferenceBackend]  # called inside the event loop (gRPC aio needs one)
    set: Callable[..., None]  # set(mode="ok", hold=False)
    arrivals: Callable[[], int]


@pytest.fixture(params=["fake", "triton", "triton-shm", "triton-http", "triton-http-shm"])
def subject(request, control: Control, clip_tokenizer_file) -> Subject:
    if request.param == "fake":
        fake = FakeBackend(tokenizer_file=str(clip_tokenizer_file))

        def set_fake(mode: str = "ok", *, hold: bool = False) -> None:
            fake.mode = mode
            fake.hold() if hold else fake.release()

        return Subject(lambda: fake, set_fake, lambda: fake.arrivals)
    triton, _ = request.getfixturevalue("control_triton")
    regions = 2 if request.param.endswith("-shm") else 0
    # the inference calls over Triton's HTTP endpoint (the launcher's way), or over gRPC
    http_url = triton.http_url if "http" in request.param else None
    return Subject(
        lambda: TritonBackend(
            triton.grpc_url, "clip_image", shared_memory_regions=regions, http_url=http_url
        ),
        control.set,
        control.arrivals,
    )


async def embed(backend: InferenceBackend, pixels: np.ndarray, deadline: float) -> np.ndarray:
    """``pixels`` embedded the way the pipeline does it: written into a batch the backend
    lends, then run; the batch given back."""
    await backend.model_info()
    with backend.image_batch(len(pixels)) as batch:
        assert batch.pixels.shape == pixels.shape and batch.pixels.dtype == np.uint8
        batch.pixels[...] = pixels
        return await backend.embed_images(batch, deadline=deadline)


def run(subject: Subject, check: Callable[[InferenceBackend], Awaitable[Any]]) -> Any:
    async def body() -> Any:
        backend = subject.make()
        try:
            return await check(backend)
        finally:
            subject.set()
            await backend.close()

    return asyncio.run(body())


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def test_model_info_and_readiness(subject: Subject, clip_tokenizer_file) -> None:
    async def check(backend: InferenceBackend) -> None:
        info = await backend.model_info()
        assert (info.image_size, info.embed_dim, info.max_batch_size) == (224, 512, 32)
        assert info.text is not None and info.text_unavailable is None
        assert (info.text.context_length, info.text.max_batch_size) == (77, 32)
        assert info.text.tokenizer_file == str(clip_tokenizer_file)
        assert info.modalities == ("image", "text")
        assert await backend.ready()

    run(subject, check)


def test_text_rows_are_deterministic_and_independent(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        whole = await backend.embed_texts(TOKENS, deadline=soon())
        parts = await asyncio.gather(
            backend.embed_texts(TOKENS[:2], deadline=soon()),
            backend.embed_texts(TOKENS[2:], deadline=soon()),
        )
        assert whole.shape == (5, 512) and whole.dtype == np.float32
        np.testing.assert_allclose(whole, np.concatenate(parts), atol=1e-5)
        assert not np.allclose(whole[0], whole[1])

    run(subject, check)


def test_text_failures_are_the_same_errors(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        await backend.model_info()
        subject.set("error")
        with pytest.raises(BackendFailed, match="failing on purpose"):
            await backend.embed_texts(TOKENS[:1], deadline=soon())
        subject.set(hold=True)
        with pytest.raises(BackendTimeout):
            await backend.embed_texts(TOKENS[:1], deadline=soon(0.5))
        subject.set()
        assert (await backend.embed_texts(TOKENS[:1], deadline=soon())).shape == (1, 512)

    run(subject, check)


def test_rows_are_deterministic_and_independent(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        whole = await embed(backend, PIXELS, soon())
        again = await embed(backend, PIXELS, soon())
        parts = await asyncio.gather(
            embed(backend, PIXELS[:2], soon()), embed(backend, PIXELS[2:], soon())
        )
        assert whole.shape == (5, 512) and whole.dtype == np.float32
        np.testing.assert_array_equal(whole, again)
        np.testing.assert_allclose(whole, np.concatenate(parts), atol=1e-5)
        assert not np.allclose(whole[0], whole[1])  # content decides the row

    run(subject, check)


def test_fake_and_triton_compute_the_same_function(control_triton, clip_tokenizer_file) -> None:
    async def both() -> tuple[np.ndarray, ...]:
        triton = TritonBackend(control_triton[0].grpc_url, "clip_image")
        fake = FakeBackend(tokenizer_file=str(clip_tokenizer_file))
        try:
            return (
                await embed(fake, PIXELS, soon()),
                await embed(triton, PIXELS, soon()),
                await fake.embed_texts(TOKENS, deadline=soon()),
                await triton.embed_texts(TOKENS, deadline=soon()),
            )
        finally:
            await triton.close()

    fake, real, fake_text, real_text = asyncio.run(both())
    np.testing.assert_allclose(fake, real, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(fake_text, real_text, rtol=1e-5, atol=1e-5)


def test_a_failing_model_raises_backend_error(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        subject.set("error")
        with pytest.raises(BackendFailed, match="failing on purpose"):
            await embed(backend, PIXELS[:1], soon())

    run(subject, check)


def test_a_broken_engine_returns_nan_rows(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        subject.set("nan")
        assert np.isnan(await embed(backend, PIXELS[:2], soon())).all()
        subject.set("negate")
        subject_rows = await embed(backend, PIXELS[:2], soon())
        subject.set()
        np.testing.assert_allclose(subject_rows, -(await embed(backend, PIXELS[:2], soon())))

    run(subject, check)


def test_an_answer_past_the_deadline_is_a_backend_timeout(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        await backend.model_info()  # connected: the timeout below is the model's, not setup's
        subject.set(hold=True)
        with pytest.raises(BackendTimeout):
            await embed(backend, PIXELS[:1], soon(0.5))
        subject.set()
        assert (await embed(backend, PIXELS[:1], soon())).shape == (1, 512)

    run(subject, check)


def test_cancelling_a_call_leaves_the_backend_usable(subject: Subject) -> None:
    async def check(backend: InferenceBackend) -> None:
        await backend.model_info()
        subject.set(hold=True)
        arrived = subject.arrivals()
        call = asyncio.ensure_future(embed(backend, PIXELS[:1], soon()))
        # arrivals are counted by the model's own process (a file), not by an asyncio object
        while subject.arrivals() <= arrived:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        subject.set()
        assert (await embed(backend, PIXELS[:2], soon())).shape == (2, 512)

    run(subject, check)


@pytest.fixture(params=["fake", "triton", "triton-http"])
def make_unavailable(request) -> Iterator[Callable[[], InferenceBackend]]:
    if request.param == "fake":
        fake = FakeBackend()
        fake.mode = "unavailable"
        yield lambda: fake
        return
    nothing_there = reserve_port()  # reserved: nothing listens there
    url = f"127.0.0.1:{nothing_there.port}"
    http_url = f"http://{url}" if request.param == "triton-http" else None
    yield lambda: TritonBackend(url, "clip_image", info_timeout=2.0, http_url=http_url)
    nothing_there.release()


def test_an_unreachable_backend_is_unavailable(
    make_unavailable: Callable[[], InferenceBackend],
) -> None:
    async def check() -> None:
        unavailable = make_unavailable()
        try:
            assert not await unavailable.ready()
            with pytest.raises(BackendUnavailable):
                await unavailable.model_info()
            with pytest.raises(BackendUnavailable):
                await unavailable.embed_images(ImageBatch(PIXELS[:1].copy()), deadline=soon(2.0))
        finally:
            await unavailable.close()

    asyncio.run(check())


def test_a_batch_needs_the_model_known_and_its_rows_run_on_their_own(subject: Subject) -> None:
    """A batch is lent once the model is known (its size); rows of it run as batches of their
    own (one call's share when a request is split) and the rows kept after failed decodes run
    as the whole batch would."""

    async def check(backend: InferenceBackend) -> None:
        with pytest.raises(BackendUnavailable, match="model_info first"):
            backend.image_batch(5)
        await backend.model_info()
        whole = await embed(backend, PIXELS, soon())
        with backend.image_batch(5) as batch:
            batch.pixels[...] = PIXELS
            parts = await asyncio.gather(
                backend.embed_images(batch.rows(0, 2), deadline=soon()),
                backend.embed_images(batch.rows(2, 5), deadline=soon()),
            )
            np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-5)
            kept = await backend.embed_images(batch.keep([1, 3, 4]), deadline=soon())
            np.testing.assert_allclose(kept, whole[[1, 3, 4]], atol=1e-5)

    run(subject, check)


def test_a_lent_batch_is_sent_from_its_own_region(control_triton) -> None:
    """The gateway decodes into a region the backend lends (no copy on the event loop): the
    rows are the same as a plain batch's, no second region is made for it, the region goes
    back to the pool when the batch is left (on error too), and a batch larger than one call
    is a plain array."""

    async def check() -> None:
        backend = TritonBackend(control_triton[0].grpc_url, "clip_image", shared_memory_regions=2)
        try:
            await backend.model_info()
            expected = await backend.embed_images(ImageBatch(PIXELS.copy()), deadline=soon())
            with backend.image_batch(5) as lent:
                assert lent.region is not None and lent.pixels.shape == PIXELS.shape
                lent.pixels[...] = PIXELS
                got = await backend.embed_images(lent, deadline=soon())
                np.testing.assert_array_equal(got, expected)
                assert backend._pool is not None and len(backend._pool.created) == 1
                first = lent.region
            lent_again: list[ImageBatch] = []

            def fail_while_lent() -> None:
                with backend.image_batch(5) as again:
                    lent_again.append(again)
                    raise RuntimeError("a decode failed")

            with pytest.raises(RuntimeError):
                fail_while_lent()
            assert lent_again[0].region is first  # given back, and lent again
            with backend.image_batch(5) as after_error, backend.image_batch(1) as other:
                assert after_error.region is first and other.region is not first
            with backend.image_batch(33) as larger:
                assert larger.region is None  # more than one call's worth
        finally:
            await backend.close()

    asyncio.run(check())


def test_a_region_triton_already_holds_is_used_not_switched_off(control_triton) -> None:
    """A registration whose answer never came back (its request cancelled mid-flight) leaves
    Triton holding the region's name: the next use must send through it, not turn shared
    memory off for the worker's lifetime ("already in manager"). Concurrent first uses of one
    region register it once."""
    import tritonclient.grpc as grpcclient

    async def check() -> None:
        url = control_triton[0].grpc_url
        backend = TritonBackend(url, "clip_image", shared_memory_regions=2)
        try:
            await backend.model_info()
            with backend.image_batch(5) as lent:
                assert lent.region is not None
                region = lent.region
                with grpcclient.InferenceServerClient(url) as other:
                    other.register_system_shared_memory(
                        region.name, f"/{region.name}", region.byte_size
                    )
                lent.pixels[...] = PIXELS
                got = await backend.embed_images(lent, deadline=soon())
            assert backend._pool is not None and backend._pool.capacity == 2  # still on
            assert region.name in backend._registered
            plain = await backend.embed_images(ImageBatch(PIXELS.copy()), deadline=soon())
            np.testing.assert_array_equal(got, plain)
            with backend.image_batch(5) as first, backend.image_batch(5) as second:
                fresh = [b.region for b in (first, second) if b.region is not region]
                assert len(fresh) == 1 and fresh[0] is not None  # not registered yet
                first.pixels[...] = second.pixels[...] = PIXELS
                results = await asyncio.gather(  # three calls at once on each region
                    *(backend.embed_images(b, deadline=soon()) for b in (first, second) * 3)
                )
            for result in results:
                np.testing.assert_array_equal(result, plain)
            assert backend._pool.capacity == 2 and fresh[0].name in backend._registered
        finally:
            await backend.close()

    asyncio.run(check())


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_a_region_triton_forgot_costs_one_call_its_region_not_the_answer(
    control_triton, transport: str
) -> None:
    """Triton restarted (its registrations gone) under a worker that thinks its regions are
    registered: the call that finds out sends its batch in the message instead and gets the same
    rows, and the next call registers the region again and uses it."""
    import tritonclient.grpc as grpcclient

    async def check() -> None:
        triton = control_triton[0]
        http_url = triton.http_url if transport == "http" else None
        backend = TritonBackend(
            triton.grpc_url, "clip_image", shared_memory_regions=1, http_url=http_url
        )
        try:
            await backend.model_info()
            plain = await backend.embed_images(ImageBatch(PIXELS.copy()), deadline=soon())
            with backend.image_batch(5) as lent:
                assert lent.region is not None
                region = lent.region
                lent.pixels[...] = PIXELS
                np.testing.assert_array_equal(
                    await backend.embed_images(lent, deadline=soon()), plain
                )
            with grpcclient.InferenceServerClient(triton.grpc_url) as other:
                other.unregister_system_shared_memory(region.name)
            with backend.image_batch(5) as lent:
                assert lent.region is region
                lent.pixels[...] = PIXELS
                np.testing.assert_array_equal(
                    await backend.embed_images(lent, deadline=soon()), plain
                )
            assert region.name not in backend._registered  # found out, forgotten
            with backend.image_batch(5) as lent:
                lent.pixels[...] = PIXELS
                np.testing.assert_array_equal(
                    await backend.embed_images(lent, deadline=soon()), plain
                )
            assert region.name in backend._registered
            with grpcclient.InferenceServerClient(triton.grpc_url) as other:
                status = other.get_system_shared_memory_status(region.name, as_json=True)
            assert status["regions"][region.name]["name"] == region.name  # registered again
        finally:
            await backend.close()

    asyncio.run(check())

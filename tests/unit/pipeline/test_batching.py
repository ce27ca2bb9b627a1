"""A request's items decoded into one batch: order, per-item errors with their index, spans and
metrics. Real thread pool, real preprocessing, an in-memory span exporter."""

from __future__ import annotations

import asyncio
import base64
import gc
import io
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from PIL import Image

from bench.harness.photos import jpeg as jpeg_bytes
from bench.harness.photos import photo
from clip_gateway.errors import (
    EmbeddingError,
    InvalidImage,
    LimitExceeded,
    Overspent,
    UnsupportedFormat,
)
from clip_gateway.imaging import work
from clip_gateway.imaging.preprocess import Decoded, DecodeOptions, preprocess
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline import batching, cputime
from clip_gateway.pipeline.batching import BatchDecoder, DecodedBatch, DecodeSample, Meter
from clip_gateway.pipeline.fair import FairExecutor, Flow
from clip_gateway.pipeline.items import ImageItem, item_bytes
from tests import samples

T = TypeVar("T")
OPTIONS = DecodeOptions(size=224, max_pixels=40_000_000, max_bytes=16 << 20)
JPEG, PNG = samples.compact(0), samples.png(1)


def image(value: bytes | str) -> ImageItem:
    """An item as the parsers make it: raw bytes (multipart) or base64 text (JSON)."""
    return ImageItem(value) if isinstance(value, bytes) else ImageItem.from_base64(value)


def expected(data: bytes, options: DecodeOptions = OPTIONS) -> tuple[np.ndarray, Decoded]:
    out = np.zeros((options.size, options.size, 3), np.uint8)
    return out, preprocess(data, out, options)


class CountingPool(ThreadPoolExecutor):
    """A real thread pool that counts the tasks it was given."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.tasks = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        self.tasks += 1
        return super().submit(fn, *args, **kwargs)


class Harness:
    def __init__(self, workers: int) -> None:
        self.pool = CountingPool(workers)
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.metrics = Metrics()
        self.decoder = BatchDecoder(self.pool, provider.get_tracer("test"), self.metrics)

    def decode(
        self,
        items: Sequence[bytes | str | ImageItem],
        *,
        skip: bool,
        options: DecodeOptions = OPTIONS,
    ) -> DecodedBatch:
        typed = [i if isinstance(i, ImageItem) else image(i) for i in items]
        return asyncio.run(self.decoder.decode(typed, options, skip_invalid=skip))  # fmt: skip

    def spans(self) -> dict[str, ReadableSpan]:
        return {span.name: span for span in self.exporter.get_finished_spans()}

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(workers=2)
    yield h
    h.pool.shutdown()


@pytest.fixture
def serial() -> Iterator[Harness]:
    """One worker: the images are decoded one after the other, in submission order."""
    h = Harness(workers=1)
    yield h
    h.pool.shutdown()


# --- item_bytes -----------------------------------------------------------------------------


def test_item_bytes_passes_raw_bytes_through_and_decodes_base64_strictly() -> None:
    assert item_bytes(image(b"\x00raw,data:")) == b"\x00raw,data:"
    assert item_bytes(image(base64.b64encode(JPEG).decode())) == JPEG
    assert item_bytes(image("data:image/jpeg;base64," + base64.b64encode(JPEG).decode())) == JPEG
    assert item_bytes(image("data:;base64,QUJD")) == b"ABC"  # media type is optional in a data: URI


@pytest.mark.parametrize(
    "item", ["data:image/png,QUJD", "data:image/png;base64", "data:image/png;charset=x,QUJD"]
)
def test_data_uri_must_be_base64(item: str) -> None:
    with pytest.raises(InvalidImage) as raised:
        item_bytes(image(item))
    assert raised.value.reason == "data: URI must be base64-encoded (data:image/jpeg;base64,...)"


@pytest.mark.parametrize(
    "item",
    ["QUJ", "QU J", "QUJD!", "data:image/jpeg;base64,QU,JD", "data:image/jpeg;base64,é"],
    ids=["padding", "space-and-padding", "alphabet", "comma-in-payload", "non-ascii"],
)
def test_invalid_base64_is_an_invalid_image_saying_what_to_send(item: str) -> None:
    with pytest.raises(InvalidImage, match=r"^invalid base64: .*; send standard base64 \(RFC"):
        item_bytes(image(item))


@pytest.mark.parametrize("item", ["QU JD", "QUJD\r\n", "QU\nJD", "DATA:image/png;BASE64,QUJD"])
def test_line_breaks_and_spaces_are_allowed_and_the_data_uri_is_case_insensitive(
    item: str,
) -> None:
    assert item_bytes(image(item)) == b"ABC"


def test_url_safe_base64_is_refused_naming_the_alphabet() -> None:
    with pytest.raises(InvalidImage) as raised:
        item_bytes(image("QUJD-_8="))
    assert raised.value.reason.startswith(
        "base64 with - or _ (the URL-safe alphabet) is not accepted; send standard base64"
    )


# --- BatchDecoder ----------------------------------------------------------------------------


def test_every_item_lands_in_its_row(harness: Harness) -> None:
    items: list[bytes | str] = [
        JPEG,
        base64.b64encode(PNG).decode(),
        "data:image/jpeg;base64," + base64.b64encode(samples.compact(2)).decode(),
    ]
    batch = harness.decode(items, skip=False)
    assert batch.pixels.shape == (3, 224, 224, 3) and batch.pixels.dtype == np.uint8
    for row, data in enumerate([JPEG, PNG, samples.compact(2)]):
        pixels, decoded = expected(data)
        assert np.array_equal(batch.pixels[row], pixels)
        assert batch.image_facts[row] == decoded
    assert batch.indices == (0, 1, 2)
    assert batch.errors == ()
    # on the pool the decoder was given: unpriced, a millisecond an image, so two tasks (the
    # request spread over both threads), in order
    assert harness.pool.tasks == 2 == len(batching._chunks(3, None, 2))


def test_the_batch_has_the_requested_size(harness: Harness) -> None:
    options = DecodeOptions(size=64, max_pixels=40_000_000, max_bytes=16 << 20)
    batch = harness.decode([JPEG, PNG], skip=False, options=options)
    assert batch.pixels.shape == (2, 64, 64, 3)
    assert np.array_equal(batch.pixels[1], expected(PNG, options)[0])


def test_first_bad_item_fails_the_request_with_its_index(harness: Harness) -> None:
    with pytest.raises(InvalidImage) as raised:
        harness.decode([JPEG, PNG, b"not an image", b""], skip=False)
    assert raised.value.index == 2
    assert raised.value.reason.startswith("not an image")
    spans = harness.spans()
    assert set(spans) == {"preprocess"}  # failed before the good images were accounted for
    assert spans["preprocess"].status.status_code is StatusCode.ERROR


def test_each_error_keeps_its_own_type(harness: Harness) -> None:
    with pytest.raises(UnsupportedFormat) as raised:
        harness.decode([JPEG, b"BM" + b"\x00" * 50, b""], skip=False)
    assert raised.value.index == 1


def test_skip_invalid_keeps_the_good_rows_and_reports_the_bad_ones(harness: Harness) -> None:
    oversized = DecodeOptions(size=224, max_pixels=40_000_000, max_bytes=len(JPEG) + 10)
    items: list[bytes | str] = [b"", JPEG, "@@@", PNG, samples.png(2)]
    batch = harness.decode(items, skip=True, options=oversized)
    assert batch.indices == (1,)
    assert batch.pixels.shape == (1, 224, 224, 3)
    assert np.array_equal(batch.pixels[0], expected(JPEG)[0])
    assert batch.image_facts == (expected(JPEG)[1],)
    assert [(type(e), e.index) for e in batch.errors] == [
        (InvalidImage, 0),
        (InvalidImage, 2),
        (LimitExceeded, 3),
        (LimitExceeded, 4),
    ]
    assert batch.errors[0].reason == "empty image (0 bytes)"
    assert batch.errors[1].reason.startswith("invalid base64: ")
    assert harness.spans()["preprocess"].attributes["images.failed"] == 4


def test_skip_invalid_with_nothing_good(harness: Harness) -> None:
    batch = harness.decode([b"x", b"y"], skip=True)
    assert batch.pixels.shape == (0, 224, 224, 3)
    assert (batch.indices, batch.image_facts) == ((), ())
    assert [e.index for e in batch.errors] == [0, 1]
    spans = harness.spans()
    assert set(spans) == {"preprocess"}  # no pool.wait/decode spans without a decoded image
    assert spans["preprocess"].attributes["images.failed"] == 2
    assert harness.sample("gateway_images_total", format="jpeg") is None


def test_a_failure_outside_the_image_errors_is_still_the_images_fault(harness: Harness) -> None:
    """Whatever a decoder raises becomes a 422 for that item, never a 500 for the request."""
    bad = ImageItem(b64=bytearray(JPEG))  # type: ignore[arg-type]  # item_bytes: a TypeError
    batch = harness.decode([JPEG, bad], skip=True)
    (error,) = batch.errors
    assert isinstance(error, InvalidImage) and isinstance(error, EmbeddingError)
    assert error.index == 1
    assert error.reason.startswith("cannot decode image: TypeError: ")
    # kept without its traceback and cause: their frames held the image and the decoder's
    # buffers until a full garbage collection
    assert error.__cause__ is None and error.__traceback__ is None
    assert error.__context__ is None and error.__suppress_context__  # as `raise ... from None`


def test_spans_describe_the_decoded_images(harness: Harness) -> None:
    png = samples.png(3)
    harness.decode([JPEG, b"", png, JPEG], skip=True)
    spans = harness.spans()
    assert set(spans) == {"preprocess", "pool.wait", "decode"}
    attributes = dict(spans["preprocess"].attributes)
    assert attributes == {
        "images": 3,
        "image.bytes": 2 * len(JPEG) + len(png),
        "image.source_pixels": 2 * 341 * 256 + 640 * 480,
        "image.decoded_pixels": 2 * 341 * 256 + 640 * 480,
        "image.formats": ("jpeg", "png"),
        "images.failed": 1,
    }
    parent = spans["preprocess"].context.span_id
    for name in ("pool.wait", "decode"):
        assert spans[name].parent is not None and spans[name].parent.span_id == parent


def test_worker_spans_are_laid_out_from_the_worker_clocks(serial: Harness) -> None:
    serial.decode([JPEG], skip=False)
    spans = serial.spans()
    wait, decode, outer = spans["pool.wait"], spans["decode"], spans["preprocess"]
    # one image: the wait ends where its decode starts, and the decode span is its decode time
    assert wait.end_time == decode.start_time
    assert outer.start_time <= wait.start_time <= wait.end_time <= decode.end_time
    assert decode.end_time <= outer.end_time
    assert wait.attributes["pool.wait_max_ms"] == (wait.end_time - wait.start_time) / 1e6
    assert decode.attributes["decode.cpu_ms"] == (decode.end_time - decode.start_time) / 1e6


def test_worker_spans_sum_and_max_over_images(serial: Harness) -> None:
    """One worker decodes the two images back to back: the second waits for the first."""
    serial.decode([JPEG, JPEG], skip=False)
    spans = serial.spans()
    wait, decode = spans["pool.wait"], spans["decode"]
    assert wait.end_time == decode.start_time  # the first image's start
    wait_max_ns = wait.attributes["pool.wait_max_ms"] * 1e6
    cpu_ns = decode.attributes["decode.cpu_ms"] * 1e6
    # the later start (of image 2) is after image 1 finished; the span covers both decodes
    assert wait_max_ns > wait.end_time - wait.start_time
    assert 0 < cpu_ns <= decode.end_time - decode.start_time
    assert wait.start_time + wait_max_ns < decode.end_time


def test_metrics_count_decoded_images_per_format(harness: Harness) -> None:
    harness.decode([JPEG, PNG, b"junk", JPEG], skip=True)
    assert harness.sample("gateway_images_total", format="jpeg") == 2
    assert harness.sample("gateway_images_total", format="png") == 1
    assert harness.sample("gateway_image_decode_seconds_count", format="jpeg") == 2
    assert harness.sample("gateway_image_decode_seconds_count", format="png") == 1


def test_decode_histogram_observes_the_worker_time_in_seconds(serial: Harness) -> None:
    serial.decode([PNG], skip=False)
    decode = serial.spans()["decode"]  # one image: the span is exactly its decode interval
    seconds = serial.sample("gateway_image_decode_seconds_sum", format="png")
    assert seconds == (decode.end_time - decode.start_time) / 1e9


def test_decodes_into_the_array_it_is_given(harness: Harness) -> None:
    """A backend may lend the memory it sends from (a shared-memory region): every row is
    written there and, when all decoded, that very array is the batch."""
    out = np.zeros((2, 224, 224, 3), np.uint8)
    batch = asyncio.run(
        harness.decoder.decode([image(JPEG), image(PNG)], OPTIONS, skip_invalid=False, out=out)
    )
    assert batch.pixels is out
    np.testing.assert_array_equal(out[0], expected(JPEG)[0])
    np.testing.assert_array_equal(out[1], expected(PNG)[0])


def test_a_cancelled_decode_returns_only_once_running_work_stopped_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelling a request cancels its queued decodes, but one already running writes into the
    batch until it ends: the cancellation waits for it, so lent memory is not lent again while
    a thread still writes to it."""
    import threading

    started, proceed = threading.Event(), threading.Event()

    def slow(
        data: bytes, out: np.ndarray, options: DecodeOptions, priced: object, **_: bool
    ) -> object:
        started.set()
        proceed.wait(30)
        out[...] = 7
        return preprocess(JPEG, np.empty_like(out), options)

    monkeypatch.setattr(batching, "preprocess", slow)
    h = Harness(workers=1)
    out = np.zeros((3, 224, 224, 3), np.uint8)

    async def scenario() -> bool:
        jpegs = [image(JPEG)] * 3
        task = asyncio.ensure_future(h.decoder.decode(jpegs, OPTIONS, skip_invalid=False, out=out))
        while not started.is_set():  # noqa: ASYNC110 - a worker thread's event
            await asyncio.sleep(0.005)
        task.cancel()
        for _ in range(20):  # the cancellation is pending while the decode runs
            await asyncio.sleep(0.005)
        pending = not task.done()
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pending

    try:
        assert asyncio.run(scenario())
        assert (out[0] == 7).all()  # the running decode finished before decode() returned
        # the queued task never ran; the running one started no image after the cancellation
        assert not out[1:].any() and h.pool.tasks == 2
    finally:
        proceed.set()
        h.pool.shutdown()


def test_each_batch_tells_admission_what_its_decodes_cost() -> None:
    """Per coding: (thread CPU seconds, header price, images) of the images that decoded, once
    per batch, with the encoded bytes and decoded pixels; the CPU time is within the decode
    span's wall time. A batch with failures asks for a trim (pixels -1) and teaches nothing."""
    told: list[tuple[object, int, int]] = []
    h = Harness(workers=2)
    h.decoder = BatchDecoder(h.pool, h.decoder._tracer, h.metrics,
                             on_decoded=lambda *a: told.append(a))  # fmt: skip
    try:
        result = h.decode([JPEG, b"not an image", PNG], skip=True)
        assert len(result.image_facts) == 2
        failed, (samples_, encoded, pixels) = told
        assert failed == ((), 0, -1)
        by_format = {s.coding.split("-")[0]: s for s in samples_}
        assert {s.coding for s in samples_} == {result.image_facts[0].work.coding, "png"}
        assert set(by_format) == {"jpeg", "png"}
        assert all(s.items == 1 and s.priced_s > 0 for s in samples_)
        assert by_format["png"].priced_s == result.image_facts[1].work.seconds
        assert encoded == len(JPEG) + len(PNG)
        assert pixels == sum(d.decoded_pixels for d in result.image_facts) > 0
        cpu_s = sum(s.cpu_seconds for s in samples_)
        wall_s = h.spans()["decode"].attributes["decode.cpu_ms"] / 1e3
        assert 0 < cpu_s <= wall_s * 1.01 + 1e-3  # thread CPU time: never more than its wall
        told.clear()
        assert not h.decode([b"not an image"], skip=True).image_facts  # nothing decoded...
        assert told == [((), 0, -1)]  # ...nothing to learn from, a trim asked for
    finally:
        h.pool.shutdown()


# --- the decode meter ------------------------------------------------------------------------


def decode_metered(
    decoder: BatchDecoder,
    items: Sequence[bytes],
    meter: Meter | None,
    *,
    indices: Sequence[int] | None = None,
    out: np.ndarray | None = None,
) -> DecodedBatch:
    """A decode bounded in time: a decode that never reports back fails the test, not hangs it."""

    async def bounded() -> DecodedBatch:
        async with asyncio.timeout(60):
            typed = [image(data) for data in items]
            return await decoder.decode(
                typed, OPTIONS, skip_invalid=False, indices=indices, out=out, meter=meter
            )

    return asyncio.run(bounded())


def test_a_meter_adds_up_what_was_spent_and_is_over_only_past_its_budget() -> None:
    meter = Meter(priced_s=0.2, budget_s=0.5)
    assert (meter.priced_s, meter.budget_s, meter.spent_s, meter.over) == (0.2, 0.5, 0.0, False)
    meter.spend(0.25)
    meter.spend(0.25)
    assert meter.spent_s == 0.5 and not meter.over  # spending all of the budget is allowed
    meter.spend(0.125)
    assert meter.spent_s == 0.625 and meter.over


def test_a_request_over_its_budget_decodes_nothing_more_and_is_told_where_it_stopped(
    harness: Harness,
) -> None:
    """The error names the first item not decoded (in request numbering) and the figures a
    client reads, in CPU seconds: three decimals in the text, four in the problem's fields."""
    meter = Meter(priced_s=0.0345678, budget_s=0.0123456)
    meter.spend(0.1)
    meter.spend(0.0434567)
    out = np.zeros((3, 224, 224, 3), np.uint8)
    with pytest.raises(Overspent) as raised:
        decode_metered(harness.decoder, [JPEG, PNG, JPEG], meter, indices=[3, 5, 8], out=out)
    error = raised.value
    assert error.index == 3
    assert error.reason == (
        "decoding stopped at item 3: this request's images were priced at 0.035 CPU-s and had "
        "spent 0.143, over 0.012 (the gateway has learned from it: a retry is priced higher)"
    )
    assert error.extra == {"priced_s": 0.0346, "spent_s": 0.1435, "budget_s": 0.0123}
    assert meter.spent_s == 0.1 + 0.0434567  # nothing was decoded, so nothing more spent
    assert not out.any() and harness.pool.tasks == 3  # each task gave its thread straight back
    assert set(harness.spans()) == {"preprocess"}
    assert harness.sample("gateway_images_total", format="jpeg") is None


def test_a_request_that_spends_its_budget_mid_batch_stops_there_and_still_teaches(
    serial: Harness,
) -> None:
    """One worker: the first image decodes and spends (thread CPU time, over a zero budget),
    the next ones are not started; what the first did spend is observed all the same."""
    told: list[tuple[Sequence[DecodeSample], int, int]] = []
    serial.decoder = BatchDecoder(serial.pool, serial.decoder._tracer, serial.metrics,
                                  on_decoded=lambda *a: told.append(a))  # fmt: skip
    meter = Meter(priced_s=0.5, budget_s=0.0)
    out = np.zeros((3, 224, 224, 3), np.uint8)
    with pytest.raises(Overspent) as raised:
        decode_metered(serial.decoder, [JPEG, PNG, JPEG], meter, indices=[2, 4, 6], out=out)
    assert raised.value.index == 4
    assert raised.value.reason.startswith("decoding stopped at item 4: ")
    assert meter.spent_s > 0
    assert raised.value.extra["spent_s"] == round(meter.spent_s, 4)
    pixels, decoded = expected(JPEG)
    np.testing.assert_array_equal(out[0], pixels)
    assert not out[1:].any()
    ((samples_, encoded, decoded_pixels),) = told
    (sample,) = samples_
    assert (sample.coding, sample.priced_s, sample.items) == (
        decoded.work.coding,
        decoded.work.seconds,
        1,
    )
    assert sample.cpu_seconds == meter.spent_s  # the one decode is all the meter counted
    assert (encoded, decoded_pixels) == (len(JPEG), decoded.decoded_pixels)
    assert set(serial.spans()) == {"preprocess", "pool.wait", "decode"}
    assert serial.sample("gateway_images_total", format="jpeg") == 1
    assert serial.sample("gateway_images_total", format="png") is None


def test_request_indices_name_the_rows_and_the_errors(harness: Harness) -> None:
    """A decode of some of a request's items (the others are texts, or cached) numbers each
    row and error as the request does."""
    batch = asyncio.run(
        harness.decoder.decode(
            [image(JPEG), image(b""), image(PNG)], OPTIONS, skip_invalid=True, indices=[10, 11, 12]
        )
    )
    assert (batch.indices, batch.rows) == ((10, 12), (0, 2))
    assert [e.index for e in batch.errors] == [11]


def test_a_bug_or_memory_error_in_a_decode_fails_the_request_even_in_skip_mode(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the image errors are reported per item; anything else is not the image's answer."""

    def short_of_memory(
        data: bytes, out: np.ndarray, options: DecodeOptions, priced: object, **_: bool
    ) -> Decoded:
        if data == PNG:
            raise MemoryError("decoder buffer")
        return preprocess(data, out, options)

    monkeypatch.setattr(batching, "preprocess", short_of_memory)
    with pytest.raises(MemoryError, match=r"^decoder buffer$"):
        harness.decode([JPEG, PNG, b"not an image"], skip=True)


class RecordingFairExecutor(FairExecutor):
    """The gateway's fair pool, noting the flow and price each task was queued with."""

    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.queued_as: list[tuple[Flow, float]] = []

    def submit_to(
        self, flow: Flow, cost: float, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> Future[T]:
        self.queued_as.append((flow, cost))
        return super().submit_to(flow, cost, fn, *args, **kwargs)


def test_on_the_fair_pool_a_request_is_one_flow_each_image_its_share_of_the_price() -> None:
    """Each request its own flow; each image costs the request's price over its images (a
    millisecond when unpriced), so another client's photo is not queued behind all of them."""
    pool = RecordingFairExecutor(2)
    decoder = BatchDecoder(pool, TracerProvider().get_tracer("test"), Metrics())
    try:
        batch = decode_metered(decoder, [JPEG, PNG, JPEG], Meter(priced_s=0.75, budget_s=10.0))
        assert batch.indices == (0, 1, 2)
        for row, data in enumerate([JPEG, PNG, JPEG]):
            np.testing.assert_array_equal(batch.pixels[row], expected(data)[0])
        priced, pool.queued_as = pool.queued_as, []
        unpriced = decode_metered(decoder, [PNG, JPEG], None)
        np.testing.assert_array_equal(unpriced.pixels[1], expected(JPEG)[0])
    finally:
        pool.shutdown()
    assert [cost for _, cost in priced] == [0.25, 0.25, 0.25]
    assert [cost for _, cost in pool.queued_as] == [1e-3, 1e-3]
    flows = {id(flow) for flow, _ in priced + pool.queued_as}
    assert len({id(flow) for flow, _ in priced}) == 1 and len(flows) == 2
    assert all(type(flow) is Flow for flow, _ in priced + pool.queued_as)


def test_decode_samples_sum_cpu_price_and_count_per_coding() -> None:
    """What admission learns from: per coding, the CPU seconds and header prices summed over
    the batch's images of that coding, and how many there were."""
    jpeg = expected(JPEG)[1]
    png_a, png_b = expected(PNG)[1], expected(samples.png(2))[1]
    timed = [
        batching._Timed(png_a, 0, 1, cpu_s=0.25),
        batching._Timed(jpeg, 0, 1, cpu_s=0.125),
        batching._Timed(png_b, 0, 1, cpu_s=0.5),
    ]
    assert batching._samples(timed) == [
        DecodeSample("png", 0.75, png_a.work.seconds + png_b.work.seconds, 2),
        DecodeSample(jpeg.work.coding, 0.125, jpeg.work.seconds, 1),
    ]


def test_a_decode_is_charged_its_own_cpu_time_not_what_its_thread_spent_before() -> None:
    """Pool threads live long: the meter and admission's sample get the CPU time between the
    decode's start and end, never the thread's running total (here 0.1 s spent before it)."""

    def in_a_thread_that_worked_before() -> tuple[float, float, float, float]:
        while time.thread_time() < 0.1:  # the thread's earlier work
            pass
        meter = Meter(priced_s=1.0, budget_s=10.0)
        out = np.zeros((OPTIONS.size, OPTIONS.size, 3), np.uint8)
        before = time.thread_time()
        timed = batching._decode_one(ImageItem(JPEG), out, OPTIONS, meter)
        return before, time.thread_time(), timed.cpu_s, meter.spent_s

    with ThreadPoolExecutor(1) as pool:
        before, after, cpu_s, spent_s = pool.submit(in_a_thread_that_worked_before).result()
    assert before >= 0.1
    assert cpu_s == spent_s  # what the meter counted is what admission learns from
    assert 0.0 <= spent_s <= after - before


@pytest.mark.parametrize(
    ("count", "priced_s", "threads", "runs"),
    [
        (32, 0.0064, 1, [(0, 10), (10, 20), (20, 30), (30, 32)]),  # 0.2 ms an image: 10 a task
        (32, 0.0064, 4, [(0, 8), (8, 16), (16, 24), (24, 32)]),  # a run for every thread
        (3, 0.75, 2, [(0, 1), (1, 2), (2, 3)]),  # a priced-over photo: one a task
        (1, 0.0001, 8, [(0, 1)]),
        (5, None, 1, [(0, 2), (2, 4), (4, 5)]),  # unpriced: a millisecond an image
        (0, 0.1, 1, []),
    ],
)
def test_a_requests_images_are_cut_into_runs_of_consecutive_priced_work(
    count: int, priced_s: float | None, threads: int, runs: list[tuple[int, int]]
) -> None:
    """At most ``CHUNK_S`` of priced work per pool task (one image at least), one task per
    thread at least, the images in order and each in exactly one run."""
    meter = None if priced_s is None else Meter(priced_s=priced_s, budget_s=1.0)
    assert batching._chunks(count, meter, threads) == runs


def test_each_image_is_decoded_with_the_price_admission_gave_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The price (with the header it walked) reaches the decode of its own image."""
    seen: list[tuple[bytes, object]] = []

    def recording(
        data: bytes, out: np.ndarray, options: DecodeOptions, priced: object, **_: bool
    ) -> object:
        seen.append((data, priced))
        return preprocess(data, out, options)

    monkeypatch.setattr(batching, "preprocess", recording)
    prices = [work.estimate(JPEG), None, work.estimate(samples.compact(5))]
    data = [JPEG, PNG, samples.compact(5)]
    pool = FairExecutor(1)
    decoder = BatchDecoder(pool, TracerProvider().get_tracer("test"), Metrics())
    try:
        asyncio.run(decoder.decode([image(d) for d in data], OPTIONS, skip_invalid=False,
                                   priced=prices))  # fmt: skip
    finally:
        pool.shutdown()
    in_order = sorted(seen, key=lambda pair: data.index(pair[0]))
    assert in_order == list(zip(data, prices, strict=True))


def test_a_collection_the_decode_happens_to_run_is_not_charged_to_it() -> None:
    """The collector runs in whichever thread allocates past its threshold, and a full
    collection walks the whole heap: on a loaded 2-core VM 40 ms, charged to a 1 ms decode of a
    request with a 20 ms budget (a spurious 429 decode-overspent). Here every allocation starts
    a collection, so the decode runs a full one over 200,000 objects; the meter gets the decode."""
    cells: list[list[object]] = []
    out = np.zeros((OPTIONS.size, OPTIONS.size, 3), np.uint8)
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        for _ in range(200_000):
            cell: list[object] = []
            cell.append(cell)
            cells.append(cell)
        meter = Meter(priced_s=1.0, budget_s=10.0)
        with ThreadPoolExecutor(1) as pool:  # a decoder watches the collector from the start
            BatchDecoder(pool, TracerProvider().get_tracer("test"), Metrics())
        collected, cpu = cputime.collected_s(), time.thread_time()
        gc.set_threshold(1, 1, 1)
        gc.enable()
        timed = batching._decode_one(ImageItem(JPEG), out, OPTIONS, meter)
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()
        cells.clear()
    spent, collected = time.thread_time() - cpu, cputime.collected_s() - collected
    assert collected > 5e-3  # a full collection ran inside the decode
    assert meter.spent_s == timed.cpu_s <= spent - collected + 1e-3
    assert meter.spent_s < collected / 3


def test_a_warm_up_decodes_every_file_in_every_thread_and_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each pool thread decodes each warm-up file once, and none of them fails: a warm-up that
    broke on its own files would be swallowed by its log line, and warm nothing."""
    import threading

    done: list[tuple[str, bytes]] = []

    def counted(data: bytes, out: np.ndarray, options: DecodeOptions) -> Decoded:
        decoded = preprocess(data, out, options)
        done.append((threading.current_thread().name, data))
        return decoded

    monkeypatch.setattr(batching, "preprocess", counted)
    with caplog.at_level("DEBUG"), ThreadPoolExecutor(2, thread_name_prefix="decode") as pool:
        asyncio.run(BatchDecoder(pool, TracerProvider().get_tracer("t"), Metrics()).warm(OPTIONS))
    assert "warm-up" not in caplog.text
    threads = {name for name, _ in done}
    assert len(threads) == 2
    assert all(name.startswith("decode_") for name in threads)  # the decoder's own pool
    for name in threads:
        assert [data for who, data in done if who == name] == list(batching._warm_files())


def test_a_decoder_that_fails_its_warm_up_never_stops_a_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Pillow built without one of the formats (or a decoder that breaks) is said in the log;
    the gateway starts, and a request of that format gets its 4xx as it would have."""
    tried: list[bytes] = []

    def failing(data: bytes, out: np.ndarray, options: DecodeOptions) -> Decoded:
        tried.append(data)
        raise OSError("decoder webp not available")

    monkeypatch.setattr(batching, "preprocess", failing)
    with ThreadPoolExecutor(1) as pool:
        asyncio.run(BatchDecoder(pool, TracerProvider().get_tracer("t"), Metrics()).warm(OPTIONS))
    assert len(tried) == 7
    assert caplog.text.count("decoder warm-up: OSError: decoder webp not available") == 7


def test_the_warm_up_decodes_each_format_photo_libraries_send() -> None:
    """A baseline and a progressive JPEG, a PNG, a WebP and a GIF, each a 64x48 photo, then
    JPEGs of the sizes requests carry: a compact upload and a preview, both resized down (the
    preview DCT-scaled in its decode), paths the small files never take."""
    files = batching._warm_files()
    codings = [work.estimate(data).coding for data in files]
    assert (
        codings
        == ["jpeg-baseline", "jpeg-progressive", "png", "webp-lossy", "gif"] + ["jpeg-baseline"] * 2
    )
    sizes = [Image.open(io.BytesIO(data)).size for data in files]
    assert sizes == [(64, 48)] * 5 + [(341, 256), (1440, 1080)]
    out = np.empty((OPTIONS.size, OPTIONS.size, 3), np.uint8)
    for data, (width, height) in zip(files, sizes, strict=True):
        decoded = preprocess(data, out, OPTIONS)
        assert (decoded.width, decoded.height) == (width, height)
        # decoded whole (and the two JPEGs downscaled), but for the preview: DCT-scaled
        assert (decoded.decoded_pixels < width * height) is (width == 1440)


# --- RowWrites: how a JPEG that is the model's input reaches its row --------------------------


def _square(seed: int) -> bytes:
    return jpeg_bytes(photo(224, 224, seed=seed), 85)


def test_row_writes_alternate_then_keep_the_way_with_the_lower_median() -> None:
    rows = batching.RowWrites()
    rows.WARMUP, rows.TRIALS = 2, 3
    for cpu in (9e-3, 1e-6):  # a new process's first images: not counted
        rows.record(False, cpu)
    assert [rows.next() for _ in range(3)] == [True] * 3  # nothing counted: no turn taken
    turns = []
    for into_cpu, copy_cpu in ((2.0e-4, 3.0e-4), (9.0e-4, 3.1e-4)):  # a slow outlier
        turns.append(rows.next())
        rows.record(True, into_cpu)
        turns.append(rows.next())
        rows.record(False, copy_cpu)
    assert turns == [True, False, True, False] and rows.choice is None
    assert rows.next() is True
    rows.record(True, 2.1e-4)
    assert rows.next() is False and rows.choice is None  # two of three copies so far
    rows.record(False, 2.9e-4)
    assert rows.choice is True and rows.medians_us == (210.0, 300.0)  # medians, not means
    assert [rows.next() for _ in range(4)] == [True] * 4
    rows.record(False, 1e-6)  # measured: no more samples
    assert rows.choice is True


def test_row_writes_keep_the_copy_when_it_costs_less() -> None:
    rows = batching.RowWrites()
    rows.WARMUP, rows.TRIALS = 0, 2
    for into, cpu in ((True, 4e-4), (False, 2e-4), (True, 5e-4), (False, 2.5e-4)):
        rows.record(into, cpu)
    assert rows.choice is False and [rows.next() for _ in range(3)] == [False] * 3


def test_the_decoder_measures_both_ways_on_squares_only_then_keeps_one(serial: Harness) -> None:
    """Centre squares alternate between libjpeg writing the row and a decode and copy (each
    timed in its decode thread), other images do not count; both ways give the same rows."""
    serial.decoder.rows.WARMUP, serial.decoder.rows.TRIALS = 0, 3
    squares = [_square(seed) for seed in range(6)]
    batch = serial.decode([JPEG, *squares[:3], PNG, *squares[3:]], skip=False)
    for row, data in enumerate([JPEG, *squares[:3], PNG, *squares[3:]]):
        assert np.array_equal(batch.pixels[row], expected(data)[0])
    ways = [facts.row for facts in batch.image_facts]
    assert ways[0] is None and ways[4] is None  # a compact JPEG and a PNG: resized, not rows
    assert sorted(w for w in ways if w is not None) == ["copy"] * 3 + ["into"] * 3
    rows = serial.decoder.rows
    assert rows.choice is not None and rows.medians_us is not None
    assert rows.choice == (rows.medians_us[0] <= rows.medians_us[1])
    again = serial.decode(squares, skip=False)
    assert {facts.row for facts in again.image_facts} == {"into" if rows.choice else "copy"}

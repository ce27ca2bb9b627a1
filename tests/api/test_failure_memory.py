"""A failed request's images are freed once it is answered, by reference counting alone: no
reference cycle through the failure's traceback keeps them until a full collection."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from clip_gateway.pipeline.items import ImageItem
from tests import hostile, samples
from tests.api.test_bad_input import post_images
from tests.api.test_immich import NAME, VISUAL, predict
from tests.fakes import FakeBackend


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off: only what reference counting frees is freed."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def items_alive() -> tuple[int, int]:
    """Image items still alive, and how many of them only a reference cycle holds."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        cyclic = sum(type(o) is ImageItem for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return sum(type(o) is ImageItem for o in gc.get_objects()), cyclic


def settled() -> tuple[int, int]:
    """``items_alive`` once the app's thread has finished unwinding the request (it may still
    be a step behind the response the client already has)."""
    for _ in range(200):
        alive, cyclic = items_alive()
        if cyclic or not alive:
            break
        time.sleep(0.01)
    return alive, cyclic


FAILURES: dict[str, tuple[Callable[[TestClient], httpx.Response], int]] = {
    "decode-refused": (
        lambda c: post_images(c, samples.compact(0), hostile.jpeg_many_segments()),
        422,
    ),
    "truncated": (lambda c: post_images(c, samples.compact(0), samples.truncated_jpeg()), 422),
    "unsupported": (lambda c: post_images(c, samples.compact(0), samples.bmp()), 415),
    "pixel-bomb": (lambda c: post_images(c, samples.claims_pixels(60000, 60000)), 422),
}


@pytest.mark.slow
@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failed_request_holds_no_images_once_answered(client: TestClient, failure: str) -> None:
    send, status = FAILURES[failure]
    assert send(client).status_code == status
    assert settled() == (0, 0)


@pytest.mark.slow
@pytest.mark.usefixtures("collector_off")
def test_a_failed_immich_predict_holds_no_image_once_answered(
    settings: ServerSettings, fake: FakeBackend
) -> None:
    on = settings.model_copy(update={"immich": True, "immich_aliases": (NAME,)})
    with TestClient(create_app(on, lambda *_: fake)) as client:
        assert predict(client, VISUAL, samples.truncated_jpeg()).status_code == 422
        assert settled() == (0, 0)

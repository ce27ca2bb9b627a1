"""The real app on the deterministic fake backend, through Litestar's test client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests.fakes import FakeBackend


@pytest.fixture
def fake(clip_tokenizer_file: Path) -> FakeBackend:
    return FakeBackend(max_batch_size=4, tokenizer_file=str(clip_tokenizer_file))


@pytest.fixture
def settings(decode_speed_here: dict[str, float]) -> ServerSettings:
    """A gateway's settings as its HTTP process would start it here: priced at this machine's
    decode speed (tests/conftest.py), so no decode's verdict rests on the factors alone."""
    return ServerSettings(
        decode_speed=decode_speed_here,
        max_items_per_request=16,
        max_body_bytes=2 << 20,
        max_image_bytes=1 << 20,
        max_image_pixels=30_000_000,
        decode_threads=2,
        model_aliases=("clip",),
        canary_interval_s=0,  # test_limits_and_keys.py turns it on where it is the subject
        admission_infer_s_per_image=0.01,
    )


@pytest.fixture
def client(settings: ServerSettings, fake: FakeBackend) -> Iterator[TestClient]:
    app = create_app(settings, lambda *_: fake)
    with TestClient(app) as test_client:
        yield test_client

"""Health, readiness, model listing and the OpenAPI document."""

from __future__ import annotations

import dataclasses
import inspect

import PIL
import pytest
from litestar.testing import TestClient

from tests.fakes import FakeBackend


def test_healthz_never_touches_the_backend(client: TestClient, fake: FakeBackend) -> None:
    fake.mode = "unavailable"
    touched = fake.touched
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert fake.touched == touched


def test_readyz_follows_the_backend(client: TestClient, fake: FakeBackend) -> None:
    assert client.get("/readyz").status_code == 200
    fake.mode = "unavailable"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["retry-after"] == "2"


def test_models_lists_the_served_model(client: TestClient, fake: FakeBackend) -> None:
    (entry,) = client.get("/v1/models").json()["data"]
    assert entry["id"] == "ViT-B-32"
    assert entry["object"] == "model"
    assert (entry["ready"], entry["embed_dim"], entry["image_size"]) == (True, 512, 224)
    assert entry["aliases"] == ["clip"]


def test_models_says_which_image_path_runs(client: TestClient) -> None:
    (entry,) = client.get("/v1/models").json()["data"]
    imaging = entry["imaging"]
    distribution = "pillow-simd" if imaging["simd"] else "pillow"
    assert imaging["resize"] == f"{distribution} {PIL.__version__}"
    assert imaging["decode"].startswith("JPEG: libjpeg-turbo")


def test_openapi_documents_both_request_forms_and_all_routes(client: TestClient) -> None:
    doc = client.get("/docs/openapi.json").json()
    assert {"/v1/embeddings", "/v1/models", "/healthz", "/readyz"} <= set(doc["paths"])
    operation = doc["paths"]["/v1/embeddings"]["post"]
    assert set(operation["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    json_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert json_schema["required"] == ["input"]
    assert set(operation["responses"]["200"]["content"]) == {
        "application/json",
        "application/octet-stream",
    }
    for status in ("400", "413", "415", "422", "503", "504"):
        assert "application/problem+json" in operation["responses"][status]["content"]
    params = {p["name"] for p in operation["parameters"]}
    assert {"dtype", "normalize"} <= params


def test_shutdown_closes_the_backend(settings, fake: FakeBackend) -> None:
    from clip_gateway.http.app import create_app

    with TestClient(create_app(settings, lambda *_: fake)) as client:
        assert client.get("/healthz").status_code == 200
    assert fake.closed


def test_no_traceresponse_when_tracing_is_off(client: TestClient) -> None:
    response = client.get("/healthz")
    assert "traceresponse" not in response.headers


def test_our_handlers_and_guards_never_hop_to_a_thread(client: TestClient) -> None:
    # Litestar runs a plain-function guard or handler in a worker thread: a thread hop per request
    # (the soak run caught the API-key guard doing that). Ours must all be coroutines.
    ours = [
        handler
        for route in client.app.routes
        for handler in getattr(route, "route_handlers", ())
        if handler.fn.__module__.startswith("clip_gateway.")
    ]
    assert {h.fn.__name__ for h in ours} >= {"create_embeddings", "healthz", "readyz", "metrics"}
    for handler in ours:
        assert inspect.iscoroutinefunction(handler.fn), handler.fn
        for guard in handler.resolve_guards():
            assert inspect.iscoroutinefunction(guard), guard


def test_models_shows_the_quantization_the_backend_reports(
    client: TestClient, fake: FakeBackend
) -> None:
    (entry,) = client.get("/v1/models").json()["data"]
    assert "quantization" not in entry  # the FP32 profiles say nothing
    reported = {"image": {"precision": "int8", "cosine_vs_fp32": {"mean": 0.9998}}}
    fake.info = dataclasses.replace(fake.info, quantization=reported)
    (entry,) = client.get("/v1/models").json()["data"]
    assert entry["quantization"] == reported


FROZEN = """
import gc
from litestar.testing import TestClient
from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests.fakes import FakeBackend
from tests import samples

fake = FakeBackend()
settings = ServerSettings(decode_threads=1, canary_interval_s=0, model_aliases=("clip",))
for freeze in (False, True):
    with TestClient(create_app(settings, lambda *_: fake, freeze_at_start=freeze)) as client:
        frozen = gc.get_freeze_count()
        answer = client.post("/v1/embeddings", files=[("image", ("a.jpg", samples.compact(0)))])
    print(frozen, answer.status_code, len(answer.json()["data"]))
"""


@pytest.mark.slow
def test_a_servers_worker_keeps_what_startup_made_out_of_the_collector() -> None:
    """A worker (``ServerConfig``) freezes its startup heap: the collector, which runs in
    whichever thread allocates (a decode's included), walks only what came after. An app made
    in-process (these tests) freezes nothing: its frozen cycles would never be freed."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FROZEN], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    unfrozen, frozen = ([int(word) for word in line.split()] for line in done.stdout.splitlines())
    assert unfrozen == [0, 200, 1]
    assert frozen[0] > 20_000 and frozen[1:] == [200, 1]

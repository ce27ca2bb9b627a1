"""Immich's failover, played from its server's side: its URL list (this gateway first, a
stand-in for Immich's full ML server second), its ``/ping`` availability check with a 2 s
timeout, healthy URLs first and "the next URL on any non-2xx or error"
(``server/src/repositories/machine-learning.repository.ts``). CLIP requests are served by the
real gateway (real Triton); faces and OCR fall through to the stand-in; text search is still
answered, with the same vector, when the gateway is stopped.

The one-URL setup (docs/IMMICH.md): Immich's list holds only the gateway, with Immich's ML
server (tests/immich_upstream.py, a process of its own) as the gateway's upstream; CLIP, faces and
OCR interleaved from several clients, then the upstream stopped, then the gateway. And an upstream
that stalls: what it can and cannot hold of the gateway.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import multipart
import numpy as np
import pytest

from bench.harness.photos import immich_preview
from clip_gateway.config.processes import GatewayProcess
from tests import immich_reference, reference
from tests.immich_upstream import FACES, OCR, UpstreamProcess
from tests.immich_upstream import answer as upstream_answer
from tests.integration.test_immich_parity import immich_gateway

NAME = "ViT-B-32__openai"
#: Immich's ``machineLearning.availabilityChecks.timeout`` is 2 s; the test allows more so that
#: a busy CI machine cannot turn a slow answer into a failure (no timed assertions).
PROBE_TIMEOUT_S = 30.0


class ImmichServer:
    """Immich's ``MachineLearningRepository``, in Python, URL for URL."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.healthy: dict[str, bool] = {}

    def tick(self) -> None:
        """The availability check Immich runs every ``interval`` on every URL."""
        for url in self.urls:
            try:
                ok = httpx.get(f"{url}/ping", timeout=PROBE_TIMEOUT_S).is_success
            except httpx.HTTPError:
                ok = False
            self.healthy[url] = ok

    def predict(self, entries: dict, **payload: Any) -> tuple[str, dict]:
        url, response = self.predict_raw(entries, **payload)
        return url, response.json()

    def predict_raw(self, entries: dict, **payload: Any) -> tuple[str, httpx.Response]:
        """``predict``: healthy URLs first, then the others; any non-2xx or error marks the
        URL unhealthy and tries the next; a success marks it healthy."""
        ordered = [u for u in self.urls if self.healthy.get(u)]
        ordered += [u for u in self.urls if not self.healthy.get(u)]
        files: list = [("entries", (None, json.dumps(entries)))]
        if "image" in payload:
            files.append(("image", ("blob", payload["image"], "application/octet-stream")))
        else:
            files.append(("text", (None, payload["text"])))
        for url in ordered:
            try:
                response = httpx.post(f"{url}/predict", files=files, timeout=120)
                if response.is_success:
                    self.healthy[url] = True
                    return url, response
            except httpx.HTTPError:
                pass
            self.healthy[url] = False
        raise RuntimeError(f"Machine learning request '{json.dumps(entries)}' failed for all URLs")

    def encode_image(self, image: bytes) -> tuple[str, np.ndarray]:
        url, answer = self.predict({"clip": {"visual": {"modelName": NAME}}}, image=image)
        return url, np.array(json.loads(answer["clip"]))

    def encode_text(self, text: str) -> tuple[str, np.ndarray]:
        entries = {"clip": {"textual": {"modelName": NAME, "options": {"language": "en"}}}}
        url, answer = self.predict(entries, text=text)
        return url, np.array(json.loads(answer["clip"]))

    def detect_faces(self, image: bytes) -> tuple[str, dict]:
        return self.predict(FACES, image=image)

    def ocr(self, image: bytes) -> tuple[str, dict]:
        return self.predict(OCR, image=image)


@dataclass
class StandIn:
    """Immich's full ML server, as far as this test needs: every task answered, CLIP with
    Immich's own pipeline (tests/immich_reference.py) on the same model and weights."""

    tokenizer_json: Path
    hits: list[str] = field(default_factory=list)
    url: str = ""

    def __call__(self, environ: dict, start: Callable[..., Any]) -> list[bytes]:
        if environ["PATH_INFO"] == "/ping":
            start("200 OK", [("Content-Type", "text/plain")])
            return [b"pong"]
        forms, files = multipart.parse_form_data(environ)
        try:
            return self.answer(forms, files, start)
        finally:
            for part in files.values():
                part.close()  # a spooled part holds a temporary file

    def answer(self, forms: Any, files: Any, start: Callable[..., Any]) -> list[bytes]:
        entries = json.loads(forms["entries"])
        ((task, types),) = entries.items()
        self.hits.append(task if task != "clip" else f"clip.{next(iter(types))}")
        body: dict[str, Any] = {}
        if "image" in files:
            data = files["image"].file.read()
            size = immich_reference.decode_pil(data).size
            body["imageWidth"], body["imageHeight"] = size
        if task == "clip" and "visual" in types:
            body["clip"] = json.dumps(immich_reference.embed_image(data).tolist())
        elif task == "clip":
            ids = immich_reference.tokenize([forms["text"]], self.tokenizer_json,
                                            "<|endoftext|>", 77)  # fmt: skip
            body["clip"] = json.dumps(immich_reference.embed_texts(ids)[0].tolist())
        elif task == "facial-recognition":
            body[task] = []
        else:
            body[task] = {"text": [], "box": [], "boxScore": [], "textScore": []}
        start("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(body).encode()]


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    app = StandIn(immich_reference.clip_tokenizer_json(tmp_path / "hub"))
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    app.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield app
    server.shutdown()
    server.server_close()


def test_immich_fails_over_between_the_gateway_and_its_own_ml_server(
    triton, standin: StandIn, tmp_path: Path
) -> None:
    gateway = immich_gateway(triton.grpc_url, tmp_path / "gateway.log", NAME).start()
    try:
        gateway.wait_ready()
        immich = ImmichServer([gateway.url, standin.url])
        immich.tick()
        assert immich.healthy == {gateway.url: True, standin.url: True}
        preview = immich_preview(1920, 1440, seed=5)

        # smart search: both towers served by the gateway, the stand-in never asked
        url, image_vector = immich.encode_image(preview)
        assert url == gateway.url
        url, text_vector = immich.encode_text("a photo of a cat")
        assert url == gateway.url and standin.hits == []

        # faces and OCR: the gateway answers non-2xx (501), the stand-in serves them
        url, faces = immich.detect_faces(preview)
        assert url == standin.url and faces["facial-recognition"] == []
        url, ocr = immich.ocr(preview)
        assert url == standin.url and ocr["ocr"]["text"] == []
        assert standin.hits == ["facial-recognition", "ocr"]

        # Immich now counts the gateway unhealthy: CLIP goes to the stand-in until the next
        # availability check, with the same vector (interchangeable), then back to the gateway
        assert immich.healthy[gateway.url] is False
        url, again = immich.encode_image(preview)
        assert url == standin.url
        assert reference.cosines(image_vector, again) >= 0.99999
        immich.tick()
        assert immich.encode_image(preview)[0] == gateway.url

        # the GPU box goes to sleep: text search is still answered, with the same vector
        gateway.stop()
        url, from_standin = immich.encode_text("a photo of a cat")
        assert url == standin.url
        assert reference.cosines(text_vector, from_standin) >= 0.99999
        immich.tick()
        assert immich.healthy == {gateway.url: False, standin.url: True}
        assert immich.encode_text("a dog on a beach")[0] == standin.url
    finally:
        gateway.stop()


# --- one URL: the gateway first and only, Immich's ML server its upstream --------------------


def one_url_gateway(triton_url: str, log: Path, upstream: str, **env: str) -> GatewayProcess:
    """The gateway Immich is pointed at, with Immich's ML server (the stand-in process) behind
    it: the same settings as ``immich_gateway`` plus the upstream."""
    gateway = immich_gateway(triton_url, log, NAME)
    gateway.env = {**gateway.env, "GATEWAY_IMMICH_UPSTREAM": upstream, **env}
    return gateway


def test_one_url_serves_clip_here_and_forwards_faces_and_ocr(triton, tmp_path: Path) -> None:
    upstream = UpstreamProcess().start()
    gateway = one_url_gateway(triton.grpc_url, tmp_path / "gateway.log", upstream.url,
                              GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S="10")  # fmt: skip
    try:
        gateway.start()
        gateway.wait_ready()
        immich = ImmichServer([gateway.url])
        immich.tick()
        assert immich.healthy == {gateway.url: True}
        previews = [immich_preview(480 + 32 * i, 360, seed=20 + i) for i in range(4)]
        reference_rows = {i: immich_reference.embed_image(p) for i, p in enumerate(previews)}
        query = "a photo of a cat"
        ids = immich_reference.tokenize([query], immich_reference.clip_tokenizer_json(
            tmp_path / "hub"), "<|endoftext|>", 77)  # fmt: skip
        text_row = immich_reference.embed_texts(ids)[0]

        # Immich's job queue: CLIP, faces and OCR interleaved, from several clients at once
        def job(n: int) -> tuple[str, int, bool, float]:
            preview = previews[n % len(previews)]
            kind = ("visual", "faces", "textual", "ocr")[n % 4]
            if kind == "visual":
                _, response = immich.predict_raw({"clip": {"visual": {"modelName": NAME}}},
                                                 image=preview)  # fmt: skip
                row = np.array(json.loads(response.json()["clip"]))
                return kind, response.status_code, True, reference.cosines(
                    row, reference_rows[n % len(previews)])  # fmt: skip
            if kind == "textual":
                entries = {"clip": {"textual": {"modelName": NAME,
                                                "options": {"language": "en"}}}}  # fmt: skip
                _, response = immich.predict_raw(entries, text=query)
                row = np.array(json.loads(response.json()["clip"]))
                return kind, response.status_code, True, reference.cosines(row, text_row)
            entries = FACES if kind == "faces" else OCR
            _, response = immich.predict_raw(entries, image=preview)
            same = response.content == upstream_answer(entries, preview, None)
            return kind, response.status_code, same, 1.0

        with ThreadPoolExecutor(6) as clients:
            results = list(clients.map(job, range(240)))
        assert len(results) == 240
        assert all(200 <= status < 300 for _, status, _, _ in results)
        assert all(same for _, _, same, _ in results)  # forwarded bodies byte for byte
        cosines = [c for kind, _, _, c in results if kind in ("visual", "textual")]
        assert min(cosines) >= 0.99999, min(cosines)
        served = httpx.get(f"{upstream.url}/hits").json()
        assert served == {"facial-recognition": 60, "ocr": 60}  # no CLIP reached it

        # Immich's ML server stops: faces fail with a problem naming it, CLIP goes on
        upstream.stop()
        faces = httpx.post(f"{gateway.url}/predict", files=form(FACES, previews[0]), timeout=60)
        assert faces.status_code in (502, 503)
        assert faces.headers["content-type"] == "application/problem+json"
        assert upstream.url in faces.json()["detail"]
        assert immich.encode_image(previews[1])[0] == gateway.url
        assert immich.encode_text("a dog on a beach")[0] == gateway.url
        status = httpx.get(f"{gateway.url}/immich/upstream", timeout=30).json()
        assert status["upstreams"] == [{"url": upstream.url, "state": "down",
                                        "detail": status["upstreams"][0]["detail"]}]  # fmt: skip
        immich.tick()
        assert immich.healthy == {gateway.url: True}  # /ping answers for the gateway

        # then the gateway stops: Immich has nowhere left to send anything
        gateway.stop()
        immich.tick()
        assert immich.healthy == {gateway.url: False}
        with pytest.raises(RuntimeError, match="failed for all URLs"):
            immich.encode_text("a dog on a beach")
    finally:
        gateway.stop()
        upstream.stop()


def form(entries: dict, image: bytes) -> list:
    return [("entries", (None, json.dumps(entries))),
            ("image", ("blob", image, "application/octet-stream"))]  # fmt: skip


def test_a_stalled_upstream_holds_no_decode_thread_and_no_more_than_the_body_limit(
    triton, tmp_path: Path
) -> None:
    """An upstream that never reads nor answers: forwards wait on it within their bound and
    their timeout, while CLIP (one decode thread) is answered; a forwarded body cannot pass
    the gateway's body limit even while nothing drains it."""
    upstream = UpstreamProcess(stall=True).start()
    gateway = one_url_gateway(
        triton.grpc_url, tmp_path / "gateway.log", upstream.url,
        GATEWAY_DECODE_THREADS="1", GATEWAY_MAX_BODY_BYTES=str(64 << 10),
        GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S="20", GATEWAY_IMMICH_UPSTREAM_CONCURRENCY="3",
    )  # fmt: skip
    preview = immich_preview(320, 240, seed=9)
    assert len(preview) < 32 << 10
    try:
        gateway.start()
        gateway.wait_ready()
        with ThreadPoolExecutor(3) as stalled_clients:
            stalled = [stalled_clients.submit(httpx.post, f"{gateway.url}/predict",
                                              files=form(FACES, preview), timeout=120)
                       for _ in range(3)]  # fmt: skip
            status = f"{gateway.url}/immich/upstream"
            while httpx.get(status, timeout=60).json()["forwards_in_flight"] < 3:
                time.sleep(0.1)
            # every forward slot is taken: one more is refused at once, not queued
            busy = httpx.post(f"{gateway.url}/predict", files=form(OCR, preview), timeout=120)
            assert busy.status_code == 503 and busy.json()["type"].endswith("/upstream-busy")
            # the one decode thread is free: CLIP is answered while the forwards hang
            for seed in range(3):
                clip = httpx.post(
                    f"{gateway.url}/predict",
                    timeout=120,
                    files=form(
                        {"clip": {"visual": {"modelName": NAME}}}, immich_preview(320, 240, seed)
                    ),
                )
                assert clip.status_code == 200, clip.text
            assert not any(f.done() for f in stalled)
            # the availability check is not queued behind the stalled forwards' connections:
            # the stand-in's /ping still answers, so the upstream is up while all three hang
            now = httpx.get(status, timeout=60).json()
            assert now["forwards_in_flight"] == 3
            assert [u["state"] for u in now["upstreams"]] == ["up"], now
            answers = [f.result() for f in stalled]
        assert [a.status_code for a in answers] == [504] * 3
        assert all(a.json()["type"].endswith("/upstream-timeout") for a in answers)

        # a body over the limit, no Content-Length, to an upstream that reads nothing
        def chunks() -> Iterator[bytes]:
            yield b'--b\r\nContent-Disposition: form-data; name="entries"\r\n\r\n'
            yield json.dumps(FACES).encode() + b"\r\n--b\r\n"
            yield b'Content-Disposition: form-data; name="image"; filename="blob"\r\n\r\n'
            for _ in range(32):
                yield b"\xff" * (16 << 10)
            yield b"\r\n--b--\r\n"

        over = httpx.post(f"{gateway.url}/predict", content=chunks(), timeout=120,
                          headers={"content-type": "multipart/form-data; boundary=b"})  # fmt: skip
        assert over.status_code == 413, over.text
        declared = httpx.post(f"{gateway.url}/predict", files=form(FACES, b"\xff" * (96 << 10)))
        assert declared.status_code == 413
    finally:
        gateway.stop()
        upstream.stop()

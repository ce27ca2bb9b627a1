"""Immich's failover, played from its server's side: its URL list (this gateway first, a
stand-in for Immich's full ML server second), its ``/ping`` availability check with a 2 s
timeout, healthy URLs first and "the next URL on any non-2xx or error"
(``server/src/repositories/machine-learning.repository.ts``). CLIP requests are served by the
real gateway (real Triton); faces and OCR fall through to the stand-in; text search is still
answered, with the same vector, when the gateway is stopped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import multipart
import numpy as np
import pytest

from bench.photos import immich_preview
from tests import immich_reference, reference
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
                    return url, response.json()
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
        entries = {"facial-recognition": {"detection": {"modelName": "buffalo_l",
                                                        "options": {"minScore": 0.7}},
                                          "recognition": {"modelName": "buffalo_l"}}}  # fmt: skip
        return self.predict(entries, image=image)

    def ocr(self, image: bytes) -> tuple[str, dict]:
        options = {"minScore": 0.5, "maxResolution": 736}
        entries = {"ocr": {"detection": {"modelName": "PP-OCRv5_mobile", "options": options},
                           "recognition": {"modelName": "PP-OCRv5_mobile",
                                           "options": {"minScore": 0.8}}}}  # fmt: skip
        return self.predict(entries, image=image)


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

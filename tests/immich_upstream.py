"""A stand-in for Immich's own machine-learning server, run as a real process on loopback
(``python -m tests.immich_upstream [--stall]``): the gateway's upstream in the one-URL tests.

It speaks Immich's protocol as ``immich_ml/main.py`` and ``schemas.py`` define it (multipart
``entries`` + ``image`` or ``text``; ``/ping``; answers keyed by task with ``imageHeight`` and
``imageWidth`` for images, compact JSON as orjson writes it) for faces and OCR, with fixed,
recognisable answers computed from the bytes it received (``answer``), so a test knows exactly
which bytes must come back. Shapes: a face is ``{"boundingBox": {x1, y1, x2, y2}, "embedding":
"<JSON array of 512 floats>", "score"}`` (``facial_recognition/recognition.py``); OCR is
``{"text": [...], "box": [8 floats per text, 0..1], "boxScore": [...], "textScore": [...]}``
(``ocr/recognition.py``). A CLIP request is answered too (a fixed vector) and counted, so a test
can show the gateway never sent one. ``--stall``: every ``/predict`` waits without reading its
body (a hung upstream).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import multipart
from PIL import Image

#: The entries Immich's server sends for faces and OCR (machine-learning.repository.ts).
FACES = {"facial-recognition": {"detection": {"modelName": "buffalo_l",
                                              "options": {"minScore": 0.7}},
                                "recognition": {"modelName": "buffalo_l"}}}  # fmt: skip
OCR = {"ocr": {"detection": {"modelName": "PP-OCRv5_mobile",
                             "options": {"minScore": 0.5, "maxResolution": 736}},
               "recognition": {"modelName": "PP-OCRv5_mobile",
                               "options": {"minScore": 0.8}}}}  # fmt: skip


TAG = "immich-upstream-stand-in"


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def floats(digest: bytes, count: int) -> list[float]:
    """``count`` fixed floats in [-1, 1) from a digest: the answer depends on every byte sent."""
    stream = b""
    counter = 0
    while len(stream) < count:
        stream += hashlib.sha256(digest + counter.to_bytes(4, "big")).digest()
        counter += 1
    return [round(b / 128 - 1, 6) for b in stream[:count]]


def answer(entries: dict[str, Any], image: bytes | None, text: str | None) -> bytes:
    """The stand-in's answer to one request, byte for byte."""
    body: dict[str, Any] = {}
    digest = hashlib.sha256(image if image is not None else (text or "").encode()).digest()
    for task, types in entries.items():
        if task == "facial-recognition":
            width, height = Image.open(io.BytesIO(image or b"")).size
            box = {"x1": width // 4, "y1": height // 4, "x2": width // 2, "y2": height // 2}
            embedding = json.dumps(floats(digest, 512), separators=(",", ":"))
            body[task] = [{"boundingBox": box, "embedding": embedding, "score": 0.987}]
        elif task == "ocr":
            body[task] = {
                "text": [TAG, digest.hex()[:16]],
                "box": [0.1, 0.1, 0.5, 0.1, 0.5, 0.2, 0.1, 0.2] * 2,
                "boxScore": [0.95, 0.9],
                "textScore": [0.99, 0.97],
            }
        elif task == "clip":
            body[task] = json.dumps([0.5] * 4)
        else:
            body[task] = {"stand-in": TAG, "types": sorted(types)}
    if image is not None:
        width, height = Image.open(io.BytesIO(image)).size
        body["imageHeight"], body["imageWidth"] = height, width
    return dumps(body)


class StandIn:
    """The WSGI app: ``/ping``, ``/``, ``/predict``, and ``/hits`` (requests per task)."""

    def __init__(self, stall: bool) -> None:
        self.stall = stall
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ["PATH_INFO"]
        if path == "/ping":
            start("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"pong"]
        if path == "/":
            start("200 OK", [("Content-Type", "application/json")])
            return [dumps({"message": "Immich ML"})]
        if path == "/hits":
            start("200 OK", [("Content-Type", "application/json")])
            with self.lock:
                return [dumps(dict(self.hits))]
        if self.stall:
            time.sleep(3600)  # never reads the body: the sender's window fills and it waits
        forms, files = multipart.parse_form_data(environ)
        try:
            entries = json.loads(forms["entries"])
            image = files["image"].file.read() if "image" in files else None
            text = forms.get("text")
        finally:
            for part in files.values():
                part.close()
        if image is None and text is None:
            start("400 Bad Request", [("Content-Type", "application/json")])
            return [dumps({"detail": "Either image or text must be provided"})]
        with self.lock:
            for task, types in entries.items():
                self.hits[task if task != "clip" else f"clip.{next(iter(types))}"] += 1
        start("200 OK", [("Content-Type", "application/json")])
        return [answer(entries, image, text)]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class UpstreamProcess:
    """The stand-in in a process of its own; ``url`` once started."""

    def __init__(self, *, stall: bool = False) -> None:
        self.stall = stall
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> UpstreamProcess:
        command = [sys.executable, "-m", "tests.immich_upstream"] + (
            ["--stall"] if self.stall else []
        )
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=root)  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "listening on <port>"
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"stand-in upstream did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> UpstreamProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stall", action="store_true")
    args = parser.parse_args()
    server = make_server("127.0.0.1", args.port, StandIn(args.stall), server_class=_Server,
                         handler_class=_Quiet)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening on {server.server_port}", flush=True)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()

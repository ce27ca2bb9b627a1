"""URL items end to end, in a network namespace with only loopback: the real app on the fake
backend, a test image server on 127.0.0.1 (allowlisted), a hosts file naming denied addresses.
Every refusal is checked for its rule and for the connections the fetcher was asked to make
(none); a guard that let one through would meet a closed port or an unreachable network here,
and the test would fail on the wrong answer, with no packet leaving the machine."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import gzip
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpcore
import numpy as np
import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import UrlFailed
from clip_gateway.http.app import create_app
from clip_gateway.http.context import app_context
from clip_gateway.http.urls.fetch import Fetcher, FetchOptions, fetcher_of
from clip_gateway.http.urls.guard import Allowlist
from clip_gateway.http.urls.streams import StreamBackend
from clip_gateway.http.urls.targets import parse
from tests import samples
from tests.controlled import wait_until
from tests.fakes import FakeBackend
from tests.metrics import sample

BOMB = gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # 64 MiB inflated, ~64 KiB sent
#: An image item that needs no fetch, before the URL item under test.
UPLOADED = "data:image/jpeg;base64," + base64.b64encode(samples.compact(0)).decode()


class Images(BaseHTTPRequestHandler):
    """The test image server: /img/N (a JPEG), and each misbehaviour the fetcher must survive."""

    def do_GET(self) -> None:
        path = self.path
        if path.startswith("/img/"):
            self._send(200, samples.compact(int(path[5:])), "image/jpeg")
        elif path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", path.split("=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/stall":
            time.sleep(5)
        elif path == "/forever":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.end_headers()
            chunk = b"\xff" * 65536
            try:
                for _ in range(10_000):  # 640 MiB, far past any cap
                    self.wfile.write(chunk)
            except OSError:
                pass  # the fetcher hung up: what it must do
        elif path == "/bomb":
            self._send(200, BOMB, "image/jpeg", encoding="gzip")
        elif path == "/text":
            self._send(200, b"not an image, whatever the header says", "image/jpeg")
        elif path in ("/404", "/500"):
            self._send(int(path[1:]), b"nope", "text/plain")
        else:
            self._send(404, b"", "text/plain")

    def _send(self, status: int, body: bytes, kind: str, encoding: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        with contextlib.suppress(OSError):  # the fetcher may hang up first
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # 32 fetches connect at once (the default backlog is 5)
    daemon_threads = True
    block_on_close = False


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = Server(("127.0.0.1", 0), Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class Counting(httpcore.AsyncNetworkBackend):
    """The fetcher's backend, counting the connections the fetcher asks for (by address)."""

    def __init__(self) -> None:
        self.inner = StreamBackend()
        self.connects: list[str] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects.append(host)
        return await self.inner.connect_tcp(host, port, timeout=timeout)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class Unbounded:
    """A fetch's budget that holds nothing back (the fetcher alone, outside a request)."""

    def received(self, count: int) -> None:
        pass

    def released(self, count: int) -> None:
        pass


def settings(**changes: Any) -> ServerSettings:
    base: dict[str, Any] = {
        "max_items_per_request": 64,
        "max_body_bytes": 8 << 20,
        "max_image_bytes": 1 << 20,
        "decode_threads": 2,
        "canary_interval_s": 0,
        "admission_infer_s_per_image": 0.001,
        "url_inputs": True,
        "url_allow": ("127.0.0.1/32",),
        "url_connect_timeout_s": 1.5,
        "url_timeout_s": 1.5,
    }
    return ServerSettings(**(base | changes))


@pytest.fixture
def gateway() -> Iterator[tuple[TestClient, Counting]]:
    app = create_app(settings(), lambda *_: FakeBackend(max_batch_size=32))
    with TestClient(app) as client:
        fetcher = fetcher_of(app.state)
        assert fetcher is not None
        counting = Counting()
        fetcher.network = counting
        yield client, counting


def post(client: TestClient, *items: object, **options: object) -> Any:
    return client.post("/v1/embeddings", json={"input": list(items), **options})


def vectors(response: Any) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def test_the_namespace_has_no_way_out() -> None:
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    with socket.socket() as sock:
        assert sock.connect_ex(("10.0.0.1", 80)) == errno.ENETUNREACH
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("example.com", 80)  # no DNS server reachable either


def test_32_url_items_embed_as_their_uploads(
    gateway: tuple[TestClient, Counting], server: str
) -> None:
    client, counting = gateway
    by_url = vectors(post(client, *({"image": f"{server}/img/{n}"} for n in range(32))))
    files = [("image", (f"{n}.jpg", samples.compact(n), "image/jpeg")) for n in range(32)]
    uploaded = vectors(client.post("/v1/embeddings", files=files))
    assert by_url.shape == (32, 512)
    assert np.array_equal(by_url, uploaded)
    cosine = np.sum(by_url * uploaded, axis=1)
    assert np.allclose(cosine, 1.0, atol=1e-6)
    assert counting.connects == ["127.0.0.1"] * 32


def test_openai_image_url_parts(gateway: tuple[TestClient, Counting], server: str) -> None:
    client, _ = gateway
    part = {"type": "image_url", "image_url": {"url": f"{server}/img/3"}}
    by_part = vectors(post(client, part, {"image": f"{server}/img/3"}))
    assert np.array_equal(by_part[0], by_part[1])


def test_url_items_off_is_a_400_saying_how(server: str) -> None:
    app = create_app(settings(url_inputs=False), lambda *_: FakeBackend())
    with TestClient(app) as client:
        response = post(client, "a text", {"image": f"{server}/img/1"})
    assert response.status_code == 400
    body = response.json()
    assert body["index"] == 1 and "GATEWAY_URL_INPUTS=true" in body["detail"]


#: Hosts the guard must refuse, each with its rule: every spelling of a denied address.
DENIED = [
    ("127.0.0.2", "loopback"),
    ("2130706434", "loopback"),  # 127.0.0.2 in decimal
    ("0177.0.0.2", "loopback"),  # octal
    ("0x7f.0.0.2", "loopback"),  # hex
    ("0x7f000002", "loopback"),
    ("127.2", "loopback"),  # short form
    ("0", "unspecified"),
    ("0.0.0.0", "unspecified"),
    ("10.0.0.1", "private"),
    ("012.0.0.1", "private"),
    ("172.16.3.4", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "metadata"),
    ("169.254.1.1", "link-local"),
    ("100.64.0.1", "carrier-grade-nat"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("192.0.2.1", "reserved"),
    ("[::1]", "loopback"),
    ("[::]", "unspecified"),
    ("[fd00::1]", "unique-local"),
    ("[fc00::1]", "unique-local"),
    ("[fe80::1]", "link-local"),
    ("[ff02::1]", "multicast"),
    ("[::ffff:127.0.0.2]", "loopback"),  # IPv4-mapped
    ("[::ffff:a9fe:a9fe]", "metadata"),
    ("[::ffff:10.0.0.1]", "private"),
    ("[::127.0.0.2]", "loopback"),  # IPv4-compatible
    ("[::10.0.0.1]", "private"),
    ("[2002:7f00:2::]", "loopback"),  # 6to4 of 127.0.0.2
    ("[2002:a00:1::]", "private"),
    ("[64:ff9b::10.0.0.1]", "private"),  # NAT64
    ("[64:ff9b::a9fe:a9fe]", "metadata"),
    ("loopname.test", "loopback"),  # names the namespace's hosts file maps
    ("internal.test", "private"),
    ("metadata.test", "metadata"),
    ("ula6.test", "unique-local"),
    ("mapped6.test", "loopback"),
    ("mixed.test", "private"),  # one allowed address beside a denied one: refused
]


@pytest.mark.parametrize(("host", "rule"), DENIED)
def test_denied_before_any_connection(
    gateway: tuple[TestClient, Counting], server: str, host: str, rule: str
) -> None:
    client, counting = gateway
    port = server.rsplit(":", 1)[1]
    response = post(client, {"image": UPLOADED}, {"image": f"http://{host}:{port}/img/1"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"].endswith("/url-refused") and body["rule"] == rule
    assert body["index"] == 1 and body["detail"].startswith("input[1]")
    if host.endswith(".test"):  # the address a name resolved to is never told
        told = body["detail"].split("):", 1)[1]
        assert re.search(r"\d+\.\d+\.\d+|[0-9a-f]*::[0-9a-f]", told) is None, told
    assert counting.connects == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://x/"])
def test_only_http_and_https(gateway: tuple[TestClient, Counting], url: str) -> None:
    client, counting = gateway
    response = post(client, {"image": "https://ok.test/"}, {"image": url})
    # "https://ok.test" is not reached either: the request stops at its first refusal
    assert response.status_code == 422
    assert response.json()["rule"] in ("scheme", "dns")
    assert counting.connects == []


def test_a_redirect_to_a_denied_address_is_refused(
    gateway: tuple[TestClient, Counting], server: str
) -> None:
    client, counting = gateway
    for target in ("http://10.0.0.1/img/1", "http://internal.test/img/1", "http://[::1]/"):
        counting.connects.clear()
        response = post(client, {"image": f"{server}/redirect?to={target}"})
        assert response.status_code == 422, response.text
        assert response.json()["type"].endswith("/url-refused")
        assert counting.connects == ["127.0.0.1"]  # the allowed first hop only


def test_a_redirect_within_the_allowed_is_followed_a_few_times(
    gateway: tuple[TestClient, Counting], server: str
) -> None:
    client, counting = gateway
    followed = vectors(post(client, {"image": f"{server}/redirect?to=/img/5"}))
    direct = vectors(post(client, {"image": f"{server}/img/5"}))
    assert np.array_equal(followed, direct)
    response = post(client, {"image": f"{server}/loop"})
    assert response.status_code == 422 and response.json()["rule"] == "redirects"
    assert len(counting.connects) == 3 + 4  # 2 + 1 above, then the first hop and 3 redirects


@pytest.mark.parametrize(
    ("path", "slug", "says"),
    [
        ("/stall", "url-fetch-failed", "within 1.5 s"),
        ("/forever", "url-fetch-failed", "over 1048576 bytes"),
        ("/bomb", "url-fetch-failed", "'gzip'-encoded"),
        ("/text", "invalid-image", ""),
        ("/404", "url-fetch-failed", "answered 404"),
        ("/500", "url-fetch-failed", "answered 500"),
    ],
)
def test_servers_that_misbehave(
    gateway: tuple[TestClient, Counting], server: str, path: str, slug: str, says: str
) -> None:
    client, _ = gateway
    response = post(client, {"image": f"{server}/img/1"}, {"image": f"{server}{path}"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"].endswith("/" + slug) and body["index"] == 1
    assert says in body["detail"]


def test_skip_invalid_reports_url_items_one_by_one(
    gateway: tuple[TestClient, Counting], server: str
) -> None:
    client, _ = gateway
    response = post(
        client,
        {"image": f"{server}/img/1"},
        {"image": f"{server}/404"},
        {"image": "http://10.0.0.1/"},
        {"image": f"{server}/img/2"},
        skip_invalid=True,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [row["index"] for row in body["data"]] == [0, 3]
    failures = {e["index"]: e for e in body["errors"]}
    assert sorted(failures) == [1, 2]
    assert "404" in failures[1]["detail"] and "private" in failures[2]["detail"]


def test_a_name_is_resolved_once_and_the_vetted_address_connected(
    gateway: tuple[TestClient, Counting], server: str
) -> None:
    client, counting = gateway
    port = server.rsplit(":", 1)[1]
    by_name = vectors(post(client, {"image": f"http://images.test:{port}/img/4"}))
    by_address = vectors(post(client, {"image": f"{server}/img/4"}))
    assert np.array_equal(by_name, by_address)
    # httpcore was handed the address the guard checked, never the name to resolve again
    assert counting.connects == ["127.0.0.1", "127.0.0.1"]


def test_fetches_beyond_the_cap_are_refused_at_once(server: str) -> None:
    app = create_app(settings(url_max_fetches=1), lambda *_: FakeBackend())
    with TestClient(app) as client:
        stalled: list[Any] = []
        holder = threading.Thread(
            target=lambda: stalled.append(post(client, {"image": f"{server}/stall"}))
        )
        holder.start()
        fetcher = fetcher_of(app.state)
        assert fetcher is not None
        # the stalled fetch holds the one slot (observed, not assumed after a while: a loaded
        # machine may not have started it yet, and the next request would be fetched)
        wait_until(lambda: fetcher.in_flight, "the stalled fetch holds the one slot")
        refused = post(client, {"image": f"{server}/img/1"})
        holder.join()
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert stalled[0].status_code == 422  # the stalled one timed out on its own
        assert app_context(app.state).pipeline.admission.backlog_s == 0
        assert vectors(post(client, {"image": f"{server}/img/1"})).shape == (1, 512)


def test_a_request_admission_could_never_take_fetches_nothing(server: str) -> None:
    """Its URL items priced at the least an image costs (a model call each) before any is
    fetched: 16 of them at 1 s each are more than the 15 s this gateway admits at once."""
    app = create_app(settings(admission_infer_s_per_image=1.0), lambda *_: FakeBackend())
    with TestClient(app) as client:
        fetcher = fetcher_of(app.state)
        assert fetcher is not None
        fetcher.network = counting = Counting()
        response = post(client, *({"image": f"{server}/img/{n}"} for n in range(16)))
        assert response.status_code == 413, response.text
        assert "split it" in response.json()["detail"]
        assert counting.connects == []
        assert vectors(post(client, {"image": f"{server}/img/1"})).shape == (1, 512)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The image server over TLS with a certificate for ``images.test`` from a CA of its own;
    its port and the CA file."""
    tmp = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=clip-gateway test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
            "-subj", "/CN=images.test")  # fmt: skip
    (tmp / "ext").write_text("subjectAltName=DNS:images.test\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext")  # fmt: skip
    httpd = Server(("127.0.0.1", 0), Images)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "srv.pem", tmp / "srv.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield str(httpd.server_address[1]), str(tmp / "ca.pem")
    httpd.shutdown()
    httpd.server_close()


def test_https_goes_to_the_vetted_address_with_the_name_in_sni_and_the_certificate(
    tls_server: tuple[str, str],
) -> None:
    port, ca = tls_server
    trust = ssl.create_default_context(cafile=ca)
    trust.verify_flags &= ~ssl.VERIFY_X509_STRICT  # openssl's quick CA lacks strict extensions
    counting = Counting()
    fetcher = Fetcher(
        FetchOptions(Allowlist.parse(["127.0.0.1/32"]), 2.0, 3.0, 1 << 20, 4),
        network=counting,
        ssl_context=trust,
    )

    async def scenario() -> None:
        body = await fetcher.fetch(parse(f"https://images.test:{port}/img/6"), Unbounded())
        assert body == samples.compact(6)
        # the address itself is no name the certificate holds: refused by the TLS check
        with pytest.raises(UrlFailed):
            await fetcher.fetch(parse(f"https://127.0.0.1:{port}/img/6"), Unbounded())

    asyncio.run(scenario())
    assert counting.connects == ["127.0.0.1", "127.0.0.1"]


def test_url_items_again_are_cache_hits_without_a_decode(server: str) -> None:
    app = create_app(settings(cache_mib=8), lambda *_: FakeBackend(max_batch_size=32))
    urls = [{"image": f"{server}/img/{n}"} for n in range(100, 132)]
    with TestClient(app) as client:
        first = vectors(post(client, *urls, normalize=False))
        scrape = client.get("/metrics").text
        decoded = sample(scrape, "gateway_images_total", format="jpeg")
        again = vectors(post(client, *urls, normalize=False))
        scrape = client.get("/metrics").text
    assert np.array_equal(first, again)
    assert sample(scrape, "gateway_images_total", format="jpeg") == decoded  # no decode
    assert sample(scrape, "gateway_cache_lookups_total", kind="image", outcome="hit") == 32

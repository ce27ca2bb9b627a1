"""The real gateway over real HTTP, in front of a real Triton (cpu profile)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import time
from http.client import HTTPConnection
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests import reference, samples

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def http(gateway) -> httpx.Client:
    with httpx.Client(base_url=gateway.url, timeout=120) as client:
        yield client


#: Cosine each row must keep to open_clip's own pipeline for the same image. Measured on these
#: images (compact JPEG, PNG, WebP, 4 MP progressive): min 0.99991. Any two different test
#: images are at most 0.99874 apart, so a row swapped with another fails too.
MIN_COSINE = 0.9998


def assert_matches(got: np.ndarray, images: list[bytes]) -> None:
    """Row i is image i's embedding, as open_clip computes it (never our own preprocessing)."""
    expected = reference.embed_images(images)
    assert got.shape == expected.shape
    cosines = reference.cosines(got, expected)
    assert cosines.min() >= MIN_COSINE, cosines
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # unit length


def files(*images: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


def rows(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text[:500]
    return np.array([r["embedding"] for r in response.json()["data"]], dtype=np.float32)


def test_multipart_batch(http: httpx.Client) -> None:
    images = [samples.compact(i) for i in range(4)] + [samples.png(1), samples.progressive_jpeg(2)]
    got = rows(http.post("/v1/embeddings", files=files(*images)))
    assert got.shape == (6, 512)
    assert_matches(got, images)


def test_more_images_than_max_batch_are_split_and_kept_in_order(http: httpx.Client) -> None:
    images = [samples.compact(i) for i in range(40)]  # model max_batch_size is 32
    got = rows(http.post("/v1/embeddings", files=files(*images)))
    assert_matches(got, images)


def test_raw_vectors_when_normalize_is_false(http: httpx.Client) -> None:
    images = [samples.compact(80), samples.compact(81)]
    got = rows(http.post("/v1/embeddings?normalize=false", files=files(*images)))
    norms = np.linalg.norm(got, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3)  # the model's own scale, not unit length
    assert_matches(got / norms[:, None], images)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_json(http: httpx.Client, encoding_format: str) -> None:
    images = [samples.compact(50), samples.webp(3)]
    payload = {
        "model": "ViT-B-32",
        "input": [
            {"image": base64.b64encode(images[0]).decode()},
            "data:image/webp;base64," + base64.b64encode(images[1]).decode(),
        ],
        "encoding_format": encoding_format,
    }
    response = http.post("/v1/embeddings", json=payload)
    assert response.status_code == 200, response.text[:500]
    data = [r["embedding"] for r in response.json()["data"]]
    if encoding_format == "base64":
        got = np.stack([np.frombuffer(base64.b64decode(d), "<f4") for d in data])
    else:
        got = np.array(data, dtype=np.float32)
    assert_matches(got, images)


def test_binary_response(http: httpx.Client) -> None:
    images = [samples.compact(60), samples.compact(61), samples.compact(62)]
    response = http.post(
        "/v1/embeddings?dtype=float16",
        files=files(*images),
        headers={"Accept": "application/octet-stream"},
    )
    assert response.status_code == 200
    assert response.headers["x-embedding-shape"] == "3,512"
    assert response.headers["x-embedding-dtype"] == "float16"
    got16 = np.frombuffer(response.content, "<f2").reshape(3, 512).astype(np.float32)
    as_json = rows(http.post("/v1/embeddings", files=files(*images)))
    # float16 is the float32 answer rounded: at most half a float16 ulp (2**-11 relative) apart
    np.testing.assert_allclose(got16, as_json, rtol=2**-11, atol=2**-24)
    float32 = http.post(
        "/v1/embeddings", files=files(*images), headers={"Accept": "application/octet-stream"}
    )
    assert float32.headers["x-embedding-dtype"] == "float32"
    np.testing.assert_array_equal(
        np.frombuffer(float32.content, "<f4").reshape(3, 512), as_json
    )  # the JSON floats and the binary floats are the same numbers
    assert_matches(as_json, images)


def test_official_openai_client(gateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="not-needed", max_retries=0)
    images = [samples.compact(70), samples.compact(71)]
    result = client.embeddings.create(
        model="ViT-B-32",
        input=[base64.b64encode(x).decode() for x in images],
        extra_body={"modality": "image"},  # bare base64 strings are images only when told
    )  # the client asks for base64 and decodes it itself
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert [d.index for d in result.data] == [0, 1]
    assert result.model == "ViT-B-32"
    assert_matches(got, images)
    assert client.models.list().data[0].id == "ViT-B-32"


def test_official_openai_client_embeds_a_search_query(gateway) -> None:
    """What a new user tries first: the openai client, a list of texts, its defaults (it asks
    for base64 and decodes it itself)."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="not-needed", max_retries=0)
    texts = ["a photo of a cat", "a diagram of a bicycle"]
    result = client.embeddings.create(model="ViT-B-32", input=texts)
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    expected = reference.embed_tokens(reference.tokens(texts))
    assert reference.cosines(got, expected).min() >= 0.9999
    # start + the BPE tokens + end, per open_clip's tokenizer
    lengths = [int(np.argmax(row == 49407)) + 1 for row in reference.tokens(texts)]
    assert result.usage.prompt_tokens == sum(lengths) == 14
    single = client.embeddings.create(model="ViT-B-32", input="a photo of a cat")
    np.testing.assert_allclose(single.data[0].embedding, got[0], atol=1e-6)


def test_mixed_multipart_batch_in_order_in_one_space(http: httpx.Client) -> None:
    images = [samples.compact(80), samples.compact(81)]
    form = [
        ("text", (None, b"a photo of a cat", "text/plain")),
        ("image", ("0.jpg", images[0], "image/jpeg")),
        ("text", (None, b"a red car", "text/plain")),
        ("image", ("1.jpg", images[1], "image/jpeg")),
    ]
    got = rows(http.post("/v1/embeddings", files=form))
    assert got.shape == (4, 512)
    assert_matches(got[[1, 3]], images)
    texts = reference.embed_tokens(reference.tokens(["a photo of a cat", "a red car"]))
    assert reference.cosines(got[[0, 2]], texts).min() >= 0.9999


def test_models_and_readiness_cover_both_towers(http: httpx.Client, exported) -> None:
    (card,) = http.get("/v1/models").json()["data"]
    assert card["modalities"] == ["image", "text"]
    assert (card["embed_dim"], card["image_size"], card["context_length"]) == (512, 224, 77)
    preprocess = exported.manifest["preprocess"]
    for key in ("size", "resize_mode", "interpolation", "mean", "std", "from_tag"):
        assert card["preprocessing"][key] == preprocess[key], key
    detail = http.get("/readyz").json()["canary"]
    assert "image canary cosine" in detail and "text canary cosine" in detail


@pytest.mark.parametrize(
    ("bad", "status"),
    [
        (b"", 422),
        (b"plain text, not an image", 422),
        (samples.truncated_jpeg(), 422),
        (samples.corrupt_jpeg(), 422),
        (samples.bmp(), 415),
        (samples.claims_pixels(40000, 40000), 422),
    ],
    ids=["empty", "not-image", "truncated", "corrupt", "bmp", "pixel-bomb"],
)
def test_bad_items_over_http(http: httpx.Client, bad: bytes, status: int) -> None:
    response = http.post("/v1/embeddings", files=files(samples.compact(0), bad))
    assert response.status_code == status
    assert response.headers["content-type"].startswith(PROBLEM)
    assert response.json()["index"] == 1


def test_request_level_errors_over_http(http: httpx.Client) -> None:
    too_many = http.post("/v1/embeddings", files=files(*[samples.compact(0)] * 65))
    assert too_many.status_code == 413
    bad_json = http.post(
        "/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400
    bad_b64 = http.post("/v1/embeddings", json={"input": ["%%%"], "modality": "image"})
    assert (bad_b64.status_code, bad_b64.json()["index"]) == (422, 0)
    wrong_type = http.post("/v1/embeddings", content=b"abc", headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 415
    for response in (too_many, bad_json, bad_b64, wrong_type):
        assert response.headers["content-type"].startswith(PROBLEM)


def test_huge_content_length_is_refused_without_reading_the_body(gateway) -> None:
    with socket.create_connection((gateway.host, gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2147483648\r\n\r\n{"
        )
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413")
    assert b"application/problem+json" in reply


def test_health_readiness_models_and_docs(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").status_code == 200
    (model,) = http.get("/v1/models").json()["data"]
    assert (model["id"], model["embed_dim"], model["image_size"]) == ("ViT-B-32", 512, 224)
    doc = http.get("/docs/openapi.json").json()
    assert "multipart/form-data" in doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]


def test_input_batches_travel_through_shared_memory(gateway, triton) -> None:
    """Gateway and Triton share this host: the gateway's regions are registered with Triton."""
    import tritonclient.grpc as grpcclient

    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        assert http.post("/v1/embeddings", files=files(samples.compact(3))).status_code == 200
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        status = client.get_system_shared_memory_status(as_json=True)
    names = [region["name"] for region in status.get("regions", {}).values()]
    assert any(name.startswith("clipgw_") for name in names), status


def test_grpc_tensor_path_gives_the_same_embeddings(triton, tmp_path) -> None:
    from clip_gateway.config.processes import GatewayProcess

    images = [samples.compact(i) for i in range(300, 305)]
    env = {"GATEWAY_TRITON_SHARED_MEMORY": "off", "GATEWAY_CANARY_INTERVAL_S": "0"}
    with GatewayProcess(triton.grpc_url, env=env, log_path=tmp_path / "gw.log") as plain:
        got = rows(httpx.post(f"{plain.url}/v1/embeddings", files=files(*images), timeout=60))
    assert_matches(got, images)


def test_shared_memory_regions_are_removed_when_the_gateway_stops(triton, start_gateway) -> None:
    import tritonclient.grpc as grpcclient

    gw = start_gateway(triton.grpc_url, GATEWAY_CANARY_INTERVAL_S="0")
    assert httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(5))).status_code == 200
    pid = gw.process.pid

    def registered() -> set[str]:
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            status = client.get_system_shared_memory_status(as_json=True)
        return {r["name"] for r in status.get("regions", {}).values()}

    ours = {name for name in registered() if str(pid) in name}
    assert ours, "the gateway registered no region"
    assert all((Path("/dev/shm") / name).exists() for name in ours)
    # uvicorn drains, shuts the app down, then re-raises SIGTERM on itself: -15 is a clean stop
    assert gw.stop() in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in gw.log_path.read_text()
    assert not ours & registered()  # unregistered from Triton
    assert not [name for name in ours if (Path("/dev/shm") / name).exists()]  # and unlinked


def test_a_killed_workers_regions_are_removed_by_its_replacement(triton, start_gateway) -> None:
    import tritonclient.grpc as grpcclient

    def registered() -> set[str]:
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            status = client.get_system_shared_memory_status(as_json=True)
        return {r["name"] for r in status.get("regions", {}).values()}

    dead = start_gateway(triton.grpc_url, GATEWAY_CANARY_INTERVAL_S="0")
    assert (
        httpx.post(f"{dead.url}/v1/embeddings", files=files(samples.compact(6))).status_code == 200
    )
    pid = dead.process.pid
    left = {name for name in registered() if name.startswith(f"clipgw_{pid}_")}
    assert left
    dead.kill()  # SIGKILL: its shutdown never runs, Triton keeps the registrations
    assert left <= registered()
    replacement = start_gateway(triton.grpc_url, GATEWAY_CANARY_INTERVAL_S="0")
    assert (
        httpx.post(f"{replacement.url}/v1/embeddings", files=files(samples.compact(7))).status_code
        == 200
    )
    assert not left & registered()  # unregistered from Triton by the new worker
    assert not [name for name in left if (Path("/dev/shm") / name).exists()]  # and unlinked


def data_uri(image: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(image).decode()


def test_json_texts_and_images_with_per_item_errors_over_http(http: httpx.Client) -> None:
    """The text half's JSON forms and refusals on the real stack: objects, a forced modality,
    a data-URI image among texts, skip_invalid naming bad texts, binary answers for texts, and
    a bare base64 image refused as ambiguous unless modality says image."""
    image = samples.compact(82)
    payload = {"input": [{"text": "a red car"}, "", {"image": data_uri(image)}, "x" * 5000,
                         "a photo of a cat"], "skip_invalid": True}  # fmt: skip
    body = http.post("/v1/embeddings", json=payload).json()
    assert [row["index"] for row in body["data"]] == [0, 2, 4]
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 422), (3, 413)]
    got = np.array([row["embedding"] for row in body["data"]], dtype=np.float32)
    texts = reference.embed_tokens(reference.tokens(["a red car", "a photo of a cat"]))
    assert reference.cosines(got[[0, 2]], texts).min() >= 0.9999
    assert_matches(got[[1]], [image])
    assert (body["usage"]["texts"], body["usage"]["images"]) == (2, 1)

    empty = http.post("/v1/embeddings", json={"input": ["a cat", "   "]})
    assert empty.status_code == 422 and empty.headers["content-type"].startswith(PROBLEM)
    assert empty.json()["index"] == 1
    forced = http.post("/v1/embeddings", json={"input": ["a red car"], "modality": "text"},
                       headers={"Accept": "application/octet-stream"})  # fmt: skip
    assert forced.status_code == 200 and forced.headers["x-embedding-shape"] == "1,512"
    binary = np.frombuffer(forced.content, dtype="<f4").reshape(1, -1)
    assert reference.cosines(binary, texts[:1]).min() >= 0.9999

    bare = base64.b64encode(image).decode()
    ambiguous = http.post("/v1/embeddings", json={"input": [bare]})
    assert ambiguous.status_code == 422 and "modality" in ambiguous.json()["detail"]
    as_image = rows(http.post("/v1/embeddings", json={"input": [bare], "modality": "image"}))
    assert_matches(as_image, [image])


def connections_by_worker(gateway_pid: int, port: int) -> dict[int, int]:
    """Each of the gateway's worker processes: the connections on ``port`` it holds open
    (not yet closed by it, whatever the client did)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")  # the gateway's side, not the listener
    task = Path(f"/proc/{gateway_pid}/task/{gateway_pid}/children")
    counts = {}
    for worker in map(int, task.read_text().split()):
        fds = [fd for fd in Path(f"/proc/{worker}/fd").iterdir() if fd.is_symlink()]
        counts[worker] = sum(str(fd.readlink()) in inodes for fd in fds)
    return counts


def test_workers_share_connections_evenly_and_none_waits_on_a_stopped_one(
    triton, start_gateway, tmp_path: Path
) -> None:
    """Eight keep-alive connections opened at once reach two workers four each (uvicorn's own
    accept gave one worker all eight, or seven, on most starts); each is served; a worker
    stopped while it has fewer holds no new connection back (another takes it); the workers'
    board is gone once the gateway stops."""
    metrics, scratch = tmp_path / "metrics", tmp_path / "tmp"
    metrics.mkdir()
    scratch.mkdir()
    gw = start_gateway(triton.grpc_url, GATEWAY_WORKERS="2", GATEWAY_DECODE_THREADS="1",
                       GATEWAY_CANARY_INTERVAL_S="0", PROMETHEUS_MULTIPROC_DIR=str(metrics),
                       TMPDIR=str(scratch))  # fmt: skip
    assert [path.name for path in scratch.glob("*/*")] == ["connections"]
    host, port = "127.0.0.1", int(gw.url.rsplit(":", 1)[1])
    clients = [HTTPConnection(host, port, timeout=10) for _ in range(8)]
    try:
        for client in clients:  # a burst: all connected before any request
            client.connect()
        for client in clients:  # each served, its connection kept
            client.request("GET", "/healthz")
            reply = client.getresponse()
            reply.read()
            assert reply.status == 200
        counts = connections_by_worker(gw.process.pid, port)
        assert sorted(n for n in counts.values() if n) == [4, 4], counts
        clients.pop(0).close()  # one client leaves: its worker has fewer, then it stops
        for _ in range(100):
            counts = connections_by_worker(gw.process.pid, port)
            if sum(counts.values()) == 7:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # its close counted out on the workers' board
        stopped = min((pid for pid in counts if counts[pid]), key=lambda pid: counts[pid])
        assert counts[stopped] == 3
        os.kill(stopped, signal.SIGSTOP)
        try:
            late = httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(90)),
                              timeout=10)  # fmt: skip
            assert late.status_code == 200  # taken by the other worker
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert connections_by_worker(gw.process.pid, port)[stopped] == 3
    finally:
        for client in clients:
            client.close()
    assert gw.stop() == 0
    assert not list(scratch.iterdir())

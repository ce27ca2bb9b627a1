"""The cpu-bf16 profile end to end: the launch path (a real Triton running OpenVINO at BF16 in the
Python backend, a real gateway, real HTTP) within the quality gate of open_clip's own pipeline,
its figures and runtime in /v1/models; a gate it cannot pass refuses to start unless the operator
asked for the FP32 fallback, which then says so. Needs a CPU with BF16 units (avx512_bf16 or
amx_bf16): elsewhere the profile is refused, and that refusal is what runs."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest

from clip_gateway.model.gate import MIN_COSINE, MIN_MEAN_COSINE
from clip_gateway.profiles import bf16
from tests import reference, samples
from tests.integration.test_int8 import launch, model_card, wait_ready  # noqa: F401

TEXTS = ["a photo of a cat", "a diagram of the solar system", "東京の夜景 at night", "x" * 300]
IMAGES = [samples.compact(i) for i in range(4)] + [samples.png(7), samples.webp(8)]
HAS_BF16 = bf16.bf16_flag(bf16.cpu_flags()) is not None
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 / amx_bf16")


def embed(url: str) -> tuple[np.ndarray, np.ndarray]:
    files = [("image", (f"{i}", data, "application/octet-stream")) for i, data in enumerate(IMAGES)]
    with httpx.Client(base_url=url, timeout=300) as http:
        pictures = http.post("/v1/embeddings", files=files)
        words = http.post("/v1/embeddings", json={"input": TEXTS})
    assert pictures.status_code == 200, pictures.text[:500]
    assert words.status_code == 200, words.text[:500]
    return tuple(  # type: ignore[return-value]
        np.array([row["embedding"] for row in answer.json()["data"]], dtype=np.float64)
        for answer in (pictures, words)
    )


def bf16_launch(launch, exported, **env: str):  # noqa: F811
    return launch(GATEWAY_MODEL_DIR=str(exported.directory), GATEWAY_TRITON_PROFILE="cpu-bf16",
                  **env)  # fmt: skip


@needs_bf16
def test_cpu_bf16_serves_within_the_gate_of_open_clip(exported, gateway, launch) -> None:  # noqa: F811
    served = bf16_launch(launch, exported)
    wait_ready(served)
    card = model_card(served.url)
    assert card["modalities"] == ["image", "text"]
    for tower in ("image", "text"):
        value = card["quantization"][tower]
        assert (value["precision"], value["runtime"]) == ("bf16", "openvino")
        assert value["cosine_vs_fp32"]["mean"] >= MIN_MEAN_COSINE
        assert value["cosine_vs_fp32"]["min"] >= MIN_COSINE
        assert value["gate"] == {"min_mean_cosine": MIN_MEAN_COSINE, "min_cosine": MIN_COSINE}
    images, texts = embed(served.url)
    expected_images = reference.embed_images(IMAGES)
    expected_texts = reference.embed_tokens(reference.tokens(TEXTS))
    for got, expected in ((images, expected_images), (texts, expected_texts)):
        found = reference.cosines(got, expected)
        print(f"\ncpu-bf16 vs open_clip: mean={found.mean():.6f} min={found.min():.6f}")
        assert found.mean() >= MIN_MEAN_COSINE and found.min() >= MIN_COSINE, found
    # BF16 really runs: not the FP32 graphs under a new name (the session's FP32 gateway)
    fp32_images, fp32_texts = embed(gateway.url)
    assert (images * fp32_images).sum(axis=1).min() < 0.999999
    assert (texts * fp32_texts).sum(axis=1).min() < 0.999999


@needs_bf16
def test_a_bf16_gate_it_cannot_pass_does_not_start_and_says_why(exported, launch) -> None:  # noqa: F811
    # OpenVINO BF16 measures ~0.99995 against FP32 here: a gate of 0.999999 refuses it
    served = bf16_launch(launch, exported, GATEWAY_INT8_MIN_MEAN_COSINE="0.999999")
    assert served.process.wait(300) == 2
    log = served.log.read_text()
    assert "BF16 refused by the quality gate" in log
    assert "< 0.999999" in log  # the numbers, not just a verdict
    assert "GATEWAY_BF16_FALLBACK=true" in log
    assert "tritonserver" not in log  # refused before Triton started


@needs_bf16
def test_the_bf16_fallback_serves_fp32_and_says_so(exported, gateway, launch) -> None:  # noqa: F811
    served = bf16_launch(launch, exported, GATEWAY_INT8_MIN_MEAN_COSINE="0.999999",
                         GATEWAY_BF16_FALLBACK="true")  # fmt: skip
    wait_ready(served)
    assert "serving the FP32 files instead (the cpu profile's" in served.log.read_text()
    card = model_card(served.url)
    for tower in ("image", "text"):
        value = card["quantization"][tower]
        assert (value["precision"], value["runtime"], value["requested"]) == (
            "fp32", "onnxruntime", "bf16")  # fmt: skip
        assert value["fallback"].startswith("BF16 refused by the quality gate")
    for ours, theirs in zip(embed(served.url), embed(gateway.url), strict=True):
        assert (ours * theirs).sum(axis=1).min() > 0.99999  # the FP32 graphs' answers


@pytest.mark.skipif(HAS_BF16, reason="this CPU has BF16 units: the profile is not refused")
def test_without_bf16_units_an_explicit_cpu_bf16_is_refused(exported, launch) -> None:  # noqa: F811
    served = bf16_launch(launch, exported)
    assert served.process.wait(300) == 2
    log = served.log.read_text()
    assert "this CPU has no BF16 units" in log and "tritonserver" not in log


# the first start for the model may build cpu-int8-openvino's files (NNCF, ~4.5 min on 2 cores)
# before timing, if no other test built them first
@pytest.mark.timeout(1500)
def test_auto_without_a_gpu_serves_at_once_then_switches_to_the_fastest_with_no_failed_request(
    exported_int8,
    launch,  # noqa: F811
) -> None:
    """``auto`` on this CPU, first start: the export's gated INT8 files serve at once; meanwhile
    each CPU profile that passes the gate is timed through Triton, and the fastest is loaded into
    the serving Triton in place while requests keep coming, none of them failing; its figures
    reach /v1/models; the next start measures nothing (the choice is kept beside the export)."""
    from clip_gateway.profiles import cpu_auto, gpu

    if gpu.detect() is not None:
        pytest.skip("a GPU is present: auto picks a GPU profile")
    (exported_int8.directory / cpu_auto.RECORD).unlink(missing_ok=True)
    env = {"GATEWAY_MODEL_DIR": str(exported_int8.directory), "GATEWAY_TRITON_PROFILE": "auto",
           "GATEWAY_AUTO_MEASURE_S": "150"}  # fmt: skip
    served = launch(**env)
    served.wait_ready(timeout=300)
    assert "Triton cpu-int8 profile (auto, first start here" in served.log.read_text()
    first = model_card(served.url)["quantization"]["image"]
    assert first["precision"] == "int8" and "profile_choice" not in first
    answers: list[int] = []
    failed: list[str] = []
    stop = threading.Event()

    def keep_asking() -> None:
        files = [("image", ("0", IMAGES[0], "application/octet-stream"))]
        with httpx.Client(base_url=served.url, timeout=300) as http:
            while not stop.is_set():
                for answer in (http.post("/v1/embeddings", files=files),
                               http.post("/v1/embeddings", json={"input": TEXTS[:1]})):  # fmt: skip
                    answers.append(answer.status_code)
                    if answer.status_code != 200:
                        failed.append(f"{time.strftime('%X')} {answer.text[:300]}")

    asking = threading.Thread(target=keep_asking)
    asking.start()
    try:
        deadline = time.monotonic() + 1300
        while "profile_choice" not in (card := model_card(served.url))["quantization"]["image"]:
            assert time.monotonic() < deadline, "auto never switched"
            assert served.process.poll() is None, served.log.read_text()[-3000:]
            time.sleep(2)
        switched = len(answers)
        # the image tower's new config may show before the text tower is loaded again
        while "loaded in place" not in served.log.read_text():
            assert time.monotonic() < deadline, "auto never finished switching"
            time.sleep(1)
        time.sleep(5)  # still asking after both towers were loaded again
    finally:
        stop.set()
        asking.join()
    choice = card["quantization"]["image"]["profile_choice"]
    measured = choice["images_per_s"]
    print(f"\nauto on this CPU: {choice}; {len(answers)} requests, {switched} before the switch")
    assert switched > 0 and len(answers) > switched
    assert set(answers) == {200}, failed
    expected = {"cpu-int8", "cpu-int8-openvino", "cpu"} | ({"cpu-bf16"} if HAS_BF16 else set())
    assert set(measured) | set(choice["failed"]) == expected
    assert choice["chosen"] == max(measured, key=measured.__getitem__)
    log = served.log.read_text()
    assert f"auto: Triton {choice['chosen']} profile (auto, measured now" in log
    assert "loaded in place" in log
    kept = json.loads((exported_int8.directory / cpu_auto.RECORD).read_text())
    assert kept["profile"] == choice["chosen"]
    embed(served.url)  # the switched profile answers images and texts

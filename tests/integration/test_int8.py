"""The cpu-int8 profile end to end: the INT8 graphs ``python -m clip_gateway.export --int8`` writes,
the quality gate's figures, and the launch path serving them (a real Triton, a real gateway, real
HTTP) within the gate of the FP32 gateway's answers; a refused export does not start unless the
operator asked for the FP32 fallback, which then says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bench.harness.supervisor import Supervisor
from clip_gateway.model.contract import INPUT_NAME
from clip_gateway.model.gate import MIN_COSINE, MIN_MEAN_COSINE, cosine
from tests import samples

TEXTS = ["a photo of a cat", "a diagram of the solar system", "東京の夜景 at night", "x" * 300]
IMAGES = 6


def images() -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(IMAGES)]


def embed(url: str) -> tuple[np.ndarray, np.ndarray]:
    """Unit embeddings of the test images and of the test texts, from a gateway."""
    with httpx.Client(base_url=url, timeout=120) as http:
        pictures = http.post("/v1/embeddings", files=images())
        words = http.post("/v1/embeddings", json={"input": TEXTS})
    assert pictures.status_code == 200, pictures.text[:500]
    assert words.status_code == 200, words.text[:500]
    return tuple(  # type: ignore[return-value]
        np.array([row["embedding"] for row in answer.json()["data"]])
        for answer in (pictures, words)
    )


def quantized_nodes(path: Path) -> list[str]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.op_type for n in graph.node if n.op_type in ("MatMulInteger", "QLinearMatMul")]


@pytest.mark.parametrize("tower", ["image", "text"])
def test_int8_graphs_keep_the_fp32_contract_and_are_quantized(exported_int8, tower: str) -> None:
    directory = exported_int8.directory
    fp32_file = "model.onnx" if tower == "image" else "text.onnx"
    fp32 = onnx.load(str(directory / fp32_file), load_external_data=False)
    path = directory / exported_int8.int8["files"][tower]
    int8 = onnx.load(str(path), load_external_data=False)
    for ours, theirs in (
        (int8.graph.input, fp32.graph.input),
        (int8.graph.output, fp32.graph.output),
    ):
        assert [(t.name, t.type) for t in ours] == [(t.name, t.type) for t in theirs]
    # the input feeds what it fed (its Cast, and the Shape beside it in the text tower): the
    # uint8/int32 wire format and the normalisation after the Cast stay as they were
    (name,) = [i.name for i in fp32.graph.input]
    assert sorted(n.op_type for n in int8.graph.node if name in n.input) == sorted(
        n.op_type for n in fp32.graph.node if name in n.input
    )
    # every weight matrix multiplication: 12 blocks x (qkv, out, fc, proj) + the projection
    assert len(quantized_nodes(path)) == 49


def test_the_recorded_figures_pass_the_gate_and_hold_on_other_images(exported_int8) -> None:
    section = exported_int8.int8
    assert section["accepted"] and section["reason"] is None
    for tower in ("image", "text"):
        measured = section["figures"][tower]
        assert measured["vs_fp32"]["mean"] >= MIN_MEAN_COSINE
        assert measured["vs_fp32"]["min"] >= MIN_COSINE
        assert measured["vs_open_clip"]["min"] >= MIN_COSINE
    # not only on the calibration set: the test photos, centre-cropped, through both graphs
    pixels = np.stack([np.asarray(samples.small_photo(i).resize((298, 224)).crop((37, 0, 261, 224)))
                       for i in range(8)])  # fmt: skip
    feeds = {INPUT_NAME: pixels}
    directory = exported_int8.directory
    exact = ort.InferenceSession(str(directory / "model.onnx")).run(None, feeds)[0]
    got = ort.InferenceSession(str(directory / "model_int8.onnx")).run(None, feeds)[0]
    found = cosine(got, exact)
    assert found.mean() >= MIN_MEAN_COSINE and found.min() >= MIN_COSINE


@pytest.fixture
def launch(tmp_path: Path) -> Iterator:
    """Start the container entrypoint (the one launch path) with extra settings; stopped (SIGTERM,
    then killed after 120 s) at the end."""
    supervisor = Supervisor(tmp_path / "launch.log")

    def run(**env: str) -> Supervisor:
        settings = {"GATEWAY_SCRATCH_DIR": str(tmp_path), "GATEWAY_TRITON_PROFILE": "cpu-int8"}
        return supervisor.entrypoint(**settings | env)

    yield run
    supervisor.close(grace=120)


def wait_ready(served: Supervisor) -> None:
    served.wait_ready(timeout=300)


def model_card(url: str) -> dict:
    (card,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return card  # type: ignore[no-any-return]


def test_cpu_int8_answers_images_and_texts_within_the_gate_of_fp32(
    exported_int8, gateway, launch
) -> None:
    served = launch(GATEWAY_MODEL_DIR=str(exported_int8.directory))
    wait_ready(served)
    card = model_card(served.url)
    assert card["modalities"] == ["image", "text"]
    for tower in ("image", "text"):
        assert card["quantization"][tower]["precision"] == "int8"
        recorded = exported_int8.int8["figures"][tower]["vs_fp32"]
        assert card["quantization"][tower]["cosine_vs_fp32"] == recorded
    int8_images, int8_texts = embed(served.url)
    fp32_images, fp32_texts = embed(gateway.url)  # the session's FP32 cpu-profile gateway
    for int8, fp32 in ((int8_images, fp32_images), (int8_texts, fp32_texts)):
        found = (int8 * fp32).sum(axis=1)  # unit vectors: the cosine
        assert found.mean() >= MIN_MEAN_COSINE and found.min() >= MIN_COSINE, found
        assert found.min() < 0.999999  # quantized: not the FP32 graph served under a new name
    assert "quantization" not in model_card(gateway.url)  # the FP32 default says nothing


def test_a_refused_int8_export_does_not_start_and_says_why(exported_int8, launch) -> None:
    # the recorded figures (0.9998 image, 0.9993 text) held to a gate they cannot pass
    served = launch(GATEWAY_MODEL_DIR=str(exported_int8.directory),
                    GATEWAY_INT8_MIN_MEAN_COSINE="0.99999")  # fmt: skip
    assert served.process.wait(120) == 2
    log = served.log.read_text()
    assert "INT8 refused by the quality gate" in log
    figure = exported_int8.int8["figures"]["image"]["vs_fp32"]["mean"]
    assert f"mean {figure:.5f} < 0.99999" in log  # the numbers, not just a verdict
    assert "GATEWAY_INT8_FALLBACK=true" in log
    assert "tritonserver" not in log  # refused before anything started


def test_the_fallback_serves_fp32_and_says_so(exported_int8, gateway, launch) -> None:
    served = launch(
        GATEWAY_MODEL_DIR=str(exported_int8.directory),
        GATEWAY_INT8_MIN_MEAN_COSINE="0.99999",
        GATEWAY_INT8_FALLBACK="true",
    )
    wait_ready(served)
    assert "serving the FP32 files instead" in served.log.read_text()
    card = model_card(served.url)
    for tower in ("image", "text"):
        value = card["quantization"][tower]
        assert (value["precision"], value["requested"]) == ("fp32", "int8")
        assert value["fallback"].startswith("INT8 refused by the quality gate")
    # the FP32 graphs: the same answers as the FP32 gateway's
    for ours, theirs in zip(embed(served.url), embed(gateway.url), strict=True):
        assert (ours * theirs).sum(axis=1).min() > 0.99999


def test_an_export_without_int8_files_is_refused_for_cpu_int8(exported, launch, tmp_path) -> None:
    """A baked export made without --int8: the launcher does not quantize it, it says how."""
    baked = tmp_path / "baked"
    baked.mkdir()
    manifest = json.loads((exported.directory / "manifest.json").read_text())
    manifest.pop("int8", None)
    (baked / "manifest.json").write_text(json.dumps(manifest))
    served = launch(GATEWAY_MODEL_DIR=str(baked))
    assert served.process.wait(120) == 2
    assert "export again with --int8" in served.log.read_text()

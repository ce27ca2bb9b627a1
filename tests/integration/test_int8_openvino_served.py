"""The cpu-int8-openvino profile end to end: the launch path builds OpenVINO INT8 with NNCF for the
test model at its first start (in the Triton env), holds it to the quality gate, and serves it
through a real Triton (the Python backend running OpenVINO), a real gateway, real HTTP, within the
gate of open_clip's own pipeline; a gate it cannot pass refuses to start and says why."""

from __future__ import annotations

import numpy as np
import pytest

from clip_gateway.model.gate import MIN_COSINE, MIN_MEAN_COSINE
from clip_gateway.profiles import int8_openvino
from tests import reference
from tests.integration.test_bf16_served import IMAGES, TEXTS, embed
from tests.integration.test_int8 import launch, model_card  # noqa: F401

# the first start builds (NNCF on both towers: ~4 min on a loaded 2-CPU machine), later ones not
pytestmark = pytest.mark.timeout(1200)


def openvino_launch(launch, exported, **env: str):  # noqa: F811
    return launch(GATEWAY_MODEL_DIR=str(exported.directory),
                  GATEWAY_TRITON_PROFILE="cpu-int8-openvino", **env)  # fmt: skip


def test_cpu_int8_openvino_is_built_gated_and_served_within_the_gate_of_open_clip(
    exported,
    gateway,
    launch,  # noqa: F811
) -> None:
    served = openvino_launch(launch, exported)
    served.wait_ready(timeout=1100)
    record = int8_openvino.kept(exported.directory)
    assert record is not None, "no OpenVINO INT8 build beside the export"
    card = model_card(served.url)
    assert card["modalities"] == ["image", "text"]
    for tower in ("image", "text"):
        value = card["quantization"][tower]
        assert (value["precision"], value["runtime"]) == ("int8", "openvino")
        assert value["nncf"] == record["runtimes"]["nncf"]
        assert value["cosine_vs_fp32"] == record["figures"][tower]["vs_fp32"]
        assert value["cosine_vs_fp32"]["mean"] >= MIN_MEAN_COSINE
        assert value["cosine_vs_fp32"]["min"] >= MIN_COSINE
        print(f"\ncpu-int8-openvino gate, {tower}: {value['cosine_vs_fp32']}")
    images, texts = embed(served.url)
    expected_images = reference.embed_images(IMAGES)
    expected_texts = reference.embed_tokens(reference.tokens(TEXTS))
    for got, expected in ((images, expected_images), (texts, expected_texts)):
        found = reference.cosines(got, expected)
        print(f"\ncpu-int8-openvino vs open_clip: mean={found.mean():.6f} min={found.min():.6f}")
        assert found.mean() >= MIN_MEAN_COSINE and found.min() >= MIN_COSINE, found
    # INT8 really runs: not the FP32 graphs under a new name (the session's FP32 gateway)
    fp32_images, fp32_texts = embed(gateway.url)
    assert np.einsum("ij,ij->i", images, fp32_images).min() < 0.99999
    assert np.einsum("ij,ij->i", texts, fp32_texts).min() < 0.99999


def test_a_gate_it_cannot_pass_does_not_start_and_says_why(exported, launch) -> None:  # noqa: F811
    # its figures are ~0.9998 against FP32 here: a gate of 0.999999 refuses them
    served = openvino_launch(launch, exported, GATEWAY_INT8_MIN_MEAN_COSINE="0.999999")
    assert served.process.wait(1100) == 2
    log = served.log.read_text()
    assert "the cpu-int8-openvino profile is refused: OpenVINO INT8 refused" in log
    assert "< 0.999999" in log  # the numbers, not just a verdict
    assert "tritonserver" not in log  # refused before Triton started

"""The gateway follows models Triton loads again in place (``auto``'s switch to the profile it
measured fastest, docs/PROFILES.md): the configs are read again every ``INFO_REFRESH_S``, a
change of quantization or canary alone is taken, a read that fails or finds the text model
missing mid-reload keeps what serves. The seam is the config read (one gRPC call per model)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from clip_gateway.backend import triton
from clip_gateway.backend.protocol import ModelInfo, TextModel
from clip_gateway.errors import BackendUnavailable

TEXT = TextModel("clip_text", 77, 32, "/tokenizer.json")
INT8 = ModelInfo("clip_image", 224, 512, 32, canary=np.ones(512, np.float32), text=TEXT,
                 quantization={"precision": "int8"}, instances=2)  # fmt: skip
CHOSEN = {"precision": "int8", "profile_choice": {"chosen": "cpu-int8-openvino"}}
OPENVINO = replace(INT8, canary=np.full(512, 0.5, np.float32), quantization=CHOSEN)


def test_a_model_loaded_again_is_followed_and_a_read_mid_reload_keeps_what_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[ModelInfo | Exception] = [
        INT8,
        INT8,  # nothing changed
        BackendUnavailable("Triton restarting"),
        replace(INT8, text=None, text_unavailable="Triton serves no text model"),  # mid-reload
        OPENVINO,  # same fields a dataclass compares: only quantization and canary differ
    ]

    async def read() -> ModelInfo:
        answer = reads.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def follow() -> list[ModelInfo]:
        backend = triton.TritonBackend("127.0.0.1:9", "clip_image")
        monkeypatch.setattr(backend, "_read_model_info", read)
        seen = [await backend.model_info()]
        monkeypatch.setattr(triton, "INFO_REFRESH_S", -1.0)  # every call reads again
        for _ in range(4):
            seen.append(await backend.model_info())
        return seen

    seen = asyncio.run(follow())
    assert not reads
    assert [s.quantization for s in seen] == [INT8.quantization] * 4 + [OPENVINO.quantization]
    assert all(s.text == TEXT for s in seen)  # texts never became unavailable
    assert seen[-1].canary is not None and float(seen[-1].canary[0]) == 0.5


def test_within_the_interval_the_configs_are_not_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = [INT8, OPENVINO]

    async def read() -> ModelInfo:
        return reads.pop(0)

    async def twice() -> tuple[ModelInfo, ModelInfo]:
        backend = triton.TritonBackend("127.0.0.1:9", "clip_image")
        monkeypatch.setattr(backend, "_read_model_info", read)
        return await backend.model_info(), await backend.model_info()

    first, second = asyncio.run(twice())
    assert first is second and reads == [OPENVINO]


@pytest.mark.parametrize(
    ("setting", "version", "wanted"),
    [
        ("auto", "2.51.0", False),  # the bundled Triton: its tracer crashes under traced load
        ("auto", "2.54.0", False),  # NGC 25.01's
        ("auto", "2.57.0", True),  # the first with the fix (triton-inference-server/server#8144)
        ("auto", "2.65.1", True),
        ("auto", "3.0.0", True),
        ("auto", "", False),  # unknown: taken as unfixed
        ("auto", "main", False),
        ("on", "2.51.0", True),
        ("on", "", True),
        ("off", "2.65.0", False),
    ],
)
def test_the_trace_context_goes_only_to_a_triton_whose_tracer_is_fixed(
    setting: triton.TritonSpans, version: str, wanted: bool
) -> None:
    assert triton.spans_wanted(setting, version) is wanted

"""The cpu-bf16 profile's pure parts (profiles/bf16.py): which CPUs have BF16 units (their
/proc/cpuinfo flags), its check's inputs and failures, and what the renderer writes for it
(runtime, precision, figures, or the FP32 fallback and why). Its gate is
tests/unit/profiles/test_gates.py's; the end-to-end path tests/integration/test_bf16_served.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clip_gateway.config.settings import PROFILES, RepositorySettings
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import QUANTIZATION_PARAMETER, TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.model.gate import Thresholds
from clip_gateway.profiles import bf16
from clip_gateway.profiles.choice import FALLBACK
from clip_gateway.profiles.plans import ModelPlan, model_plan
from tests.unit.launcher.test_repository import as_triton_json, int8_export, read

SAPPHIRE_RAPIDS = "fpu vme sse sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
COOPER_LAKE = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16"
ICE_LAKE = "fpu sse2 avx2 avx512f avx512_vnni avx512_vbmi"
ZEN3 = "fpu sse2 avx2 fma bmi2"


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\n"
        f"flags\t\t: {flags}\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    return path


@pytest.mark.parametrize(
    ("flags", "unit"),
    [
        (SAPPHIRE_RAPIDS, "amx_bf16"),
        (COOPER_LAKE, "avx512_bf16"),
        (ICE_LAKE, None),  # AVX-512 without BF16: OpenVINO would not run BF16
        (ZEN3, None),
    ],
)
def test_the_bf16_unit_is_read_from_the_cpus_flags(
    tmp_path: Path, flags: str, unit: str | None
) -> None:
    assert bf16.bf16_flag(bf16.cpu_flags(cpuinfo(tmp_path, flags))) == unit


def test_no_cpuinfo_or_no_flags_line_is_no_bf16(tmp_path: Path) -> None:
    assert bf16.cpu_flags(tmp_path / "missing") == frozenset()
    (tmp_path / "odd").write_text("processor : 0\nfeatures : avx512_bf16\n")  # not x86's "flags"
    assert bf16.bf16_flag(bf16.cpu_flags(tmp_path / "odd")) is None


def test_cpu_bf16_is_a_cpu_profile_with_openvinos_core_plan() -> None:
    assert "cpu-bf16" in PROFILES
    # one instance with every thread (bench/results/plans/openvino), not cpu-int8's 2 x 1
    assert model_plan("cpu-bf16", 2) == ModelPlan(1, 2)
    assert model_plan("cpu-bf16", 8) == ModelPlan(1, 8)
    assert RepositorySettings(profile="cpu-bf16").warmup == (1,)
    # chosen by auto and failing to load: the FP32 cpu profile, as tensorrt falls back to cuda
    assert FALLBACK["cpu-bf16"] == "cpu"


FIGURES = {
    "image": {"set": "photos", "vs_fp32": {"mean": 0.99996, "min": 0.99995, "count": 48}},
    "text": {"set": "captions", "vs_fp32": {"mean": 0.99994, "min": 0.99991, "count": 96}},
}


def test_cpu_bf16_renders_the_fp32_files_on_openvino_with_the_gates_figures(
    tmp_path: Path,
) -> None:
    section = bf16.section("2026.4.1", FIGURES, Thresholds(), None)
    repo = render(RepositorySettings(profile="cpu-bf16"), int8_export(tmp_path / "e"),
                  tmp_path / "repo", bf16=section)  # fmt: skip
    for model, kind, onnx_file in (
        (TRITON_MODEL_NAME, "image", "model.onnx"),
        (TEXT_MODEL_NAME, "text", "text.onnx"),
    ):
        config = read(repo, model)
        assert config.backend == "python"
        assert config.parameters["onnx_file"].string_value == onnx_file
        assert config.parameters["runtime"].string_value == "openvino"
        assert config.parameters["inference_precision"].string_value == "bf16"
        assert (repo / model / "1" / "model.py").exists()
        value = json.loads(config.parameters[QUANTIZATION_PARAMETER].string_value)
        assert (value["precision"], value["runtime"], value["openvino"]) == (
            "bf16", "openvino", "2026.4.1")  # fmt: skip
        assert value["cosine_vs_fp32"] == FIGURES[kind]["vs_fp32"]
        assert value["gate"] == Thresholds().as_dict()


def test_cpu_bf16_refused_renders_the_cpu_profile_saying_why(tmp_path: Path) -> None:
    from clip_gateway.backend.model_config import parse_model_config, parse_text_config

    why = "BF16 refused by the quality gate: text tower cosine vs FP32 min 0.98000 < 0.99"
    section = bf16.section("2026.4.1", FIGURES, Thresholds(), why)
    repo = render(RepositorySettings(profile="cpu-bf16"), int8_export(tmp_path / "e"),
                  tmp_path / "repo", bf16=section)  # fmt: skip
    for model in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):
        config = read(repo, model)
        assert "runtime" not in config.parameters  # ONNX Runtime, model.py's default
        assert not config.parameters["onnx_file"].string_value.endswith("_int8.onnx")
    info = parse_model_config(as_triton_json(read(repo, TRITON_MODEL_NAME)))
    info = parse_text_config(info, as_triton_json(read(repo, TEXT_MODEL_NAME)))
    assert info.quantization is not None
    for kind in ("image", "text"):
        value = info.quantization[kind]
        assert (value["precision"], value["requested"], value["fallback"]) == ("fp32", "bf16", why)


def test_cpu_bf16_needs_the_python_backend(tmp_path: Path) -> None:
    settings = RepositorySettings(profile="cpu-bf16", cpu_backend="onnxruntime")
    with pytest.raises(ValueError, match="OpenVINO in the Python backend"):
        render(settings, int8_export(tmp_path / "e"), tmp_path / "repo")


def test_calibration_inputs_are_the_models_shapes(tmp_path: Path) -> None:
    manifest = {"image_size": 64, "towers": {"image": {}}, "tokenizer": {"available": False}}
    inputs = bf16.calibration_inputs(manifest, tmp_path)
    assert set(inputs) == {"image"}  # no usable tokenizer: no text tower to gate
    assert inputs["image"].shape == (bf16.PHOTOS, 64, 64, 3)
    assert inputs["image"].dtype.name == "uint8"
    assert inputs["image"].std() > 10  # photo-like, not blank


def test_openvino_missing_from_the_triton_env_says_how_to_install_it(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    with pytest.raises(bf16.Bf16Unavailable, match="make triton-env"):
        bf16.openvino_version(python)


def fake_check(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """An export directory with a small manifest, and an "interpreter" running ``body``."""
    export = tmp_path / "export"
    export.mkdir()
    manifest = {"image_size": 32, "towers": {"image": {}}, "tokenizer": {"available": False}}
    (export / "manifest.json").write_text(json.dumps(manifest))
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\n{body}\n")
    python.chmod(0o755)
    return export, python


def test_a_failing_check_says_why(tmp_path: Path) -> None:
    export, python = fake_check(tmp_path, "echo 'RuntimeError: no bf16 here' >&2; exit 3")
    with pytest.raises(bf16.Bf16Unavailable, match="check failed: RuntimeError: no bf16 here"):
        bf16.measure(export, python, tmp_path / "check.py", 1)


@pytest.mark.slow
def test_a_stopped_launch_ends_the_check(tmp_path: Path) -> None:
    export, python = fake_check(tmp_path, "exec sleep 600")
    with pytest.raises(bf16.Bf16Unavailable, match="the launch was stopped"):
        bf16.measure(export, python, tmp_path / "check.py", 1, stop=lambda: True)
    with pytest.raises(bf16.Bf16Unavailable, match="took over 1 s"):
        bf16.measure(export, python, tmp_path / "check.py", 1, timeout=1.0)

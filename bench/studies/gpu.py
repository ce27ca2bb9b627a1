"""``python -m bench gpu``: the exported graphs on a GPU, as the ``cuda`` profile runs them.

For each model: export it (``python -m clip_gateway.export``'s own code, random weights, seeded),
then run both towers' FP32 and FP16 graphs in ONNX Runtime's CUDA execution provider with the
options ``triton/profiles/cuda.pbtxt`` passes (HEURISTIC cuDNN search, no CUDA graph), and record

- **parity** against open_clip's own torch pipeline in FP32 on the CPU
  (``clip_gateway/export/parity.py``'s references): the lowest and mean cosine, and the largest
  absolute difference for FP32;
- **throughput** per batch size, inputs and outputs in host memory (Triton's backend copies them
  in and out the same way), and open_clip in torch FP16 on the same GPU as the engine-side
  ceiling a GPU host's CPUs must feed;
- whether the TensorRT execution provider could be created at all, and if not, ONNX Runtime's
  reason (the TensorRT libraries are not pip-installable on every machine).

Results: JSON, a Markdown table and a plot in ``bench/results/gpu``. Nothing here runs in CI.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import engine
from bench.harness.output import figure, write_results

IMAGE_BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
TEXT_BATCHES: tuple[int, ...] = (1, 8, 32, 128)
PARITY_BATCH = 32
#: The provider under test; CPUExecutionProvider only to try this script on a machine with no GPU.
PROVIDER = "CUDAExecutionProvider"


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from clip_gateway.model.gate import cosine

    return cosine(a, b)


def _tower(
    session: Any, feed_name: str, reference: np.ndarray, inputs: np.ndarray
) -> dict[str, float]:
    got = session.run(None, {feed_name: inputs})[0]
    cos = _cosines(got, reference)
    return {
        "cosine_min": round(float(cos.min()), 6),
        "cosine_mean": round(float(cos.mean()), 6),
        "max_abs": float(np.abs(got.astype(np.float64) - reference).max()),
    }


def measure_model(model_name: str, cache_dir: Path, seconds: float) -> dict[str, Any]:
    from clip_gateway.export.build import ensure_exported
    from clip_gateway.export.model import load
    from clip_gateway.export.parity import reference, reference_text
    from clip_gateway.export.text import vocab_size
    from clip_gateway.model.contract import INPUT_NAME, TEXT_INPUT_DTYPE, TEXT_INPUT_NAME
    from clip_gateway.model.spec import Weights

    weights = Weights.random(0)
    started = time.perf_counter()
    exported = ensure_exported(model_name, weights, cache_dir)
    export_s = time.perf_counter() - started
    loaded = load(model_name, weights)
    size = loaded.image_size
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(PARITY_BATCH, size, size, 3), dtype=np.uint8)
    image_ref = reference(loaded, pixels).astype(np.float64)
    context = int(exported.manifest["context_length"])
    # CLIP BPE framing (start, ids, end as the largest id: open_clip pools at argmax)
    tokens = rng.integers(1, vocab_size(loaded.clip) - 2, size=(PARITY_BATCH, context))
    tokens[:, 0], tokens[:, -1] = vocab_size(loaded.clip) - 2, vocab_size(loaded.clip) - 1
    tokens = tokens.astype(TEXT_INPUT_DTYPE)
    text_ref = reference_text(loaded, tokens).astype(np.float64)

    result: dict[str, Any] = {
        "export_seconds": round(export_s, 1),
        "image_size": size,
        "fp16_fused_ops": exported.manifest["towers"]["image"].get("fp16_fused_ops"),
    }
    for precision, image_path, text_path in (
        ("fp32", exported.fp32, exported.text_fp32),
        ("fp16", exported.fp16, exported.text_fp16),
    ):
        if image_path is None:
            continue
        image = engine.session(image_path, PROVIDER)
        entry: dict[str, Any] = {"image": _tower(image, INPUT_NAME, image_ref, pixels)}
        entry["image_rates"] = {
            str(b): engine.rate(
                lambda b=b, s=image: s.run(None, {INPUT_NAME: pixels[:1].repeat(b, axis=0)}),
                b,
                seconds,
            )
            for b in IMAGE_BATCHES
        }
        if text_path is not None:
            text = engine.session(text_path, PROVIDER)
            entry["text"] = _tower(text, TEXT_INPUT_NAME, text_ref, tokens)
            entry["text_rates"] = {
                str(b): engine.rate(
                    lambda b=b, t=text: t.run(None, {TEXT_INPUT_NAME: tokens[:1].repeat(b, 0)}),
                    b,
                    seconds,
                )
                for b in TEXT_BATCHES
            }
        result[precision] = entry
    result["tensorrt_ep"] = _tensorrt_probe(exported.fp16 or exported.fp32)
    if PROVIDER == "CUDAExecutionProvider":
        result["torch_fp16"] = engine.torch_fp16(loaded, size, (32, 128, 256), seconds)
    return result


def _tensorrt_probe(path: Path) -> dict[str, Any]:
    import onnxruntime as ort

    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        return {"available": False, "why": "this onnxruntime build has no TensorRT EP"}
    try:
        session = ort.InferenceSession(
            str(path), providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        )
    except Exception as exc:  # the EP reports a missing libnvinfer as an exception
        return {"available": False, "why": str(exc).splitlines()[0][:300]}
    active = session.get_providers()
    if active[0] != "TensorrtExecutionProvider":
        return {"available": False, "why": f"fell back to {active} (libnvinfer not loadable)"}
    return {"available": True}


def _environment() -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU dry run)",
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "python": platform.python_version(),
    }


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# The exported graphs on a GPU (ONNX Runtime CUDA EP, the `cuda` profile's options)",
        "",
        f"GPU: {env['gpu']}; onnxruntime {env['onnxruntime']}, torch {env['torch']}. "
        "Random weights (seed 0); parity against open_clip in torch FP32 on the CPU, "
        f"{PARITY_BATCH} random images / token rows; rates with inputs and outputs in host memory.",
        "",
        "| model | graph | image cos min / mean | text cos min / mean | FP32 max abs (image) |",
        "|---|---|---|---|---|",
    ]
    for model, found in results["models"].items():
        for precision in ("fp32", "fp16"):
            if precision not in found:
                continue
            entry = found[precision]
            text = entry.get("text")
            text_cell = f"{text['cosine_min']:.6f} / {text['cosine_mean']:.6f}" if text else "–"
            lines.append(
                f"| {model} | {precision} | {entry['image']['cosine_min']:.6f} / "
                f"{entry['image']['cosine_mean']:.6f} | {text_cell} | "
                f"{entry['image']['max_abs']:.2e} |"
            )
    lines += ["", "Images/s (one ORT session, one stream; batch size across):", ""]
    lines += ["| model | graph | " + " | ".join(str(b) for b in IMAGE_BATCHES) + " |"]
    lines += ["|---|---|" + "---|" * len(IMAGE_BATCHES)]
    for model, found in results["models"].items():
        for precision in ("fp32", "fp16"):
            if precision in found:
                rates = found[precision]["image_rates"]
                cells = " | ".join(f"{rates[str(b)]['items_per_s']:,.0f}" for b in IMAGE_BATCHES)
                lines.append(f"| {model} | ORT CUDA {precision} | {cells} |")
        torch_rates = found.get("torch_fp16", {})
        cells = " | ".join(
            f"{torch_rates[str(b)]['items_per_s']:,.0f}" if str(b) in torch_rates else "–"
            for b in IMAGE_BATCHES
        )
        lines.append(f"| {model} | torch FP16 (device tensors) | {cells} |")
    lines += ["", "Texts/s:", ""]
    lines += ["| model | graph | " + " | ".join(str(b) for b in TEXT_BATCHES) + " |"]
    lines += ["|---|---|" + "---|" * len(TEXT_BATCHES)]
    for model, found in results["models"].items():
        for precision in ("fp32", "fp16"):
            if precision in found and "text_rates" in found[precision]:
                rates = found[precision]["text_rates"]
                cells = " | ".join(f"{rates[str(b)]['items_per_s']:,.0f}" for b in TEXT_BATCHES)
                lines.append(f"| {model} | ORT CUDA {precision} | {cells} |")
    lines += [
        "",
        "ONNX Runtime's fused ops in the FP16 image graph (clip_gateway/export/onnx_export.py):",
        "",
    ]
    for model, found in results["models"].items():
        lines.append(
            f"- {model}: {found.get('fp16_fused_ops') or 'none (an export before the fusions)'}"
        )
    lines += ["", "TensorRT EP:", ""]
    for model, found in results["models"].items():
        lines.append(f"- {model}: {found['tensorrt_ep']}")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    with figure(path, dpi=120, figsize=(7, 4)) as (_, ax):
        for model, found in results["models"].items():
            for precision in ("fp32", "fp16"):
                if precision in found:
                    rates = found[precision]["image_rates"]
                    ax.plot(
                        IMAGE_BATCHES,
                        [rates[str(b)]["items_per_s"] for b in IMAGE_BATCHES],
                        marker="o",
                        label=f"{model} ORT CUDA {precision}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("images/s")
        ax.set_title(f"Exported image towers on {results['environment']['gpu']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


def run(models: tuple[str, ...], out: Path, cache_dir: Path, seconds: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    if PROVIDER == "CUDAExecutionProvider":
        import onnxruntime as ort

        # CUDA and cuDNN from the nvidia-* wheels torch brought, before any session needs them
        ort.preload_dlls()
    results: dict[str, Any] = {"environment": _environment(), "models": {}}
    for model in models:
        results["models"][model] = measure_model(model, cache_dir, seconds)
        write_results(out, "gpu", results)  # each model's figures kept as soon as measured
    write_results(out, "gpu", results, markdown=markdown(results), plot=plot)
    return results

"""``python -m bench fidelity``: each CPU profile's served embeddings against open_clip FP32 in
torch on real photographs, through the whole gateway as deployed (the container entrypoint).

The quality gate holds each profile to the generated calibration set (clip_gateway/model/
calibration.py) at its first start; this puts the same question to photographs. Photos are
taken from ``--photos DIR`` (yours: any JPEG/PNG/WebP under it), else from the real photographs
that ship inside this machine's installed packages (matplotlib's ``grace_hopper.jpg``,
scikit-learn's ``china.jpg`` and ``flower.jpg``), each in several crops. Every view is resized
here to the model's input and sent as a lossless PNG, so the gateway only decodes it: the cosine
is the served model's against open_clip's on the same pixels (seed-0 random weights, as every
bench; the architecture and the arithmetic are the real ones).
"""

from __future__ import annotations

import io
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.harness.clients import post
from bench.harness.machine import cpu_load as machine
from bench.harness.output import write_results
from bench.harness.systems import gateway

ROOT = Path(__file__).resolve().parents[2]
#: Real photographs shipped inside packages, looked for in the gateway's venv and the Triton env.
SHIPPED = (
    "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
    "sklearn/datasets/images/china.jpg",
    "sklearn/datasets/images/flower.jpg",
)
#: The profiles measured by default: the default (``auto``, which names its choice) and each
#: fixed CPU profile.
PROFILES = ("auto", "cpu", "cpu-int8", "cpu-bf16", "cpu-int8-openvino")
SIZE = 224
SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}


def shipped_photos() -> list[Path]:
    """The package-shipped photographs found on this machine (each once)."""
    found: dict[str, Path] = {}
    for env in (ROOT / ".venv", ROOT / ".triton-env", Path(sys.prefix)):
        for site in env.glob("lib/python3*/site-packages"):
            for relative in SHIPPED:
                if (site / relative).is_file():
                    found.setdefault(Path(relative).name, site / relative)
    return sorted(found.values())


def views(photo: Image.Image) -> Iterator[Image.Image]:
    """The whole photo centre-cropped square, its four corners and centre at 60 %, mirrored."""
    rgb = photo.convert("RGB")
    width, height = rgb.size
    side = min(width, height)
    crops = [((width - side) // 2, (height - side) // 2, side)]
    part = int(side * 0.6)
    for x, y in ((0, 0), (width - part, 0), (0, height - part), (width - part, height - part),
                 ((width - part) // 2, (height - part) // 2)):  # fmt: skip
        crops.append((x, y, part))
    for x, y, s in crops:
        view = rgb.crop((x, y, x + s, y + s)).resize((SIZE, SIZE), Image.Resampling.BICUBIC)
        yield view
        yield view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def photo_set(folder: Path | None) -> tuple[list[str], list[bytes], np.ndarray]:
    paths = (sorted(p for p in folder.rglob("*") if p.suffix.lower() in SUFFIXES)
             if folder is not None else shipped_photos())  # fmt: skip
    if not paths:
        raise SystemExit("no photographs found: give --photos DIR")
    files, pixels = [], []
    for path in paths:
        with Image.open(path) as photo:
            for view in views(photo):
                buffer = io.BytesIO()
                view.save(buffer, "PNG")
                files.append(buffer.getvalue())
                pixels.append(np.asarray(view))
    return [str(p) for p in paths], files, np.stack(pixels)


def served(url: str, files: list[bytes]) -> tuple[np.ndarray, dict[str, Any] | None]:
    """The gateway's embeddings of ``files`` (16 per request), and ``auto``'s choice if any."""
    from clip_gateway.client.core import multipart

    rows = []
    for start in range(0, len(files), 16):
        body, content_type = multipart(files[start : start + 16], "image/png")
        response = post(f"{url}/v1/embeddings", content=body, timeout=300,
                        headers={"Content-Type": content_type})  # fmt: skip
        response.raise_for_status()
        rows += [row["embedding"] for row in response.json()["data"]]
    choice = None
    for card in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]:
        choice = ((card.get("quantization") or {}).get("image") or {}).get("profile_choice")
    return np.array(rows, dtype=np.float64), choice


def run(
    out: Path, profiles: tuple[str, ...] = PROFILES, photos: Path | None = None
) -> dict[str, Any]:
    from clip_gateway.export.build import ensure_exported
    from clip_gateway.export.model import load
    from clip_gateway.export.parity import reference
    from clip_gateway.model.gate import cosine
    from clip_gateway.model.spec import Weights

    names, files, pixels = photo_set(photos)
    exported = ensure_exported("ViT-B-32", Weights.random(0), int8=True)
    expected = reference(load("ViT-B-32", Weights.random(0)), pixels).astype(np.float64)
    results: dict[str, Any] = {"machine": machine(), "photos": names, "views": len(files),
                               "command": " ".join(["python -m bench", *sys.argv[1:]]),
                               "profiles": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as tmp:
        for profile in profiles:
            try:
                with gateway(profile, exported.directory, Path(tmp), {}) as url:
                    vectors, choice = served(url, files)
            except Exception as exc:  # a profile this machine cannot run: say so, go on
                results["profiles"][profile] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            found = cosine(vectors, expected)
            results["profiles"][profile] = {
                "cos_mean": round(float(found.mean()), 6),
                "cos_min": round(float(found.min()), 6),
                **({"chosen": choice["chosen"]} if profile == "auto" and choice else {}),
            }
            print(profile, results["profiles"][profile], flush=True)
    write_results(out, "fidelity", results, markdown=markdown(results))
    return results


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Fidelity on real photographs: each CPU profile against open_clip FP32",
        "",
        f"{m['cpu_model']}, nproc {m['nproc']}. `{results['command']}`. "
        f"{results['views']} views (crops, mirrored) of {len(results['photos'])} photographs: "
        + ", ".join(f"`{Path(p).name}`" for p in results["photos"])
        + f"; each resized to {SIZE} x {SIZE} here and sent as PNG through the gateway "
        "(container entrypoint), compared with open_clip in torch FP32 on the same pixels "
        "(seed-0 random ViT-B/32 weights).",
        "",
        "| profile | mean cosine | min cosine |",
        "| --- | --- | --- |",
    ]
    for profile, found in results["profiles"].items():
        name = f"{profile} (chose {found['chosen']})" if "chosen" in found else profile
        if "error" in found:
            lines.append(f"| {name} | not served here: {found['error'][:120]} | |")
        else:
            lines.append(f"| {name} | {found['cos_mean']:.6f} | {found['cos_min']:.6f} |")
    return "\n".join(lines) + "\n"

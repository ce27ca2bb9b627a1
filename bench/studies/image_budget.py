"""``python -m bench image-budget`` (run by `make image-test`): the runtime image's size over its
base and its layers, as podman reports them, to bench/results/image/ (JSON, Markdown, PNG)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.harness import study
from bench.harness.output import figure, write_results

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "image" / "containers.conf"))


def podman_json(*args: str) -> Any:
    return json.loads(subprocess.run(["podman", *args], capture_output=True, text=True,
                                     check=True).stdout)  # fmt: skip


def what(created_by: str) -> str:
    """A layer's instruction, short: ``COPY --from=…`` content is named by its destination."""
    text = created_by.replace("/bin/sh -c #(nop) ", "").strip()
    text = re.sub(r"^\|\d+ .*?/bin/sh -c ", "RUN ", text)  # build args of a RUN
    text = re.sub(r"^COPY (dir|file):[0-9a-f]+ in ", "COPY → ", text)
    return text if len(text) <= 110 else text[:107] + "..."


def measure(image: str, base: str) -> dict[str, Any]:
    (inspected,) = podman_json("image", "inspect", image)
    (base_inspected,) = podman_json("image", "inspect", base)
    history = podman_json("history", "--format", "json", image)
    base_layers = len(podman_json("history", "--format", "json", base))
    ours = history[: len(history) - base_layers]  # newest first; the base's are the last rows
    layers = [
        {"size_bytes": int(row["size"]), "instruction": what(row.get("CreatedBy", ""))}
        for row in reversed(ours)
        if int(row["size"]) > 0
    ]
    return {
        "image": image,
        "base": base,
        "size_bytes": int(inspected["Size"]),
        "base_size_bytes": int(base_inspected["Size"]),
        "over_base_bytes": int(inspected["Size"]) - int(base_inspected["Size"]),
        "layers_over_base": layers,
    }


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def write(results: dict[str, Any], out: Path) -> None:
    write_results(out, "budget", results, markdown=markdown(results), plot=plot)


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Image budget: `{results['image']}` over `{results['base']}`",
        "",
        f"Image {mb(results['size_bytes'])}, base {mb(results['base_size_bytes'])}, "
        f"**over the base {mb(results['over_base_bytes'])}** (podman's uncompressed sizes).",
        "",
        "| layer (oldest first) | size |",
        "| --- | ---: |",
    ]
    for layer in results["layers_over_base"]:
        instruction = layer["instruction"].replace("|", "\\|")
        lines.append(f"| `{instruction}` | {mb(layer['size_bytes'])} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    layers = results["layers_over_base"]
    with figure(path, figsize=(8, 0.5 + 0.45 * (len(layers) + 1))) as (_, axes):
        labels = ["base"] + [layer["instruction"][:50] for layer in layers]
        sizes = [results["base_size_bytes"]] + [layer["size_bytes"] for layer in layers]
        axes.barh(labels[::-1], [s / 1e6 for s in sizes][::-1], color="C0")
        axes.set_xlabel("MB (uncompressed)")
        axes.set_title(f"{results['image']}: {mb(results['over_base_bytes'])} over its base")


def main(argv: list[str]) -> int:
    parser = study.parser("image-budget", __doc__)
    parser.add_argument("--image", default="clip-gateway:local")
    parser.add_argument("--base", default="localhost/clip-gateway-base/tritonserver:standin")
    args = parser.parse_args(argv)
    out = study.out(args, "image")
    write(measure(args.image, args.base), out)
    print((out / "budget.md").read_text())
    return 0

"""The pinned distributions a GPU host needs beside what its image has: the transitive closure of
``clip-gateway[server,export]`` read from this checkout's installed metadata, at the lock's
versions, less what the host's image already holds (torch and its CUDA libraries, numpy).

``python bench/gpu_kit/closure.py requirements/lock.txt`` prints ``name==version`` lines.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOTS = ("clip-gateway[server,export]",)
#: On the GPU host's image already (docs/GPU_HOST.md), in builds made for its CUDA: carrying the
#: lock's versions would replace a CUDA build of torch by nothing that runs. Pillow: pillow-simd
#: is built there instead. onnxruntime: the GPU build is carried on its own.
#: The exporter's torch-side stack (onnx, transformers, timm, the hub client) is the image's too:
#: it matches its torch, and carrying it would double the kit.
HOST_HAS = re.compile(
    r"^(torch|torchvision|triton|numpy|pillow|onnxruntime|sympy|mpmath|networkx|jinja2|"
    r"markupsafe|filelock|fsspec|setuptools|nvidia-.*|cuda-.*|onnx|onnx-ir|onnxscript|"
    r"ml-dtypes|transformers|timm|huggingface-hub|hf-xet|safetensors|tokenizers|grpcio|uvloop|"
    r"regex|pyyaml|requests|urllib3|certifi|idna|charset-normalizer|tqdm|packaging|"
    r"typing-extensions|protobuf)$"
)


def closure(roots: tuple[str, ...]) -> set[str]:
    seen: set[str] = set()
    todo = [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        key = name + "[" + ",".join(sorted(requirement.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            child = Requirement(line)
            environments = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if child.marker is None or any(
                child.marker.evaluate({**env, "python_version": "3.12"}) for env in environments
            ):
                todo.append(child)
    return {key.split("[")[0] for key in seen}


def main(lock: Path) -> None:
    pins = {}
    for line in lock.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line):
            pins[canonicalize_name(match[1])] = match[2]
    for name in sorted(closure(ROOTS) - {"clip-gateway"}):
        if not HOST_HAS.match(name) and name in pins:
            print(f"{name}=={pins[canonicalize_name(name)]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""What an export is and where it lives, without torch: weights specs, the cache layout, the
manifest. The serving side reads this to find (or ask for) a model; only
``python -m clip_gateway.export``, in a process of its own, imports torch to build one."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_MODEL = "ViT-B-32"
DEFAULT_PRETRAINED = "laion2b_s34b_b79k"


class WeightsUnavailableError(RuntimeError):
    """Pretrained weights could not be fetched or a checkpoint could not be read."""


class UnsupportedModelError(RuntimeError):
    """The gateway cannot serve this model faithfully (e.g. its image preprocessing)."""


@dataclass(frozen=True)
class Weights:
    """Which weights to load: an open_clip pretrained tag, a checkpoint file, or a random seed."""

    kind: Literal["pretrained", "checkpoint", "random"]
    value: str

    @classmethod
    def pretrained(cls, tag: str = DEFAULT_PRETRAINED) -> Weights:
        return cls("pretrained", tag)

    @classmethod
    def checkpoint(cls, path: str | Path) -> Weights:
        return cls("checkpoint", str(Path(path).resolve()))

    @classmethod
    def random(cls, seed: int = 0) -> Weights:
        return cls("random", str(seed))

    def cache_id(self) -> str:
        """A string that changes whenever the weights do (checkpoints are hashed by content)."""
        if self.kind == "checkpoint":
            if not Path(self.value).is_file():
                raise WeightsUnavailableError(f"checkpoint file not found: {self.value}")
            digest = hashlib.sha256()
            with open(self.value, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            return f"checkpoint:{digest.hexdigest()}"
        return f"{self.kind}:{self.value}"

    def describe(self) -> str:
        return {"pretrained": "pretrained ", "checkpoint": "checkpoint ", "random": "random seed "}[
            self.kind
        ] + self.value


def weights_from_spec(spec: str) -> Weights:
    """``random`` / ``random:SEED`` / a path to a checkpoint file / an open_clip pretrained tag."""
    if spec == "random" or spec.startswith("random:"):
        return Weights.random(int(spec.partition(":")[2] or 0))
    if "/" in spec or spec.endswith((".bin", ".pt", ".pth", ".safetensors")):
        return Weights.checkpoint(spec)
    return Weights.pretrained(spec)


MANIFEST = "manifest.json"
FP32_FILE = "model.onnx"
FP16_FILE = "model_fp16.onnx"
TEXT_FP32_FILE = "text.onnx"
TEXT_FP16_FILE = "text_fp16.onnx"
#: INT8 variants (``python -m clip_gateway.export --int8``, clip_gateway/export/int8.py), for the
#: ``cpu-int8`` profile.
INT8_FILE = "model_int8.onnx"
TEXT_INT8_FILE = "text_int8.onnx"
#: open_clip's CLIP BPE for ``tokenizers`` (clip_gateway/export/tokenizer.py), when the model uses
#: it.
TOKENIZER_FILE = "tokenizer.json"
# Sources whose text decides the exported bytes or the manifest: a change to any of them is a
# new cache entry.
_VERSIONED_SOURCES = (
    "clip_gateway/export/build.py",
    "clip_gateway/export/model.py",
    "clip_gateway/export/onnx_export.py",
    "clip_gateway/export/graph.py",
    "clip_gateway/export/preprocessing.py",
    "clip_gateway/export/text.py",
    "clip_gateway/export/tokenizer.py",
    "clip_gateway/export/hf_tokenizer.py",
    "clip_gateway/model/contract.py",
    "clip_gateway/text/tokenizer.py",
    "clip_gateway/text/hf.py",
)


#: Sources that decide the INT8 files and their figures. Their hash is recorded in the manifest's
#: ``int8`` section: a change re-quantizes an existing export instead of exporting it again.
_INT8_SOURCES = (
    "clip_gateway/model/calibration.py",
    "clip_gateway/model/gate.py",
    "clip_gateway/export/int8.py",
    "clip_gateway/export/quantize.py",
)


def default_cache_dir() -> Path:
    if explicit := os.environ.get("CLIP_GATEWAY_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clip-gateway"


def export_code_version() -> str:
    return _hash_sources(_VERSIONED_SOURCES)


def int8_code_version() -> str:
    return _hash_sources(_INT8_SOURCES)


def _hash_sources(sources: tuple[str, ...]) -> str:
    root = Path(__file__).resolve().parents[2]  # the repository (or site-packages) root
    digest = hashlib.sha256()
    for rel in sources:
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class ExportedModel:
    """A finished export: its directory, the ONNX files and what was recorded about them."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def fp32(self) -> Path:
        return self.directory / FP32_FILE

    @property
    def fp16(self) -> Path | None:
        path = self.directory / FP16_FILE
        return path if path.exists() else None

    @property
    def text_fp32(self) -> Path | None:
        path = self.directory / TEXT_FP32_FILE
        return path if path.exists() else None

    @property
    def text_fp16(self) -> Path | None:
        path = self.directory / TEXT_FP16_FILE
        return path if path.exists() else None

    @property
    def int8(self) -> dict[str, Any] | None:
        """The manifest's ``int8`` section (clip_gateway/export/int8.py), when ``--int8`` was asked
        for."""
        section: dict[str, Any] | None = self.manifest.get("int8")
        return section

    @classmethod
    def open(cls, directory: Path) -> ExportedModel:
        return cls(directory, json.loads((directory / MANIFEST).read_text()))


def model_identity(manifest: dict[str, Any]) -> str:
    """What decides the served graph's values, from an export's manifest: the model, the
    weights' identity (tag, checkpoint content hash or seed) and the export code version.
    Keys what is built from the graph at run time (TensorRT engines, calibration), because ONNX
    Runtime names cached engines by the graph's structure and names, never its weights."""
    material = json.dumps(
        [manifest["model"], manifest["weights"]["id"], manifest["export_code_version"]],
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


#: The open_clip models Immich names otherwise than ``<model>__<tag>``
#: (``immich_ml/models/constants.py``'s ``_OPENCLIP_MODELS``): hyphens for some LAION tags,
#: capitals for the XLM-RoBERTa towers. Every other name there is ``<model>__<tag>`` as spelt.
IMMICH_SPELLINGS = {
    ("ViT-B-32", "laion2b_s34b_b79k"): "ViT-B-32__laion2b-s34b-b79k",
    ("ViT-H-14", "laion2b_s32b_b79k"): "ViT-H-14__laion2b-s32b-b79k",
    ("ViT-L-14", "laion2b_s32b_b82k"): "ViT-L-14__laion2b-s32b-b82k",
    ("ViT-g-14", "laion2b_s12b_b42k"): "ViT-g-14__laion2b-s12b-b42k",
    ("xlm-roberta-base-ViT-B-32", "laion5b_s13b_b90k"):
        "XLM-Roberta-Base-ViT-B-32__laion5b_s13b_b90k",
    ("xlm-roberta-large-ViT-H-14", "frozen_laion5b_s13b_b90k"):
        "XLM-Roberta-Large-ViT-H-14__frozen_laion5b_s13b_b90k",
}  # fmt: skip


def immich_name(manifest: dict[str, Any]) -> str | None:
    """The export's model as Immich names it (``ViT-B-32__openai``: the open_clip model and its
    pretrained tag, in Immich's spelling), or None when its weights are not a pretrained tag:
    random weights or a checkpoint never claim a pretrained model's name on their own."""
    weights = manifest["weights"]
    if weights["kind"] != "pretrained":
        return None
    model, tag = manifest["model"], weights["value"]
    return IMMICH_SPELLINGS.get((model, tag), f"{model}__{tag}")


def tokenizer_id(directory: Path) -> str:
    """A string that changes whenever a tokenizer directory's files do (hashed by content)."""
    if not directory.is_dir():
        raise WeightsUnavailableError(f"tokenizer directory not found: {directory}")
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"tokenizer:{digest.hexdigest()}"


def cache_key(model_name: str, weights: Weights, fp16: bool, tokenizer: Path | None = None) -> str:
    inputs: list[object] = [model_name, weights.cache_id(), export_code_version(), fp16]
    if tokenizer is not None:  # a given tokenizer directory; without one, the hub's (if any)
        inputs.append(tokenizer_id(tokenizer))
    material = json.dumps(inputs, separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def cache_entry(
    model_name: str,
    weights: Weights,
    cache_dir: Path,
    *,
    fp16: bool = True,
    tokenizer: Path | None = None,
) -> Path:
    """The directory an export of these inputs lives in (complete once it has a manifest)."""
    key = cache_key(model_name, weights, fp16, tokenizer)
    return cache_dir / "models" / f"{model_name}-{key}"

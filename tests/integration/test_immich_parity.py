"""Interchangeable with Immich: what the real gateway's ``/predict`` (real Triton, the exported
model) returns against what Immich's own ML server computes for the same preview bytes and
query text (tests/immich_reference.py: its transform and tokenizer, written from its sources,
with open_clip's model and the same random weights), for ViT-B-32 and a SigLIP model. The
negative controls show the limits catch the bugs that made other Immich backends drift.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.harness.photos import immich_previews, jpeg, photo
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.launcher.repository import render
from tests import hf_tokenizers, immich_reference, reference

#: Measured on the 2-core machine (random weights, seed 0; the test prints 7 places): ViT-B-32
#: images and texts min 1.0000000, SigLIP images min 0.9999999. A DCT-scaled decode (what
#: /v1/embeddings does) measured min 0.9998081 on these previews, so the limit sits above it,
#: and above the issue's 0.9999. The negative controls land at 0.33-0.99981.
IMAGE_MIN_LIMIT = 0.99999
TEXT_MIN_LIMIT = 0.99999
SIGLIP = "ViT-B-16-SigLIP"


def preview_set() -> list[tuple[str, bytes]]:
    """Immich previews (JPEG q80 and WebP, landscape, portrait, square, panorama, small), a
    progressive one, and one still carrying an EXIF orientation (which Immich ignores)."""
    out = [(s.name, s.data) for s in immich_previews()]
    out.append(("progressive", jpeg(photo(1920, 1440, seed=31), quality=80, progressive=True)))
    out.append(("exif6", jpeg(photo(960, 720, seed=32), quality=80, orientation=6)))
    out.append(("tiny", jpeg(photo(200, 150, seed=33), quality=80)))
    return out


PREVIEWS = preview_set()
#: Search queries as people type them, and what Immich's cleaning keeps that open_clip's fixes.
TEXTS = [
    "a photo of a cat", "Dog on the BEACH at sunset", "une photo d'un café à Paris",
    "東京の夜景と富士山", "🐕 dog in the snow ❄️", "Fish &amp; chips", "“curly quotes”",
    "tabs\tand\nnewlines   and    runs", "3.14159 apples, 42 oranges; 1,000,000 grapes!",
    "a long caption " + "with many words " * 60, "x", "hello_world", "São Paulo's skyline",
]  # fmt: skip


def immich_gateway(triton_url: str, log: Path, name: str) -> GatewayProcess:
    env = {
        "GATEWAY_IMMICH": "true",
        "GATEWAY_IMMICH_ALIASES": name,
        "GATEWAY_DECODE_THREADS": "2",
        "GATEWAY_CANARY_INTERVAL_S": "0",
    }
    return GatewayProcess(triton_url, env=env, log_path=log)


def predict(url: str, name: str, *, image: bytes | None = None, text: str | None = None) -> dict:
    """One request as Immich's server sends it (FormData: entries, then a Blob or text)."""
    kind = "visual" if image is not None else "textual"
    entry: dict = {"modelName": name}
    if text is not None:
        entry["options"] = {"language": "en"}
    files: list = [("entries", (None, json.dumps({"clip": {kind: entry}})))]
    if image is not None:
        files.append(("image", ("blob", image, "application/octet-stream")))
    else:
        files.append(("text", (None, text)))
    response = httpx.post(f"{url}/predict", files=files, timeout=120)
    assert response.status_code == 200, response.text[:300]
    return response.json()


def vectors(rows: list[dict]) -> np.ndarray:
    return np.array([json.loads(row["clip"]) for row in rows], dtype=np.float64)


def report(what: str, names: list[str], cosines: np.ndarray) -> None:
    print(f"\n{what}: n={len(cosines)} mean={cosines.mean():.7f} min={cosines.min():.7f}")
    for name, value in zip(names, cosines, strict=True):
        print(f"  {name[:40]!r:44s} {value:.7f}")


# --- ViT-B-32 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vit(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("immich") / "gateway.log"
    with immich_gateway(triton.grpc_url, log, "ViT-B-32__openai") as process:
        process.wait_ready()
        yield process


@pytest.fixture(scope="module")
def vit_images(vit: GatewayProcess) -> np.ndarray:
    rows = [predict(vit.url, "ViT-B-32__openai", image=data) for _, data in PREVIEWS]
    for (name, data), row in zip(PREVIEWS, rows, strict=True):
        stored = immich_reference.decode_pil(data)
        assert (row["imageWidth"], row["imageHeight"]) == stored.size, name
    return vectors(rows)


def test_vit_b_32_images_match_immichs_server(vit_images: np.ndarray) -> None:
    got = vit_images
    assert got.shape == (len(PREVIEWS), 512)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    expected = immich_reference.embed_images([d for _, d in PREVIEWS])
    cosines = reference.cosines(got, expected)
    report("ViT-B-32 images vs Immich", [n for n, _ in PREVIEWS], cosines)
    assert cosines.min() >= IMAGE_MIN_LIMIT


@pytest.mark.parametrize("bug", ["channel-swap", "exif-applied", "dct-scaled"])
def test_the_image_limit_catches_what_other_backends_got_wrong(
    vit_images: np.ndarray, bug: str
) -> None:
    """Had /predict swapped R and B, turned the image by its EXIF tag or decoded JPEGs at a
    reduced DCT scale (as /v1/embeddings does), it would sit where these do, under the limit.
    (A crop one pixel off, torchvision's rounding, is within the limit with these weights.)"""
    expected = immich_reference.embed_images([d for _, d in PREVIEWS], perturb=bug)  # type: ignore[arg-type]
    cosines = reference.cosines(vit_images, expected)
    print(f"\n{bug}: mean={cosines.mean():.7f} min={cosines.min():.7f}")
    assert cosines.min() < IMAGE_MIN_LIMIT


@pytest.fixture(scope="module")
def vit_texts(vit: GatewayProcess) -> np.ndarray:
    return vectors([predict(vit.url, "ViT-B-32__openai", text=text) for text in TEXTS])


@pytest.fixture(scope="module")
def hub_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return immich_reference.clip_tokenizer_json(tmp_path_factory.mktemp("hub") / "ViT-B-32")


def test_vit_b_32_texts_match_immichs_server(vit_texts: np.ndarray, hub_tokenizer: Path) -> None:
    ids = immich_reference.tokenize(TEXTS, hub_tokenizer, "<|endoftext|>", 77)
    cosines = reference.cosines(vit_texts, immich_reference.embed_texts(ids))
    report("ViT-B-32 texts vs Immich", TEXTS, cosines)
    assert cosines.min() >= TEXT_MIN_LIMIT


def test_the_text_limit_catches_open_clips_cleaning(vit_texts: np.ndarray) -> None:
    """open_clip's tokenizer (ftfy, HTML unescaped; what /v1/embeddings serves) is a different
    query for some texts: had /predict used it, the limit would catch it."""
    expected = reference.unit(reference.embed_tokens(reference.tokens(TEXTS)))
    cosines = reference.cosines(vit_texts, expected)
    print(f"\nopen_clip's cleaning: min={cosines.min():.7f}")
    assert cosines.min() < TEXT_MIN_LIMIT


# --- SigLIP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    """ViT-B-16-SigLIP with random weights (seed 0), served by its own Triton, exported with a
    locally built T5-style tokenizer directory (the kind its hub repository holds; the same one
    tests/integration/test_hf_text.py builds, so the export is shared). Yields the gateway and
    that directory: the files Immich's server would load."""
    from clip_gateway.model.spec import Weights
    from tests.exports import ensure_exported

    work = tmp_path_factory.mktemp("siglip")
    source = hf_tokenizers.build("t5", work / "tokenizer")
    exported = ensure_exported(SIGLIP, Weights.random(0), tokenizer=source)
    repository = render(RepositorySettings(profile="cpu"), exported.directory, work / "repo")
    with LocalTriton(repository, log_path=work / "triton.log") as server:
        gateway = immich_gateway(server.grpc_url, work / "gateway.log", "ViT-B-16-SigLIP__webli")
        with gateway as process:
            process.wait_ready(timeout=300)
            yield process, source


@pytest.fixture(scope="module")
def siglip_images(siglip: tuple[GatewayProcess, Path]) -> np.ndarray:
    url = siglip[0].url
    return vectors([predict(url, "ViT-B-16-SigLIP__webli", image=d) for _, d in PREVIEWS])


def test_siglip_images_match_immichs_server(siglip_images: np.ndarray) -> None:
    """Immich crops SigLIP's input as it crops every model's, where open_clip squashes it."""
    expected = immich_reference.embed_images([d for _, d in PREVIEWS], name=SIGLIP)
    cosines = reference.cosines(siglip_images, expected)
    report("SigLIP images vs Immich", [n for n, _ in PREVIEWS], cosines)
    assert siglip_images.shape[1] == 768
    assert cosines.min() >= IMAGE_MIN_LIMIT


@pytest.mark.parametrize("bug", ["open-clip", "channel-swap", "exif-applied"])
def test_the_siglip_limit_catches_open_clips_squash(siglip_images: np.ndarray, bug: str) -> None:
    """A backend that squashes SigLIP's input as open_clip does (what /v1/embeddings serves)
    gives other vectors than Immich's server has indexed: the limit catches it."""
    expected = immich_reference.embed_images([d for _, d in PREVIEWS], SIGLIP, bug)  # type: ignore[arg-type]
    cosines = reference.cosines(siglip_images, expected)
    print(f"\nSigLIP {bug}: mean={cosines.mean():.7f} min={cosines.min():.7f}")
    assert cosines.min() < IMAGE_MIN_LIMIT


@pytest.fixture(scope="module")
def siglip_texts(siglip: tuple[GatewayProcess, Path]) -> np.ndarray:
    return vectors([predict(siglip[0].url, "ViT-B-16-SigLIP__webli", text=t) for t in TEXTS])


def siglip_text_reference(source: Path, canonicalize: bool = True, pad: str | None = None):
    config = json.loads((source / "tokenizer_config.json").read_text())
    ids = immich_reference.tokenize(
        TEXTS, source / "tokenizer.json", pad or config["pad_token"], 64, canonicalize
    )
    return immich_reference.embed_texts(ids, name=SIGLIP)


def test_siglip_texts_match_immichs_server(
    siglip: tuple[GatewayProcess, Path], siglip_texts: np.ndarray
) -> None:
    """Immich's side, from the model's own tokenizer files: ``clean_text`` with
    ``canonicalize`` (punctuation removed, lower case; ``_`` removed, not a space as open_clip
    makes it), its tokenizer.json, padded with the config's pad token and truncated to 64."""
    cosines = reference.cosines(siglip_texts, siglip_text_reference(siglip[1]))
    report("SigLIP texts vs Immich", TEXTS, cosines)
    assert cosines.min() >= TEXT_MIN_LIMIT


@pytest.mark.parametrize("bug", ["no-canonicalize", "pad-with-pad-token"])
def test_the_siglip_text_limit_catches_other_framing(
    siglip: tuple[GatewayProcess, Path], siglip_texts: np.ndarray, bug: str
) -> None:
    """A backend that skips Immich's canonicalize for SigLIP, or pads with ``<pad>`` where the
    model's config says ``</s>``, gives other vectors: the limit catches each."""
    if bug == "no-canonicalize":
        expected = siglip_text_reference(siglip[1], canonicalize=False)
    else:
        expected = siglip_text_reference(siglip[1], pad="<pad>")
    cosines = reference.cosines(siglip_texts, expected)
    print(f"\nSigLIP texts {bug}: mean={cosines.mean():.7f} min={cosines.min():.7f}")
    assert cosines.min() < TEXT_MIN_LIMIT

"""Text search with SigLIP and SigLIP2 (Hugging Face tokenizers), end to end: random weights
(seed 0), a locally built tokenizer of the model's kind (tests/hf_tokenizers.py: T5-style
Unigram for SigLIP, Gemma-style BPE for SigLIP2) given to the exporter, a real tritonserver
and the real gateway over HTTP, against open_clip's own pipeline (``get_tokenizer`` on the same
files, ``encode_text``). Negative controls: the same texts framed wrongly must fall below the
limit. Each model is exported once into the export cache (in a child process: tests/exports.py)
and reused."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from bench.harness.supervisor import Supervisor
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.launcher.repository import render
from clip_gateway.model.spec import Weights, default_cache_dir
from tests import reference
from tests.exports import ensure_exported
from tests.hf_tokenizers import build
from tests.integration.test_supervisor import SIGLIP_MEAN_LIMIT, siglip_photos
from tests.unit.text.test_hf import SPECIAL_TEXTS
from tests.unit.text.test_tokenizer import corpus

#: Each model and the kind of tokenizer its hub repository holds (SigLIP2 at 224 and 256 px).
MODELS = {"ViT-B-16-SigLIP": "t5", "ViT-B-16-SigLIP2": "gemma", "ViT-B-16-SigLIP2-256": "gemma"}
#: Measured (random weights, seed 0, cpu profile, 2-core machine): see docs/MODELS.md.
COSINE_LIMIT = 0.99999
TEXTS = [
    "a photo of a cat", "A PHOTO OF A CAT!", "sea_waves at dusk", "naïve café résumé",
    "東京の夜景", "😀 👍🏽 🇫🇷", "&amp;lt;b&amp;gt; bold", "It's a DOG's life, isn't it?",
    "a photo of a cat " * 30, "x" * 400, *SPECIAL_TEXTS[:8],
]  # fmt: skip


class Served:
    def __init__(self, name: str, source: Path, gateway: GatewayProcess, exported) -> None:
        self.name, self.source, self.gateway, self.exported = name, source, gateway, exported


@pytest.fixture(scope="module", params=sorted(MODELS))
def served(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Served]:
    name = request.param
    work = tmp_path_factory.mktemp(name)
    source = build(MODELS[name], work / "tokenizer")
    exported = ensure_exported(name, Weights.random(0), tokenizer=source)
    repository = render(RepositorySettings(profile="cpu"), exported.directory, work / "repo")
    with (
        LocalTriton(repository, log_path=work / "triton.log") as triton,
        GatewayProcess(
            triton.grpc_url,
            env={"GATEWAY_MODEL_ID": name, "GATEWAY_REQUEST_TIMEOUT_S": "120"},
            log_path=work / "gateway.log",
        ) as gateway,
    ):
        gateway.wait_ready()
        yield Served(name, source, gateway, exported)


def embed(served: Served, texts: list[str], per_request: int = 16) -> np.ndarray:
    """The gateway's embeddings, a few texts per request (a SigLIP text tower on a busy 2-core
    machine takes seconds per text: well inside the request deadline)."""
    rows = []
    for start in range(0, len(texts), per_request):
        response = httpx.post(
            f"{served.gateway.url}/v1/embeddings",
            json={"model": served.name, "input": texts[start : start + per_request]},
            timeout=300,
        )
        assert response.status_code == 200, response.text
        rows += [row["embedding"] for row in response.json()["data"]]
    return np.array(rows, dtype=np.float64)


def expected(served: Served, tmp_path: Path, texts: list[str], tokenizer=None) -> np.ndarray:
    theirs = tokenizer or reference.hf_tokenizer(served.name, served.source, tmp_path)
    return reference.embed_tokens(theirs(texts).numpy(), name=served.name)


def test_export_writes_the_tokenizer_and_its_framing(served: Served) -> None:
    tokenizer = served.exported.manifest["tokenizer"]
    assert (tokenizer["kind"], tokenizer["available"], tokenizer["context_length"]) == (
        "hf", True, 64,
    )  # fmt: skip
    assert (tokenizer["clean"], tokenizer["pooling"], tokenizer["source"]) == (
        "canonicalize", "last", "directory",
    )  # fmt: skip
    assert tokenizer["hf_name"] == f"timm/{served.name}"
    assert tokenizer["self_check"]["mismatches"] == 0 and tokenizer["self_check"]["texts"] > 400
    kept = served.exported.directory / "hf_tokenizer"
    assert (kept / "tokenizer.json").read_bytes() == (served.source / "tokenizer.json").read_bytes()
    assert "canary_embedding" in served.exported.manifest["towers"]["text"]


def test_texts_match_open_clip_end_to_end(served: Served, tmp_path: Path) -> None:
    # fragments of every kind, long texts and random code points (one request: <= 256 items)
    texts = TEXTS + random.Random(5).sample([t for t in corpus(200, seed=5) if t.strip()], 200)
    got = embed(served, texts)
    cosines = reference.cosines(got, expected(served, tmp_path, texts))
    print(f"\n{served.name} text fidelity over {len(texts)} texts: 1 - mean "
          f"{1 - cosines.mean():.1e}, 1 - min {1 - cosines.min():.1e}")  # fmt: skip
    assert cosines.min() >= COSINE_LIMIT


@pytest.mark.parametrize("control", ["no cleaning", "wrong pad", "left truncation"])
def test_negative_controls_fall_below_the_limit(
    served: Served, tmp_path: Path, control: str
) -> None:
    """The reference side framed wrongly (cos(g, r_bug) = cos(g_bug, r) while g tracks r)."""
    texts = ["A PHOTO OF A CAT!", "sea_waves, at dusk.", "a photo of a cat " * 30]
    theirs = reference.hf_tokenizer(served.name, served.source, tmp_path)
    if control == "no cleaning":
        theirs.clean_fn = lambda text: text
    elif control == "wrong pad":
        theirs.tokenizer.pad_token = theirs.tokenizer.unk_token
    else:
        theirs.tokenizer.truncation_side = "left"
    cosines = reference.cosines(embed(served, texts), expected(served, tmp_path, texts, theirs))
    print(f"\n{served.name} control {control!r}: min cosine {cosines.min():.5f}")
    assert cosines.min() < COSINE_LIMIT


def test_images_match_open_clip_end_to_end(served: Served) -> None:
    """The same gateway's images (squashed, as SigLIP's own pipeline does) at the model's size;
    the same photos cropped (the wrong resize mode) fall below the limit."""
    photos = siglip_photos()
    files = [("image", (f"{i}", data, "image/jpeg")) for i, data in enumerate(photos)]
    response = httpx.post(f"{served.gateway.url}/v1/embeddings", files=files, timeout=300)
    assert response.status_code == 200, response.text
    got = np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float64)
    cosines = reference.cosines(got, reference.embed_images(photos, name=served.name))
    cropped = reference.cosines(got, reference.embed_images(photos, "shortest-crop", served.name))
    print(f"\n{served.name} image fidelity: mean {cosines.mean():.6f} min {cosines.min():.6f}; "
          f"cropped control mean {cropped.mean():.4f}")  # fmt: skip
    assert cosines.mean() >= SIGLIP_MEAN_LIMIT and cropped.mean() < SIGLIP_MEAN_LIMIT
    (card,) = httpx.get(f"{served.gateway.url}/v1/models").json()["data"]
    assert card["image_size"] == served.exported.manifest["image_size"]


def test_models_report_the_tokenizer_and_the_openai_client_embeds_text(
    served: Served, tmp_path: Path
) -> None:
    (card,) = httpx.get(f"{served.gateway.url}/v1/models").json()["data"]
    assert card["modalities"] == ["image", "text"]
    assert card["tokenizer"] == {
        "kind": "hf", "context_length": 64, "clean": "canonicalize", "pooling": "last",
    }  # fmt: skip
    client = openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key="not-needed", max_retries=0)
    texts = ["a photo of a cat", "a diagram of a bicycle"]
    result = client.embeddings.create(model=served.name, input=texts)
    got = np.array([d.embedding for d in result.data], dtype=np.float64)
    assert reference.cosines(got, expected(served, tmp_path, texts)).min() >= COSINE_LIMIT
    # the tokens the model reads: open_clip's ids up to its end token (id 1 in both kinds
    # built here; SigLIP pads with it too, SigLIP2 with 0)
    ids = reference.hf_tokenizer(served.name, served.source, tmp_path)(texts).numpy()
    assert result.usage.prompt_tokens == int((np.argmax(ids == 1, axis=1) + 1).sum())


def test_serve_with_a_tokenizer_directory_serves_texts(tmp_path: Path) -> None:
    """``make serve CLIP_MODEL=ViT-B-16-SigLIP2 CLIP_WEIGHTS=random CLIP_TOKENIZER=<dir>``
    (the Makefile passes ``--tokenizer``): the launch path finds the export keyed by the
    directory's content (exported above, or now), serves images and texts, and stops cleanly."""
    name = "ViT-B-16-SigLIP2"
    source = build(MODELS[name], tmp_path / "tokenizer")
    supervisor = Supervisor(tmp_path / "launch.log")
    supervisor.serve("--model", name, "--weights", "random", "--tokenizer", str(source),
                     "--cache-dir", str(default_cache_dir()),
                     "--log-file", str(tmp_path / "children.log"),
                     # the profile pinned: auto would time every CPU profile (test_bf16_served)
                     env={"GATEWAY_SCRATCH_DIR": str(tmp_path),
                          "GATEWAY_TRITON_PROFILE": "cpu"})  # fmt: skip
    url = supervisor.url

    try:
        supervisor.wait_ready(timeout=1200, every=0.5)
        (card,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert card["modalities"] == ["image", "text"] and card["tokenizer"]["kind"] == "hf"
        texts = ["a photo of a cat", "東京の夜景"]
        answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120)
        assert answer.status_code == 200, answer.text[:300]
        got = np.array([row["embedding"] for row in answer.json()["data"]])
        theirs = reference.hf_tokenizer(name, source, tmp_path)
        want = reference.embed_tokens(theirs(texts).numpy(), name=name)
        assert reference.cosines(got, want).min() >= COSINE_LIMIT
        assert supervisor.stop(120) == 0
    finally:
        supervisor.close()

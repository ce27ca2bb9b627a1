"""Immich model names from an export's manifest, and what the launcher says about protection."""

from __future__ import annotations

from pydantic import SecretStr

from clip_gateway.config.settings import ServerSettings, immich_protection
from clip_gateway.model.spec import immich_name


def manifest(kind: str, value: str, model: str = "ViT-B-32") -> dict:
    return {"model": model, "weights": {"kind": kind, "value": value, "id": f"{kind}:{value}"}}


def test_a_pretrained_tag_names_the_model_as_immich_does() -> None:
    assert immich_name(manifest("pretrained", "openai")) == "ViT-B-32__openai"
    assert immich_name(manifest("pretrained", "webli", "ViT-B-16-SigLIP")) == (
        "ViT-B-16-SigLIP__webli"
    )


def test_random_weights_and_checkpoints_claim_no_name() -> None:
    assert immich_name(manifest("random", "0")) is None
    assert immich_name(manifest("checkpoint", "/models/clip.pt")) is None


def test_names_are_the_launchers_then_the_aliases_once_each() -> None:
    settings = ServerSettings(immich_name="ViT-B-32__openai",
                              immich_aliases=("ViT-B-32__openai", "x__y"))  # fmt: skip
    assert settings.immich_names == ("ViT-B-32__openai", "x__y")
    assert ServerSettings(immich_name="").immich_names == ()


def test_the_log_says_how_the_routes_are_protected() -> None:
    assert "loopback" in immich_protection(ServerSettings(host="127.0.0.1"))
    assert "anyone who can reach" in immich_protection(ServerSettings(host="0.0.0.0"))
    keyed = ServerSettings(host="0.0.0.0", api_keys=(SecretStr("k"),))
    assert "adds it" in immich_protection(keyed)

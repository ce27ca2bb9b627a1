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


def test_names_are_spelt_as_immich_lists_them() -> None:
    """Names from ``immich_ml/models/constants.py`` (immich-app/immich, 093617f): the default
    LAION ViT-B-32 tag is hyphenated there, SigLIP2 and the multilingual towers are not."""
    assert immich_name(manifest("pretrained", "laion2b_s34b_b79k")) == (
        "ViT-B-32__laion2b-s34b-b79k"
    )
    assert immich_name(manifest("pretrained", "laion2b_e16")) == "ViT-B-32__laion2b_e16"
    assert immich_name(manifest("pretrained", "webli", "ViT-B-16-SigLIP2")) == (
        "ViT-B-16-SigLIP2__webli"
    )
    assert immich_name(manifest("pretrained", "webli", "ViT-SO400M-16-SigLIP2-384")) == (
        "ViT-SO400M-16-SigLIP2-384__webli"
    )
    assert immich_name(manifest("pretrained", "v1", "nllb-clip-base-siglip")) == (
        "nllb-clip-base-siglip__v1"
    )
    assert immich_name(manifest("pretrained", "laion5b_s13b_b90k",
                                "xlm-roberta-base-ViT-B-32")) == (
        "XLM-Roberta-Base-ViT-B-32__laion5b_s13b_b90k"
    )  # fmt: skip


def test_immichs_clean_name_reads_a_hub_path_as_the_model() -> None:
    from clip_gateway.http.immich.form import clean_name

    assert clean_name("immich-app/ViT-B-32__openai") == "ViT-B-32__openai"
    assert clean_name("ViT-B-16-SigLIP2__webli") == "ViT-B-16-SigLIP2__webli"
    assert clean_name("a:b.c") == "a_bc"


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


def test_upstreams_are_http_urls_in_order() -> None:
    import pytest
    from pydantic import ValidationError

    settings = ServerSettings(immich_upstream="http://ml-a:3003/, https://ml-b")
    assert settings.immich_upstream == ("http://ml-a:3003", "https://ml-b")
    with pytest.raises(ValidationError, match="not an http"):
        ServerSettings(immich_upstream="ml-a:3003")

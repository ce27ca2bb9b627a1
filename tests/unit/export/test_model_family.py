"""What the exporter decides per open_clip model before exporting: the image preprocessing the
gateway must reproduce (or a refusal) and the tokenizer (or why text cannot be served)."""

from __future__ import annotations

import pytest

from clip_gateway.export import tokenizer
from clip_gateway.export.preprocessing import image_preprocessing
from clip_gateway.model.spec import UnsupportedModelError

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def cfg(**changes: object) -> dict[str, object]:
    base = {"size": (224, 224), "mode": "RGB", "mean": OPENAI_MEAN, "std": OPENAI_STD,
            "interpolation": "bicubic", "resize_mode": "shortest", "fill_color": 0}  # fmt: skip
    return base | changes


def test_clip_shortest_resize_then_centre_crop() -> None:
    assert image_preprocessing("ViT-B-32", cfg()) == {
        "size": 224, "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD),
        "interpolation": "bicubic", "resize_mode": "shortest", "center_crop": True,
        "fill_color": None,
    }  # fmt: skip


def test_siglip_squash_has_no_crop_and_half_mean_std() -> None:
    got = image_preprocessing("ViT-B-16-SigLIP-384", cfg(size=384, mean=(0.5,) * 3,
                              std=(0.5,) * 3, resize_mode="squash"))  # fmt: skip
    assert (got["size"], got["mean"], got["std"]) == (384, [0.5] * 3, [0.5] * 3)
    assert (got["resize_mode"], got["center_crop"], got["fill_color"]) == ("squash", False, None)


def test_longest_resize_pads_with_its_fill_colour() -> None:
    got = image_preprocessing("m", cfg(resize_mode="longest", fill_color=(10, 20, 30)))
    assert (got["center_crop"], got["fill_color"]) == (True, [10, 20, 30])
    assert image_preprocessing("m", cfg(resize_mode="longest"))["fill_color"] == [0, 0, 0]
    assert image_preprocessing("m", cfg(interpolation="bilinear"))["interpolation"] == "bilinear"


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"size": (224, 256)}, "non-square input size 224x256"),
        ({"interpolation": "nearest"}, "interpolation 'nearest'"),
        ({"resize_mode": "random_crop"}, "resize mode 'random_crop'"),
        ({"mode": "L"}, "colour mode 'L'"),
        ({"std": (0.5, 0.0, 0.5)}, "positive std expected"),
        ({"mean": (0.5,)}, "three channels"),
        ({"resize_mode": "longest", "fill_color": 300}, "fill colour 300"),
    ],
)
def test_what_the_gateway_cannot_reproduce_is_refused_by_name(
    changes: dict[str, object], named: str
) -> None:
    with pytest.raises(UnsupportedModelError) as refused:
        image_preprocessing("Some-Model", cfg(**changes))
    message = str(refused.value)
    assert message.startswith("Some-Model: the gateway cannot reproduce")
    assert named in message and "rather than serve it approximately" in message


def test_clip_models_take_the_clip_bpe_tokenizer() -> None:
    for name, context in (("ViT-B-32", 77), ("ViT-L-14-336", 77), ("RN50", 77)):
        assert tokenizer.describe(name) == tokenizer.TokenizerInfo("clip_bpe", context)


def test_hf_tokenizers_are_served_with_open_clips_options() -> None:
    info = tokenizer.describe("ViT-B-16-SigLIP")
    assert (info.kind, info.context_length, info.available) == ("hf", 64, True)
    assert info.hf_name == "timm/ViT-B-16-SigLIP"
    assert (info.options, info.pooling) == ({"clean": "canonicalize"}, "last")


def test_hf_tokenizer_options_the_gateway_does_not_reproduce_make_text_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import open_clip

    config = {"text_cfg": {"hf_tokenizer_name": "org/tok", "tokenizer_mode": "clips"}}
    monkeypatch.setattr(open_clip, "get_model_config", lambda name: config)
    info = tokenizer.describe("Custom")
    assert (info.kind, info.available) == ("hf", False)
    assert "{'tokenizer_mode': 'clips'}" in (info.unavailable_reason or "")
    assert "serves images only" in (info.unavailable_reason or "")
    config["text_cfg"] = {"hf_tokenizer_name": "org/tok", "tokenizer_kwargs": {"clean": "odd"}}
    assert "{'clean': 'odd'}" in (tokenizer.describe("Custom").unavailable_reason or "")


def test_clip_bpe_options_the_gateway_does_not_reproduce_make_text_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import open_clip

    config = {"text_cfg": {"context_length": 77, "tokenizer_kwargs": {"clean": "whitespace"}}}
    monkeypatch.setattr(open_clip, "get_model_config", lambda name: config)
    info = tokenizer.describe("Custom")
    assert (info.kind, info.available) == ("clip_bpe", False)
    assert "{'clean': 'whitespace'}" in (info.unavailable_reason or "")

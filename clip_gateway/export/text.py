"""The exportable text tower: int32 token ids in, open_clip's ``encode_text`` projection out."""

from __future__ import annotations

import torch
from torch import nn


class TokenEncoder(nn.Module):
    """open_clip's ``encode_text`` (embedding, transformer, its own pooling: EOT argmax for CLIP,
    last token for SigLIP..., projection) taking ``int32 [batch, context_length]`` ids.

    The ids are cast to int64 first, inside the graph: open_clip's embedding lookup and argmax
    pooling see exactly what they see in torch, and the wire and TensorRT get int32 (its native
    integer type). The output is *not* normalised, like the image tower's.
    """

    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.clip = clip

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_text(tokens.to(torch.int64))  # type: ignore[operator,no-any-return]


def context_length(clip: nn.Module) -> int:
    """Tokens per text the model was built for (its positional embedding's length)."""
    return int(clip.context_length)  # type: ignore[arg-type]


def vocab_size(clip: nn.Module) -> int:
    """Ids the token embedding accepts: ``0 .. vocab_size - 1``."""
    text = getattr(clip, "text", clip)  # CustomTextCLIP keeps its tower in .text
    return int(text.token_embedding.num_embeddings)  # type: ignore[union-attr,arg-type]

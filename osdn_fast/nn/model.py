"""A small language model for synthetic recall: embedding, N pre-norm blocks, final norm, LM head.

    h ← h + Mixer(RMSNorm(h))        Mixer = OSDNLayer
    h ← h + MLP(RMSNorm(h))          MLP(x) = W_2 GELU(W_1 x), optional
    logits = W_head RMSNorm(h)
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .layer import OSDNLayer


class MLP(nn.Module):
    """W_2 GELU(W_1 x), hidden width ratio · d_model."""

    def __init__(self, d_model: int, ratio: int = 4):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, ratio * d_model), nn.Linear(ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Block(nn.Module):
    """One pre-norm residual block: the token mixer, then (optionally) the MLP."""

    def __init__(self, d_model: int, mlp: bool, layer_kwargs: dict):
        super().__init__()
        self.mixer_norm, self.mixer = nn.RMSNorm(d_model), OSDNLayer(d_model, **layer_kwargs)
        self.mlp_norm, self.mlp = (nn.RMSNorm(d_model), MLP(d_model)) if mlp else (None, None)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.mixer(self.mixer_norm(h))
        return h if self.mlp is None else h + self.mlp(self.mlp_norm(h))


class RecallLM(nn.Module):
    """tokens [B, T] (int64) → logits [B, T, vocab_size]. `layer_kwargs` go to every OSDNLayer."""

    def __init__(self, vocab_size: int, d_model: int = 64, num_layers: int = 2, *, mlp: bool = True, **layer_kwargs):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, mlp, layer_kwargs) for _ in range(num_layers))
        self.norm, self.head = nn.RMSNorm(d_model), nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def mixers(self) -> list[OSDNLayer]:
        """The token-mixing layers, in depth order."""
        return [block.mixer for block in self.blocks]

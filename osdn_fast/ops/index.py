"""Chunk bookkeeping for packed sequences: every op runs on [1, ΣT, H, ...] with cu_seqlens.

A fixed-length batch [B, T, ...] is the packed case with cu_seqlens = [0, T, 2T, ..., BT], so one set of
kernels serves both. Chunks never straddle two sequences: sequence n owns ceil(T_n / C) chunks.
"""
from __future__ import annotations

import torch


def uniform_cu_seqlens(B: int, T: int, device) -> torch.Tensor:
    """[0, T, 2T, ..., B·T]: the boundaries of a fixed-length batch seen as packed sequences."""
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)


def chunk_layout(cu_seqlens: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk_indices [NT, 2] int32: (sequence n, chunk i within n), chunk_offsets [N+1] int32: first chunk of n).

    Chunks are numbered sequence-major, so global chunk c = chunk_offsets[n] + i.
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    counts = (lengths + chunk_size - 1) // chunk_size
    offsets = torch.zeros(len(counts) + 1, dtype=torch.long, device=cu_seqlens.device)
    offsets[1:] = counts.cumsum(0)
    seq = torch.repeat_interleave(torch.arange(len(counts), device=cu_seqlens.device), counts)
    within = torch.arange(len(seq), device=cu_seqlens.device) - offsets[seq]
    return torch.stack([seq, within], dim=1).to(torch.int32).contiguous(), offsets.to(torch.int32)


def uniform_chunk_layout(B: int, T: int, chunk_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """chunk_layout of a fixed-length batch, from B and T alone: no device-to-host copy (the general form's
    repeat_interleave waits for the GPU to learn its output size)."""
    per = -(-T // chunk_size)
    idx = torch.arange(B * per, device=device, dtype=torch.int32)
    offsets = torch.arange(0, (B + 1) * per, per, device=device, dtype=torch.int32)
    return torch.stack([idx // per, idx % per], dim=1).contiguous(), offsets

"""The in-chunk cumulative log-decay G_i = Σ_{j≤i} g_j (forward) and its adjoint, the reverse sum (backward).

    forward:  G_i = Σ_{j ≤ i} g_j          backward:  ∂g_j = Σ_{i ≥ j} ∂G_i       (both within one chunk)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import chunk_rows


@triton.jit
def chunk_cumsum_kernel(x, y, cu_seqlens, chunk_indices, H, BT: tl.constexpr, REVERSE: tl.constexpr):
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    b_x = tl.load(x + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_y = tl.cumsum(b_x, axis=0)
    if REVERSE:
        b_y = tl.sum(b_x, axis=0) - b_y + b_x
    tl.store(y + o_t * H + i_h, b_y, mask=m_t)


def chunk_cumsum(x: torch.Tensor, cu_seqlens, chunk_indices, chunk_size: int, reverse: bool = False):
    """x [1, ΣT, H] → float32 [1, ΣT, H]: cumulative (or reverse-cumulative) sums inside each chunk."""
    H = x.shape[-1]
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    chunk_cumsum_kernel[(chunk_indices.shape[0], H)](x, y, cu_seqlens, chunk_indices, H, BT=chunk_size,
                                                     REVERSE=reverse)
    return y

"""Small Triton helpers shared by the phase-2 kernels: where a chunk lives and how its tiles load.

All tensors are packed token-major, [ΣT, H, D] (a batch is flattened to B·T tokens; see index.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_rows(cu_seqlens, chunk_indices, i_t, BT: tl.constexpr):
    """Global chunk i_t → (sequence n, token offsets o_t [BT], row mask m_t, index of the chunk's last token)."""
    i_n = tl.load(chunk_indices + i_t * 2)
    i_c = tl.load(chunk_indices + i_t * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    t0 = bos + i_c * BT
    o_t = t0 + tl.arange(0, BT)
    return i_n, o_t, o_t < eos, tl.minimum(t0 + BT, eos) - 1


@triton.jit
def load_tile(ptr, o_t, m_t, i_h, H, D: tl.constexpr, o_d):
    """Rows o_t, head i_h, columns o_d of a [ΣT, H, D] tensor, as float32 (zero outside)."""
    mask = m_t[:, None] & (o_d < D)[None, :]
    return tl.load(ptr + (o_t[:, None] * H + i_h) * D + o_d[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, x, o_t, m_t, i_h, H, D: tl.constexpr, o_d):
    """Store x [BT, BD] into rows o_t, head i_h, columns o_d of a [ΣT, H, D] tensor (cast to its dtype)."""
    mask = m_t[:, None] & (o_d < D)[None, :]
    tl.store(ptr + (o_t[:, None] * H + i_h) * D + o_d[None, :], x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_gate(G, o_t, m_t, i_h, H, HAS_G: tl.constexpr, BT: tl.constexpr):
    """The in-chunk cumulative log-decay G [BT] (zeros without a gate; zero on padded rows)."""
    if HAS_G:
        b_g = tl.load(G + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    else:
        b_g = tl.zeros([BT], dtype=tl.float32)
    return b_g


@triton.jit
def load_state(ptr, i_s, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    """Tile [BK, BV] of state number i_s in a [*, K, V] float32 array (zero outside)."""
    mask = (o_k < K)[:, None] & (o_v < V)[None, :]
    return tl.load(ptr + (i_s.to(tl.int64) * K + o_k[:, None]) * V + o_v[None, :], mask=mask, other=0.0)


@triton.jit
def store_state(ptr, x, i_s, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    """Store the tile x [BK, BV] of state number i_s into a [*, K, V] float32 array."""
    mask = (o_k < K)[:, None] & (o_v < V)[None, :]
    tl.store(ptr + (i_s.to(tl.int64) * K + o_k[:, None]) * V + o_v[None, :], x, mask=mask)


def block_dims(K: int, V: int) -> tuple[int, int]:
    """(BK, BV): the whole key dim padded to a power of two ≥ 16 (tl.dot's minimum), value tiles of ≤ 64."""
    BK = max(16, triton.next_power_of_2(K))
    BV = min(max(16, triton.next_power_of_2(V)), 64 if BK <= 128 else 32)
    return BK, BV


def launch_options(BK: int) -> dict:
    """Warps for [C, BK] float32 tiles; one stage (no software pipelining), so shared memory stays small."""
    return dict(num_warps=8 if BK >= 128 else 4, num_stages=1)

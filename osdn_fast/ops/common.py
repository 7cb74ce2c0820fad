"""Small Triton helpers shared by the phase-2 kernels: where a chunk lives, how its tiles load, launch configs.

All tensors are packed token-major, [ΣT, H, D] (a batch is flattened to B·T tokens; see index.py).
Precision: the matrices between stages (W, U, Ū, the chunk states, their gradients) are stored in the input
dtype and enter tl.dot as loaded (bf16/fp16 tensor cores, fp32 accumulation); the per-chunk inverse, the
running state and everything elementwise stay in float32.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .tuning import TUNING

if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def mm(a, b):
        """a @ b, fp32 accumulation. The interpreter (numpy) has no bfloat16 matmul, so the operands go up to
        float32 first: exact for bf16/fp16 values, so the product is the tensor cores' up to summation order."""
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
else:
    @triton.jit
    def mm(a, b):
        """a @ b on the tensor cores: operands as stored (bf16, fp16, or fp32 as TF32), fp32 accumulation."""
        return tl.dot(a, b)


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
    """Rows o_t, head i_h, columns o_d of a [ΣT, H, D] tensor, in its stored dtype (zero outside)."""
    mask = m_t[:, None] & (o_d < D)[None, :]
    return tl.load(ptr + (o_t[:, None] * H + i_h) * D + o_d[None, :], mask=mask, other=0.0)


@triton.jit
def load_tile_t(ptr, o_t, m_t, i_h, H, D: tl.constexpr, o_d):
    """The transpose [BD, BT] of load_tile's tile, loaded as such: a tile that enters tl.dot transposed is never
    made by tl.trans of a computed tile (miscompiled on Hopper by Triton 3.4-3.7.0, fla #640)."""
    mask = (o_d < D)[:, None] & m_t[None, :]
    return tl.load(ptr + (o_t[None, :] * H + i_h) * D + o_d[:, None], mask=mask, other=0.0)


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
    """Tile [BK, BV] of state number i_s in a [*, K, V] array, in its stored dtype (zero outside)."""
    mask = (o_k < K)[:, None] & (o_v < V)[None, :]
    return tl.load(ptr + (i_s.to(tl.int64) * K + o_k[:, None]) * V + o_v[None, :], mask=mask, other=0.0)


@triton.jit
def store_state(ptr, x, i_s, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    """Store the tile x [BK, BV] of state number i_s into a [*, K, V] array (cast to its dtype)."""
    mask = (o_k < K)[:, None] & (o_v < V)[None, :]
    tl.store(ptr + (i_s.to(tl.int64) * K + o_k[:, None]) * V + o_v[None, :], x.to(ptr.dtype.element_ty), mask=mask)


def block_dims(K: int, V: int) -> tuple[int, int]:
    """(BK, BV): the whole key dim padded to a power of two ≥ 16 (tl.dot's minimum), value tiles of ≤ 64."""
    BK = max(16, triton.next_power_of_2(K))
    BV = min(max(16, triton.next_power_of_2(V)), 64 if BK <= 128 else 32)
    return BK, BV


def launch(stage: str, BK: int, BV: int) -> tuple[int, dict]:
    """(BV, {num_warps, num_stages}) for one stage: TUNING's entry, bounded by the value tile block_dims allows."""
    cfg = TUNING[stage]
    bv = min(cfg.get("BV") or BV, BV)
    warps = max(cfg["num_warps"], 8) if BK > 128 and stage != "solve" else cfg["num_warps"]
    return bv, dict(num_warps=warps, num_stages=cfg["num_stages"])


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (0 elsewhere: the interpreter has no occupancy to fill)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def chain_stage(stage: str, BK: int, BV: int, V: int, seq_heads: int, device: torch.device) -> str:
    """The TUNING entry of a state-chain stage, one program per (value tile, sequence, head) walking all its chunks.
    With few programs (long T, small batch) the chain's latency is the time: the narrowest value tiles whose programs
    each still get an SM of their own, `<stage>_few` (BV 16) or `<stage>_some` (BV 32), else the stage's own entry."""
    for tier in (f"{stage}_few", f"{stage}_some"):
        if tier in TUNING and seq_heads * triton.cdiv(V, launch(tier, BK, BV)[0]) <= sm_count(device):
            return tier
    return stage


def chain_launch(stage: str, BK: int, BV: int, V: int, seq_heads: int, device: torch.device) -> tuple[int, dict]:
    """launch() of the entry chain_stage picks."""
    return launch(chain_stage(stage, BK, BV, V, seq_heads, device), BK, BV)

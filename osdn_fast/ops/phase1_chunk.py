"""Chunk-parallel phase 1 without the clip: the d scan as a vector-state delta rule (SPEC §3).

Per token (a = k², ν = 1/n, b = β or 1):  d_{t+1} = r_t d_t + u_t a_t,  u_t = e_t − c_t ⟨d_t, a_t⟩,
with e_t = η b_t ν_t and c_t = η b_t² ν_t (no 1/b anywhere, so β = 0 is fine). In a chunk of C tokens
entering with x_0, with γ_i = Σ_{m<i} log r_m (exclusive) and γ̄_j = γ_j + log r_j:

    x_i = e^{γ_i} x_0 + Σ_{j<i} e^{γ_i − γ̄_j} u_j a_j
    (I + L) u = e − c ⊙ e^{γ} ⊙ (A x_0),   L_ij = c_i e^{γ_i − γ̄_j} ⟨a_i, a_j⟩  (j < i)

so u = u⁰ − Tq (A x_0) with u⁰ = (I + L)⁻¹ e and Tq = (I + L)⁻¹ diag(c e^{γ}). Three launches:
`prep` (every chunk in parallel: Gram, forward substitution, u⁰, Tq), `state` (sequential over the chunks of
one (sequence, head), O(C·K) per chunk: u and the chunk-entry states), `out` (every chunk in parallel: d_t).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from osdn_ref import EPS

from .phase1 import _block_k, _seq_bounds


@triton.jit
def _chunk_tokens(k, beta, r, eta_h, cs, eos, h, H, K, eps,
                  HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
                  C: tl.constexpr, BK: tl.constexpr):
    """Load one chunk: a [C, BK], c, e, γ (exclusive) and γ̄ (inclusive log-decay sums) [C]; pads are identity."""
    it = tl.arange(0, C)
    offs = tl.arange(0, BK)
    t = cs + it
    valid = t < eos
    kt = tl.load(k + (t[:, None] * H + h) * K + offs[None, :], mask=valid[:, None] & (offs[None, :] < K),
                 other=0.0).to(tl.float32)
    a = kt * kt
    if BETA_AWARE:
        b = tl.load(beta + t * H + h, mask=valid, other=0.0).to(tl.float32)
    else:
        b = tl.where(valid, 1.0, 0.0)
    if NORMALIZE:
        nu = 1.0 / (tl.sum(a, axis=1) + eps)
    else:
        nu = tl.where(valid, 1.0, 0.0)
    e = eta_h * b * nu
    c = e * b
    if HAS_R:
        lr = tl.log(tl.load(r + t * H + h, mask=valid, other=1.0).to(tl.float32))
    else:
        lr = tl.zeros([C], dtype=tl.float32)
    g_incl = tl.cumsum(lr, axis=0)
    return t, valid, a, c, e, g_incl - lr, g_incl


@triton.jit
def phase1_chunk_prep_kernel(
    k, beta, r, eta, chunk_seq, chunk_start, cu_seqlens, tq, u0,
    T, H, K, eps,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, IS_VARLEN: tl.constexpr,
    C: tl.constexpr, BK: tl.constexpr,
):
    """Per chunk: L, then (I + L) [Tq | u⁰] = [diag(c e^γ) | e] by forward substitution."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(chunk_seq + ci)
    cs = tl.load(chunk_start + ci).to(tl.int64)
    _, eos = _seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    eta_h = tl.load(eta + h).to(tl.float32)
    t, valid, a, c, e, g, g_incl = _chunk_tokens(k, beta, r, eta_h, cs, eos, h, H, K, eps,
                                                 HAS_R, BETA_AWARE, NORMALIZE, C, BK)
    rows = tl.arange(0, C)
    lower = rows[:, None] > rows[None, :]
    gram = tl.dot(a, tl.trans(a), input_precision="ieee")
    decay = tl.where(lower, tl.exp(tl.where(lower, g[:, None] - g_incl[None, :], 0.0)), 0.0)
    L = c[:, None] * decay * gram
    x = tl.where(rows[:, None] == rows[None, :], (c * tl.exp(g))[None, :], 0.0)
    u = e
    for i in range(1, C):
        sel = rows == i
        li = tl.sum(tl.where(sel[:, None], L, 0.0), axis=0)
        x = tl.where(sel[:, None], x - tl.sum(li[:, None] * x, axis=0)[None, :], x)
        u = tl.where(sel, u - tl.sum(li * u, axis=0), u)
    tl.store(tq + ((ci * H + h) * C + rows[:, None]) * C + rows[None, :], x)
    tl.store(u0 + t * H + h, u, mask=valid)


@triton.jit
def phase1_chunk_state_kernel(
    k, beta, r, d0, eta, chunk_offsets, cu_seqlens, tq, u0, u, x0, d_final,
    T, H, K, eps,
    HAS_R: tl.constexpr, HAS_D0: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
):
    """Sequential over the chunks of (sequence n, head h): u = u⁰ − Tq (A x), x ← e^{γ_C} x + Aᵀ(e^{γ_C − γ̄} u)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = _seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    c_first = tl.load(chunk_offsets + n)
    c_last = tl.load(chunk_offsets + n + 1)
    offs = tl.arange(0, BK)
    mask = offs < K
    rows = tl.arange(0, C)
    if HAS_D0:
        x = tl.load(d0 + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.where(mask, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    for ci in range(c_first, c_last):
        cs = bos + (ci - c_first) * C
        tl.store(x0 + (ci * H + h) * K + offs, x, mask=mask)
        t, valid, a, c, e, g, g_incl = _chunk_tokens(k, beta, r, eta_h, cs, eos, h, H, K, eps,
                                                     HAS_R, BETA_AWARE, NORMALIZE, C, BK)
        tq_c = tl.load(tq + ((ci * H + h) * C + rows[:, None]) * C + rows[None, :])
        p = tl.sum(a * x[None, :], axis=1)
        uc = tl.load(u0 + t * H + h, mask=valid, other=0.0) - tl.sum(tq_c * p[None, :], axis=1)
        tl.store(u + t * H + h, uc, mask=valid)
        g_end = tl.sum(tl.where(rows == C - 1, g_incl, 0.0), axis=0)
        x = tl.exp(g_end) * x + tl.sum((tl.exp(g_end - g_incl) * uc)[:, None] * a, axis=0)
    tl.store(d_final + (n * H + h) * K + offs, x, mask=mask)


@triton.jit
def phase1_chunk_out_kernel(
    k, r, chunk_seq, chunk_start, cu_seqlens, u, x0, d_all,
    T, H, K,
    HAS_R: tl.constexpr, IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
):
    """Per chunk: d_{cs+i} = e^{γ_i} x_0 + Σ_{j<i} e^{γ_i − γ̄_j} u_j a_j."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(chunk_seq + ci)
    cs = tl.load(chunk_start + ci).to(tl.int64)
    _, eos = _seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    rows = tl.arange(0, C)
    offs = tl.arange(0, BK)
    t = cs + rows
    valid = t < eos
    m2 = valid[:, None] & (offs[None, :] < K)
    kt = tl.load(k + (t[:, None] * H + h) * K + offs[None, :], mask=m2, other=0.0).to(tl.float32)
    if HAS_R:
        lr = tl.log(tl.load(r + t * H + h, mask=valid, other=1.0).to(tl.float32))
    else:
        lr = tl.zeros([C], dtype=tl.float32)
    g_incl = tl.cumsum(lr, axis=0)
    g = g_incl - lr
    uc = tl.load(u + t * H + h, mask=valid, other=0.0)
    lower = rows[:, None] > rows[None, :]
    m = tl.where(lower, tl.exp(tl.where(lower, g[:, None] - g_incl[None, :], 0.0)), 0.0) * uc[None, :]
    x = tl.load(x0 + (ci * H + h) * K + offs, mask=offs < K, other=0.0)
    d = tl.exp(g)[:, None] * x[None, :] + tl.dot(m, kt * kt, input_precision="ieee")
    tl.store(d_all + (t[:, None] * H + h) * K + offs[None, :], d, mask=m2)


def chunk_table(B: int, T: int, cu_seqlens: torch.Tensor | None, C: int, device):
    """(chunk_seq, chunk_start, chunk_offsets): the sequence and first token of every chunk, and where each
    sequence's chunks begin. Tokens are indexed in the flattened [B*T] axis."""
    if cu_seqlens is None:
        nt = triton.cdiv(T, C)
        seq = torch.arange(B, device=device).repeat_interleave(nt)
        start = seq * T + torch.arange(nt, device=device).repeat(B) * C
        offsets = torch.arange(B + 1, device=device) * nt
    else:
        bounds = cu_seqlens.tolist()
        counts = [triton.cdiv(e - s, C) for s, e in zip(bounds[:-1], bounds[1:])]
        seq = torch.tensor([n for n, m in enumerate(counts) for _ in range(m)], dtype=torch.long)
        start = torch.tensor([s + i * C for s, m in zip(bounds, counts) for i in range(m)], dtype=torch.long)
        offsets = torch.tensor([0] + counts, dtype=torch.long).cumsum(0)
        seq, start, offsets = seq.to(device), start.to(device), offsets.to(device)
    return seq.to(torch.int32), start.to(torch.int32), offsets.to(torch.int32)


def phase1_fwd_chunk(k, beta, r, d0, eta, *, d_min=None, d_max=None, beta_aware, normalize, cu_seqlens,
                     chunk_size: int = 64):
    """Chunk-parallel forward (no clip): (d_all [B, T, H, K] float32, d_final [N, H, K] float32)."""
    if d_min is not None or d_max is not None:
        raise ValueError("phase1_fwd_chunk has no clip (d_min/d_max): use the sequential scan")
    B, T, H, K = k.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C, BK = chunk_size, _block_k(K)
    seq, start, offsets = chunk_table(B, T, cu_seqlens, C, k.device)
    NC = seq.numel()
    f32 = dict(dtype=torch.float32, device=k.device)
    tq = torch.empty(NC, H, C, C, **f32)
    u0 = torch.empty(B, T, H, **f32)
    u = torch.empty(B, T, H, **f32)
    x0 = torch.empty(NC, H, K, **f32)
    d_all = torch.empty(B, T, H, K, **f32)
    d_final = torch.empty(N, H, K, **f32)
    r_ = r if r is not None else beta
    cu = cu_seqlens if cu_seqlens is not None else offsets
    flags = dict(HAS_R=r is not None, IS_VARLEN=cu_seqlens is not None, C=C, BK=BK)
    gains = dict(BETA_AWARE=beta_aware, NORMALIZE=normalize)
    phase1_chunk_prep_kernel[(NC, H)](k, beta, r_, eta, seq, start, cu, tq, u0, T, H, K, EPS, **gains, **flags)
    phase1_chunk_state_kernel[(N, H)](
        k, beta, r_, d0 if d0 is not None else d_final, eta, offsets, cu, tq, u0, u, x0, d_final,
        T, H, K, EPS, HAS_D0=d0 is not None, **gains, **flags,
    )
    phase1_chunk_out_kernel[(NC, H)](k, r_, seq, start, cu, u, x0, d_all, T, H, K, **flags)
    return d_all, d_final

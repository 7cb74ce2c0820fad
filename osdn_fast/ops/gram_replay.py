"""Phase 1's last kernel fused into phase 2's first: k̃ = d ⊙ k formed from the chain's entry states inside the Gram.

Phase 1's chunk form leaves, per chunk of C₁ tokens, the chain's entry state x_0 and each token's u (SPEC §3,
phase1_chunk.py); its out kernel then replays every chunk,

    d_i = e^{γ_i} x_0 + Σ_{j<i} e^{γ_i − γ̄_j} u_j a_j        (a = k², γ the exclusive cumulative log r),

and writes k̃ = d ⊙ k, which phase 2's gram kernel reads back with k (wy.py). The replay holds across any span of
whole chunks, so a phase-2 chunk of C₂ = m·C₁ tokens replays from the entry state of its first phase-1 chunk. This
kernel does both per phase-2 chunk: d, k̃ (written once, in k's dtype, for the later stages and the backward), and

    A = strict_lower(diag(β) (K K̃ᵀ ⊙ Γ)),

formed as Aᵀ = K̃ Kᵀ from a transposed load of k (never tl.trans of the computed k̃: wy.py) and stored transposed.
It saves the out kernel's launch, its read of k, and the Gram's read of k̃. With `stats` it also writes each token's
s_t = ⟨d_t, a_t⟩ and ‖k_t‖², which phase 1's backward reads (phase1_bwd_chunk's `stats`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import chunk_rows, launch, load_gate, load_tile, load_tile_t, mm, store_tile
from .phase1_chunk import _log_retention, _replay_weights, _replayed_d
from .tuning import TUNING
from .wy import gram_decay


@triton.jit
def gram_replay_kernel(k, r, beta, G, u, x0, p1_offsets, A, kt, s_out, asum_out, cu_seqlens, chunk_indices, H,
                       K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, KB: tl.constexpr, C1: tl.constexpr,
                       HAS_R: tl.constexpr, HAS_G: tl.constexpr, STORE_STATS: tl.constexpr, PREC: tl.constexpr,
                       UNIFORM: tl.constexpr):
    """Per phase-2 chunk i of sequence n: d from x_0 of phase-1 chunk p1_offsets[n] + i·BT/C1 (UNIFORM: sequences of
    one length T_n, so p1_offsets[n] = n·⌈T_n/C1⌉, formed here), k̃ = d ⊙ k stored, A (float32)."""
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    i_n, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    if UNIFORM:
        first = i_n * tl.cdiv(tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n), C1)
    else:
        first = tl.load(p1_offsets + i_n)
    ci = first + tl.load(chunk_indices + i_t * 2 + 1) * (BT // C1)
    o_i = tl.arange(0, BT)
    b_b = tl.load(beta + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    if HAS_R:  # log r, 0 on padded rows
        lr = _log_retention(tl.load(r + o_t * H + i_h, mask=m_t, other=1.0))
    else:
        lr = tl.zeros([BT], dtype=tl.float32)
    g_incl = tl.cumsum(lr, axis=0)
    g = g_incl - lr
    m = _replay_weights(tl.load(u + o_t * H + i_h, mask=m_t, other=0.0), g, g_incl, BT, HAS_R)
    b_At = tl.zeros([BT, BT], dtype=tl.float32)
    s = tl.zeros([BT], dtype=tl.float32)
    a_sum = tl.zeros([BT], dtype=tl.float32)
    for k0 in range(0, BK, KB):
        o_k = k0 + tl.arange(0, KB)
        b_k = load_tile(k, o_t, m_t, i_h, H, K, o_k).to(tl.float32)
        a = b_k * b_k
        d = _replayed_d(x0, ci, i_h, H, K, o_k, g, m, a, PREC, HAS_R)
        b_kt = (d * b_k).to(kt.dtype.element_ty)
        store_tile(kt, b_kt, o_t, m_t, i_h, H, K, o_k)
        b_At += mm(b_kt, load_tile_t(k, o_t, m_t, i_h, H, K, o_k))
        if STORE_STATS:
            s += tl.sum(d * a, axis=1)
            a_sum += tl.sum(a, axis=1)
    # Aᵀ[j, i] = ⟨k̃_j, k_i⟩: scaled by Γ_ij β_i there, and stored into row i, column j of A
    b_At = b_At * gram_decay(b_g, BT, True, TRANSPOSED=True) * b_b[None, :]
    tl.store(A + (o_t[None, :] * H + i_h) * BT + o_i[:, None], b_At, mask=m_t[None, :])
    if STORE_STATS:
        tl.store(s_out + o_t * H + i_h, s, mask=m_t)
        tl.store(asum_out + o_t * H + i_h, a_sum, mask=m_t)


def gram_replay(k, beta, G, r, entries, p1_offsets, p1_chunk_size, stats, cu_seqlens, chunk_indices, chunk_size, BK,
                precision):
    """(k̃ [1, ΣT, H, K] in k's dtype, A [1, ΣT, H, C] float32) on packed inputs, from phase 1's chunk form's
    `entries` = (x_0 [NC₁, H, K], u) and `p1_offsets` (the first phase-1 chunk of each sequence; None when every
    sequence has the same length: formed in the kernel, no launches); chunk_size a multiple of p1_chunk_size. `stats` (float32 [2, ΣT, H] or None) receives s_t and ‖k_t‖²."""
    if chunk_size % p1_chunk_size:
        raise ValueError(f"chunk_size {chunk_size} must be a multiple of phase 1's chunks ({p1_chunk_size})")
    _, T, H, K = k.shape
    x0, u = entries
    kt = torch.empty_like(k)
    A = torch.empty(1, T, H, chunk_size, dtype=torch.float32, device=k.device)
    KB = min(TUNING["gram_replay"]["KB"], BK)
    gram_replay_kernel[(chunk_indices.shape[0], H)](
        k, r if r is not None else u, beta, G, u, x0, p1_offsets if p1_offsets is not None else cu_seqlens, A, kt,
        *(stats if stats is not None else (u, u)), cu_seqlens, chunk_indices, H,
        K=K, BT=chunk_size, BK=BK, KB=KB, C1=p1_chunk_size, HAS_R=r is not None, HAS_G=G is not None,
        STORE_STATS=stats is not None, PREC=precision, UNIFORM=p1_offsets is None, **launch("gram_replay", BK, BK)[1])
    return kt, A

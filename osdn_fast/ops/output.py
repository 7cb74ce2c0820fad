"""The chunk output (SPEC §3 with the GDN log-decay), forward and backward.

With P = (Q K̃ᵀ) ⊙ Γ on j ≤ i (Γ_ij = e^{G_i − G_j}), S_n the state entering the chunk and γ = e^G:

    O = scale · ((Q ⊙ γ) S_n + P Ū)

Backward (transposes come from transposed loads, never from tl.trans of a computed matrix, which Triton
3.4+ miscompiles on Hopper: fla issue #640; ∂S_{n+1} from state.py is the gradient of the state leaving the chunk, K̂ = K̃ ⊙ e^{G_C − G}):

    ∂Ū^local = scale Pᵀ ∂O                                      (before the state pass)
    ∂P = scale ∂O Ūᵀ on j ≤ i
    ∂Q = scale (∂O S_nᵀ) ⊙ γ + (∂P ⊙ Γ) K̃
    ∂K̃ = (∂P ⊙ Γ)ᵀ Q + (Ū ∂S_{n+1}ᵀ) ⊙ e^{G_C − G}              (the output and the state write)
    ∂W = −∂Ū S_nᵀ                                                (from Ū = U − W S_n)
    ∂G_i = ⟨q_i, ∂Q^inter_i⟩ + Σ_j (∂P ⊙ P)_ij − Σ_j (∂P ⊙ P)_ji − ⟨k̂_i, ∂K̂_i⟩ + [i = C] (γ_C⟨S_n, ∂S_{n+1}⟩ + Σ_j ⟨k̂_j, ∂K̂_j⟩)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import chunk_rows, launch, load_gate, load_state, load_tile, mm, store_tile
from .state import decay_to_end
from .wy import gram_decay


@triton.jit
def output_fwd_kernel(q, kt, G, h, ubar, o, scale, cu_seqlens, chunk_indices, H,
                      K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      HAS_G: tl.constexpr):
    i_v, i_t, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    DT = q.dtype.element_ty
    b_q = load_tile(q, o_t, m_t, i_h, H, K, o_k)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    b_P = mm(b_q, tl.trans(load_tile(kt, o_t, m_t, i_h, H, K, o_k))) * gram_decay(b_g, BT, False)
    b_o = mm(b_q, load_state(h, i_t * H + i_h, o_k, o_v, K, V))
    if HAS_G:  # (Q ⊙ γ) S_n = γ ⊙ (Q S_n): the [BT, BV] product's rows, not Q's [BT, BK]
        b_o *= tl.exp(b_g)[:, None]
    b_o += mm(b_P.to(DT), load_tile(ubar, o_t, m_t, i_h, H, V, o_v))
    store_tile(o, b_o * scale, o_t, m_t, i_h, H, V, o_v)


@triton.jit
def output_bwd_local_kernel(q, kt, G, do, du_local, scale, cu_seqlens, chunk_indices, H,
                            K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                            BV: tl.constexpr, HAS_G: tl.constexpr):
    i_v, i_t, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    b_Pt = mm(load_tile(kt, o_t, m_t, i_h, H, K, o_k), tl.trans(load_tile(q, o_t, m_t, i_h, H, K, o_k)))
    b_Pt = (b_Pt * (scale * gram_decay(b_g, BT, False, True))).to(q.dtype.element_ty)
    b_du = mm(b_Pt, load_tile(do, o_t, m_t, i_h, H, V, o_v))
    store_tile(du_local, b_du, o_t, m_t, i_h, H, V, o_v)


@triton.jit
def output_bwd_kernel(q, kt, G, h, dh, ubar, du, do, dq, dkt, dw, dg, scale, cu_seqlens, chunk_indices, T, H,
                      K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      HAS_G: tl.constexpr):
    # one program per key slice of BK: every term is a sum over key channels, so ∂G comes in partial sums
    i_k, i_t, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _, o_t, m_t, last = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    DT = q.dtype.element_ty
    b_q = load_tile(q, o_t, m_t, i_h, H, K, o_k)
    b_kt = load_tile(kt, o_t, m_t, i_h, H, K, o_k)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dkh = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_dP = tl.zeros([BT, BT], dtype=tl.float32)
    b_dPt = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        b_h = load_state(h, i_t * H + i_h, o_k, o_v, K, V)
        b_dh = load_state(dh, i_t * H + i_h, o_k, o_v, K, V)
        b_ub = load_tile(ubar, o_t, m_t, i_h, H, V, o_v)
        b_do = load_tile(do, o_t, m_t, i_h, H, V, o_v)
        b_dq += mm(b_do, tl.trans(b_h))
        b_dP += mm(b_do, tl.trans(b_ub))
        b_dPt += mm(b_ub, tl.trans(b_do))
        b_dkh += mm(b_ub, tl.trans(b_dh))
        b_dw -= mm(load_tile(du, o_t, m_t, i_h, H, V, o_v), tl.trans(b_h))
        b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)

    b_gam = gram_decay(b_g, BT, False)
    b_dq = b_dq * (scale * tl.exp(b_g))[:, None]
    b_dg = tl.sum(b_dq * b_q.to(tl.float32), axis=1)
    b_dP = b_dP * scale * b_gam
    b_dq += mm(b_dP.to(DT), b_kt)
    b_dPP = b_dP * mm(b_q, tl.trans(b_kt))
    b_dg += tl.sum(b_dPP, axis=1) - tl.sum(b_dPP, axis=0)
    b_decay, b_gC = decay_to_end(G, b_g, last, m_t, i_h, H, HAS_G)
    b_dkt = mm((b_dPt * scale * gram_decay(b_g, BT, False, True)).to(DT), b_q) + b_dkh * b_decay[:, None]
    b_s = tl.sum(b_dkh * b_kt.to(tl.float32) * b_decay[:, None], axis=1)
    b_dg += tl.where(o_t == last, tl.sum(b_s, axis=0) + b_gC * tl.sum(b_hdh, axis=0), 0.0) - b_s

    store_tile(dq, b_dq, o_t, m_t, i_h, H, K, o_k)
    store_tile(dkt, b_dkt, o_t, m_t, i_h, H, K, o_k)
    store_tile(dw, b_dw, o_t, m_t, i_h, H, K, o_k)
    if HAS_G:
        tl.store(dg + (i_k * T + o_t) * H + i_h, b_dg, mask=m_t)


def output_fwd(q, kt, G, h, ubar, scale, cu_seqlens, chunk_indices, chunk_size, BK, BV):
    """O [1, ΣT, H, V] in q's dtype."""
    _, T, H, K = q.shape
    V = ubar.shape[-1]
    o = torch.empty(1, T, H, V, dtype=q.dtype, device=q.device)
    BV, opts = launch("output_fwd", BK, BV)
    output_fwd_kernel[(triton.cdiv(V, BV), chunk_indices.shape[0], H)](
        q, kt, G, h, ubar, o, scale, cu_seqlens, chunk_indices, H,
        K=K, V=V, BT=chunk_size, BK=BK, BV=BV, HAS_G=G is not None, **opts)
    return o


def output_bwd_local(q, kt, G, do, scale, cu_seqlens, chunk_indices, chunk_size, BK, BV):
    """∂Ū^local = scale Pᵀ ∂O [1, ΣT, H, V] in q's dtype."""
    _, T, H, K = q.shape
    V = do.shape[-1]
    du_local = torch.empty(1, T, H, V, dtype=q.dtype, device=q.device)
    BV, opts = launch("output_bwd_local", BK, BV)
    output_bwd_local_kernel[(triton.cdiv(V, BV), chunk_indices.shape[0], H)](
        q, kt, G, do, du_local, scale, cu_seqlens, chunk_indices, H,
        K=K, V=V, BT=chunk_size, BK=BK, BV=BV, HAS_G=G is not None, **opts)
    return du_local


def output_bwd(q, kt, G, h, dh, ubar, du, do, scale, cu_seqlens, chunk_indices, chunk_size, BK, BV):
    """(∂q and ∂W in q's dtype: ∂q is final and wy_bwd rounds ∂W to it before its products; ∂k̃ partial and ∂G
    partial or None in float32, to be summed on)."""
    _, T, H, K = q.shape
    V = do.shape[-1]
    BKS = min(BK, 64)
    NK = triton.cdiv(K, BKS)
    f32 = dict(dtype=torch.float32, device=q.device)
    dq, dw = (torch.empty(1, T, H, K, dtype=q.dtype, device=q.device) for _ in range(2))
    dkt = torch.empty(1, T, H, K, **f32)
    dg = torch.empty(NK, T, H, **f32) if G is not None else None
    BV, opts = launch("output_bwd", BKS, BV)
    output_bwd_kernel[(NK, chunk_indices.shape[0], H)](
        q, kt, G, h, dh, ubar, du, do, dq, dkt, dw, dg, scale, cu_seqlens, chunk_indices, T, H,
        K=K, V=V, BT=chunk_size, BK=BKS, BV=BV, HAS_G=G is not None, **opts)
    return dq, dkt, dw, None if dg is None else dg.sum(0, keepdim=True)

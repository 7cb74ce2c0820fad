"""The sequential state pass over the chunks of each sequence (SPEC §3 with the GDN log-decay).

Forward, chunk n entering with S_n (γ = e^G, γ_C its value at the chunk's last token):

    Ū_n     = U_n − W_n S_n                              (the residuals, formed in float32)
    S_{n+1} = γ_C S_n + (K̃ ⊙ e^{G_C − G})ᵀ Ū_n

Backward, with ∂S_{n+1} known (∂S at the end is the final state's gradient) and ∂Ū^local = scale Pᵀ ∂O
from output.py:

    ∂Ū_n = ∂Ū^local_n + (K̃ ⊙ e^{G_C − G}) ∂S_{n+1}
    ∂S_n = γ_C ∂S_{n+1} + scale (Q ⊙ γ)ᵀ ∂O_n − W_nᵀ ∂Ū_n
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import chain_launch, load_gate, load_state, load_tile, load_tile_t, mm, store_state, store_tile


@triton.jit
def decay_to_end(G, b_g, last, m_t, i_h, H, HAS_G: tl.constexpr):
    """(e^{G_C − G_i} on valid rows, 0 on padding [BT]; γ_C = e^{G_C}) for the chunk ending at token `last`."""
    if HAS_G:
        g_last = tl.load(G + last * H + i_h).to(tl.float32)
        b_decay = tl.where(m_t, tl.exp(tl.where(m_t, g_last - b_g, 0.0)), 0.0)
        b_gC = tl.exp(g_last)
    else:
        b_decay = tl.where(m_t, 1.0, 0.0)
        b_gC = 1.0
    return b_decay, b_gC


@triton.jit
def chain_program(cu_seqlens, chunk_offsets, H):
    """A chain program's (value tile, sequence·H + head, head, first token, end token, first chunk's index)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n = i_nh // H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    return i_v, i_nh, i_nh % H, bos, eos, tl.load(chunk_offsets + i_n)


@triton.jit
def state_fwd_kernel(w, u, kt, G, S0, h, ubar, S_final, cu_seqlens, chunk_offsets, H,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_G: tl.constexpr, HAS_S0: tl.constexpr, STORE_FINAL: tl.constexpr):
    """From BK = 128 on, S is held as two tiles of BK / 2 key rows, a and b: W S = W_a S_a + W_b S_b, and each half
    takes its rows of K̃ᵀ Ū (fewer registers live at once: ptxas spilled far less, benchmarks/NOTES.md). The decay
    e^{G_C − G} scales Ū's rows (a [BT, BV] tile) rather than K̃'s ([BT, BK])."""
    i_v, i_nh, i_h, bos, eos, boh = chain_program(cu_seqlens, chunk_offsets, H)
    SPLIT: tl.constexpr = BK >= 128
    HK: tl.constexpr = BK // 2 if SPLIT else BK
    o_a, o_v = tl.arange(0, HK), i_v * BV + tl.arange(0, BV)
    o_b = HK + o_a
    DT = w.dtype.element_ty
    b_Sa = load_state(S0, i_nh, o_a, o_v, K, V) if HAS_S0 else tl.zeros([HK, BV], dtype=tl.float32)
    if SPLIT:
        b_Sb = load_state(S0, i_nh, o_b, o_v, K, V) if HAS_S0 else tl.zeros([HK, BV], dtype=tl.float32)
    for i_c in range(tl.cdiv((eos - bos).to(tl.int32), BT)):
        i_s = (boh + i_c) * H + i_h
        o_t = bos + i_c * BT + tl.arange(0, BT)
        m_t = o_t < eos
        b_Sad = b_Sa.to(DT)
        store_state(h, b_Sad, i_s, o_a, o_v, K, V)
        if SPLIT:
            b_Sbd = b_Sb.to(DT)
            store_state(h, b_Sbd, i_s, o_b, o_v, K, V)
        b_wS = mm(load_tile(w, o_t, m_t, i_h, H, K, o_a), b_Sad)
        if SPLIT:
            b_wS += mm(load_tile(w, o_t, m_t, i_h, H, K, o_b), b_Sbd)
        b_ub = load_tile(u, o_t, m_t, i_h, H, V, o_v).to(tl.float32) - b_wS
        b_ubd = b_ub.to(DT)
        store_tile(ubar, b_ubd, o_t, m_t, i_h, H, V, o_v)
        if HAS_G:
            b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
            b_decay, b_gC = decay_to_end(G, b_g, tl.minimum(bos + i_c * BT + BT, eos) - 1, m_t, i_h, H, HAS_G)
            b_ubd = (b_ub * b_decay[:, None]).to(DT)
            b_Sa *= b_gC
            if SPLIT:
                b_Sb *= b_gC
        b_Sa += mm(load_tile_t(kt, o_t, m_t, i_h, H, K, o_a), b_ubd)
        if SPLIT:
            b_Sb += mm(load_tile_t(kt, o_t, m_t, i_h, H, K, o_b), b_ubd)
    if STORE_FINAL:
        store_state(S_final, b_Sa, i_nh, o_a, o_v, K, V)
        if SPLIT:
            store_state(S_final, b_Sb, i_nh, o_b, o_v, K, V)


@triton.jit
def state_bwd_kernel(q, kt, w, G, do, du_local, dS_final, dh, du, dS0, scale, cu_seqlens, chunk_offsets, H,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_G: tl.constexpr, HAS_DSF: tl.constexpr):
    """∂S in two tiles of BK / 2 key rows from BK = 128 on, as the forward holds S. The gate's factors scale the
    [BT, BV] tiles: (K̃ ⊙ e^{G_C − G}) ∂S = e^{G_C − G} ⊙ (K̃ ∂S) and (Q ⊙ γ)ᵀ ∂O = Qᵀ (γ ⊙ ∂O), `scale` applied to
    the product."""
    i_v, i_nh, i_h, bos, eos, boh = chain_program(cu_seqlens, chunk_offsets, H)
    SPLIT: tl.constexpr = BK >= 128
    HK: tl.constexpr = BK // 2 if SPLIT else BK
    o_a, o_v = tl.arange(0, HK), i_v * BV + tl.arange(0, BV)
    o_b = HK + o_a
    DT = w.dtype.element_ty
    b_dSa = load_state(dS_final, i_nh, o_a, o_v, K, V) if HAS_DSF else tl.zeros([HK, BV], dtype=tl.float32)
    if SPLIT:
        b_dSb = load_state(dS_final, i_nh, o_b, o_v, K, V) if HAS_DSF else tl.zeros([HK, BV], dtype=tl.float32)
    NT = tl.cdiv((eos - bos).to(tl.int32), BT)
    for j in range(NT):
        i_c = NT - 1 - j
        i_s = (boh + i_c) * H + i_h
        o_t = bos + i_c * BT + tl.arange(0, BT)
        m_t = o_t < eos
        b_dSad = b_dSa.to(DT)
        store_state(dh, b_dSad, i_s, o_a, o_v, K, V)
        if SPLIT:
            b_dSbd = b_dSb.to(DT)
            store_state(dh, b_dSbd, i_s, o_b, o_v, K, V)
        b_kdS = mm(load_tile(kt, o_t, m_t, i_h, H, K, o_a), b_dSad)
        if SPLIT:
            b_kdS += mm(load_tile(kt, o_t, m_t, i_h, H, K, o_b), b_dSbd)
        b_do = load_tile(do, o_t, m_t, i_h, H, V, o_v)
        if HAS_G:
            b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
            b_decay, b_gC = decay_to_end(G, b_g, tl.minimum(bos + i_c * BT + BT, eos) - 1, m_t, i_h, H, HAS_G)
            b_kdS *= b_decay[:, None]
            b_do = (b_do.to(tl.float32) * tl.exp(b_g)[:, None]).to(DT)
            b_dSa *= b_gC
            if SPLIT:
                b_dSb *= b_gC
        b_dud = (load_tile(du_local, o_t, m_t, i_h, H, V, o_v).to(tl.float32) + b_kdS).to(DT)
        store_tile(du, b_dud, o_t, m_t, i_h, H, V, o_v)
        b_dSa += scale * mm(load_tile_t(q, o_t, m_t, i_h, H, K, o_a), b_do) \
            - mm(load_tile_t(w, o_t, m_t, i_h, H, K, o_a), b_dud)
        if SPLIT:
            b_dSb += scale * mm(load_tile_t(q, o_t, m_t, i_h, H, K, o_b), b_do) \
                - mm(load_tile_t(w, o_t, m_t, i_h, H, K, o_b), b_dud)
    store_state(dS0, b_dSa, i_nh, o_a, o_v, K, V)
    if SPLIT:
        store_state(dS0, b_dSb, i_nh, o_b, o_v, K, V)


def state_fwd(w, u, kt, G, S0, cu_seqlens, chunk_offsets, n_chunks, chunk_size, BK, BV, output_final_state):
    """(h: S entering each chunk [NT, H, K, V], Ū [1, ΣT, H, V], both in W's dtype; final S [N, H, K, V] float32
    or None)."""
    _, T, H, K = w.shape
    V = u.shape[-1]
    N = cu_seqlens.shape[0] - 1
    like = dict(dtype=w.dtype, device=w.device)
    h = torch.empty(n_chunks, H, K, V, **like)
    ubar = torch.empty(1, T, H, V, **like)
    S_final = torch.empty(N, H, K, V, dtype=torch.float32, device=w.device) if output_final_state else None
    BV, opts = chain_launch("state_fwd", BK, BV, V, N * H, w.device)
    state_fwd_kernel[(triton.cdiv(V, BV), N * H)](
        w, u, kt, G, S0, h, ubar, S_final, cu_seqlens, chunk_offsets, H,
        K=K, V=V, BT=chunk_size, BK=BK, BV=BV, HAS_G=G is not None, HAS_S0=S0 is not None,
        STORE_FINAL=output_final_state, **opts)
    return h, ubar, S_final


def state_bwd(q, kt, w, G, do, du_local, dS_final, scale, cu_seqlens, chunk_offsets, n_chunks, chunk_size, BK, BV):
    """(∂S after each chunk [NT, H, K, V], ∂Ū [1, ΣT, H, V], both in W's dtype; ∂S0 [N, H, K, V] float32)."""
    _, T, H, K = q.shape
    V = do.shape[-1]
    N = cu_seqlens.shape[0] - 1
    like = dict(dtype=w.dtype, device=q.device)
    dh = torch.empty(n_chunks, H, K, V, **like)
    du = torch.empty(1, T, H, V, **like)
    dS0 = torch.empty(N, H, K, V, dtype=torch.float32, device=q.device)
    BV, opts = chain_launch("state_bwd", BK, BV, V, N * H, q.device)
    state_bwd_kernel[(triton.cdiv(V, BV), N * H)](
        q, kt, w, G, do, du_local, dS_final, dh, du, dS0, scale, cu_seqlens, chunk_offsets, H,
        K=K, V=V, BT=chunk_size, BK=BK, BV=BV, HAS_G=G is not None, HAS_DSF=dS_final is not None, **opts)
    return dh, du, dS0

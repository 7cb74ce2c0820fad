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
def state_fwd_kernel(w, u, kt, G, S0, h, ubar, S_final, cu_seqlens, chunk_offsets, H,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_G: tl.constexpr, HAS_S0: tl.constexpr, STORE_FINAL: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    boh = tl.load(chunk_offsets + i_n)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    DT = w.dtype.element_ty
    if HAS_S0:
        b_S = load_state(S0, i_nh, o_k, o_v, K, V)
    else:
        b_S = tl.zeros([BK, BV], dtype=tl.float32)
    for i_c in range(tl.cdiv((eos - bos).to(tl.int32), BT)):
        b_Sd = b_S.to(DT)
        store_state(h, b_Sd, (boh + i_c) * H + i_h, o_k, o_v, K, V)
        o_t = bos + i_c * BT + tl.arange(0, BT)
        m_t = o_t < eos
        b_ub = load_tile(u, o_t, m_t, i_h, H, V, o_v).to(tl.float32) \
            - mm(load_tile(w, o_t, m_t, i_h, H, K, o_k), b_Sd)
        b_ubd = b_ub.to(DT)
        store_tile(ubar, b_ubd, o_t, m_t, i_h, H, V, o_v)
        b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
        b_decay, b_gC = decay_to_end(G, b_g, tl.minimum(bos + i_c * BT + BT, eos) - 1, m_t, i_h, H, HAS_G)
        b_ktt = (load_tile_t(kt, o_t, m_t, i_h, H, K, o_k).to(tl.float32) * b_decay[None, :]).to(DT)
        b_S = b_S * b_gC + mm(b_ktt, b_ubd)
    if STORE_FINAL:
        store_state(S_final, b_S, i_nh, o_k, o_v, K, V)


@triton.jit
def state_bwd_kernel(q, kt, w, G, do, du_local, dS_final, dh, du, dS0, scale, cu_seqlens, chunk_offsets, H,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_G: tl.constexpr, HAS_DSF: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    boh = tl.load(chunk_offsets + i_n)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    DT = w.dtype.element_ty
    if HAS_DSF:
        b_dS = load_state(dS_final, i_nh, o_k, o_v, K, V)
    else:
        b_dS = tl.zeros([BK, BV], dtype=tl.float32)
    NT = tl.cdiv((eos - bos).to(tl.int32), BT)
    for j in range(NT):
        i_c = NT - 1 - j
        b_dSd = b_dS.to(DT)
        store_state(dh, b_dSd, (boh + i_c) * H + i_h, o_k, o_v, K, V)
        o_t = bos + i_c * BT + tl.arange(0, BT)
        m_t = o_t < eos
        b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
        b_decay, b_gC = decay_to_end(G, b_g, tl.minimum(bos + i_c * BT + BT, eos) - 1, m_t, i_h, H, HAS_G)
        b_kt = (load_tile(kt, o_t, m_t, i_h, H, K, o_k).to(tl.float32) * b_decay[:, None]).to(DT)
        b_du = load_tile(du_local, o_t, m_t, i_h, H, V, o_v).to(tl.float32) + mm(b_kt, b_dSd)
        b_dud = b_du.to(DT)
        store_tile(du, b_dud, o_t, m_t, i_h, H, V, o_v)
        b_qgt = (load_tile_t(q, o_t, m_t, i_h, H, K, o_k).to(tl.float32) * (scale * tl.exp(b_g))[None, :]).to(DT)
        b_do = load_tile(do, o_t, m_t, i_h, H, V, o_v)
        b_wt = load_tile_t(w, o_t, m_t, i_h, H, K, o_k)
        b_dS = b_dS * b_gC + mm(b_qgt, b_do) - mm(b_wt, b_dud)
    store_state(dS0, b_dS, i_nh, o_k, o_v, K, V)


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

"""The WY representation of one chunk (SPEC §3 with the GDN log-decay), forward and backward.

With Γ_ij = exp(G_i − G_j) (G the in-chunk cumulative log-decay), per chunk:

    A    = strict_lower(diag(β) (K K̃ᵀ ⊙ Γ))      A_ij = β_i ⟨k_i, k̃_j⟩ e^{G_i − G_j}, j < i
    A⁻¹  = (I + A)⁻¹                              unit lower triangular, blockwise (solve.py)
    T    = A⁻¹ diag(β)
    W    = T (K ⊙ e^G)        (the RAW key)       U = T V

Backward, from ∂W and ∂U (transposed operands come from transposed loads, never from tl.trans of a computed
matrix: that pattern is miscompiled on Hopper by Triton 3.4+, fla issues #640 and #984; the one computed matrix
needed both ways, ∂M = ∂A ⊙ Γ ⊙ β_i, goes through a per-chunk scratch tile and is read back transposed):

    ∂T  = ∂W (K ⊙ e^G)ᵀ + ∂U Vᵀ                  ∂(K ⊙ e^G) = Tᵀ ∂W,  ∂V = Tᵀ ∂U
    ∂β_j += Σ_i A⁻¹_ij ∂T_ij                      ∂A = −strict_lower(A⁻ᵀ (∂T diag(β)) A⁻ᵀ)
    ∂K  += (∂A ⊙ Γ ⊙ β_i) K̃,   ∂K̃ += (∂A ⊙ Γ ⊙ β_i)ᵀ K,   ∂β_i += Σ_j ∂A_ij ⟨k_i, k̃_j⟩ Γ_ij
    ∂G_i += Σ_j (∂A ⊙ A)_ij − Σ_j (∂A ⊙ A)_ji + ⟨k_i e^{G_i}, ∂(K ⊙ e^G)_i⟩
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import chunk_rows, launch, load_gate, load_tile, load_tile_t, mm, store_tile
from .solve import unit_lower_inverse


@triton.jit
def gram_decay(b_g, BT: tl.constexpr, STRICT: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Γ_ij = exp(G_i − G_j) on j < i (STRICT) or j ≤ i, else 0 (or Γᵀ); the exponent is masked before exp."""
    o_i = tl.arange(0, BT)
    if TRANSPOSED:
        row, col = o_i[None, :], o_i[:, None]
        diff = b_g[None, :] - b_g[:, None]
    else:
        row, col = o_i[:, None], o_i[None, :]
        diff = b_g[:, None] - b_g[None, :]
    if STRICT:
        keep = row > col
    else:
        keep = row >= col
    return tl.where(keep, tl.exp(tl.where(keep, diff, 0.0)), 0.0)


@triton.jit
def gram_kernel(k, kt, beta, G, A, cu_seqlens, chunk_indices, H,
                K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HAS_G: tl.constexpr):
    """A = strict_lower(diag(β) (K K̃ᵀ ⊙ Γ)), float32, for the solve."""
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_i, o_k = tl.arange(0, BT), tl.arange(0, BK)
    b_b = tl.load(beta + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    b_A = mm(load_tile(k, o_t, m_t, i_h, H, K, o_k), load_tile_t(kt, o_t, m_t, i_h, H, K, o_k))
    store_tile(A, b_A * gram_decay(b_g, BT, True) * b_b[:, None], o_t, m_t, i_h, H, BT, o_i)


@triton.jit
def wu_kernel(k, v, beta, G, Ainv, w, u, cu_seqlens, chunk_indices, H,
              K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
              HAS_G: tl.constexpr):
    """W = A⁻¹ diag(β) (K ⊙ e^G), U = A⁻¹ diag(β) V, in k's dtype."""
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_i, o_k = tl.arange(0, BT), tl.arange(0, BK)
    b_b = tl.load(beta + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    b_T = (load_tile(Ainv, o_t, m_t, i_h, H, BT, o_i).to(tl.float32) * b_b[None, :]).to(k.dtype.element_ty)
    b_kg = (load_tile(k, o_t, m_t, i_h, H, K, o_k).to(tl.float32) * tl.exp(b_g)[:, None]).to(k.dtype.element_ty)
    store_tile(w, mm(b_T, b_kg), o_t, m_t, i_h, H, K, o_k)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        store_tile(u, mm(b_T, load_tile(v, o_t, m_t, i_h, H, V, o_v)), o_t, m_t, i_h, H, V, o_v)


@triton.jit
def wy_bwd_kernel(k, kt, v, beta, G, Ainv, dw, du, dkt_in, dg_in, dk, dkt, dv, dbeta, dg, dM_scratch,
                  cu_seqlens, chunk_indices, H,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  HAS_G: tl.constexpr):
    # the key dim in slices of BK (here ≤ 64): [C, C] matrices accumulate over them, so shared memory stays small
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    _, o_t, m_t, _ = chunk_rows(cu_seqlens, chunk_indices, i_t, BT)
    o_i = tl.arange(0, BT)
    DT = k.dtype.element_ty
    b_b = tl.load(beta + o_t * H + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_g = load_gate(G, o_t, m_t, i_h, H, HAS_G, BT)
    b_Ai = load_tile(Ainv, o_t, m_t, i_h, H, BT, o_i)
    b_Ait = tl.load(Ainv + (o_t[None, :] * H + i_h) * BT + o_i[:, None], mask=m_t[None, :], other=0.0)
    b_Tt = (b_Ait.to(tl.float32) * b_b[:, None]).to(DT)

    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_kgt = (load_tile_t(k, o_t, m_t, i_h, H, K, o_k).to(tl.float32) * tl.exp(b_g)[None, :]).to(DT)
        b_dT += mm(load_tile(dw, o_t, m_t, i_h, H, K, o_k).to(DT), b_kgt)
        b_kk += mm(load_tile(k, o_t, m_t, i_h, H, K, o_k), load_tile_t(kt, o_t, m_t, i_h, H, K, o_k))
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        b_du = load_tile(du, o_t, m_t, i_h, H, V, o_v).to(DT)
        b_dT += mm(b_du, load_tile_t(v, o_t, m_t, i_h, H, V, o_v))
        store_tile(dv, mm(b_Tt, b_du), o_t, m_t, i_h, H, V, o_v)

    b_db = tl.sum(b_dT * b_Ai.to(tl.float32), axis=0)
    b_dA = -mm(b_Ait, mm((b_dT * b_b[None, :]).to(DT), b_Ait).to(DT))
    b_dA = tl.where(o_i[:, None] > o_i[None, :], b_dA, 0.0)
    b_gam = gram_decay(b_g, BT, True)
    b_kk = b_kk * b_gam
    b_db += tl.sum(b_dA * b_kk, axis=1)
    b_dM = (b_dA * b_gam * b_b[:, None]).to(DT)
    # ∂Mᵀ for ∂K̃ = ∂Mᵀ K: through this chunk's scratch tile, written, synchronised, read back transposed
    p_dM = dM_scratch + (i_t * H + i_h).to(tl.int64) * BT * BT
    tl.store(p_dM + o_i[:, None] * BT + o_i[None, :], b_dM)
    tl.debug_barrier()
    b_dMt = tl.load(p_dM + o_i[None, :] * BT + o_i[:, None]).to(DT)
    b_dAA = b_dA * b_kk * b_b[:, None]
    b_dg = tl.sum(b_dAA, axis=1) - tl.sum(b_dAA, axis=0)

    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k = load_tile(k, o_t, m_t, i_h, H, K, o_k)
        b_kt = load_tile(kt, o_t, m_t, i_h, H, K, o_k)
        b_dkg = mm(b_Tt, load_tile(dw, o_t, m_t, i_h, H, K, o_k).to(DT))
        b_dg += tl.sum(b_dkg * b_k.to(tl.float32), axis=1) * tl.exp(b_g)
        b_dk = b_dkg * tl.exp(b_g)[:, None] + mm(b_dM, b_kt)
        b_dkt = mm(b_dMt, b_k) + load_tile(dkt_in, o_t, m_t, i_h, H, K, o_k)
        store_tile(dk, b_dk, o_t, m_t, i_h, H, K, o_k)
        store_tile(dkt, b_dkt, o_t, m_t, i_h, H, K, o_k)

    tl.store(dbeta + o_t * H + i_h, b_db.to(dbeta.dtype.element_ty), mask=m_t)
    if HAS_G:
        b_dg += tl.load(dg_in + o_t * H + i_h, mask=m_t, other=0.0)
        tl.store(dg + o_t * H + i_h, b_dg, mask=m_t)


def wy_fwd(k, kt, v, beta, G, cu_seqlens, chunk_indices, chunk_size, BK, BV, Ainv=None):
    """(A⁻¹ [1, ΣT, H, C], W [1, ΣT, H, K], U [1, ΣT, H, V]) in k's dtype; a given A⁻¹ is reused, not re-solved."""
    _, T, H, K = k.shape
    V = v.shape[-1]
    grid = (chunk_indices.shape[0], H)
    if Ainv is None:
        A = torch.empty(1, T, H, chunk_size, dtype=torch.float32, device=k.device)
        _, opts = launch("gram", BK, BV)
        gram_kernel[grid](k, kt, beta, G, A, cu_seqlens, chunk_indices, H, K=K, BT=chunk_size, BK=BK,
                          HAS_G=G is not None, **opts)
        Ainv = unit_lower_inverse(A, cu_seqlens, chunk_indices, k.dtype, **launch("solve", BK, BV)[1])
    w, u = torch.empty(1, T, H, K, dtype=k.dtype, device=k.device), torch.empty(1, T, H, V, dtype=k.dtype, device=k.device)
    BV, opts = launch("wu", BK, BV)
    wu_kernel[grid](k, v, beta, G, Ainv, w, u, cu_seqlens, chunk_indices, H,
                    K=K, V=V, BT=chunk_size, BK=BK, BV=BV, HAS_G=G is not None, **opts)
    return Ainv, w, u


def wy_bwd(k, kt, v, beta, G, Ainv, dw, du, dkt_in, dg_in, cu_seqlens, chunk_indices, chunk_size, BK, BV,
           out_dtype):
    """(∂k and ∂k̃ in `out_dtype`: phase 2's partial ∂k and total ∂k̃, which phase 1's backward reads once each (in
    k's dtype, 16-bit inputs halve that traffic, as fla's partial ∂k); ∂β, ∂G in float32: this stage's terms plus
    the carried-in ∂k̃ (`dkt_in`, float32) and ∂G, to be summed on; ∂v, final, in v's dtype). ∂k̃ is summed in
    float32 registers and rounded once into a new buffer, or, in float32, written back into `dkt_in` (each program
    reads its tile before writing it), so that no second float32 [T, H, K] is alive at the peak."""
    _, T, H, K = k.shape
    V = v.shape[-1]
    f32 = dict(dtype=torch.float32, device=k.device)
    dk = torch.empty(1, T, H, K, dtype=out_dtype, device=k.device)
    dkt = dkt_in if out_dtype == torch.float32 else torch.empty(1, T, H, K, dtype=out_dtype, device=k.device)
    dv = torch.empty(1, T, H, V, dtype=v.dtype, device=v.device)
    dbeta = torch.empty(1, T, H, **f32)
    dg = torch.empty(1, T, H, **f32) if G is not None else None
    dM_scratch = torch.empty(chunk_indices.shape[0], H, chunk_size, chunk_size, dtype=k.dtype, device=k.device)
    BV, opts = launch("wy_bwd", BK, BV)
    wy_bwd_kernel[(chunk_indices.shape[0], H)](
        k, kt, v, beta, G, Ainv, dw, du, dkt_in, dg_in, dk, dkt, dv, dbeta, dg, dM_scratch, cu_seqlens,
        chunk_indices, H,
        K=K, V=V, BT=chunk_size, BK=min(BK, 64), BV=BV, HAS_G=G is not None, **opts)
    return dk, dkt, dv, dbeta, dg

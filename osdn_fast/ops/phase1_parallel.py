"""Phase 1's forward, clip included, exactly and in parallel over each chunk (the method of
benchmarks/phase1_fixed_point.py; NOTES.md, next change 2).

Given the scalars s_t = ⟨d_t, a_t⟩ (a_t = k_t²), each coordinate of d follows a clamped affine map,

    d_{t+1} = f_t(d_t) = clamp(r_t d_t + w_t a_t, d_min, d_max),   w_t = η b_t (1 − b_t s_t) / n_t,

and such maps, (α, c, L, U) ↦ x ↦ clamp(αx + c, L, U) with α ≥ 0, compose associatively:

    g∘f = (α_g α_f,  α_g c_f + c_g,  clamp(α_g L_f + c_g, L_g, U_g),  clamp(α_g U_f + c_g, L_g, U_g)).

One program per (sequence, head) walks the chunks. In a chunk entered with d_in, row t of the tile holds the
map of token t − 1 (row 0 the identity), so one tl.associative_scan gives every d_t = f_{t−1}∘…∘f_0(d_in) at once.
The s_t are iterated to their fixed point (s ← ⟨d(s), a⟩, starting from s_t = ⟨d_in, a_t⟩): s_t depends on
s_{<t} only, so sweep m fixes token m − 1 for good and at most C + 1 sweeps reach a state that no sweep changes;
the loop stops there, bitwise. In practice 1–9 sweeps (the CPU study in NOTES.md).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .phase1_launch import launch_bwd, launch_fwd, seq_bounds

BIG = tl.constexpr(1e30)  # "no bound": finite, so that a retention of 0 (α = 0) never meets 0 · ∞


@triton.jit
def _compose(a1, c1, l1, u1, a2, c2, l2, u2):
    """(map 2)∘(map 1): the later token's map applied after the earlier one's."""
    return (a2 * a1, a2 * c1 + c2, tl.minimum(tl.maximum(a2 * l1 + c2, l2), u2),
            tl.minimum(tl.maximum(a2 * u1 + c2, l2), u2))


@triton.jit
def phase1_fwd_parallel_kernel(
    k, beta, r, d0, eta, d_all, d_final, kt_out, cu_seqlens,
    T, H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, HAS_D0: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, IS_VARLEN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
    STORE_KT: tl.constexpr,
):
    n, h = tl.program_id(0), tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_i = tl.arange(0, BT)
    m_k = o_k < K
    if HAS_D0:
        d_in = tl.load(d0 + (n * H + h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        d_in = tl.where(m_k, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    lo = d_min if HAS_MIN else -BIG
    hi = d_max if HAS_MAX else BIG
    shift = o_i[:, None] == o_i[None, :] + 1  # row t takes entry t − 1
    for c0 in range(bos, eos, BT):
        o_t = c0 + o_i
        m_t = o_t < eos
        m_p = (o_i > 0) & m_t  # rows whose map is token t − 1's (row 0: the identity)
        tile = m_t[:, None] & m_k[None, :]
        rows = (o_t[:, None] * H + h) * K + o_k[None, :]
        k_t = tl.load(k + rows, mask=tile, other=0.0).to(tl.float32)
        k_p = tl.load(k + rows - H * K, mask=m_p[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        a_t, a_p = k_t * k_t, k_p * k_p
        if BETA_AWARE:
            b_p = tl.load(beta + (o_t - 1) * H + h, mask=m_p, other=0.0).to(tl.float32)
        else:
            b_p = tl.where(m_p, 1.0, 0.0)
        if HAS_R:
            r_p = tl.load(r + (o_t - 1) * H + h, mask=m_p, other=1.0).to(tl.float32)
        else:
            r_p = tl.full([BT], 1.0, tl.float32)
        if NORMALIZE:
            nu_p = 1.0 / (tl.sum(a_p, axis=1) + eps)
        else:
            nu_p = tl.full([BT], 1.0, tl.float32)
        alpha = tl.broadcast_to(r_p[:, None], (BT, BK))
        lower = tl.where(m_p[:, None] & m_k[None, :], lo, -BIG)
        upper = tl.where(m_p[:, None] & m_k[None, :], hi, BIG)

        s = tl.sum(d_in[None, :] * a_t, axis=1)
        d = tl.broadcast_to(d_in[None, :], (BT, BK))
        changed = True
        sweeps = 0
        while changed:
            s_p = tl.sum(tl.where(shift, s[None, :], 0.0), axis=1)  # s_{t−1} on row t
            w_p = eta_h * b_p * (1.0 - b_p * s_p) * nu_p
            aa, cc, ll, uu = tl.associative_scan((alpha, w_p[:, None] * a_p, lower, upper), 0, _compose)
            d = tl.minimum(tl.maximum(aa * d_in[None, :] + cc, ll), uu)
            s_new = tl.sum(d * a_t, axis=1)
            sweeps += 1
            changed = (tl.max(tl.abs(s_new - s), axis=0) > 0) & (sweeps <= BT)
            s = s_new
        tl.store(d_all + rows, d, mask=tile)
        if STORE_KT:
            tl.store(kt_out + rows, d * k_t, mask=tile)
        # the map of the chunk's last token takes d_last to the next chunk's d_in
        last = tl.minimum(c0 + BT, eos) - 1 - c0
        is_last = (o_i == last)[:, None]
        d_last = tl.sum(tl.where(is_last, d, 0.0), axis=0)
        a_last = tl.sum(tl.where(is_last, a_t, 0.0), axis=0)
        t_last = c0 + last
        if BETA_AWARE:
            b_last = tl.load(beta + t_last * H + h).to(tl.float32)
        else:
            b_last = 1.0
        if HAS_R:
            r_last = tl.load(r + t_last * H + h).to(tl.float32)
        else:
            r_last = 1.0
        if NORMALIZE:
            nu_last = 1.0 / (tl.sum(a_last, axis=0) + eps)
        else:
            nu_last = 1.0
        s_last = tl.sum(d_last * a_last, axis=0)
        d_in = r_last * d_last + eta_h * b_last * (1.0 - b_last * s_last) * nu_last * a_last
        d_in = tl.where(m_k, tl.minimum(tl.maximum(d_in, lo), hi), 0.0)
    tl.store(d_final + (n * H + h) * K + o_k, d_in, mask=m_k)


def phase1_fwd_parallel(k, beta, r, d0, eta, *, d_min, d_max, beta_aware, normalize, cu_seqlens, store_kt=False,
                        chunk_size=64):
    """The forward of phase1.phase1_fwd_seq (same arguments and results), chunk-parallel by the fixed point."""
    return launch_fwd(phase1_fwd_parallel_kernel, k, beta, r, d0, eta, d_min=d_min, d_max=d_max,
                      beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens, store_kt=store_kt,
                      BT=chunk_size, num_warps=4)


@triton.jit
def _token_terms(k, beta, r, d_all, gd_all, dkt_in, tok, ok, h, H, K, o_k, m_k, eta_h, eps, d_min, d_max,
                 HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
                 HAS_MAX: tl.constexpr, HAS_GD_ALL: tl.constexpr, FUSED: tl.constexpr):
    """For the tokens `tok` [BT] (rows where ok): k, a = k², d, s, w, c, ν, r, b, the clip mask of the step and
    the direct ∂L/∂d_t (with ∂k̃_t ⊙ k_t when FUSED): the reverse scan's per-token arithmetic, as a tile."""
    tile = ok[:, None] & m_k[None, :]
    rows = (tok[:, None] * H + h) * K + o_k[None, :]
    kk = tl.load(k + rows, mask=tile, other=0.0).to(tl.float32)
    a = kk * kk
    d = tl.load(d_all + rows, mask=tile, other=0.0)
    if BETA_AWARE:
        b = tl.load(beta + tok * H + h, mask=ok, other=0.0).to(tl.float32)
    else:
        b = tl.where(ok, 1.0, 0.0)
    if HAS_R:
        rr = tl.load(r + tok * H + h, mask=ok, other=1.0).to(tl.float32)
    else:
        rr = tl.full(ok.shape, 1.0, tl.float32)
    if NORMALIZE:
        nu = 1.0 / (tl.sum(a, axis=1) + eps)
    else:
        nu = tl.full(ok.shape, 1.0, tl.float32)
    s = tl.sum(d * a, axis=1)
    w = eta_h * b * (1.0 - b * s) * nu
    c = eta_h * b * b * nu
    z = rr[:, None] * d + w[:, None] * a
    keep = tile
    if HAS_MIN:
        keep = keep & (z >= d_min)
    if HAS_MAX:
        keep = keep & (z <= d_max)
    if HAS_GD_ALL:
        gd = tl.load(gd_all + rows, mask=tile, other=0.0).to(tl.float32)
    else:
        gd = tl.zeros(a.shape, dtype=tl.float32)
    if FUSED:
        gd += tl.load(dkt_in + rows, mask=tile, other=0.0) * kk
    return kk, a, d, s, w, c, nu, rr, b, keep, gd


@triton.jit
def _affine(a1, b1, a2, b2):
    """(map 2)∘(map 1) for x ↦ αx + β."""
    return a2 * a1, a2 * b1 + b2


@triton.jit
def phase1_bwd_parallel_kernel(
    k, beta, r, eta, d_all, gd_all, gd_final, dkt_in, dk_in, dbeta_in, cu_seqlens,
    dk, dbeta, dr, dd0, deta,
    T, H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, HAS_GD_ALL: tl.constexpr, HAS_GD_FINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, FUSED: tl.constexpr,
):
    """phase1.phase1_bwd_seq_kernel's reverse scan, chunk-parallel. Given the masks (from the stored d), the adjoint
    is linear per coordinate, λ_t = r_t keep_t ⊙ λ_{t+1} − c_t p_t a_t + ∂L/∂d_t, coupled only through the scalars
    p_t = ⟨keep_t ⊙ λ_{t+1}, a_t⟩: an affine scan over the chunk (rows in reverse token order) and a fixed point
    in p, as in the forward."""
    n, h = tl.program_id(0), tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_i = tl.arange(0, BT)
    m_k = o_k < K
    if HAS_GD_FINAL:
        lam = tl.load(gd_final + (n * H + h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        lam = tl.zeros([BK], dtype=tl.float32)
    eta_h = tl.load(eta + h).to(tl.float32)
    deta_acc = eta_h * 0.0
    shift = o_i[:, None] == o_i[None, :] + 1
    flags = (HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, HAS_GD_ALL, FUSED)
    srcs = (k, beta, r, d_all, gd_all, dkt_in)
    for j in range(0, tl.cdiv((eos - bos).to(tl.int32), BT)):
        tok = eos - 1 - j * BT - o_i  # row i: the i-th token from the chunk's end
        ok = tok >= bos
        kk, a, d, s, w, c, nu, rr, b, keep, gd = _token_terms(*srcs, tok, ok, h, H, K, o_k, m_k, eta_h, eps,
                                                             d_min, d_max, *flags)
        # row i's map is token tok_i + 1's (the previous row's), row 0 the identity
        okn = ok & (o_i > 0)
        _, a_n, _, _, _, c_n, _, r_n, _, keep_n, gd_n = _token_terms(*srcs, tok + 1, okn, h, H, K, o_k, m_k,
                                                                     eta_h, eps, d_min, d_max, *flags)
        alpha = tl.where(okn[:, None] & keep_n, r_n[:, None], tl.where(okn[:, None], 0.0, 1.0))
        p = tl.sum(tl.where(keep, lam[None, :], 0.0) * a, axis=1)
        dz = tl.where(keep, lam[None, :], 0.0)
        changed = True
        sweeps = 0
        while changed:
            p_n = tl.sum(tl.where(shift, p[None, :], 0.0), axis=1)
            beta_n = tl.where(okn[:, None], gd_n - (c_n * p_n)[:, None] * a_n, 0.0)
            aa, bb = tl.associative_scan((alpha, beta_n), 0, _affine)
            dz = tl.where(keep, aa * lam[None, :] + bb, 0.0)  # keep_t ⊙ λ_{t+1}
            p_new = tl.sum(dz * a, axis=1)
            sweeps += 1
            changed = (tl.max(tl.abs(p_new - p), axis=0) > 0) & (sweeps <= BT)
            p = p_new
        gs = -p * c
        da = w[:, None] * dz + gs[:, None] * d
        if NORMALIZE:
            da = da - (w * p * nu)[:, None]
        tile = ok[:, None] & m_k[None, :]
        rows = (tok[:, None] * H + h) * K + o_k[None, :]
        dk_t = 2.0 * kk * da
        if FUSED:
            dk_t += tl.load(dk_in + rows, mask=tile, other=0.0) + tl.load(dkt_in + rows, mask=tile, other=0.0) * d
        tl.store(dk + rows, dk_t, mask=tile)
        deta_acc += tl.sum(tl.where(ok, p * b * (1.0 - b * s) * nu, 0.0), axis=0)
        if FUSED:
            db_t = tl.load(dbeta_in + tok * H + h, mask=ok, other=0.0)
        else:
            db_t = tl.zeros([BT], dtype=tl.float32)
        if BETA_AWARE:
            db_t += p * eta_h * (1.0 - 2.0 * b * s) * nu
        if BETA_AWARE or FUSED:
            tl.store(dbeta + tok * H + h, db_t, mask=ok)
        if HAS_R:
            tl.store(dr + tok * H + h, tl.sum(dz * d, axis=1), mask=ok)
        # λ at the chunk's first token, the next chunk's λ_{t+1}
        lam_rows = rr[:, None] * dz + gs[:, None] * a + gd
        first = tl.minimum(BT, (eos - j * BT - bos).to(tl.int32)) - 1
        lam = tl.sum(tl.where((o_i == first)[:, None], lam_rows, 0.0), axis=0)
    tl.store(dd0 + (n * H + h) * K + o_k, lam, mask=m_k)
    tl.store(deta + n * H + h, deta_acc)


def phase1_bwd_parallel(k, beta, r, eta, d_all, gd_all, gd_final, *, d_min, d_max, beta_aware, normalize,
                        cu_seqlens, phase2_grads=None, chunk_size=64):
    """The backward of phase1.phase1_bwd_seq (same arguments and results), chunk-parallel by the fixed point."""
    return launch_bwd(phase1_bwd_parallel_kernel, k, beta, r, eta, d_all, gd_all, gd_final, d_min=d_min,
                      d_max=d_max, beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens,
                      phase2_grads=phase2_grads, BT=chunk_size, num_warps=4)

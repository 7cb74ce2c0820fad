"""Phase 1 in Triton: the preconditioner scan d_t over the key stream, forward and backward (SPEC §2-3).

One step per token (a_t = k_t², n_t = ‖k_t‖² + ε or 1, b_t = β_t or 1, s_t = ⟨d_t, a_t⟩):

    z_t     = r_t d_t + w_t a_t,   w_t = η b_t (1 − b_t s_t) / n_t
    d_{t+1} = clip(z_t, d_min, d_max)

The sequential kernels run one program per (sequence, head), the K channels in one block; without a clip they take
four tokens per reduction (_fwd_block, _bwd_block), with one token by token. The backward is the reverse scan of the
adjoint λ_t = ∂L/∂d_t (p_t = ⟨λ̄_t, a_t⟩ with λ̄_t = λ_{t+1} masked by the clip):

    λ_t = r_t λ̄_t − (η b_t² / n_t) p_t a_t + ∂L/∂d_t(direct)
    ∂a_t = w_t λ̄_t − (η b_t² / n_t) p_t d_t,  ∂k_t = 2 k_t (∂a_t − w_t p_t / n_t)   (the last term if normalised)
    ∂β_t = η p_t (1 − 2 b_t s_t) / n_t,  ∂r_t = ⟨λ̄_t, d_t⟩,  ∂η = Σ_t p_t b_t (1 − b_t s_t) / n_t

`phase1_chunk` (no clip, WY form) and `phase1_parallel` (clip included, fixed point) compute the same scan
chunk-parallel; `preconditioner_scan` runs them on request. chunk_osdn runs the sequential kernels here below a
mean sequence length of 4096 when more than 256 (sequence, head) chains run, or below 256 tokens (1024 for APF
with a floor), and the chunk forms otherwise (`chunk.phase1_form`; H200 timings in benchmarks/NOTES.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .phase1_launch import block_k, launch_bwd, launch_fwd, seq_bounds, wide_index
from .phase1_parallel import phase1_bwd_parallel, phase1_fwd_parallel


@triton.jit
def _gains(eta_h, b, s, a, eps, NORMALIZE: tl.constexpr):
    """ν = 1/n_t; returns (w = η b (1 − b s) ν, c = η b² ν, ν). Shared by both passes so that the backward
    recomputes z_t (and the clip mask) with exactly the forward's arithmetic."""
    if NORMALIZE:
        nu = 1.0 / (tl.sum(a, axis=0) + eps)
    else:
        nu = 1.0
    return eta_h * b * (1.0 - b * s) * nu, eta_h * b * b * nu, nu


@triton.jit
def _clipped_update(d, a, b, rt, eta_h, eps, d_min, d_max, mask, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
                    HAS_MAX: tl.constexpr):
    """(clip(z_t), keep_t, c_t): z_t = r_t d_t + w_t a_t, keep_t the coordinates the clip leaves alone (in `mask`),
    c_t = η b_t² / n_t. One place for the step that the scans and the passes over chunks share."""
    w, c, _ = _gains(eta_h, b, tl.sum(d * a, axis=0), a, eps, NORMALIZE)
    z = rt * d + w * a
    keep = mask
    if HAS_MIN:
        keep = keep & (z >= d_min)
        z = tl.maximum(z, d_min)
    if HAS_MAX:
        keep = keep & (z <= d_max)
        z = tl.minimum(z, d_max)
    return z, keep, c


@triton.jit
def _load_token(k, beta, r, t, ok, h, H, K, offs, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr):
    """k_t, β_t, r_t of token t as stored (zeros, r = 1, when not ok). Nothing is computed from a prefetched
    load until its token's step: an instruction that reads a loaded register waits for the load there (a
    conversion at load time cost the whole memory latency on every token of version 3)."""
    kt = tl.load(k + (t * H + h) * K + offs, mask=offs < tl.where(ok, K, 0), other=0.0)
    if BETA_AWARE:
        b = tl.load(beta + t * H + h, mask=ok, other=0.0)
    else:
        b = 1.0
    if HAS_R:
        rt = tl.load(r + t * H + h, mask=ok, other=1.0)
    else:
        rt = 1.0
    return kt, b, rt


@triton.jit
def _store_token(d, kt, row, m, d_all, kt_out, STORE_KT: tl.constexpr, STORE_D: tl.constexpr):
    """Stores d_t (if STORE_D) and k̃_t = d_t ⊙ k_t (if STORE_KT) at `row` where m."""
    if STORE_D:
        tl.store(d_all + row, d, mask=m)
    if STORE_KT:
        tl.store(kt_out + row, d * kt, mask=m)


@triton.jit
def _store_and_update(d, kt, b, rt, row, m, d_all, kt_out, eta_h, eps, d_min, d_max, mask,
                      HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
                      HAS_MAX: tl.constexpr, STORE_KT: tl.constexpr, STORE_D: tl.constexpr):
    """One token of the forward: stores d_t (if STORE_D) and k̃_t = d_t ⊙ k_t (if STORE_KT) at `row` where m, then
    the clipped update: (d_{t+1}, keep, c, a = k_t²) as _clipped_update gives them."""
    kt = kt.to(tl.float32)
    _store_token(d, kt, row, m, d_all, kt_out, STORE_KT, STORE_D)
    if BETA_AWARE:
        b = b.to(tl.float32)
    if HAS_R:
        rt = rt.to(tl.float32)
    a = kt * kt
    z, keep, c = _clipped_update(d, a, b, rt, eta_h, eps, d_min, d_max, mask, NORMALIZE, HAS_MIN, HAS_MAX)
    return z, keep, c, a


@triton.jit
def _fwd_step(d, kt, b, rt, t, ok, d_all, kt_out, h, H, K, offs, eta_h, eps, d_min, d_max,
              HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
              HAS_MAX: tl.constexpr, STORE_KT: tl.constexpr, STORE_D: tl.constexpr):
    """Token t's step of the scan: returns d_{t+1}, d unchanged when not ok."""
    m = offs < tl.where(ok, K, 0)  # mask & ok (the interpreter's & of a broadcast mask is not a mask)
    z, _, _, _ = _store_and_update(d, kt, b, rt, (t * H + h) * K + offs, m, d_all, kt_out, eta_h, eps, d_min, d_max,
                                   offs < K, HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, STORE_KT, STORE_D)
    return tl.where(ok, z, d)


@triton.jit
def _token_terms(kt, b, rt, eta_h, eps, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr):
    """A token's float32 terms for the unclipped four-token step: (k_t, a_t = k_t², r_t, g_t = η b_t ν_t, b_t),
    so that w_t = g_t (1 − b_t s_t)."""
    kt = kt.to(tl.float32)
    a = kt * kt
    if BETA_AWARE:
        b = b.to(tl.float32)
    if HAS_R:
        rt = rt.to(tl.float32)
    if NORMALIZE:
        g = eta_h * b / (tl.sum(a, axis=0) + eps)
    else:
        g = eta_h * b
    return kt, a, rt, g, b


@triton.jit
def _block_products(x, a1, a2, a3, a4):
    """The ten inner products of a block of four tokens, none of which depends on another: ⟨x, a_i⟩ for i = 1 … 4
    (x = d_t forward, λ̄ backward), then the Gram entries ⟨a_j, a_i⟩, j < i, in the order 12, 13, 14, 23, 24, 34."""
    return (tl.sum(x * a1, axis=0), tl.sum(x * a2, axis=0), tl.sum(x * a3, axis=0), tl.sum(x * a4, axis=0),
            tl.sum(a1 * a2, axis=0), tl.sum(a1 * a3, axis=0), tl.sum(a1 * a4, axis=0), tl.sum(a2 * a3, axis=0),
            tl.sum(a2 * a4, axis=0), tl.sum(a3 * a4, axis=0))


@triton.jit
def _fwd_block(d, k1, a1, r1, g1, b1, k2, a2, r2, g2, b2, k3, a3, r3, g3, b3, k4, a4, r4, g4, b4, t, eos,
               d_all, kt_out, h, H, K, offs, STORE_KT: tl.constexpr, STORE_D: tl.constexpr):
    """Tokens t … t+3 of the unclipped scan from d = d_t, the block's start (terms from _token_terms). With
    e_i = ⟨d_t, a_i⟩ and G_ji = ⟨a_j, a_i⟩, all ten inner products independent of one another,

        s_1 = e_1,  s_2 = r_1 e_2 + w_1 G_12,  s_3 = r_2 (r_1 e_3 + w_1 G_13) + w_2 G_23,
        s_4 = r_3 (r_2 (r_1 e_4 + w_1 G_14) + w_2 G_24) + w_3 G_34,

    and d ← r_i d + w_i a_i after each: one reduction deep per four tokens, where the token-by-token step
    (_fwd_step) is four deep. Tokens past eos get w = 0 (and r = 1 as loaded), so d stays."""
    e1, e2, e3, e4, g12, g13, g14, g23, g24, g34 = _block_products(d, a1, a2, a3, a4)
    row = (t * H + h) * K + offs
    w1 = tl.where(t < eos, g1 * (1.0 - b1 * e1), 0.0)
    _store_token(d, k1, row, offs < tl.where(t < eos, K, 0), d_all, kt_out, STORE_KT, STORE_D)
    d = r1 * d + w1 * a1
    w2 = tl.where(t + 1 < eos, g2 * (1.0 - b2 * (r1 * e2 + w1 * g12)), 0.0)
    _store_token(d, k2, row + H * K, offs < tl.where(t + 1 < eos, K, 0), d_all, kt_out, STORE_KT, STORE_D)
    d = r2 * d + w2 * a2
    w3 = tl.where(t + 2 < eos, g3 * (1.0 - b3 * (r2 * (r1 * e3 + w1 * g13) + w2 * g23)), 0.0)
    _store_token(d, k3, row + 2 * H * K, offs < tl.where(t + 2 < eos, K, 0), d_all, kt_out, STORE_KT, STORE_D)
    d = r3 * d + w3 * a3
    w4 = tl.where(t + 3 < eos, g4 * (1.0 - b4 * (r3 * (r2 * (r1 * e4 + w1 * g14) + w2 * g24) + w3 * g34)), 0.0)
    _store_token(d, k4, row + 3 * H * K, offs < tl.where(t + 3 < eos, K, 0), d_all, kt_out, STORE_KT, STORE_D)
    return r4 * d + w4 * a4


@triton.jit
def phase1_fwd_seq_kernel(
    k, beta, r, d0, eta, d_all, d_final, kt_out, cu_seqlens,
    T, H, K, eps, d_min, d_max, guard,
    HAS_R: tl.constexpr, HAS_D0: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, IS_VARLEN: tl.constexpr, BK: tl.constexpr,
    STORE_KT: tl.constexpr, HAS_GUARD: tl.constexpr, STORE_D: tl.constexpr, WIDE_INDEX: tl.constexpr,
):
    """d_{t+1} = clip(r_t d_t + w_t a_t): one program per (sequence n, head h), four tokens per loop iteration: with a
    clip token by token (_fwd_step), without one as a block (_fwd_block). Each token's inputs live in their own slot
    (1-4), reloaded with token t + 4 once token t no longer needs them (right after its step, or after the block's
    conversions): no register is copied from slot to slot (a copy of a pending load would wait for it). STORE_KT also
    writes the write key k̃_t = d_t ⊙ k_t (in k's dtype); without STORE_D, d_t itself is not stored (a forward that no
    backward follows).
    HAS_GUARD: every program returns at once unless the int32 at `guard` is nonzero. WIDE_INDEX: token indices in
    int64, for offsets beyond int32."""
    if HAS_GUARD:
        if tl.load(guard) == 0:
            return
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    if not WIDE_INDEX:  # every offset fits in int32 (phase1_launch.wide_index): 32-bit token indices
        bos, eos = bos.to(tl.int32), eos.to(tl.int32)
    offs = tl.arange(0, BK)
    mask = offs < K
    if HAS_D0:
        d = tl.load(d0 + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        d = tl.where(mask, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    src = (k, beta, r)
    loc = (h, H, K, offs)
    step = (d_all, kt_out, h, H, K, offs, eta_h, eps, d_min, d_max)
    k1, b1, r1 = _load_token(*src, bos, bos < eos, *loc, HAS_R, BETA_AWARE)
    k2, b2, r2 = _load_token(*src, bos + 1, bos + 1 < eos, *loc, HAS_R, BETA_AWARE)
    k3, b3, r3 = _load_token(*src, bos + 2, bos + 2 < eos, *loc, HAS_R, BETA_AWARE)
    k4, b4, r4 = _load_token(*src, bos + 3, bos + 3 < eos, *loc, HAS_R, BETA_AWARE)
    if HAS_MIN or HAS_MAX:  # the clip acts per coordinate: token by token
        for t in range(bos, eos, 4):
            d = _fwd_step(d, k1, b1, r1, t, t < eos, *step,
                          HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, STORE_KT, STORE_D)
            k1, b1, r1 = _load_token(*src, t + 4, t + 4 < eos, *loc, HAS_R, BETA_AWARE)
            d = _fwd_step(d, k2, b2, r2, t + 1, t + 1 < eos, *step,
                          HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, STORE_KT, STORE_D)
            k2, b2, r2 = _load_token(*src, t + 5, t + 5 < eos, *loc, HAS_R, BETA_AWARE)
            d = _fwd_step(d, k3, b3, r3, t + 2, t + 2 < eos, *step,
                          HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, STORE_KT, STORE_D)
            k3, b3, r3 = _load_token(*src, t + 6, t + 6 < eos, *loc, HAS_R, BETA_AWARE)
            d = _fwd_step(d, k4, b4, r4, t + 3, t + 3 < eos, *step,
                          HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, STORE_KT, STORE_D)
            k4, b4, r4 = _load_token(*src, t + 7, t + 7 < eos, *loc, HAS_R, BETA_AWARE)
    else:  # unclipped: four tokens per reduction (_fwd_block)
        for t in range(bos, eos, 4):
            x1 = _token_terms(k1, b1, r1, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE)
            x2 = _token_terms(k2, b2, r2, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE)
            x3 = _token_terms(k3, b3, r3, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE)
            x4 = _token_terms(k4, b4, r4, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE)
            k1, b1, r1 = _load_token(*src, t + 4, t + 4 < eos, *loc, HAS_R, BETA_AWARE)
            k2, b2, r2 = _load_token(*src, t + 5, t + 5 < eos, *loc, HAS_R, BETA_AWARE)
            k3, b3, r3 = _load_token(*src, t + 6, t + 6 < eos, *loc, HAS_R, BETA_AWARE)
            k4, b4, r4 = _load_token(*src, t + 7, t + 7 < eos, *loc, HAS_R, BETA_AWARE)
            d = _fwd_block(d, *x1, *x2, *x3, *x4, t, eos, d_all, kt_out, h, H, K, offs, STORE_KT, STORE_D)
    tl.store(d_final + (n * H + h) * K + offs, d, mask=mask)


@triton.jit
def _load_token_bwd(k, beta, r, d_all, gd_all, dkt_in, dk_in, dbeta_in, t, ok, h, H, K, offs,
                    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, HAS_GD_ALL: tl.constexpr, FUSED: tl.constexpr):
    """Everything the reverse scan reads at token t, as stored (see _load_token): k_t, b_t, r_t, d_t, the
    direct ∂L/∂d_t and, FUSED, phase 2's ∂k̃_t, ∂k_t, ∂β_t; zeros where absent."""
    kt, b, rt = _load_token(k, beta, r, t, ok, h, H, K, offs, HAS_R, BETA_AWARE)
    m = offs < tl.where(ok, K, 0)
    row = (t * H + h) * K + offs
    d = tl.load(d_all + row, mask=m, other=0.0)
    if HAS_GD_ALL:
        gd = tl.load(gd_all + row, mask=m, other=0.0)
    else:
        gd = 0.0
    if FUSED:
        dkt = tl.load(dkt_in + row, mask=m, other=0.0)
        dk2 = tl.load(dk_in + row, mask=m, other=0.0)
        db2 = tl.load(dbeta_in + t * H + h, mask=ok, other=0.0)
    else:
        dkt, dk2, db2 = 0.0, 0.0, 0.0
    return kt, b, rt, d, gd, dkt, dk2, db2


@triton.jit
def _bwd_terms(kt, b, rt, d, gd, dkt, dk2, db2, eta_h, eps, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr,
               NORMALIZE: tl.constexpr, HAS_GD_ALL: tl.constexpr, FUSED: tl.constexpr):
    """A token's float32 terms for the reverse scan, from its loads (_load_token_bwd): (k_t, a_t, r_t, d_t, u_t,
    ∂k_t so far, ∂β_t so far, s_t, ν_t, w_t, c_t, b_t). u_t is what λ_t gains besides the scan's own terms, ∂L/∂d_t
    direct plus (FUSED) ∂k̃_t ⊙ k_t; FUSED, ∂k_t starts from phase 2's ∂k_t + ∂k̃_t ⊙ d_t and ∂β_t from phase 2's."""
    kt = kt.to(tl.float32)
    if BETA_AWARE:
        b = b.to(tl.float32)
    if HAS_R:
        rt = rt.to(tl.float32)
    if HAS_GD_ALL:
        u = gd.to(tl.float32)
    else:
        u = tl.zeros([kt.shape[0]], dtype=tl.float32)
    if FUSED:
        dkt = dkt.to(tl.float32)
        u += dkt * kt
        dk_t = dk2.to(tl.float32) + dkt * d
        db_t = db2.to(tl.float32)
    else:
        dk_t = tl.zeros([kt.shape[0]], dtype=tl.float32)
        db_t = 0.0
    a = kt * kt
    s = tl.sum(d * a, axis=0)
    w, c, nu = _gains(eta_h, b, s, a, eps, NORMALIZE)
    return kt, a, rt, d, u, dk_t, db_t, s, nu, w, c, b


@triton.jit
def _bwd_token_out(dz, p, gs, kt, d, dk_t, db_t, s, nu, w, b, t, ok, dk, dbeta, dr, h, H, K, offs, eta_h,
                   HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, FUSED: tl.constexpr):
    """Stores token t's ∂k_t, ∂β_t, ∂r_t from λ̄_t (`dz`, the clip's mask applied), p_t = ⟨λ̄_t, a_t⟩ and
    gs = ∂L/∂s_t = −c_t p_t; returns its term of ∂η (0 when not ok)."""
    da = w * dz + gs * d
    if NORMALIZE:
        da = da - w * p * nu
    tl.store(dk + (t * H + h) * K + offs, dk_t + 2.0 * kt * da, mask=offs < tl.where(ok, K, 0))
    if BETA_AWARE:
        db_t += p * eta_h * (1.0 - 2.0 * b * s) * nu
    if BETA_AWARE or FUSED:
        tl.store(dbeta + t * H + h, db_t, mask=ok)
    if HAS_R:
        tl.store(dr + t * H + h, tl.sum(dz * d, axis=0), mask=ok)
    return tl.where(ok, p * b * (1.0 - b * s) * nu, 0.0)


@triton.jit
def _bwd_step(lam, deta_acc, kt, b, rt, d, gd, dkt, dk2, db2, t, ok, dk, dbeta, dr, h, H, K, offs, mask, eta_h,
              eps, d_min, d_max, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
              HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, HAS_GD_ALL: tl.constexpr, FUSED: tl.constexpr):
    """Token t's step of the reverse scan: stores ∂k_t, ∂β_t, ∂r_t, returns (λ_t, ∂η so far); unchanged when
    not ok. FUSED: ∂L/∂d_t gains ∂k̃_t ⊙ k_t, ∂k_t gains ∂k̃_t ⊙ d_t and phase 2's ∂k_t, ∂β_t gains phase 2's."""
    kt, a, rt, d, u, dk_t, db_t, s, nu, w, c, b = _bwd_terms(kt, b, rt, d, gd, dkt, dk2, db2, eta_h, eps, HAS_R,
                                                            BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
    z = rt * d + w * a
    keep = mask
    if HAS_MIN:
        keep = keep & (z >= d_min)
    if HAS_MAX:
        keep = keep & (z <= d_max)
    dz = tl.where(keep, lam, 0.0)
    p = tl.sum(dz * a, axis=0)
    gs = -p * c  # ∂L/∂s_t
    deta_acc += _bwd_token_out(dz, p, gs, kt, d, dk_t, db_t, s, nu, w, b, t, ok, dk, dbeta, dr, h, H, K, offs, eta_h,
                               HAS_R, BETA_AWARE, NORMALIZE, FUSED)
    return tl.where(ok, rt * dz + gs * a + u, lam), deta_acc


@triton.jit
def _bwd_block_token(lam, deta_acc, p, kt, a, rt, d, u, dk_t, db_t, s, nu, w, c, b, t, ok, dk, dbeta, dr, h, H, K, offs,
                     eta_h, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
                     HAS_U: tl.constexpr, FUSED: tl.constexpr):
    """One token of _bwd_block, given p_t: stores its gradients (_bwd_token_out) and returns (λ̄ of the token before,
    ∂η so far, gs_t = −c_t p_t, 0 when not ok)."""
    gs = tl.where(ok, -p * c, 0.0)
    deta_acc += _bwd_token_out(lam, p, gs, kt, d, dk_t, db_t, s, nu, w, b, t, ok, dk, dbeta, dr, h, H, K, offs, eta_h,
                               HAS_R, BETA_AWARE, NORMALIZE, FUSED)
    lam = rt * lam + gs * a
    if HAS_U:
        lam += u
    return lam, deta_acc, gs


@triton.jit
def _bwd_block(lam, deta_acc, k1, a1, r1, d1, u1, dk1, db1, s1, nu1, w1, c1, b1,
               k2, a2, r2, d2, u2, dk2, db2, s2, nu2, w2, c2, b2, k3, a3, r3, d3, u3, dk3, db3, s3, nu3, w3, c3, b3,
               k4, a4, r4, d4, u4, dk4, db4, s4, nu4, w4, c4, b4, t, bos, dk, dbeta, dr, h, H, K, offs, eta_h,
               HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_U: tl.constexpr,
               FUSED: tl.constexpr):
    """Tokens t, t−1, t−2, t−3 (1 … 4) of the unclipped reverse scan from λ = λ̄_1, terms from _bwd_terms. With
    λ̄_{i+1} = r_i λ̄_i + gs_i a_i + u_i, gs_i = −c_i p_i, the inner products p_i = ⟨λ̄_i, a_i⟩ unfold into
    E_i = ⟨λ, a_i⟩, G_ji = ⟨a_j, a_i⟩ and U_ji = ⟨u_j, a_i⟩, none of which depends on another:

        p_1 = E_1,  p_2 = r_1 E_2 + gs_1 G_12 + U_12,  p_3 = r_2 (r_1 E_3 + gs_1 G_13 + U_13) + gs_2 G_23 + U_23,
        p_4 = r_3 (r_2 (r_1 E_4 + gs_1 G_14 + U_14) + gs_2 G_24 + U_24) + gs_3 G_34 + U_34,

    as _fwd_block unfolds s_i. Tokens before bos get gs = 0 (and r = 1, u = 0 as loaded): λ passes them unchanged.
    Returns (λ̄ of token t − 4, ∂η so far)."""
    e1, e2, e3, e4, g12, g13, g14, g23, g24, g34 = _block_products(lam, a1, a2, a3, a4)
    if HAS_U:
        u12 = tl.sum(u1 * a2, axis=0)
        u13 = tl.sum(u1 * a3, axis=0)
        u14 = tl.sum(u1 * a4, axis=0)
        u23 = tl.sum(u2 * a3, axis=0)
        u24 = tl.sum(u2 * a4, axis=0)
        u34 = tl.sum(u3 * a4, axis=0)
    else:
        u12, u13, u14, u23, u24, u34 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    out = (dk, dbeta, dr, h, H, K, offs, eta_h)
    lam, deta_acc, gs1 = _bwd_block_token(lam, deta_acc, e1, k1, a1, r1, d1, u1, dk1, db1, s1, nu1, w1, c1, b1, t,
                                          t >= bos, *out, HAS_R, BETA_AWARE, NORMALIZE, HAS_U, FUSED)
    p2 = r1 * e2 + gs1 * g12 + u12
    lam, deta_acc, gs2 = _bwd_block_token(lam, deta_acc, p2, k2, a2, r2, d2, u2, dk2, db2, s2, nu2, w2, c2, b2, t - 1,
                                          t - 1 >= bos, *out, HAS_R, BETA_AWARE, NORMALIZE, HAS_U, FUSED)
    p3 = r2 * (r1 * e3 + gs1 * g13 + u13) + gs2 * g23 + u23
    lam, deta_acc, gs3 = _bwd_block_token(lam, deta_acc, p3, k3, a3, r3, d3, u3, dk3, db3, s3, nu3, w3, c3, b3, t - 2,
                                          t - 2 >= bos, *out, HAS_R, BETA_AWARE, NORMALIZE, HAS_U, FUSED)
    p4 = r3 * (r2 * (r1 * e4 + gs1 * g14 + u14) + gs2 * g24 + u24) + gs3 * g34 + u34
    lam, deta_acc, _gs4 = _bwd_block_token(lam, deta_acc, p4, k4, a4, r4, d4, u4, dk4, db4, s4, nu4, w4, c4, b4, t - 3,
                                           t - 3 >= bos, *out, HAS_R, BETA_AWARE, NORMALIZE, HAS_U, FUSED)
    return lam, deta_acc


@triton.jit
def phase1_bwd_seq_kernel(
    k, beta, r, eta, d_all, gd_all, gd_final, dkt_in, dk_in, dbeta_in, cu_seqlens,
    dk, dbeta, dr, dd0, deta,
    T, H, K, eps, d_min, d_max, guard,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, HAS_GD_ALL: tl.constexpr, HAS_GD_FINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr, BK: tl.constexpr, FUSED: tl.constexpr, HAS_GUARD: tl.constexpr,
    WIDE_INDEX: tl.constexpr,
):
    """Reverse scan of λ_t = ∂L/∂d_t, recomputing z_t from the stored d_t; per-token ∂k, ∂β, ∂r, and ∂η.
    Four tokens per loop iteration in four load slots, as in the forward: with a clip token by token (_bwd_step;
    token t − 4 is loaded right after token t's step), without one as a block (_bwd_block). HAS_GUARD: every program
    returns at once unless the int32 at `guard` is nonzero. WIDE_INDEX: as in the forward."""
    if HAS_GUARD:
        if tl.load(guard) == 0:
            return
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    if not WIDE_INDEX:  # every offset fits in int32 (phase1_launch.wide_index): 32-bit token indices
        bos, eos = bos.to(tl.int32), eos.to(tl.int32)
    offs = tl.arange(0, BK)
    mask = offs < K
    if HAS_GD_FINAL:
        lam = tl.load(gd_final + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        lam = tl.zeros([BK], dtype=tl.float32)
    eta_h = tl.load(eta + h).to(tl.float32)
    deta_acc = eta_h * 0.0
    src = (k, beta, r, d_all, gd_all, dkt_in, dk_in, dbeta_in)
    loc = (h, H, K, offs)
    step = (dk, dbeta, dr, h, H, K, offs, mask, eta_h, eps, d_min, d_max)
    x1 = _load_token_bwd(*src, eos - 1, eos - 1 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x2 = _load_token_bwd(*src, eos - 2, eos - 2 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x3 = _load_token_bwd(*src, eos - 3, eos - 3 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x4 = _load_token_bwd(*src, eos - 4, eos - 4 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    if HAS_MIN or HAS_MAX:  # the clip acts per coordinate: token by token
        for i in range(0, eos - bos, 4):
            t = eos - 1 - i
            lam, deta_acc = _bwd_step(lam, deta_acc, *x1, t, t >= bos, *step,
                                      HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, HAS_GD_ALL, FUSED)
            x1 = _load_token_bwd(*src, t - 4, t - 4 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            lam, deta_acc = _bwd_step(lam, deta_acc, *x2, t - 1, t - 1 >= bos, *step,
                                      HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, HAS_GD_ALL, FUSED)
            x2 = _load_token_bwd(*src, t - 5, t - 5 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            lam, deta_acc = _bwd_step(lam, deta_acc, *x3, t - 2, t - 2 >= bos, *step,
                                      HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, HAS_GD_ALL, FUSED)
            x3 = _load_token_bwd(*src, t - 6, t - 6 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            lam, deta_acc = _bwd_step(lam, deta_acc, *x4, t - 3, t - 3 >= bos, *step,
                                      HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, HAS_GD_ALL, FUSED)
            x4 = _load_token_bwd(*src, t - 7, t - 7 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    else:  # unclipped: four tokens per reduction (_bwd_block)
        for i in range(0, eos - bos, 4):
            t = eos - 1 - i
            y1 = _bwd_terms(*x1, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
            y2 = _bwd_terms(*x2, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
            y3 = _bwd_terms(*x3, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
            y4 = _bwd_terms(*x4, eta_h, eps, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
            x1 = _load_token_bwd(*src, t - 4, t - 4 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            x2 = _load_token_bwd(*src, t - 5, t - 5 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            x3 = _load_token_bwd(*src, t - 6, t - 6 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            x4 = _load_token_bwd(*src, t - 7, t - 7 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
            lam, deta_acc = _bwd_block(lam, deta_acc, *y1, *y2, *y3, *y4, t, bos, dk, dbeta, dr, h, H, K, offs, eta_h,
                                       HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL or FUSED, FUSED)
    tl.store(dd0 + (n * H + h) * K + offs, lam, mask=mask)
    tl.store(deta + n * H + h, deta_acc)


def _seq_warps(BK: int) -> int:
    """One warp per (sequence, head) up to K = 128: the two reductions per token stay within a warp
    (shuffles, no shared memory or barrier), which is what bounds a latency-bound token loop."""
    return 1 if BK <= 128 else 2


def phase1_fwd_seq(k, beta, r, d0, eta, *, d_min, d_max, beta_aware, normalize, cu_seqlens, store_kt=False,
                   out=None, only_if=None, store_d=True):
    """Sequential forward: (d_all [B, T, H, K] float32, or None without `store_d`, d_final [N, H, K] float32,
    k̃ = d ⊙ k in k's dtype or None without `store_kt`), written into `out` = (d_all, d_final, k̃) if given. With
    `only_if` (an int32 [1] on the device) the scan runs only if it is nonzero, decided on the device: no host
    synchronisation."""
    return launch_fwd(phase1_fwd_seq_kernel, k, beta, r, d0, eta, d_min=d_min, d_max=d_max, beta_aware=beta_aware,
                      normalize=normalize, cu_seqlens=cu_seqlens, store_kt=store_kt, out=out, store_d=store_d,
                      guard=eta if only_if is None else only_if, HAS_GUARD=only_if is not None, STORE_D=store_d,
                      WIDE_INDEX=wide_index(k), num_warps=_seq_warps(block_k(k.shape[3])))


def phase1_bwd_seq(k, beta, r, eta, d_all, gd_all, gd_final, *, d_min, d_max, beta_aware, normalize, cu_seqlens,
                   phase2_grads=None, out=None, only_if=None):
    """Sequential backward: phase1_launch.launch_bwd's results (the fused form with `phase2_grads`), written into
    `out` if given; with `only_if` (int32 [1] on the device) it runs only if that is nonzero, as phase1_fwd_seq."""
    return launch_bwd(phase1_bwd_seq_kernel, k, beta, r, eta, d_all, gd_all, gd_final, d_min=d_min, d_max=d_max,
                      beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens, phase2_grads=phase2_grads,
                      out=out, guard=eta if only_if is None else only_if, HAS_GUARD=only_if is not None,
                      WIDE_INDEX=wide_index(k), num_warps=_seq_warps(block_k(k.shape[3])))


def _grad_like(grad, x):
    return None if x is None or not x.requires_grad else grad.to(x.dtype)


class Phase1Function(torch.autograd.Function):
    """(k, β, r, d_0, η[H]) → (d_all, d_final) in the form `form`: "sequential", "parallel" (the exact
    chunk-parallel fixed point, phase1_parallel.py), "newton" (across chunks, phase1_newton.py; its backward is the
    sequential reverse scan, exact given the stored d) or "chunked" (the unclipped chunk form, phase1_chunk.py);
    `options` are the form's own (chunk_size, and for "chunked" solver and precision)."""

    @staticmethod
    def forward(ctx, k, beta, r, d0, eta, d_min, d_max, beta_aware, normalize, cu_seqlens, form, options):
        opts = dict(d_min=d_min, d_max=d_max, beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens)
        if form == "parallel":
            d_all, d_final, _ = phase1_fwd_parallel(k, beta, r, d0, eta, **opts, **options)
        elif form == "newton":
            from .phase1_newton import phase1_fwd_newton

            d_all, d_final, _, _ = phase1_fwd_newton(k, beta, r, d0, eta, **opts, **options)
        elif form == "chunked":
            from .phase1_chunk import phase1_fwd_chunk

            d_all, d_final = phase1_fwd_chunk(k, beta, r, d0, eta, **opts, **options)
        else:
            d_all, d_final, _ = phase1_fwd_seq(k, beta, r, d0, eta, **opts)
        ctx.save_for_backward(k, beta, r, d0, eta, d_all, cu_seqlens)
        ctx.opts, ctx.form, ctx.options = opts, form, options
        return d_all, d_final

    @staticmethod
    def backward(ctx, gd_all, gd_final):
        k, beta, r, d0, eta, d_all, cu_seqlens = ctx.saved_tensors
        opts = dict(ctx.opts, cu_seqlens=cu_seqlens)
        gd_all = None if gd_all is None else gd_all.contiguous()
        gd_final = None if gd_final is None else gd_final.contiguous()
        if ctx.form == "parallel":
            grads = phase1_bwd_parallel(k, beta, r, eta, d_all, gd_all, gd_final, **opts, **ctx.options)
        elif ctx.form == "chunked":
            from .phase1_chunk import phase1_bwd_chunk

            grads = phase1_bwd_chunk(k, beta, r, eta, d_all, gd_all, gd_final, **opts, **ctx.options)
        else:
            grads = phase1_bwd_seq(k, beta, r, eta, d_all, gd_all, gd_final, **opts)
        dk, dbeta, dr, dd0, deta = grads
        return (
            dk.to(k.dtype), dbeta.to(beta.dtype), _grad_like(dr, r), _grad_like(dd0, d0),
            _grad_like(deta.sum(0), eta), None, None, None, None, None, None, None,
        )


def preconditioner_scan(
    k: torch.Tensor,
    beta: torch.Tensor,
    *,
    eta,
    r: torch.Tensor | None = None,
    d0: torch.Tensor | None = None,
    d_min: float | None = None,
    d_max: float | None = None,
    beta_aware: bool = True,
    normalize: bool = True,
    cu_seqlens: torch.Tensor | None = None,
    chunked: bool = False,
    parallel: bool = False,
    newton: bool = False,
    chunk_size: int = 64,
    solver: str = "substitution",
    dot_precision: str = "ieee",
    newton_jacobian: str = "dense",
    chain_group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 1 in Triton: (d_all [B, T, H, K] float32, d_final [N, H, K] float32), differentiable.

    d_all[t] is the d_t used at token t (d_0 = 1 unless `d0` [N, H, K]); `eta` is a float or a tensor [H];
    with `cu_seqlens` (B = 1) d restarts from d0[n] at each sequence. The default is the sequential scan. `chunked=True` takes
    the unclipped chunk form (chunks of `chunk_size`, a power of two ≥ 16; `solver` "substitution", "doubling" or
    "blockwise" forms each chunk's (I + L)⁻¹, `dot_precision` is tl.dot's input_precision, `chain_group` G makes
    its chains walk groups of G chunks; chunk_osdn runs it with chunk.PHASE1_CHUNKED from a mean sequence length of
    4096, grouped by chunk.phase1_group), `parallel=True` the exact
    chunk-parallel fixed point, clip included (phase1_parallel.py), `newton=True` the forward across chunks by
    Newton's method, clip included (phase1_newton.py; chunks of `chunk_size`, `newton_jacobian` "dense" or
    "diagonal", its backward the sequential reverse scan). Otherwise the backward takes the forward's form.
    Inputs are assumed validated.
    """
    H = k.shape[2]
    if not isinstance(eta, torch.Tensor):
        eta = torch.full((H,), float(eta), dtype=torch.float32, device=k.device)
    if chunked + parallel + newton > 1:
        raise ValueError("chunked, parallel, newton: pick one form of phase 1")
    if chunked and (d_min is not None or d_max is not None):
        raise ValueError("the chunk-parallel phase 1 has no clip: use chunked=False with d_min/d_max")
    contig = lambda x: None if x is None else x.contiguous()  # noqa: E731
    form = "parallel" if parallel else "newton" if newton else "chunked" if chunked else "sequential"
    if chain_group is not None and not chunked:
        raise ValueError("chain_group: only the chunk form (chunked=True) walks its chains in groups")
    options = dict(chunk_size=chunk_size, solver=solver, precision=dot_precision, group=chain_group) if chunked else \
        dict(chunk_size=chunk_size, jacobian=newton_jacobian) if newton else \
        dict(chunk_size=chunk_size) if parallel else {}
    return Phase1Function.apply(
        k.contiguous(), beta.contiguous(), contig(r), contig(d0), eta.contiguous(), d_min, d_max,
        beta_aware, normalize, contig(cu_seqlens), form, options,
    )

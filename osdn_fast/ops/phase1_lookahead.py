"""Phase 1's sequential scan without the clip, its dependent reduction taken two tokens ahead (SPEC §2).

The scan of phase1.py waits, at every token, for the reduction s_t = ⟨d_t, a_t⟩ across the K channels (a_t = k_t²)
before it can update d. Without the clip, d_{t+1} = r_t d_t + w_t a_t is linear in d_t, so

    s_{t+1} = κ_{t+1} + w_t ⟨a_t, a_{t+1}⟩,     κ_{t+1} = r_t ⟨d_t, a_{t+1}⟩
    κ_{t+2} = r_{t+1} (r_t ⟨d_t, a_{t+2}⟩ + w_t ⟨a_t, a_{t+2}⟩)

with w_t = η b_t (1 − b_t s_t) / n_t. The reduction over d_t at token t serves token t + 2, and the Gram terms
⟨a_t, a_{t+j}⟩ do not depend on d at all: what each token waits for is two scalar multiply-adds. Each s_t is built
from a reduction over the actual d_{t−2} plus two correction terms, so rounding does not accumulate along the scan.

The reverse scan (module docstring of phase1.py, no clip: p_t = ⟨λ_{t+1}, a_t⟩) is the same in reverse:

    p_{t−1} = κ_{t−1} + ⟨g_t, a_{t−1}⟩ − c_t p_t ⟨a_t, a_{t−1}⟩,     κ_{t−1} = r_t ⟨λ_{t+1}, a_{t−1}⟩
    κ_{t−2} = r_{t−1} (⟨r_t λ_{t+1} + g_t, a_{t−2}⟩ − c_t p_t ⟨a_t, a_{t−2}⟩)

with g_t the direct ∂L/∂d_t and c_t = η b_t² / n_t. Both kernels keep eight tokens' inputs in flight (slots 1-8,
each reloaded eight tokens ahead right after its own step), since a step now takes a fraction of a load's latency.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .phase1 import _gains, _load_token, _load_token_bwd
from .phase1_launch import block_k, launch_bwd, launch_fwd, seq_bounds


@triton.jit
def _square(kt):
    kt = kt.to(tl.float32)
    return kt * kt


@triton.jit
def _fwd_step(d, s, kap, kA, bA, rA, kB, bB, rB, kC, bC, rC, t, ok, d_all, kt_out, h, H, K, offs, eta_h, eps,
              HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, STORE_KT: tl.constexpr,
              STORE_D: tl.constexpr):
    """Token t (slot A) with tokens t + 1, t + 2 (slots B, C): stores d_t (and k̃_t), returns (d_{t+1}, s_{t+1},
    κ_{t+2}). Tokens outside the sequence load k = 0, r = 1 (and b = 0 if BETA_AWARE): identity steps."""
    m = offs < tl.where(ok, K, 0)
    row = (t * H + h) * K + offs
    if STORE_D:
        tl.store(d_all + row, d, mask=m)
    kf = kA.to(tl.float32)
    if STORE_KT:
        tl.store(kt_out + row, d * kf, mask=m)
    if BETA_AWARE:
        bA = bA.to(tl.float32)
    if HAS_R:
        rA = rA.to(tl.float32)
        rB = rB.to(tl.float32)
    a = kf * kf
    a2 = _square(kC)
    x = tl.sum(d * a2, axis=0)  # ⟨d_t, a_{t+2}⟩: what token t + 2 will need of d_t
    w, _, _ = _gains(eta_h, bA, s, a, eps, NORMALIZE)
    s_next = kap + w * tl.sum(a * _square(kB), axis=0)
    kap_next = rB * (rA * x + w * tl.sum(a * a2, axis=0))
    return rA * d + w * a, s_next, kap_next


@triton.jit
def phase1_fwd_lookahead_kernel(
    k, beta, r, d0, eta, d_all, d_final, kt_out, cu_seqlens,
    T, H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, HAS_D0: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, IS_VARLEN: tl.constexpr, BK: tl.constexpr,
    STORE_KT: tl.constexpr, STORE_D: tl.constexpr,
):
    """d_{t+1} = r_t d_t + w_t a_t, one program per (sequence n, head h), eight tokens per loop iteration
    (the module docstring's recurrence; HAS_MIN and HAS_MAX must be False)."""
    tl.static_assert(not (HAS_MIN or HAS_MAX), "the lookahead scan has no clip")
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    offs = tl.arange(0, BK)
    mask = offs < K
    if HAS_D0:
        d = tl.load(d0 + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        d = tl.where(mask, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    src = (k, beta, r)
    loc = (h, H, K, offs)
    step = (d_all, kt_out, h, H, K, offs, eta_h, eps)
    x1 = _load_token(*src, bos, bos < eos, *loc, HAS_R, BETA_AWARE)
    x2 = _load_token(*src, bos + 1, bos + 1 < eos, *loc, HAS_R, BETA_AWARE)
    x3 = _load_token(*src, bos + 2, bos + 2 < eos, *loc, HAS_R, BETA_AWARE)
    x4 = _load_token(*src, bos + 3, bos + 3 < eos, *loc, HAS_R, BETA_AWARE)
    x5 = _load_token(*src, bos + 4, bos + 4 < eos, *loc, HAS_R, BETA_AWARE)
    x6 = _load_token(*src, bos + 5, bos + 5 < eos, *loc, HAS_R, BETA_AWARE)
    x7 = _load_token(*src, bos + 6, bos + 6 < eos, *loc, HAS_R, BETA_AWARE)
    x8 = _load_token(*src, bos + 7, bos + 7 < eos, *loc, HAS_R, BETA_AWARE)
    r1 = x1[2]
    if HAS_R:
        r1 = r1.to(tl.float32)
    s = tl.sum(d * _square(x1[0]), axis=0)
    kap = r1 * tl.sum(d * _square(x2[0]), axis=0)
    for t in range(bos, eos, 8):
        d, s, kap = _fwd_step(d, s, kap, *x1, *x2, *x3, t, t < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x1 = _load_token(*src, t + 8, t + 8 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x2, *x3, *x4, t + 1, t + 1 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x2 = _load_token(*src, t + 9, t + 9 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x3, *x4, *x5, t + 2, t + 2 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x3 = _load_token(*src, t + 10, t + 10 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x4, *x5, *x6, t + 3, t + 3 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x4 = _load_token(*src, t + 11, t + 11 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x5, *x6, *x7, t + 4, t + 4 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x5 = _load_token(*src, t + 12, t + 12 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x6, *x7, *x8, t + 5, t + 5 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x6 = _load_token(*src, t + 13, t + 13 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x7, *x8, *x1, t + 6, t + 6 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x7 = _load_token(*src, t + 14, t + 14 < eos, *loc, HAS_R, BETA_AWARE)
        d, s, kap = _fwd_step(d, s, kap, *x8, *x1, *x2, t + 7, t + 7 < eos, *step,
                               HAS_R, BETA_AWARE, NORMALIZE, STORE_KT, STORE_D)
        x8 = _load_token(*src, t + 15, t + 15 < eos, *loc, HAS_R, BETA_AWARE)
    tl.store(d_final + (n * H + h) * K + offs, d, mask=mask)


@triton.jit
def _bwd_step(lam, p, kap, deta_acc, kA, bA, rA, dA, gdA, dktA, dk2A, db2A, kB, rB, kC, t, ok, dk, dbeta, dr,
              h, H, K, offs, eta_h, eps, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
              HAS_GD_ALL: tl.constexpr, FUSED: tl.constexpr):
    """Token t (slot A: all it loads) with k_{t−1}, r_{t−1} and k_{t−2}: stores ∂k_t, ∂β_t, ∂r_t from λ_{t+1}
    (`lam`) and p_t, returns (λ_t, p_{t−1}, κ_{t−2}, ∂η so far). FUSED as phase1._bwd_step."""
    kf = kA.to(tl.float32)
    if BETA_AWARE:
        bA = bA.to(tl.float32)
    if HAS_R:
        rA = rA.to(tl.float32)
        rB = rB.to(tl.float32)
    if HAS_GD_ALL:
        gd = gdA.to(tl.float32)
    else:
        gd = tl.zeros([offs.shape[0]], dtype=tl.float32)
    if FUSED:
        dktA = dktA.to(tl.float32)
        gd += dktA * kf
        dk_t = dk2A.to(tl.float32) + dktA * dA
        db_t = db2A.to(tl.float32)
    else:
        dk_t = tl.zeros([offs.shape[0]], dtype=tl.float32)
        db_t = 0.0
    a = kf * kf
    a1 = _square(kB)
    a2 = _square(kC)
    s = tl.sum(dA * a, axis=0)
    w, c, nu = _gains(eta_h, bA, s, a, eps, NORMALIZE)
    cp = c * p
    y = rA * lam + gd
    p_next = kap + tl.sum(gd * a1, axis=0) - cp * tl.sum(a * a1, axis=0)
    kap_next = rB * (tl.sum(y * a2, axis=0) - cp * tl.sum(a * a2, axis=0))
    da = w * lam - cp * dA
    if NORMALIZE:
        da = da - w * p * nu
    row = (t * H + h) * K + offs
    tl.store(dk + row, dk_t + 2.0 * kf * da, mask=offs < tl.where(ok, K, 0))
    if BETA_AWARE:
        db_t += p * eta_h * (1.0 - 2.0 * bA * s) * nu
    if BETA_AWARE or FUSED:
        tl.store(dbeta + t * H + h, db_t, mask=ok)
    if HAS_R:
        tl.store(dr + t * H + h, tl.sum(lam * dA, axis=0), mask=ok)
    deta_acc += tl.where(ok, p * bA * (1.0 - bA * s) * nu, 0.0)
    return y - cp * a, p_next, kap_next, deta_acc


@triton.jit
def phase1_bwd_lookahead_kernel(
    k, beta, r, eta, d_all, gd_all, gd_final, dkt_in, dk_in, dbeta_in, cu_seqlens,
    dk, dbeta, dr, dd0, deta,
    T, H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, HAS_GD_ALL: tl.constexpr, HAS_GD_FINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr, BK: tl.constexpr, FUSED: tl.constexpr,
):
    """Reverse scan of λ_t = ∂L/∂d_t from the stored d_t, eight tokens per loop iteration, p_t two tokens ahead
    (module docstring); per-token ∂k, ∂β, ∂r and ∂η as phase1_bwd_seq_kernel. HAS_MIN, HAS_MAX must be False."""
    tl.static_assert(not (HAS_MIN or HAS_MAX), "the lookahead scan has no clip")
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
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
    step = (dk, dbeta, dr, h, H, K, offs, eta_h, eps)
    x1 = _load_token_bwd(*src, eos - 1, eos - 1 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x2 = _load_token_bwd(*src, eos - 2, eos - 2 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x3 = _load_token_bwd(*src, eos - 3, eos - 3 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x4 = _load_token_bwd(*src, eos - 4, eos - 4 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x5 = _load_token_bwd(*src, eos - 5, eos - 5 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x6 = _load_token_bwd(*src, eos - 6, eos - 6 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x7 = _load_token_bwd(*src, eos - 7, eos - 7 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    x8 = _load_token_bwd(*src, eos - 8, eos - 8 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    r1 = x1[2]
    if HAS_R:
        r1 = r1.to(tl.float32)
    p = tl.sum(lam * _square(x1[0]), axis=0)
    kap = r1 * tl.sum(lam * _square(x2[0]), axis=0)
    for i in range(0, eos - bos, 8):
        t = eos - 1 - i
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x1, x2[0], x2[2], x3[0], t, t >= bos, *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x1 = _load_token_bwd(*src, t - 8, t - 8 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x2, x3[0], x3[2], x4[0], t - 1, t - 1 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x2 = _load_token_bwd(*src, t - 9, t - 9 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x3, x4[0], x4[2], x5[0], t - 2, t - 2 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x3 = _load_token_bwd(*src, t - 10, t - 10 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x4, x5[0], x5[2], x6[0], t - 3, t - 3 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x4 = _load_token_bwd(*src, t - 11, t - 11 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x5, x6[0], x6[2], x7[0], t - 4, t - 4 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x5 = _load_token_bwd(*src, t - 12, t - 12 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x6, x7[0], x7[2], x8[0], t - 5, t - 5 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x6 = _load_token_bwd(*src, t - 13, t - 13 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x7, x8[0], x8[2], x1[0], t - 6, t - 6 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x7 = _load_token_bwd(*src, t - 14, t - 14 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
        lam, p, kap, deta_acc = _bwd_step(lam, p, kap, deta_acc, *x8, x1[0], x1[2], x2[0], t - 7, t - 7 >= bos,
                                          *step, HAS_R, BETA_AWARE, NORMALIZE, HAS_GD_ALL, FUSED)
        x8 = _load_token_bwd(*src, t - 15, t - 15 >= bos, *loc, HAS_R, BETA_AWARE, HAS_GD_ALL, FUSED)
    tl.store(dd0 + (n * H + h) * K + offs, lam, mask=mask)
    tl.store(deta + n * H + h, deta_acc)


def _warps(BK: int) -> int:
    """One warp per (sequence, head) up to K = 128, as the scan of phase1.py: every reduction stays in a warp."""
    return 1 if BK <= 128 else 2


def phase1_fwd_lookahead(k, beta, r, d0, eta, *, d_min, d_max, beta_aware, normalize, cu_seqlens, store_kt=False,
                         out=None, store_d=True):
    """phase1.phase1_fwd_seq's results without the clip (d_min and d_max must be None)."""
    if d_min is not None or d_max is not None:
        raise ValueError("d_min, d_max: the lookahead scan has no clip; use phase1_fwd_seq")
    return launch_fwd(phase1_fwd_lookahead_kernel, k, beta, r, d0, eta, d_min=None, d_max=None,
                      beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens, store_kt=store_kt, out=out,
                      store_d=store_d, STORE_D=store_d, num_warps=_warps(block_k(k.shape[3])))


def phase1_bwd_lookahead(k, beta, r, eta, d_all, gd_all, gd_final, *, d_min, d_max, beta_aware, normalize,
                         cu_seqlens, phase2_grads=None, out=None):
    """phase1.phase1_bwd_seq's results without the clip (d_min and d_max must be None)."""
    if d_min is not None or d_max is not None:
        raise ValueError("d_min, d_max: the lookahead scan has no clip; use phase1_bwd_seq")
    return launch_bwd(phase1_bwd_lookahead_kernel, k, beta, r, eta, d_all, gd_all, gd_final, d_min=None,
                      d_max=None, beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens,
                      phase2_grads=phase2_grads, out=out, num_warps=_warps(block_k(k.shape[3])))

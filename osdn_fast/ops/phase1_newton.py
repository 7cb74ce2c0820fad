"""Phase 1's forward across chunks, clip included, by Newton's method over the chunks (NOTES.md, next change 1;
the float64 study is benchmarks/phase1_newton.py).

Chunk c of a sequence maps the d entering it to the d leaving it, x_{c+1} = F_c(x_c): piecewise affine, with
Jacobian J_c = Π_t diag(keep_t)(r_t I − c_t a_t a_tᵀ) (keep_t: the coordinates the clip left alone, c_t = η b_t² / n_t).
One round:

1. chunk pass, every chunk of every sequence and head at once (`newton_chunk_kernel`): from its guess g_c, the
   token loop of the sequential scan (writing d_t and k̃_t), then F_c(g_c) and J_c;
2. chain pass, one program per (sequence, head) (`newton_chain_kernel`): g'_0 = d_0,
   g'_{c+1} = F_c(g_c) + J_c (g'_c − g_c), and the largest change |g' − g| relative to |g|.

Rounds repeat until no chunk start changes (to `tol`); the chunk pass of that last round ran from the fixed point,
so its d_t are the scan's. Each (sequence, head) stops on its own: once its chain moved no start (its `change` is at
most `tol`), both kernels of later rounds return at once for it, so rounds beyond the ones a sequence needs cost a
launch, not a pass. Round m makes chunk m's start exact, so a sequence of n chunks needs at most n + 1
rounds; the study needed 2–7 at 256 chunks. The fixed point g = F(g) does not depend on J's accuracy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from osdn_ref import EPS

from .index import chunk_layout, uniform_chunk_layout, uniform_cu_seqlens
from .phase1 import _bwd_step, _clipped_update, _load_token, _load_token_bwd, _store_and_update
from .phase1_launch import block_k


@triton.jit
def _chunk_span(cu_seqlens, chunk_indices, i_t, BT: tl.constexpr):
    """Tokens [t0, t1) of chunk i_t (flattened token axis; the last chunk of a sequence may be short)."""
    i_n = tl.load(chunk_indices + i_t * 2)
    i_c = tl.load(chunk_indices + i_t * 2 + 1)
    t0 = tl.load(cu_seqlens + i_n).to(tl.int64) + i_c * BT
    return t0, tl.minimum(t0 + BT, tl.load(cu_seqlens + i_n + 1).to(tl.int64))


@triton.jit
def _chunk_tiles(cu_seqlens, chunk_indices, i_t, h, H, K, BK: tl.constexpr, BT: tl.constexpr):
    """Chunk i_t's tokens [t0, t1), the key offsets and mask, and the offsets of its (chunk, head) state vector."""
    t0, t1 = _chunk_span(cu_seqlens, chunk_indices, i_t, BT)
    offs = tl.arange(0, BK)
    return t0, t1, offs, offs < K, (i_t * H + h) * K + offs


@triton.jit
def _converged(change, n, h, H, tol):
    """Whether the chain of (sequence n, head h) moved no chunk start in the last round (`change` starts at +inf)."""
    return tl.load(change + n * H + h) <= tol


@triton.jit
def newton_chunk_kernel(
    k, beta, r, eta, guess, d_all, kt_out, F, J, cu_seqlens, chunk_indices, change, tol,
    H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
    HAS_MAX: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, STORE_KT: tl.constexpr, DIAGONAL: tl.constexpr,
    STORE_D: tl.constexpr = True,
):
    """Chunk i_t, head h, from d = guess[i_t, h]: stores d_t (if STORE_D) and k̃_t (if STORE_KT) of its tokens,
    F = the d leaving it, and
    J [K, K] = ∂F/∂guess (row: coordinate of F, column: coordinate of the guess), or with DIAGONAL only
    J [K] = Π_t keep_t r_t, the Jacobian without its rank-one terms (O(K) per token instead of O(K²))."""
    i_t, h = tl.program_id(0), tl.program_id(1)
    if _converged(change, tl.load(chunk_indices + i_t * 2), h, H, tol):
        return
    t0, t1, offs, mask, state = _chunk_tiles(cu_seqlens, chunk_indices, i_t, h, H, K, BK, BT)
    d = tl.load(guess + state, mask=mask, other=0.0)
    both = tl.maximum(offs[:, None], offs[None, :]) < K  # the [K, K] block of the [BK, BK] tile
    if DIAGONAL:
        jac = tl.where(mask, 1.0, 0.0)
    else:
        jac = tl.where((offs[:, None] == offs[None, :]) & both, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    for t in range(t0, t1):
        kt, b, rt = _load_token(k, beta, r, t, t < t1, h, H, K, offs, HAS_R, BETA_AWARE)
        z, keep, c, a = _store_and_update(d, kt, b, rt, (t * H + h) * K + offs, mask, d_all, kt_out, eta_h, eps,
                                          d_min, d_max, mask, HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX,
                                          STORE_KT, STORE_D)
        if HAS_R:
            rt = rt.to(tl.float32)
        if DIAGONAL:
            jac = tl.where(keep, rt * jac, 0.0)
        else:
            at_j = tl.sum(a[:, None] * jac, axis=0)  # aᵀJ
            jac = tl.where(keep[:, None], rt * jac - c * a[:, None] * at_j[None, :], 0.0)
        d = z
    tl.store(F + state, d, mask=mask)
    if DIAGONAL:
        tl.store(J + state, jac, mask=mask)
    else:
        tl.store(J + (i_t * H + h) * K * K + offs[:, None] * K + offs[None, :], jac, mask=both)


@triton.jit
def newton_bwd_chunk_kernel(
    k, beta, r, eta, d_all, guess, dkt_in, dk_in, dbeta_in, F, J, dk, dbeta, dr, deta, cu_seqlens, chunk_indices,
    change, tol, H, K, eps, d_min, d_max,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_MIN: tl.constexpr,
    HAS_MAX: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
):
    """Chunk i_t, head h, the reverse scan (phase1's _bwd_step, fused with phase 2's gradients) from λ = guess[i_t, h]
    at the chunk's end: stores ∂k_t, ∂β_t, ∂r_t of its tokens, ∂η of the chunk, F = λ at its start and the diagonal
    J = Π_t keep_t r_t of ∂F/∂guess (the clip masks come from the stored d_t, so the map is linear)."""
    i_t, h = tl.program_id(0), tl.program_id(1)
    if _converged(change, tl.load(chunk_indices + i_t * 2), h, H, tol):
        return
    t0, t1, offs, mask, state = _chunk_tiles(cu_seqlens, chunk_indices, i_t, h, H, K, BK, BT)
    lam = tl.load(guess + state, mask=mask, other=0.0)
    jac = tl.where(mask, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    deta_acc = eta_h * 0.0
    src = (k, beta, r, d_all, d_all, dkt_in, dk_in, dbeta_in)
    for i in range(0, t1 - t0):
        t = t1 - 1 - i
        x = _load_token_bwd(*src, t, t >= t0, h, H, K, offs, HAS_R, BETA_AWARE, False, True)
        lam, deta_acc = _bwd_step(lam, deta_acc, *x, t, t >= t0, dk, dbeta, dr, h, H, K, offs, mask, eta_h, eps,
                                  d_min, d_max, HAS_R, BETA_AWARE, NORMALIZE, HAS_MIN, HAS_MAX, False, True)
        kt, b, rt, d = x[0].to(tl.float32), x[1], x[2], x[3]  # the step's clip mask, for J
        if BETA_AWARE:
            b = b.to(tl.float32)
        if HAS_R:
            rt = rt.to(tl.float32)
        _, keep, _ = _clipped_update(d, kt * kt, b, rt, eta_h, eps, d_min, d_max, mask, NORMALIZE, HAS_MIN, HAS_MAX)
        jac = tl.where(keep, rt * jac, 0.0)
    tl.store(F + state, lam, mask=mask)
    tl.store(J + state, jac, mask=mask)
    tl.store(deta + i_t * H + h, deta_acc)


@triton.jit
def newton_chain_kernel(guess, F, J, new_guess, change, tol, d0, d_final, chunk_offsets, H, K, BK: tl.constexpr,
                        DIAGONAL: tl.constexpr, REVERSE: tl.constexpr = False, HAS_D0: tl.constexpr = True):
    """Sequence n, head h: g'_0 = d_0, g'_{c+1} = F_c + J_c (g'_c − g_c) over its chunks (J_c a vector with
    DIAGONAL); stores g', the d leaving the sequence, and max |g' − g| / max |g| over its chunks. REVERSE walks the
    chunks last to first (the backward: g is then each chunk's λ at its end, `d0` the λ after the sequence, zero
    without HAS_D0, and `d_final` receives λ at its start). A chain that moved nothing last round returns at once."""
    n, h = tl.program_id(0), tl.program_id(1)
    if _converged(change, n, h, H, tol):
        return
    offs = tl.arange(0, BK)
    mask = offs < K
    if HAS_D0:
        x = tl.load(d0 + (n * H + h) * K + offs, mask=mask, other=0.0)
    else:
        x = tl.zeros([BK], dtype=tl.float32)
    moved = 0.0
    size = 0.0
    c_first, c_last = tl.load(chunk_offsets + n), tl.load(chunk_offsets + n + 1)
    for i in range(c_first, c_last):
        if REVERSE:
            c = c_first + c_last - 1 - i
        else:
            c = i
        state = (c * H + h) * K + offs
        g = tl.load(guess + state, mask=mask, other=0.0)
        tl.store(new_guess + state, x, mask=mask)
        moved = tl.maximum(moved, tl.max(tl.abs(x - g), axis=0))
        size = tl.maximum(size, tl.max(tl.abs(g), axis=0))
        if DIAGONAL:
            step = tl.load(J + state, mask=mask, other=0.0) * (x - g)
        else:
            jac = tl.load(J + (c * H + h) * K * K + offs[:, None] * K + offs[None, :],
                          mask=tl.maximum(offs[:, None], offs[None, :]) < K, other=0.0)
            step = tl.sum(jac * (x - g)[None, :], axis=1)
        x = tl.load(F + state, mask=mask, other=0.0) + step
    tl.store(d_final + (n * H + h) * K + offs, x, mask=mask)
    tl.store(change + n * H + h, moved / tl.maximum(size, 1e-30))


JACOBIANS = ("dense", "diagonal")


def _chunk_setup(k, cu_seqlens, chunk_size, fixed_rounds):
    """(N, cu_seqlens, chunk indices, chunk offsets, rounds to run): `fixed_rounds`, or one more than the most chunks
    of a sequence (round m makes chunk m's start exact), which for packed sequences costs a host synchronisation."""
    B, T = k.shape[:2]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if cu_seqlens is None:
        cu, (indices, offsets) = uniform_cu_seqlens(B, T, k.device), uniform_chunk_layout(B, T, chunk_size, k.device)
        most = -(-T // chunk_size)
    else:
        cu, (indices, offsets) = cu_seqlens, chunk_layout(cu_seqlens, chunk_size)
        most = int((offsets[1:] - offsets[:-1]).max()) if fixed_rounds is None else 0
    return N, cu, indices, offsets, fixed_rounds or most + 1


def phase1_fwd_newton(k, beta, r, d0, eta, *, d_min, d_max, beta_aware, normalize, cu_seqlens, store_kt=False,
                      chunk_size=64, tol=1e-6, jacobian="dense", fixed_rounds=None, store_d=True):
    """The forward of phase1.phase1_fwd_seq (same arguments and results, plus a fourth), across chunks by Newton's
    method ("dense": the chunk Jacobian; "diagonal": its diagonal part Π keep_t r_t only, a quasi-Newton method
    with the same fixed point, linear rather than quadratic convergence). Without `fixed_rounds`: rounds until no
    chunk start moves (to `tol`), one host synchronisation per round, and the fourth result is the number of rounds.
    With `fixed_rounds` = m: exactly m rounds and no synchronisation; the fourth result is then an int32 [1] on the
    device, 1 if the last round still moved a start (the results are then not the scan's: phase1_fwd_seq's
    `only_if` can redo them)."""
    if jacobian not in JACOBIANS:
        raise ValueError(f"jacobian must be one of {JACOBIANS}, got {jacobian!r}")
    diagonal = jacobian == "diagonal"
    B, T, H, K = k.shape
    N, cu, indices, offsets, rounds_cap = _chunk_setup(k, cu_seqlens, chunk_size, fixed_rounds)
    NT, BK = indices.shape[0], block_k(K)
    f32 = dict(dtype=torch.float32, device=k.device)
    start = d0.float().contiguous() if d0 is not None else torch.ones(N, H, K, **f32)
    guess = start[indices[:, 0].long()].contiguous()  # every chunk starts from its sequence's d_0
    new_guess, F = torch.empty_like(guess), torch.empty_like(guess)
    J = torch.empty(NT, H, K, **f32) if diagonal else torch.empty(NT, H, K, K, **f32)
    d_all = torch.empty(B, T, H, K, **f32) if store_d else None
    d_final = torch.empty(N, H, K, **f32)
    change = torch.full((N, H), float("inf"), **f32)  # no chain has converged before the first round
    kt = torch.empty_like(k) if store_kt else None
    flags = dict(HAS_R=r is not None, BETA_AWARE=beta_aware, NORMALIZE=normalize, HAS_MIN=d_min is not None,
                 HAS_MAX=d_max is not None, BK=BK)
    for rounds in range(1, rounds_cap + 1):
        newton_chunk_kernel[(NT, H)](
            k, beta, r if r is not None else beta, eta, guess, d_all if store_d else F, kt if store_kt else F, F, J,
            cu, indices,
            change, tol, H, K, EPS, 0.0 if d_min is None else float(d_min), 0.0 if d_max is None else float(d_max),
            BT=chunk_size, STORE_KT=store_kt, DIAGONAL=diagonal, STORE_D=store_d, **flags,
            num_warps=1 if diagonal else 4,
        )
        newton_chain_kernel[(N, H)](guess, F, J, new_guess, change, tol, start, d_final, offsets, H, K, BK=BK,
                                    DIAGONAL=diagonal, num_warps=1 if diagonal else 4)
        if fixed_rounds is None and change.max().item() <= tol:
            break
        guess, new_guess = new_guess, guess
    if fixed_rounds is not None:
        return d_all, d_final, kt, (change.max() > tol).to(torch.int32).reshape(1)
    return d_all, d_final, kt, rounds


def phase1_bwd_newton(k, beta, r, eta, d_all, gd_final, *, d_min, d_max, beta_aware, normalize, cu_seqlens,
                      phase2_grads, chunk_size=64, tol=1e-6, fixed_rounds=None):
    """The fused backward of phase1.phase1_bwd_seq (phase2_grads = (∂k̃, ∂k, ∂β) of phase 2) across chunks by the
    same quasi-Newton method in reverse chunk order, with the diagonal Jacobian: given the stored d, the adjoint
    recurrence is linear, so the rounds converge to the reverse scan's λ. Results (dk, dbeta in k's and β's dtypes,
    dr float32 or None, dd0, deta [chunks, H]) and, as phase1_fwd_newton, the rounds or the device flag."""
    B, T, H, K = k.shape
    N, cu, indices, offsets, rounds_cap = _chunk_setup(k, cu_seqlens, chunk_size, fixed_rounds)
    NT, BK = indices.shape[0], block_k(K)
    f32 = dict(dtype=torch.float32, device=k.device)
    guess = torch.zeros(NT, H, K, **f32)
    new_guess, F, J = torch.empty_like(guess), torch.empty_like(guess), torch.empty_like(guess)
    dk, dbeta = torch.empty_like(k), torch.empty_like(beta)
    dr = torch.empty(beta.shape, **f32) if r is not None else None
    dd0 = torch.empty(N, H, K, **f32)
    deta = torch.empty(NT, H, **f32)
    change = torch.full((N, H), float("inf"), **f32)
    flags = dict(HAS_R=r is not None, BETA_AWARE=beta_aware, NORMALIZE=normalize, HAS_MIN=d_min is not None,
                 HAS_MAX=d_max is not None, BK=BK)
    for rounds in range(1, rounds_cap + 1):
        newton_bwd_chunk_kernel[(NT, H)](
            k, beta, r if r is not None else beta, eta, d_all, guess, *phase2_grads, F, J, dk, dbeta,
            dr if dr is not None else deta, deta, cu, indices, change, tol, H, K, EPS, 0.0 if d_min is None else float(d_min),
            0.0 if d_max is None else float(d_max), BT=chunk_size, **flags, num_warps=1,
        )
        newton_chain_kernel[(N, H)](guess, F, J, new_guess, change, tol, gd_final if gd_final is not None else dd0, dd0,
                                    offsets, H, K, BK=BK, DIAGONAL=True, REVERSE=True, HAS_D0=gd_final is not None,
                                    num_warps=1)
        if fixed_rounds is None and change.max().item() <= tol:
            break
        guess, new_guess = new_guess, guess
    if fixed_rounds is not None:
        return dk, dbeta, dr, dd0, deta, (change.max() > tol).to(torch.int32).reshape(1)
    return dk, dbeta, dr, dd0, deta, rounds


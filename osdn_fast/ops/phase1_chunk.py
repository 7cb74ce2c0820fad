"""Chunk-parallel phase 1 without the clip: the d scan as a vector-state delta rule (SPEC §3).

Per token (a = k², ν = 1/n, b = β or 1):  d_{t+1} = r_t d_t + u_t a_t,  u_t = e_t − c_t ⟨d_t, a_t⟩,
with e_t = η b_t ν_t and c_t = η b_t² ν_t (no 1/b anywhere, so β = 0 is fine). In a chunk of C tokens
entering with x_0, with γ_i = Σ_{m<i} log r_m (exclusive) and γ̄_j = γ_j + log r_j:

    x_i = e^{γ_i} x_0 + Σ_{j<i} e^{γ_i − γ̄_j} u_j a_j
    (I + L) u = e − c ⊙ e^{γ} ⊙ (A x_0),   L_ij = c_i e^{γ_i − γ̄_j} ⟨a_i, a_j⟩  (j < i)

so u = u⁰ − Tq (A x_0) with u⁰ = (I + L)⁻¹ e and Tq = (I + L)⁻¹ diag(c e^{γ}). Three launches:
`prep` (every chunk in parallel: Gram, (I + L)⁻¹, u⁰, Tq), `state` (sequential over the chunks of
one (sequence, head), O(C·K) per chunk: u and the chunk-entry states), `out` (every chunk in parallel: d_t).
With `group` G the sequential launch is split in three: the chain's affine map x ↦ M x + m over every group of G
chunks, all in parallel (`group_map`, K×K), the walk over each sequence's groups (`group_walk`), then `state`
replaying each group's chunks from its entry: 2G + T/(C·G) dependent steps instead of T/C (`chain_group`).

Backward: the adjoint λ_t = ∂L/∂d_t obeys λ_t = r_t λ_{t+1} − c_t p_t a_t + ∂L/∂d_t (p_t = ⟨λ_{t+1}, a_t⟩), the
transposed recurrence, so p in a chunk solves (I + Lᵀ) p = e^{Γ − γ̄} ⊙ (A λ_end) + Σ_{j>i} e^{γ_j − γ̄_i} ⟨a_i, g_j⟩
with the same L. The same three launches run in reverse order of chunks; the local gradients of each token
(module docstring of `phase1`) need only d_t, p_t and λ_{t+1}, so they are computed in parallel.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from osdn_ref import EPS

from .phase1_launch import block_k, seq_bounds
from .solve import invert_chunk
from .tuning import TUNING

TUNED_TILES = (32, 128)  # (C, BK) of TUNING's phase1_* entries: chunk.PHASE1_CHUNKED's chunks at K = 128 (tuning_key)
CHAIN_REGISTERS = dict(maxnreg=128)  # the forward chain's launch with r replaying groups: 149 registers unbounded
SOLVERS = ("substitution", "doubling", "blockwise")  # how each chunk's (I + L)⁻¹ is formed: _unit_lower_inverse
# in the prep kernels, or (blockwise) L stored by the prep kernel and inverted there in place, solve.py's 16×16 tiles


@triton.jit
def _key_block(k, t, valid, h, H, K, k0, KB: tl.constexpr):
    """Key channels k0 … k0 + KB of a chunk's tokens t (rows where `valid`): their offsets, the [C, KB] mask and
    element offsets, and the keys in float32."""
    offs = k0 + tl.arange(0, KB)
    m2 = valid[:, None] & (offs[None, :] < K)
    ptr = (t[:, None] * H + h) * K + offs[None, :]
    return offs, m2, ptr, tl.load(k + ptr, mask=m2, other=0.0).to(tl.float32)


@triton.jit
def _log_retention(r):
    """log r_t, floored at −80 (r below e⁻⁸⁰ ≈ 2e−35 acts as 0) so that r = 0 gives no −∞ − (−∞) in decay ratios."""
    return tl.maximum(tl.log(r.to(tl.float32)), -80.0)


@triton.jit
def _chunk_load(k, beta, r, cs, eos, h, H, K, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr,
                C: tl.constexpr, BK: tl.constexpr):
    """Raw inputs of the chunk starting at token cs: k [C, BK] (input dtype), b and log r [C] (float32).
    Padding rows (t ≥ eos) get k = 0, b = 0 and log r = 0: identity steps."""
    t, valid, b, lr = _chunk_scalars(beta, r, cs, eos, h, H, HAS_R, BETA_AWARE, C)
    offs = tl.arange(0, BK)
    kt = tl.load(k + (t[:, None] * H + h) * K + offs[None, :], mask=valid[:, None] & (offs[None, :] < K), other=0.0)
    return t, valid, kt, b, lr


@triton.jit
def _chunk_scalars(beta, r, cs, eos, h, H, HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, C: tl.constexpr):
    """Tokens t of the chunk starting at cs, their validity (t < eos), b and log r [C] (identity on padding)."""
    t = cs + tl.arange(0, C)
    valid = t < eos
    if BETA_AWARE:
        b = tl.load(beta + t * H + h, mask=valid, other=0.0).to(tl.float32)
    else:
        b = tl.where(valid, 1.0, 0.0)
    if HAS_R:
        lr = _log_retention(tl.load(r + t * H + h, mask=valid, other=1.0))
    else:
        lr = tl.zeros([C], dtype=tl.float32)
    return t, valid, b, lr


@triton.jit
def _chunk_gains(kt, b, lr, valid, eta_h, eps, NORMALIZE: tl.constexpr):
    """a = k² [C, BK] (float32) and `_token_gains`: ν, c, e, γ, γ̄ [C]."""
    kt = kt.to(tl.float32)
    a = kt * kt
    nu, c, e, g, g_incl = _token_gains(tl.sum(a, axis=1), b, lr, valid, eta_h, eps, NORMALIZE)
    return a, nu, c, e, g, g_incl


@triton.jit
def _token_gains(a_sum, b, lr, valid, eta_h, eps, NORMALIZE: tl.constexpr):
    """From ‖k‖² = Σ a, b and log r [C]: ν, c = η b² ν, e = η b ν, γ (exclusive) and γ̄ (inclusive sums)."""
    if NORMALIZE:
        nu = 1.0 / (a_sum + eps)
    else:
        nu = tl.where(valid, 1.0, 0.0)
    e = eta_h * b * nu
    g_incl = tl.cumsum(lr, axis=0)
    return nu, e * b, e, g_incl - lr, g_incl


@triton.jit
def _chunk_of(ci, chunk_seq, chunk_start, T, C: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Sequence n and first token cs (flattened token axis) of chunk ci."""
    if IS_VARLEN:
        n = tl.load(chunk_seq + ci)
        cs = tl.load(chunk_start + ci).to(tl.int64)
    else:
        nt = tl.cdiv(T, C)
        n = ci // nt
        cs = n.to(tl.int64) * T + (ci % nt) * C
    return n, cs


@triton.jit
def _chunks_of(n, chunk_offsets, T, C: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The chunk indices [c_first, c_last) of sequence n."""
    if IS_VARLEN:
        c_first = tl.load(chunk_offsets + n)
        c_last = tl.load(chunk_offsets + n + 1)
    else:
        nt = tl.cdiv(T, C)
        c_first = n * nt
        c_last = c_first + nt
    return c_first, c_last


@triton.jit
def _unit_lower_inverse(L, C: tl.constexpr, LOG2_C: tl.constexpr, DOUBLING: tl.constexpr, PREC: tl.constexpr):
    """P = (I + L)⁻¹ for strictly lower L [C, C]. Substitution: row i of P is e_i − Σ_{j<i} L_ij P_j (C − 1
    dependent steps). Doubling: with N = −L nilpotent, P = (I + N)(I + N²)(I + N⁴)… (2 log₂C − 2 products)."""
    rows = tl.arange(0, C)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    if DOUBLING:
        n_pow = -L
        p = eye + n_pow
        for _ in range(1, LOG2_C):
            n_pow = tl.dot(n_pow, n_pow, input_precision=PREC)
            p = p + tl.dot(p, n_pow, input_precision=PREC)
    else:
        p = eye
        for i in range(1, C):
            sel = rows == i
            li = tl.sum(tl.where(sel[:, None], L, 0.0), axis=0)
            p = tl.where(sel[:, None], p - tl.sum(li[:, None] * p, axis=0)[None, :], p)
    return p


@triton.jit
def _decay_lower(gram, c, g, g_incl, C: tl.constexpr):
    """L_ij = c_i e^{γ_i − γ̄_j} ⟨a_i, a_j⟩ for j < i, else 0 (gram = A Aᵀ)."""
    rows = tl.arange(0, C)
    lower = rows[:, None] > rows[None, :]
    decay = tl.where(lower, tl.exp(tl.where(lower, g[:, None] - g_incl[None, :], 0.0)), 0.0)
    return c[:, None] * decay * gram


@triton.jit
def phase1_chunk_prep_kernel(
    k, beta, r, eta, chunk_seq, chunk_start, cu_seqlens, inv, tq, u0, wd, ed,
    T, H, K, eps,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, IS_VARLEN: tl.constexpr,
    C: tl.constexpr, BK: tl.constexpr, LOG2_C: tl.constexpr, DOUBLING: tl.constexpr, PREC: tl.constexpr,
    KB: tl.constexpr, HAS_INV: tl.constexpr, BLOCKWISE: tl.constexpr, P_ONLY: tl.constexpr,
):
    """Per chunk: L, P = (I + L)⁻¹, Tq = P diag(c e^γ), u⁰ = P e and, with r, the chain's decays: each token's
    e^{γ_C − γ̄} (wd [B, T, H]) and the chunk's e^{γ_C} (ed [NC, H]). HAS_INV: P is read from `inv` (rows by token,
    [ΣT, H, C]) instead of formed here. BLOCKWISE: L is stored there and inverted in place by solve.py's 16×16
    blockwise inverse, which reads L row by row (written and read back by this program, so mostly from cache), then
    P is read back; P_ONLY: stop once P is stored."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n, cs = _chunk_of(ci, chunk_seq, chunk_start, T, C, IS_VARLEN)
    _, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    eta_h = tl.load(eta + h).to(tl.float32)
    t, valid, b, lr = _chunk_scalars(beta, r, cs, eos, h, H, HAS_R, BETA_AWARE, C)
    gram = tl.zeros([C, C], dtype=tl.float32)
    a_sum = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, BK, KB):  # A Aᵀ over blocks of KB channels: small dot operands, no register spills
        offs, _mask, _ptr, kb = _key_block(k, t, valid, h, H, K, k0, KB)
        ab = kb * kb
        if not HAS_INV:
            gram += tl.dot(ab, tl.trans(ab), input_precision=PREC)
        a_sum += tl.sum(ab, axis=1)
    _, c, e, g, g_incl = _token_gains(a_sum, b, lr, valid, eta_h, eps, NORMALIZE)
    rows = tl.arange(0, C)
    by_token = (t[:, None] * H + h) * C + rows[None, :]
    if BLOCKWISE:
        tl.store(inv + by_token, _decay_lower(gram, c, g, g_incl, C), mask=valid[:, None])
        tl.debug_barrier()  # L visible to every thread of the program
        invert_chunk(inv, inv, cs, eos, h, H, C, IN_PLACE=True, SIDE_BY_SIDE=True)
        if P_ONLY:
            return
        tl.debug_barrier()  # P visible likewise
    if HAS_INV or BLOCKWISE:
        p = tl.load(inv + by_token, mask=valid[:, None], other=0.0)
    else:
        p = _unit_lower_inverse(_decay_lower(gram, c, g, g_incl, C), C, LOG2_C, DOUBLING, PREC)
    x = p * (c * tl.exp(g))[None, :]
    u = tl.sum(p * e[None, :], axis=1)
    tl.store(tq + ((ci * H + h) * C + rows[:, None]) * C + rows[None, :], x)
    tl.store(u0 + t * H + h, u, mask=valid)
    if HAS_R:
        g_end = tl.sum(tl.where(rows == C - 1, g_incl, 0.0), axis=0)
        tl.store(wd + t * H + h, tl.exp(g_end - g_incl), mask=valid)
        tl.store(ed + ci * H + h, tl.exp(g_end))


@triton.jit
def phase1_chunk_state_kernel(
    k, wd, ed, d0, chunk_offsets, cu_seqlens, tq, u0, u, x0, d_final, x_grp, group_seq, group_first,
    T, H, K, outside, d_min, d_max,
    HAS_R: tl.constexpr, HAS_D0: tl.constexpr, IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    G: tl.constexpr,
    HAS_MIN: tl.constexpr = False, HAS_MAX: tl.constexpr = False,
):
    """Sequential over the chunks of (sequence n, head h): u = u⁰ − Tq (A x), x ← e^{γ_C} x + Aᵀ(e^{γ_C − γ̄} u),
    with r the decays read from the prep kernel's `wd` and `ed`, so a step forms no gains and loads no r.
    G > 0: one program per group of G chunks instead, starting from its entry state x_grp (group_walk).
    HAS_MIN / HAS_MAX: set `outside` to 1 if the final d leaves [d_min, d_max] (the out kernel checks every d_t)."""
    h = tl.program_id(1)
    offs = tl.arange(0, BK)
    mask = offs < K
    rows = tl.arange(0, C)
    if G > 0:
        gi = tl.program_id(0)
        n, lo, hi = _group_of(gi, group_seq, group_first, chunk_offsets, T, C, G, IS_VARLEN)
        x = tl.load(x_grp + (gi * H + h) * K + offs, mask=mask, other=0.0)
    else:
        n = tl.program_id(0)
        lo, hi = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
        if HAS_D0:
            x = tl.load(d0 + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.where(mask, 1.0, 0.0)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    c_first, c_last = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
    bos += (lo - c_first) * C
    cc = rows[:, None] * C + rows[None, :]
    tn, vn, kn, _, _ = _chunk_load(k, k, k, bos, eos, h, H, K, False, False, C, BK)
    tqn = tl.load(tq + (lo * H + h) * C * C + cc)
    u0n = tl.load(u0 + tn * H + h, mask=vn, other=0.0)
    if HAS_R:
        wdn = tl.load(wd + tn * H + h, mask=vn, other=0.0)
        edn = tl.load(ed + lo * H + h)
    for ci in range(lo, hi):  # the next chunk's inputs are loaded one step ahead
        t, valid, kt, tq_c, u0_c = tn, vn, kn, tqn, u0n
        tn, vn, kn, _, _ = _chunk_load(k, k, k, bos + (ci + 1 - lo) * C, eos, h, H, K, False, False, C, BK)
        tqn = tl.load(tq + ((ci + 1) * H + h) * C * C + cc, mask=cc < tl.where(ci + 1 < hi, C * C, 0), other=0.0)
        u0n = tl.load(u0 + tn * H + h, mask=vn, other=0.0)
        if HAS_R:
            wd_c, ed_c = wdn, edn
            wdn = tl.load(wd + tn * H + h, mask=vn, other=0.0)
            edn = tl.load(ed + tl.minimum(ci + 1, hi - 1) * H + h)
        tl.store(x0 + (ci * H + h) * K + offs, x, mask=mask)
        a = kt.to(tl.float32)
        a = a * a
        uc = u0_c - tl.sum(tq_c * tl.sum(a * x[None, :], axis=1)[None, :], axis=1)
        tl.store(u + t * H + h, uc, mask=valid)
        if HAS_R:
            x = ed_c * x + tl.sum((wd_c * uc)[:, None] * a, axis=0)
        else:  # no retention: every decay is e⁰ = 1
            x = x + tl.sum(uc[:, None] * a, axis=0)
    if hi == c_last:
        tl.store(d_final + (n * H + h) * K + offs, x, mask=mask)
        if HAS_MIN or HAS_MAX:
            _flag_if_any(outside, _out_of_bounds(x, mask, tl.zeros([BK], dtype=tl.int32), d_min, d_max,
                                                 HAS_MIN, HAS_MAX))


@triton.jit
def _out_of_bounds(d, mask, marks, d_min, d_max, HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr):
    """`marks` with a 1 wherever d (under `mask`) is below d_min (HAS_MIN) or above d_max (HAS_MAX)."""
    if HAS_MIN:
        marks = tl.where(mask & (d < d_min), 1, marks)
    if HAS_MAX:
        marks = tl.where(mask & (d > d_max), 1, marks)
    return marks


@triton.jit
def _flag_if_any(flag, marks):
    """flag[0] = 1 if any of the int32 `marks` [n] is 1: one reduction, and an atomic only when there is something
    to set."""
    hit = tl.max(marks, axis=0)
    tl.atomic_max(flag, hit, mask=hit > 0)


@triton.jit
def _replay_weights(u, g, g_incl, C: tl.constexpr, HAS_R: tl.constexpr):
    """M_ij = e^{γ_i − γ̄_j} u_j for j < i, else 0: the chunk's d_i = e^{γ_i} x_0 + (M A)_i. Without r every decay
    is 1 and _replayed_d needs no M: u comes back as it is."""
    if HAS_R:  # one return: a compiled kernel rejects returns of different shapes, even under a constexpr branch
        rows = tl.arange(0, C)
        lower = rows[:, None] > rows[None, :]
        m = tl.where(lower, tl.exp(tl.where(lower, g[:, None] - g_incl[None, :], 0.0)), 0.0) * u[None, :]
    else:
        m = u
    return m


@triton.jit
def _replayed_d(x0, ci, h, H, K, offs, g, m, ab, PREC: tl.constexpr, HAS_R: tl.constexpr):
    """d of the chunk's tokens on key channels `offs` [C, KB]: e^{γ} x_0ᵀ + M A, from the chunk's entry state x_0
    (x0 [NC, H, K]), M (_replay_weights) and a = k² on those channels. Without r (m = u): x_0ᵀ + the exclusive
    running sum Σ_{j<i} u_j a_j down the chunk, O(C·KB) float32 adds instead of the O(C²·KB) product, which runs in
    TF32 on a GPU and bounded the kernels that form d (version 39)."""
    x = tl.load(x0 + (ci * H + h) * K + offs, mask=offs < K, other=0.0)
    if HAS_R:
        d = tl.exp(g)[:, None] * x[None, :] + tl.dot(m, ab, input_precision=PREC)
    else:
        ua = m[:, None] * ab
        d = x[None, :] + (tl.cumsum(ua, axis=0) - ua)
    return d


@triton.jit
def phase1_chunk_out_kernel(
    k, r, chunk_seq, chunk_start, cu_seqlens, u, x0, d_all, kt_out, outside, s_out, asum_out,
    T, H, K, d_min, d_max,
    HAS_R: tl.constexpr, IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
    KB: tl.constexpr, STORE_KT: tl.constexpr, HAS_MIN: tl.constexpr, HAS_MAX: tl.constexpr, STORE_D: tl.constexpr,
    STORE_STATS: tl.constexpr,
):
    """Per chunk: d_{cs+i} = e^{γ_i} x_0 + Σ_{j<i} e^{γ_i − γ̄_j} u_j a_j, in blocks of KB channels, stored if
    STORE_D. STORE_KT also writes k̃ = d ⊙ k (k's dtype); HAS_MIN / HAS_MAX set `outside` to 1 if any d_t leaves
    [d_min, d_max]; STORE_STATS writes each token's s_t = ⟨d_t, a_t⟩ and ‖k_t‖² to `s_out` and `asum_out`
    ([B·T, H] each), which the backward's output kernel would otherwise form again from k and d_all. The bounds are
    checked per element and reduced once per program, which writes `outside` only if a value left them: an idle
    clip costs no atomic (version 16 made two per key block, all on one address)."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n, cs = _chunk_of(ci, chunk_seq, chunk_start, T, C, IS_VARLEN)
    _, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    t, valid, _, lr = _chunk_scalars(r, r, cs, eos, h, H, HAS_R, False, C)
    g_incl = tl.cumsum(lr, axis=0)
    g = g_incl - lr
    m = _replay_weights(tl.load(u + t * H + h, mask=valid, other=0.0), g, g_incl, C, HAS_R)
    s = tl.zeros([C], dtype=tl.float32)
    a_sum = tl.zeros([C], dtype=tl.float32)
    out_of_bounds = tl.zeros([C, KB], dtype=tl.int32)
    for k0 in range(0, BK, KB):
        offs, m2, ptr, kb = _key_block(k, t, valid, h, H, K, k0, KB)
        ab = kb * kb
        d = _replayed_d(x0, ci, h, H, K, offs, g, m, ab, PREC, HAS_R)
        if STORE_STATS:
            s += tl.sum(d * ab, axis=1)
            a_sum += tl.sum(ab, axis=1)
        if STORE_D:
            tl.store(d_all + ptr, d, mask=m2)
        if STORE_KT:
            tl.store(kt_out + ptr, (d * kb).to(kt_out.dtype.element_ty), mask=m2)
        out_of_bounds = _out_of_bounds(d, m2, out_of_bounds, d_min, d_max, HAS_MIN, HAS_MAX)
    if HAS_MIN or HAS_MAX:
        _flag_if_any(outside, tl.max(out_of_bounds, axis=1))
    if STORE_STATS:
        tl.store(s_out + t * H + h, s, mask=valid)
        tl.store(asum_out + t * H + h, a_sum, mask=valid)


@triton.jit
def phase1_chunk_bwd_prep_kernel(
    k, beta, r, eta, gd_all, chunk_seq, chunk_start, cu_seqlens, inv_in, tp, pg, hg, cg, ge,
    T, H, K, eps,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, IS_VARLEN: tl.constexpr,
    C: tl.constexpr, BK: tl.constexpr, LOG2_C: tl.constexpr, DOUBLING: tl.constexpr, PREC: tl.constexpr,
    KB: tl.constexpr, HAS_INV: tl.constexpr, FUSED: tl.constexpr,
):
    """Per chunk: with P = (I + L)⁻¹, Tp = Pᵀ diag(e^{Γ − γ̄}), pᵍ = Pᵀ (Σ_{j>i} e^{γ_j − γ̄_i} ⟨a_i, g_j⟩)_i and
    hᵍ = Σ_j e^{γ_j} g_j, each token's c e^{γ} for the chain's update (cg) and, with r, the chunk's decay e^{Γ}
    (ge [NC, H]). HAS_INV: P is read from `inv_in` (rows by token), transposed by the load. FUSED: `gd_all` holds
    phase 2's ∂k̃, and the direct gradient of d is g = ∂k̃ ⊙ k, formed here."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n, cs = _chunk_of(ci, chunk_seq, chunk_start, T, C, IS_VARLEN)
    _, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    eta_h = tl.load(eta + h).to(tl.float32)
    t, valid, b, lr = _chunk_scalars(beta, r, cs, eos, h, H, HAS_R, BETA_AWARE, C)
    g_incl = tl.cumsum(lr, axis=0)
    g = g_incl - lr
    gram = tl.zeros([C, C], dtype=tl.float32)
    a_gd = tl.zeros([C, C], dtype=tl.float32)
    a_sum = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, BK, KB):  # A Aᵀ, A Gᵀ and hᵍ over blocks of KB channels
        offs, m2, ptr, kb = _key_block(k, t, valid, h, H, K, k0, KB)
        gb = tl.load(gd_all + ptr, mask=m2, other=0.0).to(tl.float32)
        if FUSED:
            gb = gb * kb
        ab = kb * kb
        if not HAS_INV:
            gram += tl.dot(ab, tl.trans(ab), input_precision=PREC)
        a_gd += tl.dot(ab, tl.trans(gb), input_precision=PREC)
        a_sum += tl.sum(ab, axis=1)
        tl.store(hg + (ci * H + h) * K + offs, tl.sum(tl.exp(g)[:, None] * gb, axis=0), mask=offs < K)
    _, c, e, g, g_incl = _token_gains(a_sum, b, lr, valid, eta_h, eps, NORMALIZE)
    rows = tl.arange(0, C)
    upper = rows[:, None] < rows[None, :]
    q = tl.where(upper, tl.exp(tl.where(upper, g[None, :] - g_incl[:, None], 0.0)), 0.0)
    rg = tl.sum(q * a_gd, axis=1)
    g_end = tl.sum(tl.where(rows == C - 1, g_incl, 0.0), axis=0)
    if HAS_INV:  # inv_t[j, i] = P_ij
        inv_t = tl.load(inv_in + (t[None, :] * H + h) * C + rows[:, None], mask=valid[None, :], other=0.0)
    else:
        inv_t = tl.trans(_unit_lower_inverse(_decay_lower(gram, c, g, g_incl, C), C, LOG2_C, DOUBLING, PREC))
    x = inv_t * tl.exp(g_end - g_incl)[None, :]
    rg = tl.sum(inv_t * rg[None, :], axis=1)
    tl.store(tp + ((ci * H + h) * C + rows[:, None]) * C + rows[None, :], x)
    tl.store(pg + t * H + h, rg, mask=valid)
    tl.store(cg + t * H + h, c * tl.exp(g), mask=valid)
    if HAS_R:
        tl.store(ge + ci * H + h, tl.exp(g_end))


@triton.jit
def phase1_chunk_bwd_state_kernel(
    k, ge, gd_final, chunk_offsets, cu_seqlens, tp, pg, hg, cg, p, lam_end, dd0, x_grp, group_seq, group_first,
    T, H, K,
    HAS_R: tl.constexpr, HAS_GD_FINAL: tl.constexpr, IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    G: tl.constexpr,
):
    """Reverse over the chunks of (n, h): p = pᵍ + Tp (A λ), λ ← e^{Γ} λ + hᵍ − Aᵀ(e^{γ} c ⊙ p) with each token's
    e^{γ} c read from `cg` and, with r, the chunk's e^{Γ} from `ge` (the prep kernel's), so a step forms no gains
    and loads no r; dd_0 = λ.
    G > 0: one program per group of G chunks instead, starting from the λ leaving it, x_grp (group_walk)."""
    h = tl.program_id(1)
    offs = tl.arange(0, BK)
    mask = offs < K
    rows = tl.arange(0, C)
    if G > 0:
        gi = tl.program_id(0)
        n, lo, hi = _group_of(gi, group_seq, group_first, chunk_offsets, T, C, G, IS_VARLEN)
        lam = tl.load(x_grp + (gi * H + h) * K + offs, mask=mask, other=0.0)
    else:
        n = tl.program_id(0)
        lo, hi = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
        if HAS_GD_FINAL:
            lam = tl.load(gd_final + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            lam = tl.zeros([BK], dtype=tl.float32)
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    c_first, c_last = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
    cc = rows[:, None] * C + rows[None, :]
    cl = hi - 1
    tn, vn, kn, _, _ = _chunk_load(k, k, k, bos + (cl - c_first) * C, eos, h, H, K, False, False, C, BK)
    if HAS_R:
        gen = tl.load(ge + cl * H + h)
    tpn = tl.load(tp + (cl * H + h) * C * C + cc)
    pgn = tl.load(pg + tn * H + h, mask=vn, other=0.0)
    cgn = tl.load(cg + tn * H + h, mask=vn, other=0.0)
    hgn = tl.load(hg + (cl * H + h) * K + offs, mask=mask, other=0.0)
    for j in range(0, hi - lo):  # chunks in reverse; the previous chunk's inputs are loaded one step ahead
        ci = cl - j
        t, valid, kt, tp_c, pg_c, cg_c, hg_c = tn, vn, kn, tpn, pgn, cgn, hgn
        more = ci > lo
        tn, vn, kn, _, _ = _chunk_load(k, k, k, tl.where(more, bos + (ci - 1 - c_first) * C, eos), eos, h, H, K,
                                       False, False, C, BK)
        if HAS_R:
            ge_c = gen
            gen = tl.load(ge + tl.maximum(ci - 1, lo) * H + h)
        tpn = tl.load(tp + ((ci - 1) * H + h) * C * C + cc, mask=cc < tl.where(more, C * C, 0), other=0.0)
        pgn = tl.load(pg + tn * H + h, mask=vn, other=0.0)
        cgn = tl.load(cg + tn * H + h, mask=vn, other=0.0)
        hgn = tl.load(hg + ((ci - 1) * H + h) * K + offs, mask=offs < tl.where(more, K, 0), other=0.0)
        tl.store(lam_end + (ci * H + h) * K + offs, lam, mask=mask)
        a = kt.to(tl.float32)
        a = a * a
        pc = pg_c + tl.sum(tp_c * tl.sum(a * lam[None, :], axis=1)[None, :], axis=1)
        tl.store(p + t * H + h, pc, mask=valid)
        if HAS_R:
            lam = ge_c * lam + hg_c - tl.sum((cg_c * pc)[:, None] * a, axis=0)
        else:  # no retention: every decay is e⁰ = 1
            lam = lam + hg_c - tl.sum((cg_c * pc)[:, None] * a, axis=0)
    if lo == c_first:
        tl.store(dd0 + (n * H + h) * K + offs, lam, mask=mask)


@triton.jit
def _group_of(gi, group_seq, group_first, chunk_offsets, T, C: tl.constexpr, G: tl.constexpr,
              IS_VARLEN: tl.constexpr):
    """Sequence n and chunks [lo, hi) of group gi: G consecutive chunks of one sequence (its last may hold fewer)."""
    if IS_VARLEN:
        n = tl.load(group_seq + gi)
        lo = tl.load(group_first + gi)
    else:
        nt = tl.cdiv(T, C)
        per = tl.cdiv(nt, G)
        n = gi // per
        lo = n * nt + (gi % per) * G
    _, c_last = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
    return n, lo, tl.minimum(lo + G, c_last)


@triton.jit
def phase1_chunk_group_map_kernel(
    k, beta, r, eta, chunk_offsets, cu_seqlens, group_seq, group_first, tmat, y0, bias, maps, shifts,
    T, H, K, eps,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, IS_VARLEN: tl.constexpr,
    C: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, PREC: tl.constexpr, REVERSE: tl.constexpr,
    BN: tl.constexpr, VEC: tl.constexpr,
):
    """The chain's affine map over group gi, x ↦ M x + m [BK, BK], [BK]: each chunk maps
    x ↦ e^{γ_C} x + bias_c + Aᵀ(ω ⊙ (y⁰ + σ T (A x))), the state kernels' step, composed in the chain's order.
    Forward (x = d entering): T = Tq, y⁰ = u⁰, ω = e^{γ_C − γ̄}, σ = −1, no bias. REVERSE (x = λ leaving, chunks
    in reverse): T = Tp, y⁰ = pᵍ, ω = −c e^{γ}, σ = +1, bias = hᵍ. Per chunk M ← e^{γ_C} M + Aᵀ(σω ⊙ T (A M)):
    three dots (PREC) for a block of BN columns of M (program axis 2; a column of M evolves on its own). VEC: a
    launch of its own forms m (the same step plus the chunk's constant part, no dots), which in the same programs
    as M's columns made them spill (ptxas, sm_90)."""
    gi = tl.program_id(0)
    h = tl.program_id(1)
    n, lo, hi = _group_of(gi, group_seq, group_first, chunk_offsets, T, C, G, IS_VARLEN)
    c_first, c_last = _chunks_of(n, chunk_offsets, T, C, IS_VARLEN)
    if (lo == c_first) if REVERSE else (hi == c_last):  # the chain's last group: the walk needs no map of it
        return
    bos, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    eta_h = tl.load(eta + h).to(tl.float32)
    offs = tl.arange(0, BK)
    rows = tl.arange(0, C)
    cc = rows[:, None] * C + rows[None, :]
    cols = tl.program_id(2) * BN + tl.arange(0, BN)
    if VEC:
        m_vec = tl.zeros([BK], dtype=tl.float32)
    else:
        m_mat = tl.where(offs[:, None] == cols[None, :], 1.0, 0.0)
    for j in range(0, hi - lo):
        ci = hi - 1 - j if REVERSE else lo + j
        t, valid, kt, b, lr = _chunk_load(k, beta, r, bos + (ci - c_first) * C, eos, h, H, K, HAS_R, BETA_AWARE,
                                          C, BK)
        a, _, c, _, g, g_incl = _chunk_gains(kt, b, lr, valid, eta_h, eps, NORMALIZE)
        g_end = tl.sum(tl.where(rows == C - 1, g_incl, 0.0), axis=0)
        rho = tl.exp(g_end)
        t_c = tl.load(tmat + (ci * H + h) * C * C + cc)
        w = -c * tl.exp(g) if REVERSE else -tl.exp(g_end - g_incl)
        if VEC:
            ty_vec = tl.sum(t_c * tl.sum(a * m_vec[None, :], axis=1)[None, :], axis=1)
            y0_c = tl.load(y0 + t * H + h, mask=valid, other=0.0)
            if REVERSE:
                y_vec = y0_c + ty_vec
                shift = tl.load(bias + (ci * H + h) * K + offs, mask=offs < K, other=0.0)
            else:
                y_vec = ty_vec - y0_c  # σω (y⁰ + σ T A m) with σ = −1, ω = −w
                shift = tl.zeros([BK], dtype=tl.float32)
            m_vec = rho * m_vec + shift + tl.sum((w * y_vec)[:, None] * a, axis=0)
        else:
            ty = tl.dot(t_c, tl.dot(a, m_mat, input_precision=PREC), input_precision=PREC)
            m_mat = rho * m_mat + tl.dot(tl.trans(a), w[:, None] * ty, input_precision=PREC)
    if VEC:
        tl.store(shifts + (gi * H + h) * BK + offs, m_vec)
    else:
        tl.store(maps + ((gi * H + h) * BK + offs[:, None]) * BK + cols[None, :], m_mat)


@triton.jit
def phase1_chunk_group_walk_kernel(
    x_init, maps, shifts, x_grp, x_final, group_offsets, T, H, K,
    HAS_INIT: tl.constexpr, IS_VARLEN: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
    REVERSE: tl.constexpr, ONES: tl.constexpr,
):
    """Sequential over the groups of (sequence n, head h), in the chain's order: x_grp[g] = x, then x ← M_g x + m_g
    (but after the last group, whose map group_map skips).
    x starts at x_init (d_0 or ∂L/∂d_final), else at 1 (ONES: the forward's d_0 = 1) or 0. The replay of each
    group's chunks (the state kernels with G > 0) writes the final x; here only a sequence without chunks does."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    if IS_VARLEN:
        g_first = tl.load(group_offsets + n)
        g_last = tl.load(group_offsets + n + 1)
    else:
        per = tl.cdiv(tl.cdiv(T, C), G)
        g_first = n * per
        g_last = g_first + per
    offs = tl.arange(0, BK)
    mask = offs < K
    if HAS_INIT:
        x = tl.load(x_init + (n * H + h) * K + offs, mask=mask, other=0.0).to(tl.float32)
    elif ONES:
        x = tl.where(mask, 1.0, 0.0)
    else:
        x = tl.zeros([BK], dtype=tl.float32)
    for j in range(0, g_last - g_first - 1):
        gi = g_last - 1 - j if REVERSE else g_first + j
        tl.store(x_grp + (gi * H + h) * K + offs, x, mask=mask)
        m_mat = tl.load(maps + ((gi * H + h) * BK + offs[:, None]) * BK + offs[None, :])
        x = tl.sum(m_mat * x[None, :], axis=1) + tl.load(shifts + (gi * H + h) * BK + offs)
    if g_last > g_first:  # the chain's last group: its entry only
        tl.store(x_grp + ((g_first if REVERSE else g_last - 1) * H + h) * K + offs, x, mask=mask)
    else:  # a sequence without chunks
        tl.store(x_final + (n * H + h) * K + offs, x, mask=mask)


@triton.jit
def _chunk_d(d_all, x0, ci, h, H, K, offs, m2, ptr, g, m, ab, PREC: tl.constexpr, REPLAY: tl.constexpr,
             HAS_R: tl.constexpr):
    """The forward's d on one key block of the chunk: formed again (REPLAY, _replayed_d) or read from d_all."""
    if REPLAY:
        return _replayed_d(x0, ci, h, H, K, offs, g, m, ab, PREC, HAS_R)
    return tl.load(d_all + ptr, mask=m2, other=0.0)


@triton.jit
def phase1_chunk_bwd_out_kernel(
    k, beta, r, eta, d_all, x0, u_fwd, gd_all, chunk_seq, chunk_start, cu_seqlens, p, lam_end, s_in, asum_in,
    dk, dbeta, dr, deta, dk_in, dbeta_in,
    T, H, K, eps,
    HAS_R: tl.constexpr, BETA_AWARE: tl.constexpr, NORMALIZE: tl.constexpr, IS_VARLEN: tl.constexpr,
    C: tl.constexpr, BK: tl.constexpr, LOG2_C: tl.constexpr, DOUBLING: tl.constexpr, PREC: tl.constexpr,
    KB: tl.constexpr, FUSED: tl.constexpr, HAS_STATS: tl.constexpr, REPLAY: tl.constexpr,
):
    """Per chunk: λ_{t+1} = e^{Γ − γ̄_i} λ_end + Σ_{j>i} e^{γ_j − γ̄_i} (g_j − c_j p_j a_j), then the local
    gradients of token t (module docstring of phase1). Two passes over blocks of KB channels: s_t and ‖k_t‖²
    (HAS_STATS: read from the forward's, `s_in` and `asum_in`), then λ_{t+1} and ∂k_t; without r λ is a reverse
    running sum, with r two [C, C] × [C, KB] products (version 40 measured a scan there: slower). FUSED (`gd_all` = phase 2's ∂k̃, as in the prep kernel): ∂k_t also gains ∂k̃_t ⊙ d_t and
    phase 2's ∂k_t (`dk_in`), ∂β_t phase 2's (`dbeta_in`), and both are written once in the outputs' dtypes.
    REPLAY: d_t is formed again from the forward chain's entry states x0 and its u (`u_fwd`), as the forward's out
    kernel forms it (_replayed_d), instead of read from d_all."""
    ci = tl.program_id(0)
    h = tl.program_id(1)
    n, cs = _chunk_of(ci, chunk_seq, chunk_start, T, C, IS_VARLEN)
    _, eos = seq_bounds(cu_seqlens, n, T, IS_VARLEN)
    eta_h = tl.load(eta + h).to(tl.float32)
    t, valid, b, lr = _chunk_scalars(beta, r, cs, eos, h, H, HAS_R, BETA_AWARE, C)
    g_fwd = tl.cumsum(lr, axis=0)  # γ̄, then γ: the decays of the forward's d (REPLAY), formed as its out kernel does
    if REPLAY:
        m_fwd = _replay_weights(tl.load(u_fwd + t * H + h, mask=valid, other=0.0), g_fwd - lr, g_fwd, C, HAS_R)
    else:
        m_fwd = tl.zeros([C, C], dtype=tl.float32)
    g_fwd -= lr
    if HAS_STATS:
        s = tl.load(s_in + t * H + h, mask=valid, other=0.0)
        a_sum = tl.load(asum_in + t * H + h, mask=valid, other=0.0)
    else:
        s = tl.zeros([C], dtype=tl.float32)
        a_sum = tl.zeros([C], dtype=tl.float32)
        for k0 in range(0, BK, KB):
            offs, m2, ptr, kb = _key_block(k, t, valid, h, H, K, k0, KB)
            ab = kb * kb
            d = _chunk_d(d_all, x0, ci, h, H, K, offs, m2, ptr, g_fwd, m_fwd, ab, PREC, REPLAY, HAS_R)
            s += tl.sum(d * ab, axis=1)
            a_sum += tl.sum(ab, axis=1)
    nu, c, e, g, g_incl = _token_gains(a_sum, b, lr, valid, eta_h, eps, NORMALIZE)
    w = e * (1.0 - b * s)
    pc = tl.load(p + t * H + h, mask=valid, other=0.0)
    rows = tl.arange(0, C)
    upper = rows[:, None] < rows[None, :]
    if HAS_R:
        q = tl.where(upper, tl.exp(tl.where(upper, g[None, :] - g_incl[:, None], 0.0)), 0.0)
    else:
        q = tl.zeros([C, C], dtype=tl.float32)
    g_end = tl.sum(tl.where(rows == C - 1, g_incl, 0.0), axis=0)
    dr_acc = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, BK, KB):
        offs, m2, ptr, kb = _key_block(k, t, valid, h, H, K, k0, KB)
        ab = kb * kb
        gb = tl.load(gd_all + ptr, mask=m2, other=0.0).to(tl.float32)
        d = _chunk_d(d_all, x0, ci, h, H, K, offs, m2, ptr, g_fwd, m_fwd, ab, PREC, REPLAY, HAS_R)
        if FUSED:
            dkt = gb
            gb = gb * kb
        lam = tl.load(lam_end + (ci * H + h) * K + offs, mask=offs < K, other=0.0)
        if HAS_R:
            mu = tl.exp(g_end - g_incl)[:, None] * lam[None, :] + tl.dot(q, gb, input_precision=PREC) \
                - tl.dot(q * (c * pc)[None, :], ab, input_precision=PREC)
        else:  # every decay 1: λ_end + the reverse exclusive sum Σ_{j>i} x_j = Σ_j x_j − Σ_{j≤i} x_j (version 41)
            x = gb - (c * pc)[:, None] * ab
            mu = lam[None, :] + (tl.sum(x, axis=0)[None, :] - tl.cumsum(x, axis=0))
        da = w[:, None] * mu - (c * pc)[:, None] * d
        if NORMALIZE:
            da = da - (w * pc * nu)[:, None]
        dk_t = 2.0 * kb * da
        if FUSED:
            dk_t += dkt * d + tl.load(dk_in + ptr, mask=m2, other=0.0)
        tl.store(dk + ptr, dk_t.to(dk.dtype.element_ty), mask=m2)
        dr_acc += tl.sum(mu * d, axis=1)
    if BETA_AWARE:
        db = pc * eta_h * (1.0 - 2.0 * b * s) * nu
    else:
        db = tl.zeros([C], dtype=tl.float32)
    if FUSED:
        db += tl.load(dbeta_in + t * H + h, mask=valid, other=0.0)
    if BETA_AWARE or FUSED:
        tl.store(dbeta + t * H + h, db.to(dbeta.dtype.element_ty), mask=valid)
    if HAS_R:
        tl.store(dr + t * H + h, dr_acc, mask=valid)
    tl.store(deta + t * H + h, pc * b * (1.0 - b * s) * nu, mask=valid)


def chunk_table(B: int, T: int, cu_seqlens: torch.Tensor | None, C: int, device):
    """(NC, chunk_seq, chunk_start, chunk_offsets): the number of chunks, and for packed sequences the sequence and
    first token of every chunk and where each sequence's chunks begin (None without cu_seqlens: the kernels
    compute them from the chunk index). Tokens are indexed in the flattened [B*T] axis."""
    if cu_seqlens is None:
        return B * triton.cdiv(T, C), None, None, None
    bounds = cu_seqlens.tolist()
    counts = [triton.cdiv(e - s, C) for s, e in zip(bounds[:-1], bounds[1:])]
    seq = [n for n, m in enumerate(counts) for _ in range(m)]
    start = [s + i * C for s, m in zip(bounds, counts) for i in range(m)]
    offsets = [0]
    for m in counts:
        offsets.append(offsets[-1] + m)
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return len(seq), as_tensor(seq), as_tensor(start), as_tensor(offsets)


def group_table(B: int, T: int, cu_seqlens: torch.Tensor | None, C: int, G: int, device):
    """(NG, group_seq, group_first, group_offsets): the number of groups of G consecutive chunks of one sequence (a
    sequence's last group may hold fewer), and for packed sequences each group's sequence and first chunk and where
    each sequence's groups begin (None without cu_seqlens: the kernels compute them, _group_of)."""
    if cu_seqlens is None:
        return B * triton.cdiv(triton.cdiv(T, C), G), None, None, None
    bounds = cu_seqlens.tolist()
    seq, first, offsets, chunk0 = [], [], [0], 0
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        chunks = triton.cdiv(e - s, C)
        for j in range(0, chunks, G):
            seq.append(n)
            first.append(chunk0 + j)
        chunk0 += chunks
        offsets.append(len(seq))
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return len(seq), as_tensor(seq), as_tensor(first), as_tensor(offsets)


def chain_group(chunks: float) -> int:
    """Chunks per group for the chains of sequences of `chunks` chunks (mean): a power of two near √chunks (at
    least 2), which balances the three dependent depths (G chunks per map, chunks / G groups walked, G chunks
    replayed)."""
    return 2 ** max(1, round(math.log2(max(chunks, 1)) / 2))


def _group_entries(prep, offsets, cu_seqlens, tmat, y0, bias, x_init, x_final, G, flags, gains, prec, reverse):
    """The chain's state entering each group (x_grp [NG, H, K] float32; REVERSE: λ leaving it) and the group table:
    the maps of all groups in parallel (phase1_chunk_group_map_kernel), then the walk over each sequence's groups."""
    k, beta, r, eta = prep[:4]
    (B, T, H, K), C, BK = k.shape, flags["C"], flags["BK"]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    NG, gseq, gfirst, goffs = group_table(B, T, cu_seqlens, C, G, k.device)
    gseq, gfirst, goffs = (x if x is not None else offsets for x in (gseq, gfirst, goffs))
    f32 = dict(dtype=torch.float32, device=k.device)
    maps = torch.empty(NG, H, BK, BK, **f32)
    shifts = torch.empty(NG, H, BK, **f32)
    x_grp = torch.empty(NG, H, K, **f32)
    cu = cu_seqlens if cu_seqlens is not None else k
    launch = dict(TUNING["phase1_group_map"])
    BN = min(launch.pop("BN"), BK)
    for vec, grid in ((False, (NG, H, BK // BN)), (True, (NG, H, 1))):  # M's columns, then m
        phase1_chunk_group_map_kernel[grid](
            k, beta, r, eta, offsets, cu, gseq, gfirst, tmat, y0, bias if bias is not None else y0, maps, shifts,
            T, H, K, EPS, **gains, **flags, G=G, PREC=prec, REVERSE=reverse, BN=BN, VEC=vec, **launch,
        )
    phase1_chunk_group_walk_kernel[(N, H)](
        x_init if x_init is not None else x_final, maps, shifts, x_grp, x_final, goffs, T, H, K,
        HAS_INIT=x_init is not None, IS_VARLEN=flags["IS_VARLEN"], C=C, BK=BK, G=G, REVERSE=reverse,
        ONES=not reverse, **TUNING["phase1_group_walk"],
    )
    return NG, x_grp, gseq, gfirst


def _tile_warps(C: int, BK: int) -> int:
    """Warps of the chunk kernels: 8 once a [C, BK] tile reaches 8192 elements, else 4. Chosen from ptxas's
    register/stack report for sm_90 (compiled here without a GPU): at C = 64, K = 128 the state pass (whole
    [C, K] tiles, the next chunk prefetched) spills with 4 warps and does not with 8. To be timed on the GPU."""
    return 8 if C * BK >= 8192 else 4


def tuning_key(stage: str, C: int, BK: int) -> str | None:
    """The TUNING entry of phase-1 kernel `stage` at tiles (C, BK): `phase1_<stage>` at TUNED_TILES, and
    `phase1_<stage>_k<BK>` at its chunks with another key block (version 19: K = 64); None at other chunks. An entry
    that TUNING lacks leaves the kernel to the rule (_parallel_launch, _chain_launch)."""
    if C != TUNED_TILES[0]:
        return None
    return "phase1_" + stage + ("" if BK == TUNED_TILES[1] else f"_k{BK}")


def _parallel_launch(stage: str, C: int, BK: int) -> dict:
    """KB, warps and stages of a chunk-parallel phase-1 kernel (`prep`, `out`, `bwd_prep`, `bwd_out`): TUNING's
    entry at these tiles (tuning_key), else _k_block's and _tile_warps' rule with Triton's default of 3 stages. KB
    orders only the float32 sums over key channels."""
    key = tuning_key(stage, C, BK)
    if key in TUNING:
        return dict(TUNING[key])
    return dict(KB=_k_block(C, BK), num_warps=_tile_warps(C, BK), num_stages=3)


def _chain_launch(stage: str, C: int, BK: int) -> dict:
    """Warps and stages of a chain kernel of the chunk form (`state`, `bwd_state`: one program per (sequence, head),
    walking its chunks): TUNING's entry at these tiles (tuning_key), else _tile_warps' rule with Triton's default of
    3 stages."""
    key = tuning_key(stage, C, BK)
    if key in TUNING:
        return dict(TUNING[key])
    return dict(num_warps=_tile_warps(C, BK), num_stages=3)


def _k_block(C: int, BK: int) -> int:
    """Key channels per block in the parallel kernels off chunk_osdn's tiles (_parallel_launch): 32, or 16 from
    C = 64 on, version 5's choice by ptxas's sm_90 report (no spills at K = 128). At C = 64, K = 128 the H200
    sweep picked settings that spill and run up to 2.4x faster (TUNING, version 9)."""
    return min(BK, 32 if C <= 32 else 16)


def _check_stats(stats, k) -> None:
    if stats is not None and (stats.shape != (2, *k.shape[:3]) or stats.dtype != torch.float32
                              or not stats.is_contiguous()):
        raise ValueError(f"stats: expected a contiguous float32 [2, B, T, H] = [2, {', '.join(map(str, k.shape[:3]))}] "
                         f"tensor, "
                         f"got {stats.dtype} {list(stats.shape)}")


def _check_group(group) -> None:
    if group is not None and (not isinstance(group, int) or group < 2 or group & (group - 1)):
        raise ValueError(f"group must be None or a power of two >= 2, got {group!r}")


def _solver_flags(chunk_size: int, solver: str, precision: str) -> dict:
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "blockwise" and chunk_size > 64:
        raise ValueError(f"the blockwise solver takes chunk_size 16, 32 or 64, got {chunk_size}")
    return dict(LOG2_C=chunk_size.bit_length() - 1, DOUBLING=solver == "doubling", PREC=precision)


def _shared_args(k, beta, r, eta, cu_seqlens, C, solver, precision, beta_aware, normalize):
    """What the launches of one chunk-form call share: (NC, chunk_offsets, `prep` = the prep kernels' leading
    arguments, flags, gains, solver flags); absent optional tensors are stood in for by k or β (never read)."""
    B, T, H, K = k.shape
    NC, seq, start, offsets = chunk_table(B, T, cu_seqlens, C, k.device)
    seq, start, offsets = (x if x is not None else k for x in (seq, start, offsets))
    prep = (k, beta, r if r is not None else beta, eta, seq, start, cu_seqlens if cu_seqlens is not None else k)
    flags = dict(HAS_R=r is not None, IS_VARLEN=cu_seqlens is not None, C=C, BK=block_k(K))
    gains = dict(BETA_AWARE=beta_aware, NORMALIZE=normalize)
    return NC, offsets, prep, flags, gains, _solver_flags(C, solver, precision)


def _check_inverse(inverse, k, C, name) -> None:
    B, T, H, _ = k.shape
    if inverse.shape != (B * T, H, C) or inverse.dtype != torch.float32:
        raise ValueError(f"{name} must be float32 of shape {(B * T, H, C)}, got {inverse.dtype} {tuple(inverse.shape)}")


def _inverse(solver, inverse, k, C, inverse_out=None):
    """The prep kernels' P argument and mode: `inverse` when the caller kept it from an earlier call on the same
    inputs (HAS_INV), else for the blockwise solver the tensor the prep kernel forms P in (`inverse_out` or a new
    one; BLOCKWISE), and for the other solvers, whose prep kernels form P in registers, a stand-in."""
    if solver != "blockwise":
        if inverse is not None or inverse_out is not None:
            raise ValueError(f"inverse, inverse_out: only the blockwise solver keeps an inverse, not {solver!r}")
        return k, dict(HAS_INV=False, BLOCKWISE=False)
    if inverse is not None:
        if inverse_out is not None:
            raise ValueError("inverse_out: P is given (inverse), not formed")
        _check_inverse(inverse, k, C, "inverse")
        return inverse, dict(HAS_INV=True, BLOCKWISE=False)
    if inverse_out is not None:
        _check_inverse(inverse_out, k, C, "inverse_out")
        return inverse_out, dict(HAS_INV=False, BLOCKWISE=True)
    B, T, H, _ = k.shape
    return torch.empty(B * T, H, C, dtype=torch.float32, device=k.device), dict(HAS_INV=False, BLOCKWISE=True)


def _formed_inverse(NC, prep, flags, gains, solve) -> torch.Tensor:
    """Every chunk's P, by the blockwise solver in one launch of the prep kernel (P_ONLY)."""
    k = prep[0]
    _, T, H, K = k.shape
    inv, mode = _inverse("blockwise", None, k, flags["C"])
    phase1_chunk_prep_kernel[(NC, H)](
        *prep, inv, inv, inv, inv, inv, T, H, K, EPS, **gains, **flags, **solve, **mode, P_ONLY=True,
        **_parallel_launch("prep", flags["C"], flags["BK"]),
    )
    return inv


def chunk_inverses(k, beta, r, eta, *, beta_aware, normalize, cu_seqlens, chunk_size: int = 64,
                   precision: str = "ieee") -> torch.Tensor:
    """Every chunk's P = (I + L)⁻¹ [B·T, H, C] float32, rows by token, as the blockwise solver forms it: what
    phase1_fwd_chunk and phase1_bwd_chunk take as `inverse`. chunk_osdn's forward forms it with Tq and u⁰ in one
    launch instead (phase1_fwd_chunk's `inverse_out`)."""
    NC, _, prep, flags, gains, solve = _shared_args(k, beta, r, eta, cu_seqlens, chunk_size, "blockwise", precision,
                                                    beta_aware, normalize)
    return _formed_inverse(NC, prep, flags, gains, solve)


def chunk_entries(k, cu_seqlens, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty float32 buffers for what the forward chain leaves behind, from which d is formed again: each chunk's
    entry state x_0 [NC, H, K] and each token's u [B, T, H] (phase1_fwd_chunk's and phase1_bwd_chunk's `entries`):
    1/C + 1/K of d_all's size."""
    B, T, H, K = k.shape
    NC = chunk_table(B, T, cu_seqlens, chunk_size, k.device)[0]
    return (torch.empty(NC, H, K, dtype=torch.float32, device=k.device),
            torch.empty(B, T, H, dtype=torch.float32, device=k.device))


def _check_entries(entries, k, NC) -> None:
    if entries is None:
        return
    B, T, H, K = k.shape
    shapes = ((NC, H, K), (B, T, H))
    if (not isinstance(entries, (tuple, list)) or len(entries) != 2
            or any(x.shape != s or x.dtype != torch.float32 or not x.is_contiguous() for x, s in zip(entries, shapes))):
        got = [f"{x.dtype} {list(x.shape)}" for x in entries] if isinstance(entries, (tuple, list)) else type(entries)
        raise ValueError(f"entries: expected contiguous float32 (x_0 {list(shapes[0])}, u {list(shapes[1])}) "
                         f"(chunk_entries), got {got}")


def replay_d(k, r, entries, *, cu_seqlens, chunk_size: int = 64, precision: str = "ieee") -> torch.Tensor:
    """d_all [B, T, H, K] float32 formed from a forward's `entries` by the out kernel alone, as phase1_bwd_chunk forms
    it again per key block: what that forward would have stored with `store_d`."""
    B, T, H, K = k.shape
    C, BK = chunk_size, block_k(K)
    NC, seq, start, _ = chunk_table(B, T, cu_seqlens, C, k.device)
    _check_entries(entries, k, NC)
    x0, u = entries
    d_all = torch.empty(B, T, H, K, dtype=torch.float32, device=k.device)
    phase1_chunk_out_kernel[(NC, H)](
        k, r if r is not None else u, seq if seq is not None else k, start if start is not None else k,
        cu_seqlens if cu_seqlens is not None else k, u, x0, d_all, u, u, u, u, T, H, K, 0.0, 0.0,
        HAS_R=r is not None, IS_VARLEN=cu_seqlens is not None, C=C, BK=BK, PREC=precision, STORE_KT=False,
        HAS_MIN=False, HAS_MAX=False, STORE_D=True, STORE_STATS=False, **_parallel_launch("out", C, BK),
    )
    return d_all


def phase1_fwd_chunk(k, beta, r, d0, eta, *, d_min=None, d_max=None, beta_aware, normalize, cu_seqlens,
                     chunk_size: int = 64, solver: str = "substitution", precision: str = "ieee",
                     store_kt: bool = False, bounds: tuple | None = None, store_d: bool = True, inverse=None,
                     inverse_out: torch.Tensor | None = None, group: int | None = None,
                     stats: torch.Tensor | None = None, entries: tuple | None = None, out: bool = True):
    """Chunk-parallel forward (no clip): (d_all [B, T, H, K] float32 or None without `store_d`, d_final [N, H, K]
    float32), and with
    `store_kt` / `bounds` also (k̃ = d ⊙ k in k's dtype or None, `outside`: an int32 [1] on the device, 1 if some
    d_t or final d of the unclipped scan leaves bounds = (d_min, d_max), or None). When `outside` is 0 the clip
    never acts, so the unclipped result is the clipped scan's exactly. `inverse`: chunk_inverses' P (blockwise).
    `inverse_out`: a float32 [B·T, H, C] tensor that receives the P this call forms (blockwise, no `inverse`).
    `group`: the chain walks groups of that many chunks (chain_group; _group_entries), else one chunk at a time.
    `stats`: a float32 [2, B, T, H] tensor that receives each token's s_t = ⟨d_t, a_t⟩ and ‖k_t‖² for the backward
    (phase1_bwd_chunk's `stats`). `entries`: chunk_entries' buffers, which receive the chain's entry states and u,
    from which phase1_bwd_chunk forms d again: a backward then needs no d_all (chunk_osdn passes store_d=False).
    Without `out` the out kernel is not launched: the call returns (None, d_final), and `entries`, which it needs,
    hold all that d_t is formed from (chunk_osdn forms k̃ and `stats` inside phase 2's Gram: gram_replay.py)."""
    if d_min is not None or d_max is not None:
        raise ValueError("phase1_fwd_chunk has no clip (d_min/d_max): use the sequential scan")
    _check_group(group)
    _check_stats(stats, k)
    B, T, H, K = k.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C, BK = chunk_size, block_k(K)
    NC, offsets, prep, flags, gains, solve = _shared_args(k, beta, r, eta, cu_seqlens, C, solver, precision,
                                                          beta_aware, normalize)
    _check_entries(entries, k, NC)
    if not out and (entries is None or store_d or store_kt or bounds is not None or stats is not None):
        raise ValueError("out=False: pass `entries` (d is formed from them later), and no store_d, store_kt, "
                         "bounds or stats, which the out kernel would write")
    _, _, r_, _, seq, start, cu = prep
    f32 = dict(dtype=torch.float32, device=k.device)
    tq = torch.empty(NC, H, C, C, **f32)
    u0 = torch.empty(B, T, H, **f32)
    wd = torch.empty(B, T, H, **f32) if r is not None else u0  # no decays without r: stand-ins, never read
    ed = torch.empty(NC, H, **f32) if r is not None else u0
    x0, u = entries if entries is not None else (torch.empty(NC, H, K, **f32), torch.empty(B, T, H, **f32))
    d_all = torch.empty(B, T, H, K, **f32) if store_d else None
    d_final = torch.empty(N, H, K, **f32)
    inv, mode = _inverse(solver, inverse, k, C, inverse_out)
    phase1_chunk_prep_kernel[(NC, H)](
        *prep, inv, tq, u0, wd, ed, T, H, K, EPS, **gains, **flags, **solve, **mode, P_ONLY=False,
        **_parallel_launch("prep", C, BK),
    )
    programs, x_grp, gseq, gfirst = N, d_final, offsets, offsets
    if group:
        programs, x_grp, gseq, gfirst = _group_entries(prep, offsets, cu_seqlens, tq, u0, None, d0, d_final, group,
                                                       flags, gains, precision, reverse=False)
    lo, hi = bounds if bounds is not None else (None, None)
    outside = torch.zeros(1, dtype=torch.int32, device=k.device) if bounds is not None else None
    flag = outside if bounds is not None else u  # never written without bounds
    limits = dict(d_min=0.0 if lo is None else float(lo), d_max=0.0 if hi is None else float(hi),
                  HAS_MIN=lo is not None, HAS_MAX=hi is not None)
    phase1_chunk_state_kernel[(programs, H)](
        k, wd, ed, d0 if d0 is not None else d_final, offsets, cu, tq, u0, u, x0, d_final, x_grp, gseq, gfirst,
        T, H, K, flag, **limits, HAS_D0=d0 is not None, **flags, G=group or 0,
        **_chain_launch("state", C, BK), **(CHAIN_REGISTERS if r is not None and group else {}),
    )
    if not out:
        return None, d_final
    kt = torch.empty_like(k) if store_kt else None
    phase1_chunk_out_kernel[(NC, H)](
        k, r_, seq, start, cu, u, x0, d_all if store_d else u, kt if store_kt else u,
        flag, *(stats if stats is not None else (u, u)), T, H, K, **limits,
        **flags, PREC=precision, STORE_KT=store_kt, STORE_D=store_d, STORE_STATS=stats is not None,
        **_parallel_launch("out", C, BK),
    )
    if not store_kt and bounds is None:
        return d_all, d_final
    return d_all, d_final, kt, outside


def phase1_bwd_chunk(k, beta, r, eta, d_all, gd_all, gd_final, *, d_min=None, d_max=None, beta_aware, normalize,
                     cu_seqlens, chunk_size: int = 64, solver: str = "substitution", precision: str = "ieee",
                     phase2_grads=None, inverse=None, group: int | None = None, stats: torch.Tensor | None = None,
                     entries: tuple | None = None):
    """Chunk-parallel backward (no clip): (dk, dbeta, dr, dd0, deta [B, T, H]) in float32 (dr None without r). With
    `phase2_grads` = (∂k̃, ∂k, ∂β) of phase 2 (k's and β's sizes, any float dtype, summed in float32; `gd_all` must be None), the fused form
    of phase1.phase1_bwd_seq: the direct gradient of d is ∂k̃ ⊙ k, and ∂k, ∂β are the totals in k's and β's dtypes.
    `inverse`: the forward's P (chunk_inverses; blockwise solver), else formed again here. `group`: as in the
    forward, the reverse chain over groups of chunks. `stats`: the forward's per-token s_t and ‖k_t‖² (its
    `stats`), else formed again from k and d. `entries`: the forward's (its `entries`), from which d is formed again
    where it is used (d_all is then None and not read), at the forward's `precision`."""
    if d_min is not None or d_max is not None:
        raise ValueError("phase1_bwd_chunk has no clip (d_min/d_max): use the sequential scan")
    if (d_all is None) == (entries is None):
        raise ValueError("phase1_bwd_chunk: pass either d_all or entries (the forward's, to form d again)")
    _check_group(group)
    _check_stats(stats, k)
    B, T, H, K = k.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C, BK = chunk_size, block_k(K)
    NC, offsets, prep, flags, gains, solve = _shared_args(k, beta, r, eta, cu_seqlens, C, solver, precision,
                                                          beta_aware, normalize)
    _check_entries(entries, k, NC)
    _, _, r_, _, seq, start, cu = prep
    f32 = dict(dtype=torch.float32, device=k.device)
    fused = phase2_grads is not None
    if fused:
        if gd_all is not None:
            raise ValueError("phase1_bwd_chunk: pass either gd_all or phase2_grads")
        gd_all, dk_in, dbeta_in = phase2_grads
    elif gd_all is None:
        gd_all = torch.zeros(B, T, H, K, **f32)
    tp = torch.empty(NC, H, C, C, **f32)
    pg = torch.empty(B, T, H, **f32)
    hg = torch.empty(NC, H, K, **f32)
    cg = torch.empty(B, T, H, **f32)
    ge = torch.empty(NC, H, **f32) if r is not None else cg  # no decays without r: a stand-in, never read
    p = torch.empty(B, T, H, **f32)
    lam_end = torch.empty(NC, H, K, **f32)
    dd0 = torch.empty(N, H, K, **f32)
    if solver == "blockwise" and inverse is None:
        inverse = _formed_inverse(NC, prep, flags, gains, solve)
    inv, mode = _inverse(solver, inverse, k, C)
    phase1_chunk_bwd_prep_kernel[(NC, H)](
        *prep[:4], gd_all, *prep[4:], inv, tp, pg, hg, cg, ge, T, H, K, EPS, **gains, **flags, **solve,
        HAS_INV=mode["HAS_INV"], FUSED=fused, **_parallel_launch("bwd_prep", C, BK),
    )
    programs, x_grp, gseq, gfirst = N, dd0, offsets, offsets
    if group:
        programs, x_grp, gseq, gfirst = _group_entries(prep, offsets, cu_seqlens, tp, pg, hg, gd_final, dd0, group,
                                                       flags, gains, precision, reverse=True)
    phase1_chunk_bwd_state_kernel[(programs, H)](
        k, ge, gd_final if gd_final is not None else dd0, offsets, cu, tp, pg, hg, cg, p, lam_end, dd0,
        x_grp, gseq, gfirst, T, H, K, HAS_GD_FINAL=gd_final is not None, **flags, G=group or 0,
        **_chain_launch("bwd_state", C, BK),
    )
    # the chain's C×C maps are read no more: released before the outputs are allocated (the peak at K = 64, NOTES)
    del tp, pg, hg, cg, ge, inv, x_grp
    dk = torch.empty_like(k) if fused else torch.empty(B, T, H, K, **f32)
    if fused:
        dbeta = torch.empty_like(beta)
    else:
        dbeta = torch.empty(B, T, H, **f32) if beta_aware else torch.zeros(B, T, H, **f32)
    dr = torch.empty(B, T, H, **f32) if r is not None else None
    deta = torch.empty(B, T, H, **f32)
    x0, u_fwd = entries if entries is not None else (p, p)
    phase1_chunk_bwd_out_kernel[(NC, H)](
        k, beta, r_, eta, d_all if d_all is not None else p, x0, u_fwd, gd_all, seq, start, cu, p, lam_end,
        *(stats if stats is not None else (p, p)), dk, dbeta, dr if dr is not None else dbeta, deta,
        dk_in if fused else dk, dbeta_in if fused else dbeta, T, H, K, EPS,
        **gains, **flags, **solve, FUSED=fused, HAS_STATS=stats is not None, REPLAY=entries is not None,
        **_parallel_launch("bwd_out_sum" if r is None and tuning_key("bwd_out_sum", C, BK) in TUNING else "bwd_out",
                           C, BK),
    )
    return dk, dbeta, dr, dd0, deta.flatten(0, 1)

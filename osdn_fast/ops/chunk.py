"""`chunk_osdn` in Triton: phase 1 (the d scan, writing k̃ = d ⊙ k), then the phase-2 WY chunkwise pass.

Phase 2 runs on packed sequences [1, ΣT, H, ·]; a fixed-length batch is packed as B sequences of length T.
Forward: cumsum → gram → solve → wu → state → output; it keeps the chunks' A⁻¹ (C numbers per token) for the
backward. Backward recomputes W, U from A⁻¹ and the states, then: local ∂Ū (output) → reverse state pass
(state) → ∂q, ∂k̃, ∂W (output) → ∂k, ∂k̃, ∂v, ∂β, ∂G (wy) → ∂g (reverse cumsum) → phase 1's reverse scan,
which turns ∂k̃ into ∂d and ∂k and adds the rest (`ChunkOSDN`). `ChunkOSDNPhase2` is phase 2 alone.
"""
from __future__ import annotations

import os

import torch

from osdn_ref import validate_inputs

from .common import block_dims, launch
from .cumsum import chunk_cumsum
from .gram_replay import gram_replay
from .index import chunk_layout, uniform_chunk_layout, uniform_cu_seqlens
from .output import output_bwd, output_bwd_local, output_fwd
from .phase1 import phase1_bwd_seq, phase1_fwd_seq
from .phase1_chunk import chain_group, chunk_entries, phase1_bwd_chunk, phase1_fwd_chunk
from .phase1_newton import phase1_bwd_newton, phase1_fwd_newton
from .solve import unit_lower_inverse
from .state import state_bwd, state_fwd
from .wy import wy_bwd, wy_fwd

MAX_K = 256
MAX_V = 256
CHUNK_SIZES = (16, 32, 64)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def phase2_fwd(q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state, chunk_size, layout, replay=None):
    """Packed [1, ΣT, H, ·] inputs → (o, S_final or None, A⁻¹ kept for the backward, k̃); `layout` = chunk_layout(...).
    k̃ None: the Gram forms it from `replay` = gram_replay's (r, entries, p1_offsets, p1_chunk_size, stats,
    precision), phase 1's chunk form's chain, instead of reading it (gram_replay.py)."""
    chunk_indices, chunk_offsets = layout
    BK, BV = block_dims(k.shape[-1], v.shape[-1])
    G = None if g is None else chunk_cumsum(g, cu_seqlens, chunk_indices, chunk_size)
    Ainv = None
    if kt is None:
        r, entries, p1_offsets, p1_chunk_size, stats, precision = replay
        kt, A = gram_replay(k, beta, G, r, entries, p1_offsets, p1_chunk_size, stats, cu_seqlens, chunk_indices,
                            chunk_size, BK, precision)
        Ainv = unit_lower_inverse(A, cu_seqlens, chunk_indices, k.dtype, **launch("solve", BK, BV)[1])
    Ainv, w, u = wy_fwd(k, kt, v, beta, G, cu_seqlens, chunk_indices, chunk_size, BK, BV, Ainv=Ainv)
    h, ubar, S_final = state_fwd(w, u, kt, G, S0, cu_seqlens, chunk_offsets, chunk_indices.shape[0],
                                 chunk_size, BK, BV, output_final_state)
    o = output_fwd(q, kt, G, h, ubar, scale, cu_seqlens, chunk_indices, chunk_size, BK, BV)
    return o, S_final, Ainv, kt


def phase2_bwd(q, k, kt, v, beta, g, S0, cu_seqlens, Ainv, do, dS_final, scale, C, layout, grad_dtype=None):
    """(∂q, ∂v in their inputs' dtype; phase 2's parts of ∂k and ∂k̃ in `grad_dtype` (None: k's); ∂β float32; ∂g in
    g's dtype or None; ∂S0 float32) from ∂o and ∂S_final (either None)."""
    if do is None:
        do = torch.zeros(*v.shape, dtype=q.dtype, device=q.device)
    do = do.contiguous()
    dS_final = None if dS_final is None else dS_final.float().contiguous()
    chunk_indices, chunk_offsets = layout
    NT = chunk_indices.shape[0]
    BK, BV = block_dims(k.shape[-1], v.shape[-1])
    G = None if g is None else chunk_cumsum(g, cu_seqlens, chunk_indices, C)
    # each buffer is released at its last use (`del`): the peak is then output_bwd's, not wy_bwd's (NOTES, v16)
    _, w, u = wy_fwd(k, kt, v, beta, G, cu_seqlens, chunk_indices, C, BK, BV, Ainv=Ainv)
    h, ubar, _ = state_fwd(w, u, kt, G, S0, cu_seqlens, chunk_offsets, NT, C, BK, BV, False)
    del u
    du_local = output_bwd_local(q, kt, G, do, scale, cu_seqlens, chunk_indices, C, BK, BV)
    dh, du, dS0 = state_bwd(q, kt, w, G, do, du_local, dS_final, scale, cu_seqlens, chunk_offsets, NT, C, BK, BV)
    del w, du_local
    dq, dkt, dw, dG = output_bwd(q, kt, G, h, dh, ubar, du, do, scale, cu_seqlens, chunk_indices, C, BK, BV)
    del h, ubar, dh
    dk, dkt, dv, dbeta, dG = wy_bwd(k, kt, v, beta, G, Ainv, dw, du, dkt, dG, cu_seqlens, chunk_indices, C, BK, BV,
                                    grad_dtype or k.dtype)
    dg = None if g is None else chunk_cumsum(dG, cu_seqlens, chunk_indices, C, reverse=True).to(g.dtype)
    return dq, dk, dkt, dv, dbeta, dg, dS0


class ChunkOSDNPhase2(torch.autograd.Function):
    """Phase 2 alone: (q, k, k̃, v, β, g, S0) packed [1, ΣT, H, ·] → (o, S_final); gradients for all seven."""

    @staticmethod
    def forward(ctx, q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state, chunk_size):
        layout = chunk_layout(cu_seqlens, chunk_size)
        o, S_final, Ainv, _ = phase2_fwd(q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state,
                                         chunk_size, layout)
        ctx.save_for_backward(q, k, kt, v, beta, g, S0, cu_seqlens, Ainv, *layout)
        ctx.scale, ctx.chunk_size = scale, chunk_size
        ctx.set_materialize_grads(False)
        return o, S_final

    @staticmethod
    def backward(ctx, do, dS_final):
        q, k, kt, v, beta, g, S0, cu_seqlens, Ainv, *layout = ctx.saved_tensors
        dq, dk, dkt, dv, dbeta, dg, dS0 = phase2_bwd(q, k, kt, v, beta, g, S0, cu_seqlens, Ainv, do, dS_final,
                                                     ctx.scale, ctx.chunk_size, layout)
        return (dq.to(q.dtype), dk.to(k.dtype), dkt.to(kt.dtype), dv.to(v.dtype), dbeta.to(beta.dtype), dg,
                None if S0 is None else dS0, None, None, None, None)


PHASE1_CHUNKED_MIN_T = 4096  # mean sequence length from which phase 1 runs chunk-parallel (NOTES.md, version 5)
PHASE1_FEW_CHAINS = 256  # ... and below it from PHASE1_FEW_CHAINS_MIN_T[form] when at most this many (sequence, head)
PHASE1_FEW_CHAINS_MIN_T = dict(chunked=256, newton=1024)  # chains run: the scan then idles most SMs (version 36)
# phase 1's own chunks (phase 2 keeps chunk_osdn's chunk_size): 32 since version 18 (NOTES.md); phase1_chunk.TUNED_TILES
PHASE1_CHUNKED = dict(chunk_size=32, solver="blockwise", precision="tf32")
PHASE1_GROUP_MIN_CHUNKS = 32  # the chunk form's chains walk groups of chunks from this many chunks per sequence (mean)
PHASE1_GROUP_MAX_CHAINS = 16  # ... when at most this many (sequence, head) chains run (NOTES, after version 10)
PHASE1_NEWTON = dict(chunk_size=64, jacobian="diagonal", fixed_rounds=6)
PHASE1_OUT_IN_GRAM = True  # the unclipped chunk form's d and k̃ formed in phase 2's Gram (gram_replay.py; version 39)


def phase1_form(T_mean: float, r, d_min, d_max, chains: int | None = None) -> str:
    """"chunked" (phase1_chunk.py, speculating that the clip stays idle), "newton" (phase1_newton.py, quasi-Newton
    over chunks, for APF with a floor) or "sequential" (phase1.py), for `chains` = N·H (sequence, head) chains of
    mean length T_mean. The scan takes T dependent steps whatever the batch, one warp per chain, so with few chains
    it leaves most SMs idle; the chunk forms' work grows with the number of chunks instead. On the H200 they measured
    faster from T = 4096 on (version 5) and, with at most 256 chains, from T = 256 (chunked) and T = 1024 (newton;
    version 36, benchmarks/NOTES.md). `chains=None` applies the length rule alone, as chunk_osdn did in versions 5
    to 35 (book/08 classifies their timings with it). With APF and a floor the retention decays d onto d_min within
    a few hundred tokens, so the clip acts and the chunk form's speculation would fail; a held coordinate forgets its
    start, which is what makes the diagonal quasi-Newton converge in few rounds there."""
    form = "newton" if r is not None and d_min is not None else "chunked"
    few = chains is not None and chains <= PHASE1_FEW_CHAINS and T_mean >= PHASE1_FEW_CHAINS_MIN_T[form]
    return form if T_mean >= PHASE1_CHUNKED_MIN_T or few else "sequential"


def phase1_group(k, cu_seqlens) -> int | None:
    """The chunk form's `group` (phase1_chunk.chain_group) for these inputs, or None: one program per (sequence,
    head) walks its chunks, which leaves most SMs idle when few chains run; grouping trades K×K maps for depth."""
    N = k.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    chunks = k.shape[0] * k.shape[1] / N / PHASE1_CHUNKED["chunk_size"]
    if chunks < PHASE1_GROUP_MIN_CHUNKS or N * k.shape[2] > PHASE1_GROUP_MAX_CHAINS:
        return None
    return chain_group(chunks)


def phase1_fwd(k, beta, r, d0, eta, cu_seqlens, p1, store_d=True, chunk_size=None):
    """Phase 1's forward for ChunkOSDN: (form, d_all, d_final, k̃, `outside`, kept). "newton" runs a fixed number of
    quasi-Newton rounds across chunks, then the sequential scan behind them, guarded to run only if they did not
    converge; its backward is the same in reverse (`phase1_bwd_newton_guarded`). The chunk form runs without the
    clip and flags (`outside`, int32 [1] on the device) any d that leaves [d_min, d_max]: the clip would have
    acted there, so the sequential scan, launched behind it, then redoes the call in place; otherwise its programs
    return at once. The backward reads the same flag on the device (`phase1_bwd_speculative_guarded`), never the host.
    form: "sequential", "newton", "chunked" (no clip) or "speculative" (chunked, clip given: `outside` decides).
    Without `store_d` (no backward will follow) d_all is not written and comes back None. The chunk form never
    stores d_all (version 29): when a backward follows it keeps, in `kept` = (P, stats, entries), its (I + L)⁻¹
    (phase1_fwd_chunk's `inverse_out`), per-token s_t, ‖k_t‖² (`stats`) and the chain's entry states and u
    (`entries`), from which its backward forms d again. The guarded scan of the speculative form stores no d either:
    if the clip acted, its backward runs that scan again for d (phase1_bwd_speculative_guarded). So d_all is None in
    both chunk forms. Other forms, and no backward: kept is None.
    The chunk form without the clip, when phase 2's `chunk_size` is a multiple of phase 1's chunks, launches no out
    kernel (PHASE1_OUT_IN_GRAM): k̃ comes back None, and phase 2's Gram forms d, k̃ and the backward's stats from
    `kept`'s entries (gram_replay.py); kept's inverse and stats are then None without `store_d`."""
    N = k.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    form = phase1_form(k.shape[0] * k.shape[1] / N, r, p1["d_min"], p1["d_max"], chains=N * k.shape[2])
    if form == "sequential":  # r as stored: float32 r made the forward-only scan slower since version 14 (NOTES)
        return form, *phase1_fwd_seq(k, beta, r, d0, eta, cu_seqlens=cu_seqlens, store_kt=True, store_d=store_d,
                                     **p1), None, None
    if form == "newton":  # PHASE1_NEWTON's rounds without a host synchronisation; the guarded scan if unconverged
        d_all, d_final, kt, unconverged = phase1_fwd_newton(k, beta, r, d0, eta, cu_seqlens=cu_seqlens, store_kt=True,
                                                            store_d=store_d, **p1, **PHASE1_NEWTON)
        phase1_fwd_seq(k, beta, r, d0, eta, cu_seqlens=cu_seqlens, store_kt=True, out=(d_all, d_final, kt),
                       only_if=unconverged, store_d=store_d, **p1)
        return form, d_all, d_final, kt, None, None
    clipped = p1["d_min"] is not None or p1["d_max"] is not None
    in_gram = (not clipped and PHASE1_OUT_IN_GRAM and chunk_size is not None
               and chunk_size % PHASE1_CHUNKED["chunk_size"] == 0)
    gains = dict(beta_aware=p1["beta_aware"], normalize=p1["normalize"], cu_seqlens=cu_seqlens)
    kept = None
    if store_d or in_gram:  # a backward reuses the chunks' inverses, s_t, ‖k_t‖² and entry states; the Gram, these
        f32 = dict(dtype=torch.float32, device=k.device)
        kept = (torch.empty(k.shape[0] * k.shape[1], k.shape[2], PHASE1_CHUNKED["chunk_size"], **f32)
                if store_d else None,
                torch.empty(2, *k.shape[:3], **f32) if store_d else None,
                chunk_entries(k, cu_seqlens, PHASE1_CHUNKED["chunk_size"]))
    inv, stats, entries = kept if kept is not None else (None, None, None)
    chunk_args = dict(**gains, store_d=False, inverse_out=inv, group=phase1_group(k, cu_seqlens), entries=entries,
                      **PHASE1_CHUNKED)
    if in_gram:  # the stats are written by the Gram too
        _, d_final = phase1_fwd_chunk(k, beta, r, d0, eta, **chunk_args, out=False)
        return form, None, d_final, None, None, kept
    _, d_final, kt, outside = phase1_fwd_chunk(
        k, beta, r, d0, eta, **chunk_args, store_kt=True, bounds=(p1["d_min"], p1["d_max"]) if clipped else None,
        stats=stats)
    if not clipped:
        return form, None, d_final, kt, None, kept
    phase1_fwd_seq(k, beta, r, d0, eta, cu_seqlens=cu_seqlens, store_kt=True, out=(None, d_final, kt),
                   only_if=outside, store_d=False, **p1)
    return "speculative", None, d_final, kt, outside, kept


def phase1_bwd_newton_guarded(k, beta, r, eta, d_all, dd_final, cu_seqlens, phase2_grads, p1):
    """The backward after the quasi-Newton forward: PHASE1_NEWTON's rounds of the reverse quasi-Newton (no host
    synchronisation), then the sequential reverse scan into the same outputs, guarded to run only if they did not
    converge. (dk, dbeta, dr, dd0, deta [1, H])."""
    rounds = dict(chunk_size=PHASE1_NEWTON["chunk_size"], fixed_rounds=PHASE1_NEWTON["fixed_rounds"])
    dk, dbeta, dr, dd0, deta_chunks, unconverged = phase1_bwd_newton(
        k, beta, r, eta, d_all, dd_final, cu_seqlens=cu_seqlens, phase2_grads=phase2_grads, **p1, **rounds)
    deta_seq = torch.empty(dd0.shape[:2], dtype=torch.float32, device=k.device)
    phase1_bwd_seq(k, beta, r, eta, d_all, None, dd_final, cu_seqlens=cu_seqlens, phase2_grads=phase2_grads,
                   out=(dk, dbeta, dr, dd0, deta_seq), only_if=unconverged, **p1)
    deta = torch.where(unconverged.bool(), deta_seq.sum(0), deta_chunks.sum(0))  # the unchosen side may be garbage
    return dk, dbeta, dr, dd0, deta[None]


def phase1_bwd_chunked(k, beta, r, eta, dd_final, cu_seqlens, phase2_grads, p1, kept):
    """The backward after the chunk form's forward (phase1_bwd_chunk with what the forward kept: its inverses,
    stats and entry states, from which d is formed again): (dk, dbeta, dr, dd0, deta [B, T, H])."""
    inv, stats, entries = kept
    return phase1_bwd_chunk(k, beta, r, eta, None, None, dd_final, beta_aware=p1["beta_aware"],
                            normalize=p1["normalize"], cu_seqlens=cu_seqlens, phase2_grads=phase2_grads, inverse=inv,
                            group=phase1_group(k, cu_seqlens), stats=stats, entries=entries, **PHASE1_CHUNKED)


def phase1_bwd_speculative_guarded(k, beta, r, d0, eta, dd_final, cu_seqlens, phase2_grads, p1, outside, kept):
    """The backward after the speculative forward: the chunk form's backward, then, guarded by the forward's `outside`
    flag to run only if the clip acted, the clipped sequential scan again for its d_t (the forward stored none), and
    the sequential reverse scan into the same outputs. d_all is allocated here, after phase 2's backward has released
    its buffers, so below the forward+backward's peak. No host synchronisation, so it can be captured in a CUDA graph.
    (dk, dbeta, dr, dd0, deta [1, H])."""
    dk, dbeta, dr, dd0, deta_chunks = phase1_bwd_chunked(k, beta, r, eta, dd_final, cu_seqlens, phase2_grads, p1,
                                                         kept)
    d_all = torch.empty(k.shape, dtype=torch.float32, device=k.device)
    phase1_fwd_seq(k, beta, r, d0, eta, cu_seqlens=cu_seqlens, out=(d_all, torch.empty_like(dd0), None),
                   only_if=outside, **p1)
    deta_seq = torch.empty(dd0.shape[:2], dtype=torch.float32, device=k.device)
    phase1_bwd_seq(k, beta, r, eta, d_all, None, dd_final, cu_seqlens=cu_seqlens, phase2_grads=phase2_grads,
                   out=(dk, dbeta, dr, dd0, deta_seq), only_if=outside, **p1)
    deta = torch.where(outside.bool(), deta_seq.sum(0), deta_chunks.sum(0))  # the unchosen side may be garbage
    return dk, dbeta, dr, dd0, deta[None]


def phase2_grad_dtype(form: str, dtype: torch.dtype, has_r: bool) -> torch.dtype:
    """The dtype of phase 2's partial ∂k and total ∂k̃, which phase 1's backward `form` reads: k's where the chunk
    form's kernels (half the traffic in 16 bits) or APF's scan read them, float32 for the scan without r and the
    quasi-Newton form, whose builds ran slower on 16-bit inputs in the H200's suite (NOTES, after 2026-12-03 (3))."""
    return dtype if form in ("chunked", "speculative") or (form == "sequential" and has_r) else torch.float32


class ChunkOSDN(torch.autograd.Function):
    """The whole op: phase 1 (`phase1_fwd`, which also writes k̃ = d ⊙ k in k's dtype), then phase 2.

    Backward: phase 2's, then phase 1's. The sequential reverse scan takes ∂k̃ (∂d_t += ∂k̃_t ⊙ k_t,
    ∂k_t += ∂k̃_t ⊙ d_t) and adds phase 2's ∂k, ∂β, so that every gradient is summed in float32 and written once;
    the chunk form's backward does the same in its prep and output kernels.
    Inputs [B, T, H, ·] (B = 1 with cu_seqlens); `eta` [H] float32; `p1` phase 1's options.
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, g, r, S0, d0, eta, cu_seqlens, p1, scale, output_final_state, chunk_size,
                store_d):
        B, T = k.shape[:2]
        ctx.p1_form, d_all, d_final, kt, outside, p1_kept = phase1_fwd(k, beta, r, d0, eta, cu_seqlens, p1,
                                                                       store_d=store_d, chunk_size=chunk_size)
        if cu_seqlens is None:
            cu, layout = uniform_cu_seqlens(B, T, q.device), uniform_chunk_layout(B, T, chunk_size, q.device)
        else:
            cu, layout = cu_seqlens, chunk_layout(cu_seqlens, chunk_size)
        pk = lambda x: None if x is None else x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
        p1_inv, p1_stats, (x0, u) = p1_kept if p1_kept is not None else (None, None, (None, None))
        replay = None
        if kt is None:  # phase 1's chunk form left d and k̃ to phase 2's Gram (PHASE1_OUT_IN_GRAM)
            C1 = PHASE1_CHUNKED["chunk_size"]
            p1_offsets = None if cu_seqlens is None else chunk_layout(cu_seqlens, C1)[1]  # None: formed in the kernel
            replay = (pk(r), (x0, pk(u)), p1_offsets, C1,
                      None if p1_stats is None else p1_stats.reshape(2, B * T, -1), PHASE1_CHUNKED["precision"])
        o, S_final, Ainv, kt = phase2_fwd(pk(q), pk(k), pk(kt), pk(v), pk(beta), pk(g), S0, cu, scale,
                                          output_final_state, chunk_size, layout, replay)
        kt = kt.reshape(k.shape)
        ctx.save_for_backward(q, k, kt, v, beta, g, r, S0, d0, eta, cu_seqlens, cu, d_all, p1_inv, p1_stats, x0, u,
                              outside, Ainv, *layout)
        ctx.p1, ctx.scale, ctx.chunk_size = p1, scale, chunk_size
        ctx.set_materialize_grads(False)
        return o.reshape(v.shape), S_final, d_final

    @staticmethod
    def backward(ctx, do, dS_final, dd_final):
        (q, k, kt, v, beta, g, r, S0, d0, eta, cu_seqlens, cu, d_all, p1_inv, p1_stats, x0, u, outside, Ainv,
         *layout) = ctx.saved_tensors
        p1_kept = p1_inv, p1_stats, (x0, u)
        B, T = k.shape[:2]
        pk = lambda x: None if x is None else x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
        form = ctx.p1_form
        dq, dk2, dkt, dv, dbeta2, dg, dS0 = phase2_bwd(pk(q), pk(k), pk(kt), pk(v), pk(beta), pk(g), S0, cu, Ainv,
                                                       pk(do), dS_final, ctx.scale, ctx.chunk_size, layout,
                                                       phase2_grad_dtype(form, k.dtype, r is not None))
        dd_final = None if dd_final is None else dd_final.float().contiguous()
        if form == "newton":
            dk, dbeta, dr, dd0, deta = phase1_bwd_newton_guarded(k, beta, r, eta, d_all, dd_final, cu_seqlens,
                                                                 (dkt, dk2, dbeta2), ctx.p1)
        elif form == "speculative":
            dk, dbeta, dr, dd0, deta = phase1_bwd_speculative_guarded(k, beta, r, d0, eta, dd_final, cu_seqlens,
                                                                      (dkt, dk2, dbeta2), ctx.p1, outside, p1_kept)
        elif form == "chunked":
            dk, dbeta, dr, dd0, deta = phase1_bwd_chunked(k, beta, r, eta, dd_final, cu_seqlens, (dkt, dk2, dbeta2),
                                                          ctx.p1, p1_kept)
        else:
            dk, dbeta, dr, dd0, deta = phase1_bwd_seq(
                k, beta, r, eta, d_all, None, dd_final, cu_seqlens=cu_seqlens, phase2_grads=(dkt, dk2, dbeta2),
                **ctx.p1)
        shaped = lambda x, ref: None if x is None else x.reshape(ref.shape).to(ref.dtype)  # noqa: E731
        return (shaped(dq, q), dk, shaped(dv, v), dbeta, None if g is None else dg.reshape(g.shape),
                None if r is None else dr.to(r.dtype), None if S0 is None else dS0,
                None if d0 is None else dd0.to(d0.dtype), deta.sum(0), None, None, None, None, None, None)


def _check_runtime(q: torch.Tensor, chunk_size: int) -> None:
    if q.dtype not in DTYPES:
        raise ValueError(f"q, k, v: osdn_fast takes float32, bfloat16 or float16, got {q.dtype} "
                         "(osdn_ref.chunk_osdn runs any dtype)")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} for osdn_fast, got {chunk_size}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"q is on {q.device}: osdn_fast runs on CUDA, or on the CPU with TRITON_INTERPRET=1")


def chunk_osdn(q, k, v, beta, *, eta, g=None, r=None, scale=None, initial_state=None, output_final_state=False,
               d_min=None, d_max=None, beta_aware=True, normalize=True, chunk_size=64, cu_seqlens=None):
    """OSDN with Triton kernels; the arguments and result of `osdn_ref.chunk_osdn` (SPEC §4).

    q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H] → (o [B, T, H, V] in q's dtype,
    (S [N, H, K, V] float32, d [N, H, K] float32) or None). K, V ≤ 256; g None or GDN [B, T, H].
    """
    dims = validate_inputs(q, k, v, beta, eta=eta, g=g, r=r, scale=scale, initial_state=initial_state,
                           d_min=d_min, d_max=d_max, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                           max_k=MAX_K, max_v=MAX_V)
    if g is not None and g.dim() == 4:
        raise NotImplementedError("osdn_fast.chunk_osdn supports the scalar (GDN) gate g [B, T, H] only; "
                                  "for the per-channel (KDA) gate [B, T, H, K] use osdn_ref.chunk_osdn")
    _check_runtime(q, chunk_size)
    B, T, H, K, V = dims.B, dims.T, dims.H, dims.K, dims.V
    scale = K**-0.5 if scale is None else float(scale)
    S0, d0 = initial_state if initial_state is not None else (None, None)

    if isinstance(eta, torch.Tensor):
        eta = eta.reshape(-1).expand(H).float().contiguous()
    else:
        eta = torch.full((H,), float(eta), dtype=torch.float32, device=q.device)
    contig = lambda x: None if x is None else x.contiguous()  # noqa: E731
    p1 = dict(d_min=d_min, d_max=d_max, beta_aware=beta_aware, normalize=normalize)
    # d_all is read by the backward only: a call that autograd will not differentiate does not write it (inside
    # the Function, grad mode is off and needs_input_grad ignores torch.no_grad, so the choice is made here)
    store_d = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                              for x in (q, k, v, beta, g, r, S0, d0, eta))
    o, S, d_final = ChunkOSDN.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), contig(g), contig(r),
        None if S0 is None else S0.float().contiguous(), contig(d0), eta,
        None if cu_seqlens is None else cu_seqlens.to(torch.int32).contiguous(), p1, scale, output_final_state,
        chunk_size, store_d)
    return o, ((S, d_final) if output_final_state else None)

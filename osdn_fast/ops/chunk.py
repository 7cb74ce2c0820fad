"""`chunk_osdn` in Triton: phase 1 (the d scan), then the phase-2 WY chunkwise pass as one autograd Function.

    k̃ = d ⊙ k is formed in PyTorch between the phases (rounded to k's dtype), so autograd routes ∂k̃ into
    both d (phase 1) and k.

Phase 2 (this module's Function) runs on packed sequences [1, ΣT, H, ·]; a fixed-length batch is packed
as B sequences of length T. Forward: cumsum → wy → state → output; it keeps the chunks' A⁻¹ (C numbers
per token) for the backward. Backward recomputes W, U from A⁻¹ and the states, then: local ∂Ū (output) →
reverse state pass (state) → ∂q, ∂k̃, ∂W (output) → ∂k, ∂k̃, ∂v, ∂β, ∂G (wy) → ∂g (reverse cumsum).
"""
from __future__ import annotations

import os

import torch

from osdn_ref import validate_inputs

from .common import block_dims
from .cumsum import chunk_cumsum
from .index import chunk_layout, uniform_cu_seqlens
from .output import output_bwd, output_bwd_local, output_fwd
from .phase1 import preconditioner_scan
from .state import state_bwd, state_fwd
from .wy import wy_bwd, wy_fwd

MAX_K = 256
MAX_V = 256
CHUNK_SIZES = (16, 32, 64)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ChunkOSDNPhase2(torch.autograd.Function):
    """(q, k, k̃, v, β, g, S0) packed [1, ΣT, H, ·] → (o, S_final); gradients for all seven inputs."""

    @staticmethod
    def forward(ctx, q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state, chunk_size):
        chunk_indices, chunk_offsets = chunk_layout(cu_seqlens, chunk_size)
        BK, BV = block_dims(k.shape[-1], v.shape[-1])
        G = None if g is None else chunk_cumsum(g, cu_seqlens, chunk_indices, chunk_size)
        Ainv, w, u = wy_fwd(k, kt, v, beta, G, cu_seqlens, chunk_indices, chunk_size, BK, BV)
        h, ubar, S_final = state_fwd(w, u, kt, G, S0, cu_seqlens, chunk_offsets, chunk_indices.shape[0],
                                     chunk_size, BK, BV, output_final_state)
        o = output_fwd(q, kt, G, h, ubar, scale, cu_seqlens, chunk_indices, chunk_size, BK, BV)
        ctx.save_for_backward(q, k, kt, v, beta, g, S0, cu_seqlens, Ainv)
        ctx.scale, ctx.chunk_size = scale, chunk_size
        ctx.set_materialize_grads(False)
        return o, S_final

    @staticmethod
    def backward(ctx, do, dS_final):
        q, k, kt, v, beta, g, S0, cu_seqlens, Ainv = ctx.saved_tensors
        scale, C = ctx.scale, ctx.chunk_size
        if do is None:
            do = torch.zeros(*v.shape, dtype=q.dtype, device=q.device)
        do = do.contiguous()
        dS_final = None if dS_final is None else dS_final.float().contiguous()
        chunk_indices, chunk_offsets = chunk_layout(cu_seqlens, C)
        NT = chunk_indices.shape[0]
        BK, BV = block_dims(k.shape[-1], v.shape[-1])
        G = None if g is None else chunk_cumsum(g, cu_seqlens, chunk_indices, C)
        _, w, u = wy_fwd(k, kt, v, beta, G, cu_seqlens, chunk_indices, C, BK, BV, Ainv=Ainv)
        h, ubar, _ = state_fwd(w, u, kt, G, S0, cu_seqlens, chunk_offsets, NT, C, BK, BV, False)

        du_local = output_bwd_local(q, kt, G, do, scale, cu_seqlens, chunk_indices, C, BK, BV)
        dh, du, dS0 = state_bwd(q, kt, w, G, do, du_local, dS_final, scale, cu_seqlens, chunk_offsets, NT, C, BK, BV)
        dq, dkt, dw, dG = output_bwd(q, kt, G, h, dh, ubar, du, do, scale, cu_seqlens, chunk_indices, C, BK, BV)
        dk, dkt, dv, dbeta, dG = wy_bwd(k, kt, v, beta, G, Ainv, dw, du, dkt, dG, cu_seqlens, chunk_indices, C, BK, BV)
        dg = None if g is None else chunk_cumsum(dG, cu_seqlens, chunk_indices, C, reverse=True).to(g.dtype)
        return (dq.to(q.dtype), dk.to(k.dtype), dkt.to(kt.dtype), dv.to(v.dtype), dbeta.to(beta.dtype), dg,
                None if S0 is None else dS0, None, None, None, None)


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
        eta = eta.reshape(-1).expand(H)
    d_all, d_final = preconditioner_scan(k, beta, eta=eta, r=r, d0=d0, d_min=d_min, d_max=d_max,
                                         beta_aware=beta_aware, normalize=normalize, cu_seqlens=cu_seqlens)
    kt = (d_all * k).to(k.dtype)

    cu = uniform_cu_seqlens(B, T, q.device) if cu_seqlens is None else cu_seqlens.to(torch.int32)
    packed = lambda x: None if x is None else x.reshape(1, B * T, *x.shape[2:]).contiguous()  # noqa: E731
    o, S = ChunkOSDNPhase2.apply(
        packed(q), packed(k), packed(kt), packed(v), packed(beta), packed(g),
        None if S0 is None else S0.float().contiguous(), cu.contiguous(), scale, output_final_state, chunk_size)
    o = o.reshape(B, T, H, V)
    return o, ((S, d_final) if output_final_state else None)

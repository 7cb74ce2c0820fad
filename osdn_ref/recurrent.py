"""SPEC §2: OSDN as a token loop, the readable oracle.

Per token t (one head; heads and batch are independent):

    k̃_t = d_t ⊙ k_t                       write key, scaled by the pre-update d_t
    S'  = a_t ⊙ S_{t-1}                    a_t = exp(g_t): scalar (GDN) or per key channel (KDA)
    u_t = v_t − S'ᵀ k_t                    residual, read with the raw key
    S_t = S' + β_t k̃_t u_tᵀ               = S' − β_t ∇f_t(S') D_t
    o_t = S_tᵀ (scale · q_t)
    d_{t+1} = clip(r_t d_t − η ∇h_t(d_t), d_min, d_max)
"""
from __future__ import annotations

import torch

from .preconditioner import preconditioner_step, state_dtype
from .validate import validate_inputs
from .varlen import run_per_sequence


def delta_rule_step(S, k, k_tilde, v, beta, log_decay=None):
    """One memory write: S' = exp(g) ⊙ S, u = v − S'ᵀk, S_new = S' + β k̃ uᵀ.  S [B, H, K, V].

    `log_decay` is None, [B, H] (GDN) or [B, H, K] (KDA). Returns (S_new, u).
    """
    if log_decay is not None:
        a = log_decay.exp()
        S = S * (a[..., None, None] if a.dim() == 2 else a[..., None])
    u = v - torch.einsum("bhkv,bhk->bhv", S, k)
    return S + beta[..., None, None] * k_tilde[..., None] * u[..., None, :], u


def recurrent_osdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    eta,
    g: torch.Tensor | None = None,
    r: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    d_min: float | None = None,
    d_max: float | None = None,
    beta_aware: bool = True,
    normalize: bool = True,
    cu_seqlens: torch.Tensor | None = None,
):
    """OSDN token by token. q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H] → (o [B, T, H, V], final_state).

    final_state is (S [N, H, K, V], d [N, H, K]) in `state_dtype` when `output_final_state`, else None.
    """
    dims = validate_inputs(q, k, v, beta, eta=eta, g=g, r=r, scale=scale, initial_state=initial_state,
                           d_min=d_min, d_max=d_max, cu_seqlens=cu_seqlens)
    options = dict(eta=eta, scale=scale, d_min=d_min, d_max=d_max, beta_aware=beta_aware, normalize=normalize)
    if cu_seqlens is not None:
        return run_per_sequence(recurrent_osdn, q, k, v, beta, g=g, r=r, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens, **options)
    B, T, H, K, V = dims.B, dims.T, dims.H, dims.K, dims.V
    in_dtype, dt = q.dtype, state_dtype(q.dtype)
    scale = K**-0.5 if scale is None else scale
    S0, d0 = initial_state if initial_state is not None else (None, None)
    S = torch.zeros(B, H, K, V, dtype=dt, device=q.device) if S0 is None else S0.to(dt)
    d = torch.ones(B, H, K, dtype=dt, device=q.device) if d0 is None else d0.to(dt)
    q, k, v, beta = (x.to(dt) for x in (q, k, v, beta))
    g = None if g is None else g.to(dt)
    r = None if r is None else r.to(dt)
    eta = eta.to(dt) if isinstance(eta, torch.Tensor) else eta

    outputs = []
    for t in range(T):
        S, _ = delta_rule_step(S, k[:, t], d * k[:, t], v[:, t], beta[:, t], None if g is None else g[:, t])
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
        d = preconditioner_step(d, k[:, t], beta[:, t], eta=eta, r=None if r is None else r[:, t],
                                d_min=d_min, d_max=d_max, beta_aware=beta_aware, normalize=normalize)
    o = torch.stack(outputs, dim=1).to(in_dtype)
    return o, ((S, d) if output_final_state else None)

"""Phase 1 of OSDN: the diagonal preconditioner d_t, learned online by hypergradient descent (SPEC §2-3).

Everything here needs only the keys k_t, the gates β_t (and the APF retention r_t): never the memory S,
the values v_t or the residuals u_t. That decoupling is what lets phase 1 run before the memory pass.

Shapes follow fla: k [B, T, H, K], beta [B, T, H], d [B, H, K] (one step) or [B, T, H, K] (all steps).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

EPS = 1e-6  # ε of the normalised hypergradient: keeps zero keys finite


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """States and accumulations are at least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def surrogate_loss(d: torch.Tensor, k: torch.Tensor, beta: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """h_t(d) = ((1 − β_t ⟨d, k_t²⟩)² − 1) / (2 (‖k_t‖² + ε)).

    The closed form of (f_t(S_t) − f_t(S')) / ‖∇f_t(S')‖_F², the relative change of the inner loss
    f_t(S) = ½‖Sᵀk_t − v_t‖² made by the write with k̃ = d ⊙ k. It is independent of S, v_t and u_t.
    """
    s = (d * k * k).sum(-1)
    return ((1 - beta * s) ** 2 - 1) / (2 * ((k * k).sum(-1) + eps))


def surrogate_grad(
    d: torch.Tensor,
    k: torch.Tensor,
    beta: torch.Tensor,
    *,
    beta_aware: bool = True,
    normalize: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """∇h_t = −b_t (1 − b_t ⟨d, k_t²⟩) k_t² / (‖k_t‖² + ε), with b_t = β_t (beta_aware) or 1.

    With beta_aware and normalize this is exactly ∇_d surrogate_loss; without normalize the
    denominator is 1; without beta_aware it is the authors' DeltaNet form (1 − ⟨d, k²⟩) k².
    """
    b = beta.unsqueeze(-1) if beta_aware else torch.ones_like(beta).unsqueeze(-1)
    k2 = k * k
    s = (d * k2).sum(-1, keepdim=True)
    grad = -b * (1 - b * s) * k2
    if normalize:
        grad = grad / (k2.sum(-1, keepdim=True) + eps)
    return grad


def preconditioner_step(
    d: torch.Tensor,
    k: torch.Tensor,
    beta: torch.Tensor,
    *,
    eta,
    r: torch.Tensor | None = None,
    d_min: float | None = None,
    d_max: float | None = None,
    beta_aware: bool = True,
    normalize: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """d_{t+1} = clip(r_t d_t − η ∇h_t(d_t), d_min, d_max)  (one token; d, k [B, H, K], beta, r [B, H]).

    r = None is OSDN (r_t = 1); r in (0, 1] is OSDN-APF. `eta` is a float or a per-head tensor [H].
    Descent (− η ∇h) grows d along k² while β⟨d, k²⟩ < 1: it shrinks the post-write residual.
    """
    eta = eta.reshape(-1, 1) if isinstance(eta, torch.Tensor) else eta
    decayed = d if r is None else r.unsqueeze(-1) * d
    d_next = decayed - eta * surrogate_grad(d, k, beta, beta_aware=beta_aware, normalize=normalize, eps=eps)
    if d_min is not None or d_max is not None:
        d_next = torch.clamp(d_next, min=d_min, max=d_max)
    return d_next


class Phase1(NamedTuple):
    """Result of the preconditioner scan."""

    d: torch.Tensor  # [B, T, H, K]: d_t used at token t (built from tokens < t)
    k_tilde: torch.Tensor  # [B, T, H, K]: the write keys k̃_t = d_t ⊙ k_t
    d_final: torch.Tensor  # [B, H, K]: d_T, the state after the last token


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
    eps: float = EPS,
) -> Phase1:
    """Phase 1: run `preconditioner_step` over the key stream; d_0 = 1 unless `d0` [B, H, K] is given.

    Computed in `state_dtype(k.dtype)`; the write keys come back in the same dtype.
    """
    B, T, H, K = k.shape
    dt = state_dtype(k.dtype)
    k, beta = k.to(dt), beta.to(dt)
    r = None if r is None else r.to(dt)
    eta = eta.to(dt) if isinstance(eta, torch.Tensor) else eta
    d = torch.ones(B, H, K, dtype=dt, device=k.device) if d0 is None else d0.to(dt)
    ds = []
    for t in range(T):
        ds.append(d)
        d = preconditioner_step(
            d, k[:, t], beta[:, t], eta=eta, r=None if r is None else r[:, t],
            d_min=d_min, d_max=d_max, beta_aware=beta_aware, normalize=normalize, eps=eps,
        )
    d_all = torch.stack(ds, dim=1)
    return Phase1(d=d_all, k_tilde=d_all * k, d_final=d)


def phase1_as_delta_rule(
    k: torch.Tensor,
    beta: torch.Tensor,
    *,
    eta,
    beta_aware: bool = True,
    normalize: bool = True,
    eps: float = EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rewrite the unclipped phase-1 step as a vector-state delta rule (SPEC §3).

    d_t − η∇h_t = d_t + c_t a_t (y_t − ⟨d_t, a_t⟩) with key a_t = k_t², gate c_t = η b_t² / (‖k_t‖² + ε)
    and target y_t = 1 / b_t (b_t = β_t or 1). Returns (a, c, y): [B, T, H, K], [B, T, H], [B, T, H].
    Needs b_t > 0 (y is 1/b).
    """
    b = beta if beta_aware else torch.ones_like(beta)
    a = k * k
    denom = a.sum(-1) + eps if normalize else torch.ones_like(b)
    eta = eta.reshape(-1) if isinstance(eta, torch.Tensor) else eta
    return a, eta * b * b / denom, 1 / b


def vector_delta_rule(
    a: torch.Tensor,
    c: torch.Tensor,
    y: torch.Tensor,
    *,
    r: torch.Tensor | None = None,
    d0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule with a vector state: d_{t+1} = r_t d_t + c_t a_t (y_t − ⟨d_t, a_t⟩).

    a [B, T, H, K], c, y, r [B, T, H]. Returns (d_t for every t [B, T, H, K], d_T [B, H, K]).
    """
    B, T, H, K = a.shape
    d = torch.ones(B, H, K, dtype=a.dtype, device=a.device) if d0 is None else d0
    ds = []
    for t in range(T):
        ds.append(d)
        decayed = d if r is None else r[:, t, :, None] * d
        err = y[:, t] - (d * a[:, t]).sum(-1)
        d = decayed + (c[:, t] * err).unsqueeze(-1) * a[:, t]
    return torch.stack(ds, dim=1), d

"""The paper's mechanism diagnostic: per-token residual ratios and their geometric mean q_geo."""
from __future__ import annotations

import torch

TINY = 1e-30  # floor for log ρ: an exact gated-Newton write gives ρ = 0


def residual_ratios(d: torch.Tensor, k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """ρ_t = f_t(S_t) / f_t(S') = (1 − β_t ⟨d_t, k_t²⟩)².

    The write leaves the residual S_tᵀk_t − v_t = −(1 − β_t⟨d_t, k_t²⟩) u_t, whatever S' and v_t are.
    d, k [..., K] (d_t as used at token t), beta [...].
    """
    return (1 - beta * (d * k * k).sum(-1)) ** 2


def q_geo(rho: torch.Tensor, dim=None) -> torch.Tensor:
    """q_geo = exp(mean_t log ρ_t), the geometric-mean contraction per token (lower is faster)."""
    log_rho = rho.clamp_min(TINY).log()
    return (log_rho.mean() if dim is None else log_rho.mean(dim)).exp()

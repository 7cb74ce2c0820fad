"""The OSDN token-mixing layer, fla style (DeltaNet / Gated DeltaNet with an optional online preconditioner).

    q, k, v = SiLU(ShortConv(W_q x)), SiLU(ShortConv(W_k x)), SiLU(ShortConv(W_v x))   per head
    q, k    ← q/‖q‖, k/‖k‖            β = σ(W_β x)
    g       = −exp(A_log) · softplus(W_a x + dt_bias)                    (GDN only: scalar log-decay per head)
    r       = σ(W_r x + b_r)           W_r = 0, b_r = 6.9 at init          (APF only: retention per head)
    o, _    = OSDN(q, k, v, β; η, g, r, d_0, d_min, d_max)                SPEC §2 (η = 0, d_0 = 1 when 'off')
    y       = W_o RMSNorm(o)           norm per head

fla's GDN layer also gates its output (SiLU gate inside the norm); it is left out here, so that the two
backbones differ only by the decay g. With preconditioner 'off' the op runs with η = 0 and d_0 = 1: exactly
DeltaNet (or GDN). 'osdn' learns d_0
(ones(H, K)) and uses η (fixed, or learnable per head as η = exp(log η)); 'apf' adds the retention gate r.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import osdn_ref

BACKBONES = ("deltanet", "gdn")
PRECONDITIONERS = ("off", "osdn", "apf")
MODES = ("chunk", "recurrent")
KERNELS = ("auto", "ref", "fast")


class ShortConv(nn.Module):
    """Causal depthwise convolution over time followed by SiLU: y_t = SiLU(Σ_{i<w} c_i ⊙ x_{t−i}).  x [B, T, C].

    The result is contiguous [B, T, C], as fla's ShortConvolution returns it: heads split from it are [B, T, H, K]
    with K contiguous, so the L2 norms reduce contiguous rows and the ops take q, k, v without a copy. `kernel`
    'fast' (and 'auto' on CUDA) runs osdn_fast.nn.short_conv's Triton kernels in that layout; 'ref' (and 'auto'
    elsewhere) runs conv1d on [B, C, T] and copies back, which on an H100 took 12-14× the Triton forward's time and
    5.0-5.7× its forward+backward's (benchmarks/NOTES.md, "The Triton short convolution on a GPU")."""

    def __init__(self, channels: int, width: int = 4, kernel: str = "auto"):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=False)
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "fast" or (self.kernel == "auto" and x.device.type == "cuda"):
            from osdn_fast.nn.short_conv import short_conv

            return short_conv(x, self.conv.weight)
        T = x.shape[1]
        return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2).contiguous())


def chunk_op(device: torch.device, kernel: str):
    """The chunkwise op: osdn_fast's Triton op (imported only when used) on CUDA, osdn_ref's elsewhere."""
    if kernel == "fast" or (kernel == "auto" and device.type == "cuda"):
        from osdn_fast import chunk_osdn

        return chunk_osdn
    return osdn_ref.chunk_osdn


class OSDNLayer(nn.Module):
    """Token mixing with the delta rule, optionally preconditioned online (SPEC §2). x [B, T, D] → [B, T, D]."""

    def __init__(
        self,
        d_model: int,
        num_heads: int = 2,
        *,
        head_dim: int | None = None,
        backbone: str = "deltanet",
        preconditioner: str = "off",
        eta: float = 0.003,
        learn_eta: bool = False,
        beta_aware: bool = True,
        d_min: float = 2 / 3,
        d_max: float = 1.5,
        conv_size: int = 4,
        mode: str = "chunk",
        chunk_size: int = 64,
        kernel: str = "auto",
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        for name, value, allowed in (("backbone", backbone, BACKBONES), ("preconditioner", preconditioner,
                                     PRECONDITIONERS), ("mode", mode, MODES), ("kernel", kernel, KERNELS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        H = num_heads
        K = head_dim or d_model // num_heads
        self.H, self.K = H, K
        self.backbone, self.preconditioner, self.mode, self.kernel = backbone, preconditioner, mode, kernel
        self.beta_aware, self.d_min, self.d_max, self.chunk_size = beta_aware, d_min, d_max, chunk_size

        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, H * K, bias=False) for _ in range(3))
        self.q_conv, self.k_conv, self.v_conv = (ShortConv(H * K, conv_size, kernel) for _ in range(3))
        self.b_proj = nn.Linear(d_model, H, bias=False)
        if backbone == "gdn":  # fla's GDN initialisation: A ~ U(0, 16), dt ~ logU(1e-3, 0.1), dt_bias = softplus⁻¹(dt)
            self.a_proj = nn.Linear(d_model, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H).uniform_(0, 16).log())
            dt = torch.empty(H).uniform_(math.log(1e-3), math.log(0.1)).exp().clamp_min(1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        if preconditioner != "off":
            self.d0 = nn.Parameter(torch.ones(H, K))
            log_eta = torch.full((H,), math.log(eta))
            self.log_eta = nn.Parameter(log_eta) if learn_eta else None
            self.eta = None if learn_eta else float(eta)
        if preconditioner == "apf":
            self.r_proj = nn.Linear(d_model, H)
            nn.init.zeros_(self.r_proj.weight)
            nn.init.constant_(self.r_proj.bias, 6.9)
        self.o_norm = nn.RMSNorm(K, eps=norm_eps)
        self.o_proj = nn.Linear(H * K, d_model, bias=False)
        self.record = False  # when True, forward keeps what `diagnostics` needs
        self.last = None

    def gates(self, x: torch.Tensor):
        """(q, k, v [B, T, H, K], β [B, T, H], g or None, r or None) from x [B, T, D]."""
        B, T, _ = x.shape
        heads = lambda y: y.view(B, T, self.H, self.K)  # noqa: E731
        q = F.normalize(heads(self.q_conv(self.q_proj(x))), dim=-1)
        k = F.normalize(heads(self.k_conv(self.k_proj(x))), dim=-1)
        v = heads(self.v_conv(self.v_proj(x)))
        beta = torch.sigmoid(self.b_proj(x))
        g = None
        if self.backbone == "gdn":
            g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        r = torch.sigmoid(self.r_proj(x)) if self.preconditioner == "apf" else None
        return q, k, v, beta, g, r

    def eta_value(self):
        """η as the op takes it: 0.0 ('off'), a float, or the learnable per-head tensor exp(log η) [H]."""
        if self.preconditioner == "off":
            return 0.0
        return self.eta if self.log_eta is None else self.log_eta.exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v, beta, g, r = self.gates(x)
        d0 = None if self.preconditioner == "off" else self.d0.unsqueeze(0).expand(B, -1, -1)
        clip = {} if self.preconditioner == "off" else dict(d_min=self.d_min, d_max=self.d_max)
        S0 = torch.zeros(B, self.H, self.K, self.K, dtype=torch.float32, device=x.device)
        d_init = torch.ones(B, self.H, self.K, dtype=torch.float32, device=x.device) if d0 is None else d0
        if self.mode == "recurrent":
            op, extra = osdn_ref.recurrent_osdn, {}
        else:
            op, extra = chunk_op(x.device, self.kernel), dict(chunk_size=self.chunk_size)
        o, _ = op(q, k, v, beta, eta=self.eta_value(), g=g, r=r, initial_state=(S0, d_init),
                  beta_aware=self.beta_aware, **clip, **extra)
        if self.record:
            self.last = dict(k=k.detach(), beta=beta.detach(), r=None if r is None else r.detach(),
                             d0=d_init.detach())
        return self.o_proj(self.o_norm(o.to(x.dtype)).reshape(B, T, self.H * self.K))

    @torch.no_grad()
    def diagnostics(self) -> dict:
        """From the last recorded forward: d_t (phase 1 again), ρ_t = (1 − β_t⟨d_t, k_t²⟩)², q_geo, clip fraction.

        The clip fraction counts d coordinates at d_min or d_max over t ≥ 1 (d_0 is learned, not clipped).
        """
        if self.last is None:
            raise RuntimeError("set layer.record = True and run a forward pass first")
        k, beta, r, d0 = (self.last[n] for n in ("k", "beta", "r", "d0"))
        dt = torch.promote_types(k.dtype, torch.float32)
        k, beta, d0 = k.to(dt), beta.to(dt), d0.to(dt)
        if self.preconditioner == "off":
            d = torch.ones_like(k)
        else:
            eta = self.eta_value()
            eta = eta.detach().to(dt) if isinstance(eta, torch.Tensor) else eta
            d = osdn_ref.preconditioner_scan(k, beta, eta=eta, r=r, d0=d0, d_min=self.d_min,
                                             d_max=self.d_max, beta_aware=self.beta_aware).d
        rho = osdn_ref.residual_ratios(d, k, beta)
        later = d[:, 1:]
        if self.preconditioner == "off" or later.numel() == 0:
            clipped = 0.0
        else:
            tol = 1e-6
            clipped = ((later <= self.d_min + tol) | (later >= self.d_max - tol)).float().mean().item()
        return dict(d=d, rho=rho, q_geo=osdn_ref.q_geo(rho).item(), clip_fraction=clipped,
                    d_mean=d.mean().item(), beta_mean=beta.mean().item())

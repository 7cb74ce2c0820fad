"""SPEC §3: the chunkwise (WY) form of OSDN in plain PyTorch, stage by stage as the kernels do it.

For a chunk of C tokens entering with state S (no decay):

    L  = strict_lower(diag(b) K K̃ᵀ)        L_ij = b_i ⟨k_i, k̃_j⟩, j < i
    T  = (I + L)⁻¹ diag(b)                 the UT transform
    W  = T K ;  U = T V                    W uses the RAW key
    Ū  = U − W S
    O  = scale · (Q S + lower_incl(Q K̃ᵀ) Ū)
    S ← S + K̃ᵀ Ū

With log-decay g (GDN scalar or KDA per channel) let G_i = Σ_{j≤i} g_j inside the chunk. Every pairwise
product ⟨x_i, y_j⟩ becomes Σ_c x_ic y_jc exp(G_ic − G_jc), reads of the entering state use
x_i ⊙ exp(G_i), and the state leaves as exp(G_C) ⊙ S + Σ_j (exp(G_C − G_j) ⊙ k̃_j) ū_jᵀ.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .preconditioner import preconditioner_scan, state_dtype
from .validate import validate_inputs
from .varlen import run_per_sequence


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, H, ...] → [B, H, NC, C, ...], zero-padded to a whole number of chunks.

    Zero padding is exact: a padded token has k = k̃ = 0, β = 0 and g = 0, so it writes and decays nothing.
    """
    T = x.shape[1]
    pad = (-T) % chunk_size
    x = x.movedim(1, 2)  # [B, H, T, ...]
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])


def decayed_gram(x: torch.Tensor, y: torch.Tensor, G: torch.Tensor, diagonal: int) -> torch.Tensor:
    """M_ij = Σ_c x_ic y_jc exp(G_ic − G_jc) for j ≤ i + diagonal (0: inclusive, −1: strict), else 0.

    x, y [..., C, K]; G [..., C, 1] (no decay or GDN) or [..., C, K] (KDA). The exponent is masked
    before exp, so no upper-triangle term can overflow.
    """
    C = x.shape[-2]
    keep = torch.ones(C, C, dtype=torch.bool, device=x.device).tril(diagonal)
    diff = (G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~keep[..., None], float("-inf"))  # [..., C, C, K|1]
    if G.shape[-1] == 1:
        return (x @ y.transpose(-1, -2)) * diff[..., 0].exp()
    return torch.einsum("...ik,...jk,...ijk->...ij", x, y, diff.exp())


def ut_transform(L: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """T = (I + L)⁻¹ diag(β) for strictly lower L [..., C, C]: a unit-triangular solve (forward substitution)."""
    C = L.shape[-1]
    eye = torch.eye(C, dtype=L.dtype, device=L.device)
    return torch.linalg.solve_triangular(eye + L, torch.diag_embed(beta), upper=False, unitriangular=True)


def wy_representation(k, k_tilde, v, beta, G):
    """W = T (K ⊙ e^G) and U = T V with T = (I + L)⁻¹ diag(β), L = strict_lower(diag(β) decayed K K̃ᵀ).

    All inputs are chunked ([B, H, NC, C, ...]); G [..., C, 1 | K] is the in-chunk cumulative log-decay.
    """
    L = beta.unsqueeze(-1) * decayed_gram(k, k_tilde, G, diagonal=-1)
    T = ut_transform(L, beta)
    return T @ (k * G.exp()), T @ v


def state_pass(W, U, k_tilde, G, S0):
    """Sequential over chunks: Ū_n = U_n − W_n S_n, S_{n+1} = e^{G_C} ⊙ S_n + (K̃ ⊙ e^{G_C − G})ᵀ Ū_n.

    Returns (S entering each chunk [B, H, NC, K, V], Ū [B, H, NC, C, V], final S [B, H, K, V]).
    """
    S, entering, U_bar = S0, [], []
    for n in range(W.shape[2]):
        entering.append(S)
        u = U[:, :, n] - W[:, :, n] @ S
        G_last = G[:, :, n, -1:]  # [B, H, 1, K|1]
        S = G_last.transpose(-1, -2).exp() * S + (k_tilde[:, :, n] * (G_last - G[:, :, n]).exp()).transpose(-1, -2) @ u
        U_bar.append(u)
    return torch.stack(entering, dim=2), torch.stack(U_bar, dim=2), S


def chunk_output(q, k_tilde, U_bar, S_entering, G, scale):
    """O = scale · ((Q ⊙ e^G) S + lower_incl(decayed Q K̃ᵀ) Ū), per chunk."""
    return scale * ((q * G.exp()) @ S_entering + decayed_gram(q, k_tilde, G, diagonal=0) @ U_bar)


def memory_pass(q, k, k_tilde, v, beta, *, g=None, scale, S0, chunk_size):
    """Phase 2: the WY chunkwise memory pass with read key k and write key k̃ (all [B, T, H, ·]).

    Returns (o [B, T, H, V], S_T [B, H, K, V]); g is None, [B, T, H] (GDN) or [B, T, H, K] (KDA).
    """
    B, T, H, V = v.shape
    if g is None:
        g = q.new_zeros(B, T, H, 1)
    elif g.dim() == 3:
        g = g.unsqueeze(-1)
    G = to_chunks(g.to(q.dtype), chunk_size).cumsum(-2)  # [B, H, NC, C, 1 | K]
    qc, kc, ktc, vc = (to_chunks(x, chunk_size) for x in (q, k, k_tilde, v))
    W, U = wy_representation(kc, ktc, vc, to_chunks(beta, chunk_size), G)
    S_entering, U_bar, S_final = state_pass(W, U, ktc, G, S0)
    o = chunk_output(qc, ktc, U_bar, S_entering, G, scale)  # [B, H, NC, C, V]
    return o.reshape(B, H, -1, V)[:, :, :T].movedim(2, 1), S_final


def chunk_osdn(
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
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
):
    """OSDN in two phases: the d scan (phase 1), then the WY chunkwise memory pass (phase 2).

    Same arguments and result as `recurrent_osdn`, plus `chunk_size`; exact for any T.
    """
    dims = validate_inputs(q, k, v, beta, eta=eta, g=g, r=r, scale=scale, initial_state=initial_state,
                           d_min=d_min, d_max=d_max, cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    options = dict(eta=eta, scale=scale, d_min=d_min, d_max=d_max, beta_aware=beta_aware,
                   normalize=normalize, chunk_size=chunk_size)
    if cu_seqlens is not None:
        return run_per_sequence(chunk_osdn, q, k, v, beta, g=g, r=r, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens, **options)
    B, T, H, K, V = dims.B, dims.T, dims.H, dims.K, dims.V
    in_dtype, dt = q.dtype, state_dtype(q.dtype)
    scale = K**-0.5 if scale is None else scale
    S0, d0 = initial_state if initial_state is not None else (None, None)
    S0 = torch.zeros(B, H, K, V, dtype=dt, device=q.device) if S0 is None else S0.to(dt)
    q, k, v, beta = (x.to(dt) for x in (q, k, v, beta))

    phase1 = preconditioner_scan(k, beta, eta=eta, r=r, d0=d0, d_min=d_min, d_max=d_max,
                                 beta_aware=beta_aware, normalize=normalize)

    o, S_final = memory_pass(q, k, phase1.k_tilde, v, beta, g=g, scale=scale, S0=S0, chunk_size=chunk_size)
    o = o.to(in_dtype)
    return o, ((S_final, phase1.d_final) if output_final_state else None)

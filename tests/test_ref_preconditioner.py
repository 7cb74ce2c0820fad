"""osdn_ref phase 1: the surrogate h_t, its gradient, the d step, the vector-delta-rule view, and ρ_t / q_geo.

The surrogate is checked against its *definition* (f_t(S_t) − f_t(S')) / ‖∇f_t(S')‖_F² evaluated on
memory states that the reference itself produced, not against a second copy of the closed form.
"""
import torch
from hypothesis import given
from hypothesis import strategies as st

from osdn_ref import (
    delta_rule_step,
    phase1_as_delta_rule,
    preconditioner_scan,
    preconditioner_step,
    q_geo,
    recurrent_osdn,
    rel_err,
    residual_ratios,
    surrogate_grad,
    surrogate_loss,
    vector_delta_rule,
)
from strategies import problems

f64 = dict(dtypes=(torch.float64,))


def inner_loss(S, k, v):
    """f_t(S) = ½‖Sᵀk − v‖² per (batch, head). S [B, H, K, V], k [B, H, K], v [B, H, V]."""
    return 0.5 * (torch.einsum("bhkv,bhk->bhv", S, k) - v).pow(2).sum(-1)


def last_token_write(p):
    """Run the reference over tokens < T−1, then write token T−1 by hand: (S', S_t, d_t, k, v, β)."""
    B, T, H, K, V = p.dims
    opts = {**p.options, "output_final_state": True}
    g, r = opts.pop("g", None), opts.pop("r", None)
    if T > 1:
        _, (S_prev, d) = recurrent_osdn(*(x[:, :-1] for x in p.args()), g=None if g is None else g[:, :-1],
                                        r=None if r is None else r[:, :-1], **opts)
    else:
        S0, d0 = p.options.get("initial_state") or (None, None)
        S_prev = torch.zeros(B, H, K, V, dtype=torch.float64) if S0 is None else S0
        d = torch.ones(B, H, K, dtype=torch.float64) if d0 is None else d0
    k, v, beta = p.k[:, -1], p.v[:, -1], p.beta[:, -1]
    log_decay = None if g is None else g[:, -1]
    S_new, u = delta_rule_step(S_prev, k, d * k, v, beta, log_decay)
    S_decayed, _ = delta_rule_step(S_prev, k, torch.zeros_like(k), v, beta, log_decay)  # a write of zero: S'
    return S_decayed, S_new, u, d, k, v, beta


@given(p=problems(**f64))
def test_surrogate_matches_its_definition_on_real_states(p):
    S_decayed, S_new, u, d, k, v, beta = last_token_write(p)
    f_before, f_after = inner_loss(S_decayed, k, v), inner_loss(S_new, k, v)
    grad_f = k.unsqueeze(-1) * (-u).unsqueeze(-2)  # ∇f_t(S') = k (S'ᵀk − v)ᵀ = −k uᵀ
    definition = (f_after - f_before) / grad_f.pow(2).sum((-1, -2))
    # f_t(S_t) − f_t(S') cancels when β⟨d, k²⟩ is tiny: compare on h's natural scale 1 / (2‖k‖²)
    h_scale = 1 / (2 * (k * k).sum(-1))
    assert torch.all((surrogate_loss(d, k, beta, eps=0.0) - definition).abs() <= 1e-10 * h_scale)
    assert torch.all((surrogate_loss(d, k, beta) - definition).abs() <= 1e-5 * h_scale)  # ε of the normalisation


@given(p=problems(**f64))
def test_residual_ratios_match_real_states(p):
    """ρ_t = f_t(S_t) / f_t(S') at every token, from states written by the reference's own step."""
    B, T, H, K, V = p.dims
    S0, d0 = p.options.get("initial_state") or (None, None)
    phase1 = preconditioner_scan(p.k, p.beta, eta=p.options["eta"], r=p.options.get("r"), d0=d0,
                                 d_min=p.options["d_min"], d_max=p.options["d_max"],
                                 beta_aware=p.options["beta_aware"], normalize=p.options["normalize"])
    S = torch.zeros(B, H, K, V, dtype=torch.float64) if S0 is None else S0
    g = p.options.get("g")
    ratios = []
    for t in range(T):
        k, v, beta = p.k[:, t], p.v[:, t], p.beta[:, t]
        log_decay = None if g is None else g[:, t]
        S_decayed, _ = delta_rule_step(S, k, torch.zeros_like(k), v, beta, log_decay)
        S, _ = delta_rule_step(S, k, phase1.k_tilde[:, t], v, beta, log_decay)
        ratios.append(inner_loss(S, k, v) / inner_loss(S_decayed, k, v))
    expected = torch.stack(ratios, dim=1)
    rho = residual_ratios(phase1.d, p.k, p.beta)
    assert rel_err(rho, expected) <= 1e-9
    n = min(T, 20)  # a product of 20 ratios stays far from underflow
    assert rel_err(q_geo(rho[:, :n]), expected[:, :n].prod() ** (1 / expected[:, :n].numel())) <= 1e-9


@given(p=problems(**f64))
def test_surrogate_grad_is_autograd_of_surrogate_loss(p):
    k, beta = p.k[:, 0], p.beta[:, 0]
    B, T, H, K, V = p.dims
    d = (0.5 + torch.rand(B, H, K, generator=torch.Generator().manual_seed(K), dtype=torch.float64))
    d.requires_grad_(True)
    (auto,) = torch.autograd.grad(surrogate_loss(d, k, beta).sum(), d)
    assert rel_err(surrogate_grad(d, k, beta, beta_aware=True, normalize=True), auto) <= 1e-12
    # the other flags are the same formula with b = 1 and/or denominator 1
    ones = torch.ones_like(beta)
    norm = (k * k).sum(-1, keepdim=True) + 1e-6
    free = surrogate_grad(d, k, beta, beta_aware=False, normalize=True)
    assert rel_err(free, surrogate_grad(d, k, ones)) <= 1e-12
    assert rel_err(surrogate_grad(d, k, beta, normalize=False), auto * norm) <= 1e-10


@given(p=problems(**f64), data=st.data())
def test_step_is_the_spec_update(p, data):
    """d_{t+1} = clip(r_t d_t + η b_t (1 − b_t⟨d_t, k_t²⟩) k_t² / (‖k_t‖² + ε), d_min, d_max), written out."""
    o = p.options
    B, T, H, K, V = p.dims
    d = 0.5 + torch.rand(B, H, K, generator=torch.Generator().manual_seed(T), dtype=torch.float64)
    t = data.draw(st.integers(0, T - 1))
    k, beta, r = p.k[:, t], p.beta[:, t], (o["r"][:, t] if "r" in o else torch.ones_like(p.beta[:, t]))
    b = beta if o["beta_aware"] else torch.ones_like(beta)
    denom = (k * k).sum(-1) + 1e-6 if o["normalize"] else torch.ones_like(beta)
    eta = o["eta"].reshape(1, H) if isinstance(o["eta"], torch.Tensor) else o["eta"]
    step = (eta * b * (1 - b * (d * k * k).sum(-1)) / denom).unsqueeze(-1) * k * k
    expected = r.unsqueeze(-1) * d + step
    if o["d_min"] is not None:
        expected = torch.maximum(expected, torch.tensor(o["d_min"], dtype=torch.float64))
    if o["d_max"] is not None:
        expected = torch.minimum(expected, torch.tensor(o["d_max"], dtype=torch.float64))
    d_next = preconditioner_step(d, k, beta, eta=o["eta"], r=o["r"][:, t] if "r" in o else None,
                                 d_min=o["d_min"], d_max=o["d_max"], beta_aware=o["beta_aware"],
                                 normalize=o["normalize"])
    assert rel_err(d_next, expected) <= 1e-14


@given(p=problems(**f64), eta=st.floats(1e-4, 1e-2))
def test_step_descends_the_surrogate(p, eta):
    """A small step −η∇h lowers h (the sign of SPEC §2: descent, not ascent), unless ∇h = 0."""
    d, k, beta = torch.ones_like(p.k[:, 0]), p.k[:, 0], p.beta[:, 0]
    d_next = preconditioner_step(d, k, beta, eta=eta)
    grad = surrogate_grad(d, k, beta)
    expected_drop = eta * grad.pow(2).sum(-1)
    drop = surrogate_loss(d, k, beta) - surrogate_loss(d_next, k, beta)
    assert torch.all(drop >= 0.5 * expected_drop - 1e-14)
    # and it moves toward the gated-Newton point: ρ does not grow
    assert torch.all(residual_ratios(d_next, k, beta) <= residual_ratios(d, k, beta) + 1e-15)


@given(p=problems(**f64))
def test_gated_newton_point_zeroes_the_residual(p):
    """β⟨d, k²⟩ = 1 makes the write exact: S_tᵀk_t = v_t, ρ_t = 0, ∇h_t = 0, h_t at its minimum."""
    S_decayed, _, _, d, k, v, beta = last_token_write(p)
    d_any = 0.5 + torch.rand(d.shape, generator=torch.Generator().manual_seed(d.numel()), dtype=d.dtype)
    d_newton = d_any / (beta * (d_any * k * k).sum(-1)).unsqueeze(-1)
    S_new, u = delta_rule_step(S_decayed, k, d_newton * k, v, beta)  # S' is already decayed
    residual = torch.einsum("bhkv,bhk->bhv", S_new, k) - v
    assert residual.abs().max() <= 1e-10 * (1 + u.abs().max())
    assert residual_ratios(d_newton, k, beta).max() <= 1e-20
    assert surrogate_grad(d_newton, k, beta, eps=0.0).abs().max() <= 1e-12
    minimum = -1 / (2 * (k * k).sum(-1))
    assert rel_err(surrogate_loss(d_newton, k, beta, eps=0.0), minimum) <= 1e-12


@given(p=problems(**f64, clip=False))
def test_phase1_is_a_vector_delta_rule(p):
    """Unclipped phase 1 equals the delta rule with state d, key k², gate ηb²/(‖k‖²+ε), target 1/b (SPEC §3)."""
    o = p.options
    S0, d0 = o.get("initial_state") or (None, None)
    phase1 = preconditioner_scan(p.k, p.beta, eta=o["eta"], r=o.get("r"), d0=d0,
                                 beta_aware=o["beta_aware"], normalize=o["normalize"])
    a, c, y = phase1_as_delta_rule(p.k, p.beta, eta=o["eta"], beta_aware=o["beta_aware"], normalize=o["normalize"])
    d_all, d_final = vector_delta_rule(a, c, y, r=o.get("r"), d0=d0)
    assert rel_err(d_all, phase1.d) <= 1e-12
    assert rel_err(d_final, phase1.d_final) <= 1e-12
    assert rel_err(phase1.k_tilde, phase1.d * p.k) <= 1e-15

"""η = 0 is exactly DeltaNet (and, with a log-decay g, Gated DeltaNet / KDA): SPEC §2, d_0 = 1.
And for any η, OSDN is that same delta rule with the write key k̃_t = d_t ⊙ k_t, d_t from the phase-1 scan.

The reference below is written independently of osdn_ref: one head at a time, the state update in its
matrix form S ← (I − β k̃ kᵀ) diag(a) S + β k̃ vᵀ (k̃ = k for DeltaNet), the output S_tᵀ (scale · q_t).
"""
import torch
from hypothesis import given
from hypothesis import strategies as st

from osdn_ref import chunk_osdn, preconditioner_scan, recurrent_osdn, rel_err
from strategies import chunk_sizes, problems

TOL = {torch.float64: 1e-10, torch.float32: 2e-5}  # float32: the tolerance of test_ref_chunk


def plain_delta_rule(q, k, v, beta, g=None, scale=None, S0=None, k_write=None):
    """Gated delta rule, head by head in float64. g: None, [B, T, H] or [B, T, H, K] (log-decay).

    k_write [B, T, H, K]: the key the write stores along (default k: DeltaNet); the read always uses k.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, beta = (x.double() for x in (q, k, v, beta))
    k_write = k if k_write is None else k_write.double()
    o = torch.zeros(B, T, H, V, dtype=torch.float64)
    S_final = torch.zeros(B, H, K, V, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(K, V, dtype=torch.float64) if S0 is None else S0[b, h].double().clone()
            for t in range(T):
                if g is not None:
                    a = g[b, t, h].double().exp()
                    S = a * S if a.dim() == 0 else torch.diag(a) @ S
                kt, kw = k[b, t, h], k_write[b, t, h]
                S = (torch.eye(K, dtype=torch.float64) - beta[b, t, h] * torch.outer(kw, kt)) @ S \
                    + beta[b, t, h] * torch.outer(kw, v[b, t, h])
                o[b, t, h] = S.T @ (scale * q[b, t, h])
            S_final[b, h] = S
    return o, S_final


@given(p=problems(retention=False, initial_state=False, clip=False, eta=st.just(0.0)),
       zero_as_tensor=st.booleans(), with_S0=st.booleans(), chunk_size=chunk_sizes)
def test_eta_zero_is_deltanet(p, zero_as_tensor, with_S0, chunk_size):
    B, T, H, K, V = p.dims
    eta = torch.zeros(H, dtype=p.q.dtype) if zero_as_tensor else 0.0
    S0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(T), dtype=p.q.dtype) if with_S0 else None
    g, scale = p.options.get("g"), p.options["scale"]
    o_ref, S_ref = plain_delta_rule(*p.args(), g=g, scale=scale, S0=S0)
    tol = TOL[p.q.dtype]
    for op, extra in ((recurrent_osdn, {}), (chunk_osdn, {"chunk_size": chunk_size})):
        o, (S, d) = op(*p.args(), eta=eta, g=g, scale=scale, initial_state=(S0, None),
                       beta_aware=p.options["beta_aware"], normalize=p.options["normalize"],
                       output_final_state=True, **extra)
        assert rel_err(o, o_ref) <= tol, op.__name__
        assert rel_err(S, S_ref) <= tol, op.__name__
        assert torch.equal(d, torch.ones_like(d)), op.__name__


@given(p=problems(dtypes=(torch.float64,), retention=False, initial_state=False, clip=False, eta=st.just(0.0)))
def test_eta_zero_with_clip_around_one_is_deltanet(p):
    """A clip whose interval contains d = 1 leaves DeltaNet unchanged (the authors' defaults 2/3, 1.5)."""
    o_ref, _ = plain_delta_rule(*p.args(), g=p.options.get("g"), scale=p.options["scale"])
    for op in (recurrent_osdn, chunk_osdn):
        o, _ = op(*p.args(), **{**p.options, "d_min": 2 / 3, "d_max": 1.5})
        assert rel_err(o, o_ref) <= 1e-10, op.__name__


@given(p=problems(dtypes=(torch.float64,)))
def test_osdn_is_the_delta_rule_with_the_scaled_write_key(p):
    """Token t writes along k̃_t = d_t ⊙ k_t with the PRE-update d_t (built from tokens < t), reads with k_t."""
    o_ = p.options
    S0, d0 = o_.get("initial_state") or (None, None)
    phase1 = preconditioner_scan(p.k, p.beta, eta=o_["eta"], r=o_.get("r"), d0=d0, d_min=o_["d_min"],
                                 d_max=o_["d_max"], beta_aware=o_["beta_aware"], normalize=o_["normalize"])
    assert torch.equal(phase1.d[:, 0], torch.ones_like(phase1.d[:, 0]) if d0 is None else d0)
    o_ref, S_ref = plain_delta_rule(*p.args(), g=o_.get("g"), scale=o_["scale"], S0=S0, k_write=phase1.k_tilde)
    for op, extra in ((recurrent_osdn, {}), (chunk_osdn, {"chunk_size": p.chunk_size})):
        o, (S, d) = op(*p.args(), **o_, output_final_state=True, **extra)
        assert rel_err(o, o_ref) <= 1e-10, op.__name__
        assert rel_err(S, S_ref) <= 1e-10, op.__name__
        assert rel_err(d, phase1.d_final) <= 1e-12, op.__name__

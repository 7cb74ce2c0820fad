"""osdn_ref is differentiable in q, k, v, β, g (both kinds), r, initial_state (S0 and d0) and a tensor η.

`torch.autograd.gradcheck` (finite differences, float64) on small shapes, without the clip: the clip is
piecewise linear, and a finite difference across its kink disagrees with the one-sided derivative. The
clip's own derivative (zero where it binds) is checked separately.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from osdn_ref import chunk_osdn, recurrent_osdn, rel_err
from strategies import examples

OPS = {"recurrent": recurrent_osdn, "chunk": chunk_osdn}
NAMES = ("q", "k", "v", "beta", "g", "r", "S0", "d0", "eta")


def small_problem(seed, gate, B=1, T=5, H=2, K=3, V=2):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)

    inputs = {
        "q": randn(B, T, H, K),
        "k": torch.nn.functional.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V),
        "beta": rand(0.1, 1.0, B, T, H),
        "g": None if gate == "none" else rand(-1.0, -0.05, *((B, T, H) if gate == "gdn" else (B, T, H, K))),
        "r": rand(0.5, 0.99, B, T, H),
        "S0": randn(B, H, K, V),
        "d0": rand(0.5, 1.5, B, H, K),
        "eta": rand(0.05, 0.5, H),
    }
    return {name: (x.requires_grad_(True) if x is not None else None) for name, x in inputs.items()}


def call(op, inputs, flags, chunk_size):
    """Both outputs: o and the final state (S, d), so every gradient path is exercised."""
    extra = {"chunk_size": chunk_size} if op is chunk_osdn else {}
    x = inputs
    o, (S, d) = op(x["q"], x["k"], x["v"], x["beta"], eta=x["eta"], g=x["g"], r=x["r"],
                   initial_state=(x["S0"], x["d0"]), output_final_state=True, **flags, **extra)
    return o, S, d


@pytest.mark.parametrize("gate", ["none", "gdn", "kda"])
@pytest.mark.parametrize("op", sorted(OPS))
@examples(12)
@given(seed=st.integers(0, 2**16), beta_aware=st.booleans(), normalize=st.booleans(),
       chunk_size=st.sampled_from([2, 3, 4]), T=st.sampled_from([1, 4, 5]))
def test_gradcheck(op, gate, seed, beta_aware, normalize, chunk_size, T):
    inputs = small_problem(seed, gate, T=T)
    names = [n for n in NAMES if inputs[n] is not None]
    flags = dict(beta_aware=beta_aware, normalize=normalize)

    def fn(*tensors):
        return call(OPS[op], dict(zip(names, tensors)) | {n: None for n in NAMES if n not in names}, flags, chunk_size)

    assert torch.autograd.gradcheck(fn, tuple(inputs[n] for n in names), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_input_receives_a_gradient(op):
    """No input is silently detached: each gets a nonzero gradient from a generic loss."""
    inputs = small_problem(0, "kda")
    o, S, d = call(OPS[op], inputs, {}, 2)
    (o.sum() + S.square().sum() + d.square().sum()).backward()
    for name in NAMES:
        assert inputs[name].grad is not None and inputs[name].grad.abs().sum() > 0, name


@pytest.mark.parametrize("op", sorted(OPS))
def test_clip_has_zero_derivative_where_it_binds(op):
    """d_min = d_max pins d_t (t ≥ 1) to one value: then nothing depends on η, and d_T not on d0.

    Without the clip the same gradients are nonzero, so the zeros are the clip's doing.
    """
    inputs = small_problem(1, "gdn", T=6)
    for bounds, binds in (((1.2, 1.2), True), ((0.01, 100.0), False)):
        o, S, d = call(OPS[op], inputs, dict(d_min=bounds[0], d_max=bounds[1]), 4)
        (g_eta,) = torch.autograd.grad(o.sum() + S.sum() + d.sum(), inputs["eta"], retain_graph=True)
        g_eta_d, g_d0_d = torch.autograd.grad(d.sum(), (inputs["eta"], inputs["d0"]))
        if binds:
            assert torch.all(d == 1.2)
            assert torch.all(g_eta == 0) and torch.all(g_eta_d == 0) and torch.all(g_d0_d == 0)
        else:
            assert torch.all(g_eta != 0) and torch.all(g_eta_d != 0) and torch.all(g_d0_d != 0)


@pytest.mark.parametrize("op", sorted(OPS))
def test_zero_keys_are_finite(op):
    """k = 0 is legal (the ε keeps the normalised surrogate finite): outputs and gradients stay finite."""
    for normalize in (True, False):
        inputs = small_problem(2, "kda", T=6)
        with torch.no_grad():
            inputs["k"][:, ::2] = 0  # every other token, including the first
        o, S, d = call(OPS[op], inputs, dict(normalize=normalize), 4)
        assert all(torch.isfinite(x).all() for x in (o, S, d))
        grads = torch.autograd.grad(o.sum() + S.sum() + d.sum(), [inputs[n] for n in NAMES])
        assert all(torch.isfinite(gr).all() for gr in grads)
        all_zero = {n: x.detach() for n, x in inputs.items()} | {"k": torch.zeros_like(inputs["k"])}
        o, S, d = call(OPS[op], all_zero, dict(normalize=normalize), 4)
        assert torch.isfinite(o).all()
        assert rel_err(d, all_zero["d0"] * all_zero["r"].prod(1).unsqueeze(-1)) <= 1e-14  # only the APF decay

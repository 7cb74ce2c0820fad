"""The OSDN layer and the small LM: preconditioner 'off' is plain DeltaNet / GDN, chunk = recurrent mode,
causality, diagnostics, gradients, forward/backward of the model on the CPU."""
import pytest
import torch

import osdn_ref
from osdn_fast.nn import OSDNLayer, RecallLM


def plain_delta_rule(q, k, v, beta, g=None):
    """Independent token loop: S ← e^g S;  S ← S + β k (v − Sᵀk)ᵀ;  o = Sᵀ q / √K.  [B, T, H, ·] layout."""
    B, T, H, K = k.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
    out = []
    for t in range(T):
        if g is not None:
            S = S * g[:, t].exp()[..., None, None]
        kt, vt, bt = k[:, t], v[:, t], beta[:, t]
        err = vt - torch.einsum("bhkv,bhk->bhv", S, kt)
        S = S + bt[..., None, None] * torch.einsum("bhk,bhv->bhkv", kt, err)
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * K**-0.5)
    return torch.stack(out, 1)


def _x(B=2, T=21, D=16, seed=0):
    return torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backbone", ["deltanet", "gdn"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_off_is_plain_delta_rule(backbone, mode):
    torch.manual_seed(0)
    layer = OSDNLayer(16, 2, backbone=backbone, preconditioner="off", mode=mode, chunk_size=8).double()
    x = _x()
    q, k, v, beta, g, r = layer.gates(x)
    assert r is None and (g is None) == (backbone == "deltanet")
    o = plain_delta_rule(q, k, v, beta, g)
    expected = layer.o_proj(layer.o_norm(o).reshape(2, 21, 16))
    osdn_ref.check(f"layer off = plain {backbone} ({mode})", layer(x), expected, 1e-12)


def test_gates_follow_the_fla_recipe():
    torch.manual_seed(1)
    layer = OSDNLayer(16, 2, backbone="gdn", preconditioner="apf").double()
    q, k, v, beta, g, r = layer.gates(_x())
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(2, 21, 2, dtype=torch.float64))
    torch.testing.assert_close(k.norm(dim=-1), torch.ones(2, 21, 2, dtype=torch.float64))
    assert ((beta > 0) & (beta < 1)).all() and (g < 0).all()
    torch.testing.assert_close(r, torch.full_like(r, torch.sigmoid(torch.tensor(6.9)).item()))  # APF init


def test_gates_are_contiguous_heads():
    """q, k, v come out [B, T, H, K] contiguous (fla's layout): the ops then copy nothing, and the L2 norm reduces
    contiguous rows (before, K had a stride of T, from conv1d's transposed output)."""
    layer = OSDNLayer(16, 2)
    q, k, v, beta, _, _ = layer.gates(_x().float())
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        assert t.is_contiguous(), (name, t.stride())


@pytest.mark.parametrize("backbone", ["deltanet", "gdn"])
@pytest.mark.parametrize("preconditioner", ["off", "osdn", "apf"])
@pytest.mark.parametrize("beta_aware", [True, False])
def test_chunk_equals_recurrent(backbone, preconditioner, beta_aware):
    torch.manual_seed(2)
    kwargs = dict(backbone=backbone, preconditioner=preconditioner, beta_aware=beta_aware, eta=0.5, chunk_size=8)
    chunk = OSDNLayer(16, 2, mode="chunk", **kwargs).double()
    rec = OSDNLayer(16, 2, mode="recurrent", **kwargs).double()
    rec.load_state_dict(chunk.state_dict())
    if preconditioner != "off":
        with torch.no_grad():
            chunk.d0.uniform_(0.8, 1.3)
            rec.d0.copy_(chunk.d0)
    x = _x(T=19)
    osdn_ref.check("layer chunk = recurrent", chunk(x), rec(x), 1e-10)


def test_preconditioner_changes_the_output_and_learns():
    torch.manual_seed(3)
    off = OSDNLayer(16, 2, preconditioner="off").double()
    for pre in ("osdn", "apf"):
        layer = OSDNLayer(16, 2, preconditioner=pre, eta=0.5, learn_eta=True).double()
        layer.load_state_dict(off.state_dict(), strict=False)
        x = _x()
        y = layer(x)
        assert osdn_ref.rel_err(y, off(x)) > 1e-4  # beta-aware: d moves from the first token
        y.square().sum().backward()
        grads = [layer.d0.grad, layer.log_eta.grad] + ([layer.r_proj.bias.grad] if pre == "apf" else [])
        assert all(gr is not None and gr.abs().sum() > 0 for gr in grads)


def test_beta_free_with_unit_d0_is_deltanet():
    """With L2-normalised keys ⟨1, k²⟩ = 1: the beta-free gradient vanishes at d = 1 (SPEC §2)."""
    torch.manual_seed(4)
    off = OSDNLayer(16, 2, preconditioner="off").double()
    bf = OSDNLayer(16, 2, preconditioner="osdn", beta_aware=False, eta=0.5).double()
    bf.load_state_dict(off.state_dict(), strict=False)
    x = _x()
    osdn_ref.check("beta-free OSDN from d0 = 1 = DeltaNet", bf(x), off(x), 1e-10)


def test_causal():
    torch.manual_seed(5)
    layer = OSDNLayer(16, 2, backbone="gdn", preconditioner="apf", eta=0.5, chunk_size=8).double()
    x = _x(T=20)
    y = layer(x)
    x2 = x.clone()
    x2[:, 12:] += 1.0
    torch.testing.assert_close(layer(x2)[:, :12], y[:, :12])


def test_diagnostics():
    torch.manual_seed(6)
    off = OSDNLayer(16, 2, preconditioner="off").double()
    off.record = True
    x = _x()
    off(x)
    diag = off.diagnostics()
    beta = off.last["beta"]
    assert diag["clip_fraction"] == 0.0
    torch.testing.assert_close(torch.tensor(diag["q_geo"], dtype=torch.float64),
                               ((1 - beta) ** 2).log().mean().exp())  # ρ = (1 − β)² when d = 1, ‖k‖ = 1
    apf = OSDNLayer(16, 2, preconditioner="apf", eta=0.01).double()
    with torch.no_grad():
        apf.r_proj.bias.fill_(-2.0)  # strong decay: d falls onto the floor d_min
    apf.record = True
    apf(x)
    diag = apf.diagnostics()
    assert diag["clip_fraction"] > 0.5 and diag["d"].min().item() == pytest.approx(2 / 3)
    with pytest.raises(RuntimeError):
        OSDNLayer(16, 2).diagnostics()


def test_diagnostics_d_matches_the_op_state():
    torch.manual_seed(7)
    layer = OSDNLayer(16, 2, preconditioner="osdn", eta=0.5).double()
    layer.record = True
    x = _x()
    layer(x)
    d = layer.diagnostics()["d"]
    q, k, v, beta, g, r = layer.gates(x)
    d0 = layer.d0.expand(2, -1, -1)
    _, (_, d_final) = osdn_ref.recurrent_osdn(q, k, v, beta, eta=0.5, initial_state=(None, d0),
                                              output_final_state=True, d_min=2 / 3, d_max=1.5)
    step = osdn_ref.preconditioner_step(d[:, -1], k[:, -1], beta[:, -1], eta=0.5, d_min=2 / 3, d_max=1.5)
    torch.testing.assert_close(step, d_final)
    torch.testing.assert_close(d[:, 0], d0)


def test_bad_options_raise():
    for bad in (dict(backbone="kda"), dict(preconditioner="adam"), dict(mode="parallel"), dict(kernel="cuda")):
        with pytest.raises(ValueError):
            OSDNLayer(16, 2, **bad)


@pytest.mark.parametrize("mlp", [True, False])
def test_model_forward_backward_cpu(mlp):
    torch.manual_seed(8)
    model = RecallLM(32, 16, 2, mlp=mlp, num_heads=2, backbone="gdn", preconditioner="apf", eta=0.1)
    tokens = torch.randint(32, (3, 13))
    logits = model(tokens)
    assert logits.shape == (3, 13, 32) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing
    assert len(model.mixers()) == 2


FAST_VS_REF = """
import torch, osdn_ref
from osdn_fast.nn import OSDNLayer
torch.manual_seed(0)
x = torch.randn(2, 40, 32)
for bb, pre in (("deltanet", "apf"), ("gdn", "osdn")):
    a, b = (OSDNLayer(32, 2, backbone=bb, preconditioner=pre, eta=0.3, learn_eta=True, kernel=kn, chunk_size=16)
            for kn in ("ref", "fast"))
    b.load_state_dict(a.state_dict())
    ya, yb = a(x), b(x)
    ya.square().sum().backward()
    yb.square().sum().backward()
    grads = lambda m: torch.cat([p.grad.flatten() for p in m.parameters()])
    osdn_ref.check(f"layer fast = ref ({bb}, {pre})", yb, ya, 1e-5)
    osdn_ref.check(f"layer fast = ref grads ({bb}, {pre})", grads(b), grads(a), 1e-5)
"""


def test_fast_kernel_path_matches_ref_under_interpreter():
    """kernel='fast' (what CUDA runs) gives the reference output and gradients, via Triton's CPU interpreter."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", FAST_VS_REF], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ok ") == 4


@pytest.mark.parametrize("kernel, runs_triton", [("fast", True), ("ref", False), ("auto", torch.cuda.is_available())])
def test_short_conv_kernel_choice(monkeypatch, kernel, runs_triton):
    """ShortConv runs osdn_fast.nn.short_conv for 'fast', and for 'auto' on CUDA only; torch's conv1d otherwise."""
    import osdn_fast.nn.short_conv as triton_conv
    from osdn_fast.nn.layer import ShortConv

    calls = []
    monkeypatch.setattr(triton_conv, "short_conv", lambda x, w: calls.append(x.device) or torch.zeros_like(x))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ShortConv(6, 4, kernel=kernel).to(device)(torch.randn(1, 5, 6, device=device))
    assert bool(calls) == runs_triton

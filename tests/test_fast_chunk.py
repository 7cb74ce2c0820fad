"""osdn_fast.chunk_osdn (Triton, run in the CPU interpreter without a GPU) against osdn_ref.chunk_osdn in
float64: the output, both final states and the gradient of every differentiable input (q, k, v, β, g, r,
S0, d0, η) — fixed length and packed variable-length sequences — plus the input checks of SPEC §4."""
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import osdn_fast  # noqa: E402
import osdn_fast.ops.chunk as chunk_ops  # noqa: E402
import osdn_fast.ops.phase1_chunk as phase1_chunk  # noqa: E402
import osdn_ref  # noqa: E402
from strategies import make_tensors, problems  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# float32 kernels against the float64 reference; on a GPU, float32 tl.dot runs in TF32 (10-bit mantissa)
FORWARD_TOL = 1e-4 if DEVICE == "cpu" else 5e-3
GRAD_TOL = 1e-3 if DEVICE == "cpu" else 1e-2
HALF_TOL = 3e-2  # bfloat16 / float16 inputs (rounded once on the way in)
FLOOR = 1e-2  # below this norm errors count absolutely: e.g. ∂η vanishes at the beta-free fixed point d = 1,
#               where the float32 round-off of 1 − ⟨d, k²⟩ is all that is left
# ... or TF32's, on a GPU, where phase 1's chains are walked in groups: the groups' K×K maps are TF32 products, and
# the adjoints carry their round-off into ∂η. On the H200, over benchmarks/grouped_deta.py's 48 problems at η = 0.1
# (T ≤ 130), ∂η at that fixed point was off by up to 6.1e-2 (walked: 7.8e-5), while β-aware problems of the same sizes
# have |∂η| of 1 to 100 and relative errors up to 7.8e-3 in every form (NOTES, after version 30; 3xTF32 maps cost 41% of
# the forward, operands rounded to nearest 1.6% and still left 2.4e-2). So on a GPU the grouped chains' ∂η counts as
# absolute below a norm of 20 (≈ 3 × 6.1e-2 / GRAD_TOL): exact to GRAD_TOL at the scale ∂η has away from that point.
# On the CPU the interpreter computes the maps in float32 and the same grid left at most 1.1e-5 (4.4e-6 at η = 1;
# walked 3.5e-6), just above FLOOR × GRAD_TOL = 1e-5: the CPU's floor is three times that maximum.
GROUPED_DETA_FLOOR = 20.0 if DEVICE == "cuda" else 3e-2


def leaves(tensors, dtype):
    """Detached copies on DEVICE in `dtype` that require grad (None and non-tensors pass through)."""
    return {name: x.detach().to(DEVICE, dtype).requires_grad_() if isinstance(x, torch.Tensor) else x
            for name, x in tensors.items()}


def run(op, x, options, cotangents, **extra):
    """Call op, pull the cotangents back through (o, S, d) and return the results and every leaf gradient."""
    init = (x["S0"], x["d0"]) if x["S0"] is not None or x["d0"] is not None else None
    o, (S, d) = op(x["q"], x["k"], x["v"], x["beta"], eta=x["eta"], g=x["g"], r=x["r"], initial_state=init,
                   output_final_state=True, **options, **extra)
    do, dS, dd = (c.to(o.device) for c in cotangents)
    ((o.double() * do).sum() + (S.double() * dS).sum() + (d.double() * dd).sum()).backward()
    grads = {f"d{name}": t.grad for name, t in x.items() if isinstance(t, torch.Tensor)}
    return {"o": o, "S": S, "d": d, **grads}


def compare(tensors, options, chunk_size, dtype=torch.float32, fwd_tol=FORWARD_TOL, grad_tol=GRAD_TOL,
            cu_seqlens=None, floors=None):
    """Run both ops on the same float64 values and check every result and gradient (relative errors, with norms
    below FLOOR, or the result's own floor in `floors`, counted as that floor)."""
    gen = torch.Generator().manual_seed(1)
    o_shape = tensors["v"].shape
    N, H, K = (len(cu_seqlens) - 1 if cu_seqlens is not None else o_shape[0]), o_shape[2], tensors["k"].shape[-1]
    cot = (torch.randn(o_shape, generator=gen, dtype=torch.float64),
           torch.randn(N, H, K, o_shape[-1], generator=gen, dtype=torch.float64),
           torch.randn(N, H, K, generator=gen, dtype=torch.float64))
    ref = run(osdn_ref.chunk_osdn, leaves(tensors, torch.float64), options, cot, cu_seqlens=cu_seqlens)
    cu = None if cu_seqlens is None else cu_seqlens.to(DEVICE)
    fast = run(osdn_fast.chunk_osdn, leaves(tensors, dtype), options, cot, chunk_size=chunk_size, cu_seqlens=cu)
    assert fast["o"].dtype == dtype and fast["S"].dtype == torch.float32 and fast["d"].dtype == torch.float32
    for name, expected in ref.items():
        tol = fwd_tol if name in ("o", "S", "d") else grad_tol
        assert name in fast and fast[name] is not None, name
        floor = (floors or {}).get(name, FLOOR)
        err = (fast[name].double() - expected).norm().item() / max(expected.norm().item(), floor)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


def as_tensors(p):
    """A strategies.Problem → the named inputs of `run` (None where the problem has no such input)."""
    S0, d0 = p.options.get("initial_state") or (None, None)
    tensors = dict(q=p.q, k=p.k, v=p.v, beta=p.beta, g=p.options.get("g"), r=p.options.get("r"), S0=S0, d0=d0,
                   eta=p.options["eta"])
    options = {name: p.options.get(name) for name in ("scale", "d_min", "d_max")}
    options.update(beta_aware=p.options["beta_aware"], normalize=p.options["normalize"])
    return tensors, options


@settings(max_examples=20)
@given(p=problems(dtypes=(torch.float64,), T=st.sampled_from([1, 5, 16, 33, 64, 70]), gates=("none", "gdn"),
                  K=st.sampled_from([1, 3, 16, 20]), V=st.sampled_from([2, 5, 16, 17])),
       chunk_size=st.sampled_from([16, 32, 64]))
def test_matches_reference(p, chunk_size):
    """Forward and every gradient, over shapes (T = 1, < C, not a multiple of C), flags, gates, r, clip,
    initial states and η as a float or a per-head tensor."""
    compare(*as_tensors(p), chunk_size)


@settings(max_examples=12)
@given(p=problems(dtypes=(torch.float64,), T=st.sampled_from([1, 16, 33, 70, 130]), gates=("none", "gdn"),
                  K=st.sampled_from([3, 16, 20]), V=st.sampled_from([2, 16])),
       chunk_size=st.sampled_from([16, 64]))
def test_matches_reference_with_chunked_phase1(p, chunk_size):
    """The same with phase 1 chunk-parallel (chunk.phase1_form's choice from T = 4096 on, and from T = 256 with few
    chains; forced here): exact
    where the clip stays idle, the sequential scan where it acts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
        compare(*as_tensors(p), chunk_size)


@settings(max_examples=6)
@given(p=problems(dtypes=(torch.float64,), T=st.sampled_from([33, 70, 130]), gates=("none",),
                  K=st.sampled_from([3, 16]), V=st.sampled_from([2, 16])))
def test_matches_reference_with_grouped_phase1_chains(p):
    """The same with phase 1's chains walked in groups of chunks (chunk.phase1_group, forced at any length and
    number of chains, as validate_gpu.py's "grouped" runs force it); ∂η's floor is TF32's on a GPU
    (GROUPED_DETA_FLOOR)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
        patch.setattr(chunk_ops, "PHASE1_GROUP_MIN_CHUNKS", 2)
        patch.setattr(chunk_ops, "PHASE1_GROUP_MAX_CHAINS", 1 << 30)
        compare(*as_tensors(p), 16, floors=dict(deta=GROUPED_DETA_FLOOR))


def test_phase1_group_rule():
    """chunk_osdn groups phase 1's chains only for long sequences on few chains (chunks of 32 since version 18): at
    (1, 16384, 16, 128) in groups of 16 chunks; at (2, 8192, 16, 128) (32 chains), (4, 4096, 16, 128) and below 32
    chunks per sequence (T < 1024) not at all."""
    def group(B, T, H, cu=None):
        return chunk_ops.phase1_group(torch.empty(B, T, H, 1, device="meta"), cu)

    assert chunk_ops.PHASE1_CHUNKED["chunk_size"] == 32
    assert group(1, 16384, 16) == 16 and group(1, 4096, 16) == 16 and group(1, 8192, 8) == 16 and group(1, 2048, 16) == 8
    assert group(2, 8192, 16) is None and group(4, 4096, 16) is None and group(1, 1000, 16) is None
    assert group(1, 16384, 2, torch.arange(0, 16385, 2048)) == 8  # packed: 8 sequences, the mean length per sequence


def test_phase1_form_rule():
    """chunk_osdn's phase-1 form by mean length and number of (sequence, head) chains (version 36): the chunk forms
    from T = 4096 on, and below it from T = 256 (unclipped or speculating on a clip) or T = 1024 (APF with a floor:
    quasi-Newton) when at most 256 chains run; else the scan. Without `chains` the length rule alone (versions 5-35)."""
    def form(T, chains, apf_floor=False):
        return chunk_ops.phase1_form(T, True if apf_floor else None, 2 / 3 if apf_floor else None,
                                     1.5 if apf_floor else None, chains=chains)

    assert [form(2048, 8 * 16), form(2048, 16 * 16), form(2048, 17 * 16), form(1024, 32 * 16)] == \
        ["chunked", "chunked", "sequential", "sequential"]
    assert [form(4096, 4 * 16), form(4096, 64 * 16), form(255, 1), form(256, 1)] == \
        ["chunked", "chunked", "sequential", "chunked"]
    assert [form(512, 32, True), form(1024, 32, True), form(1024, 257, True), form(4096, 1024, True)] == \
        ["sequential", "newton", "sequential", "newton"]
    assert [chunk_ops.phase1_form(T, None, None, None) for T in (256, 2048, 4096)] == ["sequential"] * 2 + ["chunked"]
    assert chunk_ops.phase1_form(2048, None, 2 / 3, 1.5, chains=64) == "chunked"  # the clip alone: speculate


@pytest.mark.parametrize("B, T, H, cu, chains", [(4, 300, 2, None, 8), (1, 600, 3, [0, 100, 600], 6)])
def test_chunk_osdn_counts_chains_for_phase1_form(B, T, H, cu, chains, monkeypatch):
    """phase1_fwd passes phase1_form the mean length per sequence and N·H chains (N = the packed sequences)."""
    seen = []
    form = chunk_ops.phase1_form
    monkeypatch.setattr(chunk_ops, "phase1_form", lambda *a, **kw: seen.append((a[0], kw["chains"])) or form(*a, **kw))
    k = torch.nn.functional.normalize(torch.randn(B, T, H, 4), dim=-1).to(DEVICE)
    beta = torch.rand(B, T, H, device=DEVICE)
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE, dtype=torch.int32)
    p1 = dict(d_min=None, d_max=None, beta_aware=True, normalize=True)
    used = chunk_ops.phase1_fwd(k, beta, None, None, torch.full((H,), 0.01, device=DEVICE), cu_t, p1)[0]
    N = B if cu is None else len(cu) - 1
    assert seen == [(B * T / N, chains)] and used == form(B * T / N, None, None, None, chains=chains)


def force_phase1(monkeypatch, form):
    """Make chunk_osdn take the scan ("sequential") or a chunk form (any other) at any length and chain count."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 10**9 if form == "sequential" else 1)
    if form == "sequential":
        monkeypatch.setattr(chunk_ops, "PHASE1_FEW_CHAINS", 0)


@pytest.mark.parametrize("eta, r, form, acted", [(0.01, False, "speculative", False), (2.0, False, "speculative", True),
                                                 (0.01, True, "newton", None), (2.0, True, "newton", None)])
def test_phase1_form_speculates_on_an_idle_clip(eta, r, form, acted, monkeypatch):
    """With the clip [0.9, 1.1]: a small η keeps d inside (the chunk form stands), a large one pushes d out (the
    sequential scan, launched behind it, redoes it), and APF with a floor runs the quasi-Newton rounds (the guarded
    scan behind them if they did not converge)."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    _, (q, k, v, beta) = make_tensors(2, 2, 50, 2, 8, 8, torch.float32)
    k, beta = k.to(DEVICE), beta.to(DEVICE)
    rr = torch.full(beta.shape, 0.99, device=DEVICE) if r else None
    eta_h = torch.full((2,), eta, device=DEVICE)
    p1 = dict(d_min=0.9, d_max=1.1, beta_aware=True, normalize=True)
    used, d_all, d_final, kt, outside, kept = chunk_ops.phase1_fwd(k, beta, rr, None, eta_h, None, p1)
    assert (kept is not None) == (form in ("chunked", "speculative"))  # for its backward
    assert used == form
    assert (outside is None) if acted is None else (bool(outside.item()) == acted)
    assert (d_all is None) == (form == "speculative")  # the chunk forms store no d_t: their backward forms them again
    if acted is False:  # from the chunk form's entries (version 29)
        d_all = phase1_chunk.replay_d(k, rr, kept[2], cu_seqlens=None,
                                      chunk_size=chunk_ops.PHASE1_CHUNKED["chunk_size"],
                                      precision=chunk_ops.PHASE1_CHUNKED["precision"])
    elif acted:  # by the guarded scan again, which the backward runs if the clip acted
        d_all = chunk_ops.phase1_fwd_seq(k, beta, rr, None, eta_h, cu_seqlens=None, **p1)[0]
    ref = osdn_ref.preconditioner_scan(k.double(), beta.double(), eta=eta, r=None if rr is None else rr.double(),
                                       d_min=0.9, d_max=1.1)
    osdn_ref.check("d_all", d_all, ref.d, FORWARD_TOL)
    osdn_ref.check("k̃", kt, (ref.d * k.double()), FORWARD_TOL)


@pytest.mark.parametrize("side, eta, seed, start, apf", [("d_max", 0.5, 5, 1.0, False), ("d_min", 0.2, 3, 2.5, False),
                                                        ("d_max", 0.5, 3, 0.2, True)])
@pytest.mark.parametrize("grouped", [False, True])
def test_speculation_fails_when_only_the_final_d_leaves_the_clip(side, eta, seed, start, apf, grouped, monkeypatch):
    """d_t is the state before token t, so the last update shows only in d_final: a bound between every d_t and
    d_final (from the float64 scan; from d_0 = 2.5, d falls towards its fixed point; with APF's r = 0.99 from 0.2 it
    rises) must still flag the speculation. The chunk form's state kernel checks the final d (version 16 checked it
    with PyTorch ops after the kernels), with r too (its launch with the decays of the prep kernel, version 27); the
    redone scan clips d_final, every d_t stays the unclipped one. Ungrouped and grouped chains (then the last group
    writes d_final). With r only an upper bound speculates: a floor takes the quasi-Newton form."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    if grouped:
        monkeypatch.setattr(chunk_ops, "PHASE1_GROUP_MIN_CHUNKS", 2)
    _, (q, k, v, beta) = make_tensors(seed, 1, 200, 2, 8, 8, torch.float32)
    d0 = torch.full((1, 2, 8), start, dtype=torch.float64)
    rr = torch.full(beta.shape, 0.99) if apf else None
    r64 = None if rr is None else rr.double()
    ref = osdn_ref.preconditioner_scan(k.double(), beta.double(), eta=eta, r=r64, d0=d0)
    sign = 1 if side == "d_max" else -1
    inner, final = (sign * ref.d).max(), (sign * ref.d_final).max()
    assert final > inner + 1e-3  # this seed's last update goes beyond every earlier d on this side
    bound = sign * float((inner + final) / 2)
    p1 = {"d_min": None, "d_max": None, "beta_aware": True, "normalize": True, side: bound}
    form, d_all, d_final, kt, outside, *_ = chunk_ops.phase1_fwd(k.to(DEVICE), beta.to(DEVICE),
                                                                None if rr is None else rr.to(DEVICE),
                                                                d0.float().to(DEVICE),
                                                                torch.full((2,), eta, device=DEVICE), None, p1)
    assert form == "speculative" and int(outside.item()) == 1
    assert (chunk_ops.phase1_group(k, None) is not None) == grouped
    clipped = osdn_ref.preconditioner_scan(k.double(), beta.double(), eta=eta, r=r64, d0=d0, **{side: bound})
    assert d_all is None  # the redone scan stores no d_t: the backward runs it again if the clip acted
    osdn_ref.check("k̃", kt, clipped.d * k.double(), FORWARD_TOL)
    osdn_ref.check("d_final", d_final, clipped.d_final, FORWARD_TOL)
    assert not torch.allclose(clipped.d_final, ref.d_final)  # the clip acted on the final d


@pytest.mark.parametrize("rounds", [1, 8])
def test_newton_phase1_redone_when_unconverged(rounds, monkeypatch):
    """APF with a floor, forced onto the quasi-Newton form over chunks of 64 (three chunks here): one round cannot
    converge, so the guarded scan must redo the call; eight do. Either way d and k̃ are the clipped scan's."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    monkeypatch.setitem(chunk_ops.PHASE1_NEWTON, "fixed_rounds", rounds)
    _, (q, k, v, beta) = make_tensors(4, 1, 150, 2, 8, 8, torch.float32)
    k, beta = k.to(DEVICE), beta.to(DEVICE)
    rr = (0.9 + 0.1 * torch.rand(beta.shape, generator=torch.Generator().manual_seed(5))).to(DEVICE)
    eta_h = torch.full((2,), 2.0, device=DEVICE)
    p1 = dict(d_min=0.9, d_max=1.1, beta_aware=True, normalize=True)
    _, d_all, d_final, kt, *_ = chunk_ops.phase1_fwd(k, beta, rr, None, eta_h, None, p1)
    *_, unconverged = chunk_ops.phase1_fwd_newton(k, beta, rr, None, eta_h, cu_seqlens=None, **p1,
                                                  **chunk_ops.PHASE1_NEWTON)
    assert int(unconverged) == (rounds == 1)
    ref = osdn_ref.preconditioner_scan(k.double(), beta.double(), eta=2.0, r=rr.double(), d_min=0.9, d_max=1.1)
    osdn_ref.check("d_all", d_all, ref.d, FORWARD_TOL)
    osdn_ref.check("d_final", d_final, ref.d_final, FORWARD_TOL)
    osdn_ref.check("k̃", kt, ref.d * k.double(), FORWARD_TOL)


@pytest.mark.parametrize("rounds", [1, 8])
def test_newton_phase1_forward_and_backward(rounds, monkeypatch):
    """The whole op with APF and a floor on the quasi-Newton form (forced): with one round neither pass converges
    and the guarded scans redo both, with eight they converge; every result and gradient against float64."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    monkeypatch.setitem(chunk_ops.PHASE1_NEWTON, "fixed_rounds", rounds)
    gen, (q, k, v, beta) = make_tensors(9, 2, 140, 2, 8, 8, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=torch.tensor([2.0, 0.5], dtype=torch.float64), g=None,
                   r=0.5 + 0.5 * torch.rand(2, 140, 2, generator=gen, dtype=torch.float64),
                   S0=None, d0=0.5 + torch.rand(2, 2, 8, generator=gen, dtype=torch.float64))
    compare(tensors, dict(d_min=0.6, d_max=1.5), 64)


@pytest.mark.parametrize("eta, r, clip, form", [(0.5, False, False, "sequential"), (0.5, False, False, "chunked"),
                                                (0.01, False, True, "speculative"), (2.0, False, True, "speculative"),
                                                (0.5, True, True, "newton"), (0.5, True, True, "sequential")])
def test_forward_without_backward_skips_d_all(eta, r, clip, form, monkeypatch):
    """When no input needs a gradient, phase 1 does not write d_all (only the backward reads it), in every form,
    the speculation's redo included; the op's results are bitwise those of a call that keeps it for a backward
    (the chunk form never writes it: it keeps its chain's entries, version 29)."""
    force_phase1(monkeypatch, form)
    _, (q, k, v, beta) = make_tensors(6, 2, 150, 2, 8, 8, torch.float32)
    q, k, v, beta = (x.to(DEVICE) for x in (q, k, v, beta))
    rr = torch.full(beta.shape, 0.95, device=DEVICE, dtype=torch.bfloat16) if r else None  # as the suite passes r
    eta_h = torch.full((2,), eta, device=DEVICE)
    p1 = dict(d_min=0.9 if clip else None, d_max=1.1 if clip else None, beta_aware=True, normalize=True)
    kept = chunk_ops.phase1_fwd(k, beta, rr, None, eta_h, None, p1)
    skipped = chunk_ops.phase1_fwd(k, beta, rr, None, eta_h, None, p1, store_d=False)
    assert kept[0] == skipped[0] == form and skipped[1] is None
    assert (kept[1] is None) == (form in ("chunked", "speculative"))  # the chunk forms keep their entries instead
    assert skipped[5] is None  # P, stats and entries, kept only for a backward of the chunk form
    assert (kept[5] is not None) == (form in ("chunked", "speculative"))
    for a, b in zip(kept[2:5], skipped[2:5]):  # d_final, k̃, and the speculation's flag
        assert (a is None and b is None) or torch.equal(a, b)
    options = dict(eta=eta, r=rr, d_min=p1["d_min"], d_max=p1["d_max"], output_final_state=True)
    asked = []
    phase1_fwd = chunk_ops.phase1_fwd
    monkeypatch.setattr(chunk_ops, "phase1_fwd", lambda *a, store_d, **kw: asked.append(store_d) or phase1_fwd(*a, store_d, **kw))
    o1, (S1, d1) = osdn_fast.chunk_osdn(q, k, v, beta.requires_grad_(), **options)
    with torch.no_grad():  # beta still requires grad: torch.no_grad decides
        o2, (S2, d2) = osdn_fast.chunk_osdn(q, k, v, beta, **options)
    o3, _ = osdn_fast.chunk_osdn(q, k, v, beta.detach(), **options)  # nothing requires grad
    assert asked == [True, False, False]
    assert torch.equal(o1, o2) and torch.equal(S1, S2) and torch.equal(d1, d2) and torch.equal(o1, o3)


class Spy:
    """Stands in for a Triton kernel: `kernel[grid](*args)` calls `on_call(args)` first, then the kernel."""

    def __init__(self, kernel, on_call):
        self.kernel, self.on_call = kernel, on_call

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.on_call(args)
            return self.kernel[grid](*args, **kwargs)
        return call


def test_phase2_backward_releases_buffers_at_their_last_use(monkeypatch):
    """phase2_bwd drops W, U, h, ū, ∂h and the local ∂U once no kernel reads them, so none is alive when wy_bwd
    runs (where version 15's forward+backward peaked, NOTES); wy_bwd's ∂k̃, in k's dtype (float32 here: summed in
    place into output_bwd's buffer; 16-bit: a new buffer), is the carried-in ∂k̃ plus what a zeroed one gives."""
    held, seen = {}, {}

    def spy(name, pick):
        fn = getattr(chunk_ops, name)

        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            held.update({label: weakref.ref(x) for label, x in pick(out).items()})
            return out
        monkeypatch.setattr(chunk_ops, name, wrapped)

    spy("wy_fwd", lambda out: dict(W=out[1], U=out[2]))
    spy("state_fwd", lambda out: dict(h=out[0], ubar=out[1]))
    spy("output_bwd_local", lambda out: dict(du_local=out))
    spy("state_bwd", lambda out: dict(dh=out[0]))
    wy_bwd = chunk_ops.wy_bwd

    def checked(*args):
        seen["alive"] = sorted(label for label, ref in held.items() if ref() is not None)
        dkt_in = args[8]
        carried = dkt_in.clone()
        terms = wy_bwd(*args[:8], torch.zeros_like(dkt_in), *args[9:])[1]
        out = wy_bwd(*args)
        in_place = out[1] is dkt_in
        seen["placed"] = out[1].dtype == args[0].dtype and in_place == (out[1].dtype == torch.float32)
        expected = terms + carried
        seen["err"] = ((out[1] - expected).abs().max() / expected.abs().max()).item()
        return out
    monkeypatch.setattr(chunk_ops, "wy_bwd", checked)
    _, (q, k, v, beta) = make_tensors(8, 2, 70, 2, 8, 8, torch.float32)
    x = [t.to(DEVICE).requires_grad_() for t in (q, k, v, beta)]
    g = (-0.1 * torch.rand(2, 70, 2, generator=torch.Generator().manual_seed(3))).to(DEVICE).requires_grad_()
    o, _ = osdn_fast.chunk_osdn(*x, eta=0.5, g=g, chunk_size=16)
    o.sum().backward()
    assert set(held) == {"W", "U", "h", "ubar", "du_local", "dh"} and seen["alive"] == []
    # bitwise in the interpreter; on a GPU the compiler may fold the sum into the dot's accumulator (rounding)
    assert seen["placed"] and seen["err"] <= (0.0 if DEVICE == "cpu" else 1e-5)


def test_phase1_chunk_backward_releases_its_chain_before_its_outputs(monkeypatch):
    """phase1_bwd_chunk drops its chain's C×C maps (and their gains and decays) once the reverse chain has run, so
    ∂k, ∂β, ∂r and ∂η are allocated into their room: at K = 64 the maps are two bf16 [B, T, H, K] units (NOTES, v16).
    Run with APF's r, so that the chunks' decays exist."""
    import osdn_fast.ops.phase1_chunk as p1c
    held, seen = {}, {}

    def on_prep(args):
        tp, pg, hg, cg, ge = args[-9:-4]
        assert tp.dim() == 4 and tp.shape[-1] == tp.shape[-2] == 16 and tp.dtype == torch.float32
        assert ge.shape == tp.shape[:2]
        held.update(tp=weakref.ref(tp), pg=weakref.ref(pg), hg=weakref.ref(hg), cg=weakref.ref(cg),
                    ge=weakref.ref(ge))

    monkeypatch.setattr(p1c, "phase1_chunk_bwd_prep_kernel", Spy(p1c.phase1_chunk_bwd_prep_kernel, on_prep))
    monkeypatch.setattr(p1c, "phase1_chunk_bwd_out_kernel", Spy(
        p1c.phase1_chunk_bwd_out_kernel, lambda args: seen.update(alive=[n for n, r in held.items() if r() is not None])))
    _, (q, k, v, beta) = make_tensors(5, 2, 50, 2, 8, 8, torch.float32)
    k, beta = k.to(DEVICE), beta.to(DEVICE)
    eta_h = torch.full((2,), 0.5, device=DEVICE)
    gens = torch.Generator().manual_seed(4)
    dd_final = torch.randn(2, 2, 8, generator=gens).to(DEVICE)
    r = (0.9 + 0.1 * torch.rand(beta.shape, generator=gens)).to(DEVICE)
    d_all, _ = p1c.phase1_fwd_chunk(k, beta, r, None, eta_h, beta_aware=True, normalize=True, cu_seqlens=None,
                                    chunk_size=16)
    dk, *_ = p1c.phase1_bwd_chunk(k, beta, r, eta_h, d_all, torch.randn(d_all.shape, generator=gens).to(DEVICE),
                                  dd_final, beta_aware=True, normalize=True, cu_seqlens=None, chunk_size=16)
    assert set(held) == {"tp", "pg", "hg", "cg", "ge"} and seen["alive"] == [] and torch.isfinite(dk).all()


@pytest.mark.parametrize("eta, r, acted", [(0.01, False, False), (2.0, False, True), (0.01, True, False),
                                           (2.0, True, True)])
def test_speculative_backward_guarded_on_the_device(eta, r, acted, monkeypatch):
    """After the speculative forward (the chunk form, the clip's flag `outside` on the device) the backward runs the
    chunk form's backward and then the sequential reverse scan guarded by that flag, into the same outputs: every
    result is bit for bit the one of the form the flag names, run alone. With APF's r the clip is a ceiling only
    (a floor with r takes the quasi-Newton form)."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    gen, (q, k, v, beta) = make_tensors(6, 2, 150, 2, 8, 8, torch.float32)
    k, beta = k.to(DEVICE), beta.to(DEVICE)
    rr = (0.9 + 0.1 * torch.rand(beta.shape, generator=gen)).to(DEVICE) if r else None
    eta_h = torch.full((2,), eta, device=DEVICE)
    p1 = dict(d_min=None if r else 0.9, d_max=1.1, beta_aware=True, normalize=True)
    form, d_all, _, _, outside, kept = chunk_ops.phase1_fwd(k, beta, rr, None, eta_h, None, p1)
    assert form == "speculative" and bool(outside.item()) == acted
    grads = (torch.randn(k.shape, generator=gen).to(DEVICE), torch.randn(k.shape, generator=gen).to(DEVICE),
             torch.randn(beta.shape, generator=gen).to(DEVICE))
    dd_final = torch.randn(2, 2, 8, generator=gen).to(DEVICE)
    assert d_all is None  # neither the chunk form nor the guarded scan stores d_t
    guarded = chunk_ops.phase1_bwd_speculative_guarded(k, beta, rr, None, eta_h, dd_final, None, grads, p1, outside,
                                                       kept)
    if acted:
        d_seq = chunk_ops.phase1_fwd_seq(k, beta, rr, None, eta_h, cu_seqlens=None, **p1)[0]
        alone = chunk_ops.phase1_bwd_seq(k, beta, rr, eta_h, d_seq, None, dd_final, cu_seqlens=None,
                                         phase2_grads=grads, **p1)
    else:
        inv, stats, entries = kept  # d_all was not written: the chunk form's backward forms d from the entries
        alone = chunk_ops.phase1_bwd_chunk(k, beta, rr, eta_h, None, None, dd_final, beta_aware=True, normalize=True,
                                           cu_seqlens=None, phase2_grads=grads, inverse=inv,
                                           group=chunk_ops.phase1_group(k, None), stats=stats, entries=entries,
                                           **chunk_ops.PHASE1_CHUNKED)
    alone = (*alone[:4], alone[4].sum(0)[None])
    for name, a, b in zip(("dk", "dbeta", "dr", "dd0", "deta"), guarded, alone):
        assert (a is None and b is None) or torch.equal(a, b), name


@pytest.mark.parametrize("eta", [0.003, 2.0])
def test_clipped_forward_backward_peaks_at_the_unclipped_ones(eta, monkeypatch):
    """The speculative form holds nothing for its clip until the backward (version 30): counted by memory_peak.py's
    LiveStorages (the storages torch operators return, alive until their last tensor dies), one forward+backward of
    `osdn_clip` peaks at `osdn`'s (but its 4-byte flag), with the clip idle (η = 0.003) and acting (η = 2: its backward runs the clipped scan
    again, into a d_all allocated after the peak). Version 29 held a float32 d_all from the forward: two bf16 units more."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_peak", Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  "memory_peak.py")
    memory_peak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory_peak)
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    gen, (q, k, v, beta) = make_tensors(8, 1, 64, 2, 16, 16, torch.float32)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, torch.bfloat16)
    peaks, forms = {}, {}
    for name, clip in (("osdn", {}), ("osdn_clip", dict(d_min=2 / 3, d_max=1.5))):
        xs = [t.to(DEVICE, torch.bfloat16).requires_grad_() for t in (q, k, v, beta)]
        p1 = dict(d_min=clip.get("d_min"), d_max=clip.get("d_max"), beta_aware=True, normalize=True)
        form = chunk_ops.phase1_fwd(xs[1].detach(), xs[3].detach(), None, None, torch.full((2,), eta, device=DEVICE),
                                    None, p1, store_d=False)
        forms[name] = (form[0], None if form[4] is None else bool(form[4].item()))
        call = lambda xs=xs, clip=clip: osdn_fast.chunk_osdn(*xs, eta=eta, **clip)[0]  # noqa: E731
        peaks[name] = memory_peak.cpu_peak(call, do, unit=1)["peak_mib"] * 2**20
    assert forms == {"osdn": ("chunked", None), "osdn_clip": ("speculative", eta > 1)}
    unit = k.numel() * 2  # one bf16 [B, T, H, K]: 4096 bytes here
    assert 0 <= peaks["osdn_clip"] - peaks["osdn"] < 0.01 * unit, peaks  # the clip's int32 flag (4 bytes) alone


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("eta, acted", [(0.01, False), (2.0, True)])
def test_clipped_forward_backward_captures_in_a_cuda_graph(eta, acted, monkeypatch):
    """With the clip's backward decided on the device, the speculative forward+backward has no host
    synchronisation: captured in a CUDA graph and replayed, it gives the eager call's output and gradients bit
    for bit, with the clip idle and acting."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    gen, (q, k, v, beta) = make_tensors(7, 2, 150, 2, 16, 16, torch.float32)
    xs = [t.to(DEVICE, torch.bfloat16).requires_grad_() for t in (q, k, v, beta)]
    do = torch.randn(v.shape, generator=gen).to(DEVICE, torch.bfloat16)
    options = dict(eta=eta, d_min=0.9, d_max=1.1)
    p1 = dict(d_min=0.9, d_max=1.1, beta_aware=True, normalize=True)
    form, *_, outside, _ = chunk_ops.phase1_fwd(xs[1].detach(), xs[3].detach(), None, None,
                                                   torch.full((2,), eta, device=DEVICE), None, p1)
    assert form == "speculative" and bool(outside.item()) == acted

    def step():
        for x in xs:
            x.grad = None
        o, _ = osdn_fast.chunk_osdn(*xs, **options)
        o.backward(do)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and autotune outside the capture
        eager = [step().detach().clone()]
        eager += [x.grad.clone() for x in xs]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = step()
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(("o", "dq", "dk", "dv", "dbeta"), [o] + [x.grad for x in xs], eager):
        assert torch.equal(a, b), name


@settings(max_examples=10)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4), gate=st.booleans(), states=st.booleans(),
       K=st.sampled_from([4, 16, 20]), V=st.sampled_from([3, 16]), seed=st.integers(0, 2**31 - 1))
def test_varlen_matches_reference(lengths, gate, states, K, V, seed):
    """Packed sequences (cu_seqlens, B = 1): each restarts from its own initial state and ends in its own."""
    T, H, N = sum(lengths), 2, len(lengths)
    gen, (q, k, v, beta) = make_tensors(seed, 1, T, H, K, V, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=torch.tensor([0.5, 0.1], dtype=torch.float64),
                   g=-torch.rand(1, T, H, generator=gen, dtype=torch.float64) if gate else None,
                   r=0.5 + 0.5 * torch.rand(1, T, H, generator=gen, dtype=torch.float64),
                   S0=torch.randn(N, H, K, V, generator=gen, dtype=torch.float64) if states else None,
                   d0=0.5 + torch.rand(N, H, K, generator=gen, dtype=torch.float64) if states else None)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    compare(tensors, dict(d_min=0.5, d_max=2.0), 16, cu_seqlens=cu)


def test_wide_heads_match_reference():
    """K, V above 64 and not powers of two: padded tiles, two key slices in the backward, two value tiles."""
    gen, (q, k, v, beta) = make_tensors(5, 1, 40, 1, 80, 70, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=0.3, g=-0.2 * torch.rand(1, 40, 1, generator=gen, dtype=torch.float64),
                   r=None, S0=torch.randn(1, 1, 80, 70, generator=gen, dtype=torch.float64), d0=None)
    compare(tensors, {}, 32)


@pytest.mark.parametrize("sms, stage", [(132, "state_fwd_few"), (8, "state_fwd_some"), (5, "state_fwd")])
def test_state_chain_tiers(sms, stage, monkeypatch):
    """The state chain's launch follows how many (sequence, head, value tile) programs the narrow value tiles of its
    `_few` (16) and `_some` (32) entries make against the SMs (common.chain_stage: on the H200, 132 SMs, "few" at
    (1, 16384, 16, 128), "some" at (2, 8192, 16, 128) and (2, 4096, 32, 64), the standard entry at (4, 4096) and
    (8, 2048)); forced on the CPU, where sm_count is 0, the op still matches float64."""
    from osdn_fast.ops import common
    from osdn_fast.ops.tuning import TUNING

    monkeypatch.setattr(common, "sm_count", lambda device: 132)
    monkeypatch.setitem(TUNING, "state_bwd_few", dict(BV=16, num_warps=4, num_stages=3))
    monkeypatch.setitem(TUNING, "state_bwd_some", dict(BV=32, num_warps=4, num_stages=3))
    cpu = torch.device("cpu")
    tiers = {seq_heads: common.chain_stage("state_bwd", 128, 64, 128, seq_heads, cpu) for seq_heads in (16, 17, 33, 34)}
    # 8 value tiles of 16: 16·8 = 128 ≤ 132 < 17·8; 4 of 32: 33·4 = 132 < 34·4
    assert tiers == {16: "state_bwd_few", 17: "state_bwd_some", 33: "state_bwd_some", 34: "state_bwd"}
    tiers = {seq_heads: common.chain_stage("state_bwd", 128, 64, 64, seq_heads, cpu) for seq_heads in (33, 34, 66, 67)}
    assert tiers == {33: "state_bwd_few", 34: "state_bwd_some", 66: "state_bwd_some", 67: "state_bwd"}  # V = 64
    assert common.chain_launch("state_bwd", 128, 64, 128, 16, cpu) == (16, dict(num_warps=4, num_stages=3))
    assert common.chain_launch("state_bwd", 128, 64, 128, 32, cpu) == (32, dict(num_warps=4, num_stages=3))
    monkeypatch.setattr(common, "sm_count", lambda device: sms)
    gen, (q, k, v, beta) = make_tensors(5, 2, 40, 1, 80, 70, torch.float64)  # 2 sequences · 5 value tiles of 16
    assert common.chain_stage("state_fwd", 128, 64, 70, 2, cpu) == stage  # 10 programs at BV 16, 6 at BV 32
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=0.3, g=-0.2 * torch.rand(2, 40, 1, generator=gen, dtype=torch.float64),
                   r=None, S0=torch.randn(2, 1, 80, 70, generator=gen, dtype=torch.float64), d0=None)
    compare(tensors, {}, 32)


@pytest.mark.parametrize("r, clip, form", [(False, False, "sequential"), (True, True, "sequential"),
                                           (False, False, "chunked"), (False, True, "speculative"),
                                           (True, True, "newton")])
def test_phase2_gradients_for_phase1_in_the_dtype_its_form_reads(r, clip, form, monkeypatch):
    """wy_bwd writes phase 2's partial ∂k and total ∂k̃ in bfloat16 where the chunk form's backward or APF's scan
    reads them (∂k̃ into a new buffer), in float32 for the scan without r and the quasi-Newton form
    (chunk.phase2_grad_dtype; ∂k̃ summed in place, as version 30 did); the op's gradients stay close to the float64
    reference in every form."""
    force_phase1(monkeypatch, form)
    written = []
    wy_bwd = chunk_ops.wy_bwd

    def spy(*args):
        out = wy_bwd(*args)
        written.append((out[0].dtype, out[1].dtype, out[1].data_ptr() == args[8].data_ptr()))  # args[8]: dkt_in
        return out
    monkeypatch.setattr(chunk_ops, "wy_bwd", spy)
    gen, (q, k, v, beta) = make_tensors(11, 1, 70, 2, 16, 16, torch.float64)
    rr = 0.9 + 0.1 * torch.rand(1, 70, 2, generator=gen, dtype=torch.float64) if r else None
    x = [t.to(DEVICE, torch.bfloat16).requires_grad_() for t in (q, k, v, beta)]
    options = dict(eta=0.5, d_min=0.5 if clip else None, d_max=2.0 if clip else None, chunk_size=16)
    o, _ = osdn_fast.chunk_osdn(*x, r=None if rr is None else rr.to(DEVICE, torch.bfloat16), **options)
    (o.float() * torch.linspace(-1, 1, o.numel(), device=DEVICE).reshape(o.shape)).sum().backward()
    low = form in ("chunked", "speculative") or (form, r) == ("sequential", True)
    assert chunk_ops.phase2_grad_dtype(form, torch.bfloat16, r) == (torch.bfloat16 if low else torch.float32)
    dtype = chunk_ops.phase2_grad_dtype(form, torch.bfloat16, r)
    assert written == [(dtype, dtype, dtype == torch.float32)]  # float32 ∂k̃ summed in place: no second buffer
    ref = [t.to(torch.bfloat16).double().requires_grad_() for t in (q, k, v, beta)]
    o_ref, _ = osdn_ref.chunk_osdn(*ref, r=None if rr is None else rr.to(torch.bfloat16).double(), **options)
    (o_ref * torch.linspace(-1, 1, o_ref.numel(), dtype=torch.float64).reshape(o_ref.shape)).sum().backward()
    for name, a, b in zip("qkvb", x, ref):
        err = ((a.grad.double().cpu() - b.grad).norm() / b.grad.norm()).item()
        assert err < HALF_TOL, (name, err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype):
    """bfloat16 / float16 in, float32 state and accumulation: close to the float64 reference."""
    _, (q, k, v, beta) = make_tensors(3, 1, 40, 2, 16, 16, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=0.5, g=-0.1 * torch.ones(1, 40, 2, dtype=torch.float64),
                   r=None, S0=None, d0=None)
    compare(tensors, {}, 16, dtype=dtype, fwd_tol=HALF_TOL, grad_tol=HALF_TOL)


def test_without_final_state():
    """output_final_state=False returns None and the same output and gradients (no final-state store)."""
    _, (q, k, v, beta) = make_tensors(7, 2, 20, 1, 8, 8, torch.float32)
    g = -0.3 * torch.rand(2, 20, 1)
    results = []
    for final in (True, False):
        x = [t.clone().to(DEVICE).requires_grad_() for t in (q, k, v, beta, g)]
        o, state = osdn_fast.chunk_osdn(*x[:4], eta=0.4, g=x[4], output_final_state=final, chunk_size=16)
        assert (state is None) == (not final)
        o.sum().backward()
        results.append([o] + [t.grad for t in x])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def small(B=1, T=4, H=2, K=8, V=8, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype) for s in ((B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H))]


@pytest.mark.parametrize("change, match", [
    (dict(K=257), "key dim K = 257"),
    (dict(V=300), "value dim V = 300"),
    (dict(dtype=torch.float64), "float32, bfloat16 or float16"),
    (dict(chunk_size=8), "chunk_size"),
    (dict(beta_shape=(1, 4, 3)), "beta must have shape"),
    (dict(cu_seqlens=torch.tensor([0, 3, 3, 4])), "strictly increasing"),
])
def test_bad_inputs_raise_value_error(change, match):
    """SPEC §4: ValueError naming the argument before any kernel launch (K, V above the kernels' 256 too)."""
    chunk_size, beta_shape, cu = change.pop("chunk_size", 64), change.pop("beta_shape", None), change.pop("cu_seqlens", None)
    q, k, v, beta = small(**change)
    beta = torch.rand(beta_shape) if beta_shape else beta
    with pytest.raises(ValueError, match=match):
        osdn_fast.chunk_osdn(q, k, v, beta, eta=0.1, chunk_size=chunk_size, cu_seqlens=cu)


def test_kda_gate_not_implemented():
    q, k, v, beta = small()
    with pytest.raises(NotImplementedError, match="osdn_ref.chunk_osdn"):
        osdn_fast.chunk_osdn(q, k, v, beta, eta=0.1, g=-torch.rand(1, 4, 2, 8))


def test_kernels_compile_for_h200(tmp_path):
    """Every phase-1 and phase-2 kernel compiles ahead of time for sm_90 (the H200) with the installed Triton, within
    shared memory: benchmarks/compile_check.py in a subprocess, outside the interpreter. Its SASS fingerprints
    (--sass-out) then tell a second run (--same-as) which builds moved: here exactly the one whose recorded
    fingerprint was altered."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    prints = tmp_path / "sass.json"
    run = lambda *extra: subprocess.run([sys.executable, str(root / "benchmarks" / "compile_check.py"), "--dims", "128",  # noqa: E731
                                         *extra], cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    res = run("--sass-out", str(prints))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    recorded = json.loads(prints.read_text())
    builds = recorded["builds"]
    assert len(builds) > 40 and all(b["instructions"] > 0 and len(b["sha256"]) == 64 for b in builds.values())
    altered = sorted(builds)[0]
    builds[altered]["sha256"] = "0" * 64
    prints.write_text(json.dumps(recorded))
    res = run("--same-as", str(prints))
    assert res.returncode == 1 and res.stdout.count("SASS moved: ") == 1 and f"SASS moved: {altered} (" in res.stdout
    assert f"{len(builds) - 1} of {len(builds)} builds; moved 1, new 0, no longer built 0" in res.stdout


def test_compile_check_loops_of_the_chains():
    """compile_check.py --kernels compiles only the kernels it names, and --loops gives each build's longest loop: a
    chain's step over chunks, with the barriers of its cross-warp reductions (NOTES, version 41)."""
    import re

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "benchmarks" / "compile_check.py"), "--dims", "128", "--kernels",
                          "phase1_chunk_state", "--loops"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    builds = re.findall(r"^ok\s+K=V=128\s+bf16 (\S+)", res.stdout, flags=re.M)
    loops = re.findall(r"loop: instructions (\d+), barriers (\d+), shared_loads \d+, shared_stores \d+, "
                       r"shuffles (\d+), global_loads (\d+)", res.stdout)
    assert len(builds) >= 4 and set(builds) == {"phase1_chunk_state_kernel"} and len(loops) == len(builds)
    assert all(int(n) > 100 and int(bar) > 0 and int(ldg) > 0 for n, bar, _, ldg in loops)


@pytest.mark.parametrize("B,T,C", [(1, 1, 16), (3, 64, 64), (2, 100, 32), (4, 17, 16)])
def test_uniform_chunk_layout_is_chunk_layout(B, T, C):
    """The host-side layout of fixed-length batches (no device-to-host wait) equals the general one."""
    from osdn_fast.ops.index import chunk_layout, uniform_chunk_layout, uniform_cu_seqlens

    general = chunk_layout(uniform_cu_seqlens(B, T, "cpu"), C)
    for got, want in zip(uniform_chunk_layout(B, T, C, "cpu"), general):
        assert got.dtype == want.dtype == torch.int32
        assert torch.equal(got, want)

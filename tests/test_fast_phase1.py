"""osdn_fast phase 1 (Triton, run in the CPU interpreter without a GPU) against osdn_ref.preconditioner_scan
in float64: forward (d_t for every token, d_T) and every gradient (k, β, r, d_0, η), sequential and
chunk-parallel, fixed length and packed variable-length sequences."""
import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import osdn_ref  # noqa: E402
from osdn_fast.ops.phase1 import phase1_fwd_seq, preconditioner_scan  # noqa: E402
from osdn_fast.ops.phase1_chunk import SOLVERS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORWARD_TOL = 1e-5
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


@st.composite
def phase1_problems(draw, clip=None):
    """Sizes, flags and a seed for one phase-1 call; tensors are drawn from a seeded generator."""
    varlen = draw(st.booleans())
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4)) if varlen else None
    clipped = draw(st.booleans()) if clip is None else clip
    d_min, d_max = (None, None)
    if clipped:
        d_min, d_max = draw(st.sampled_from([(0.9, 1.1), (2 / 3, 1.5), (0.8, None), (None, 1.2)]))
    return dict(
        B=1 if varlen else draw(st.integers(1, 2)),
        T=sum(lengths) if varlen else draw(st.sampled_from([1, 2, 7, 16, 17, 40])),
        H=draw(st.integers(1, 2)),
        K=draw(st.sampled_from([1, 3, 5, 8, 12, 20, 40])),
        lengths=lengths,
        options=dict(
            beta_aware=draw(st.booleans()), normalize=draw(st.booleans()), d_min=d_min, d_max=d_max,
        ),
        has_r=draw(st.booleans()),
        has_d0=draw(st.booleans()),
        eta_kind=draw(st.sampled_from(["float", "tensor", "zero"])),
        zero_key=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16])),
        chunk_size=draw(st.sampled_from([16, 32])),
        solver=draw(st.sampled_from(SOLVERS)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_inputs(p):
    """float64 leaves on the CPU: k (L2-normalised, one zero key if asked), β ∈ [0, 1], r ∈ [0.5, 1], d_0, η."""
    gen = torch.Generator().manual_seed(p["seed"])
    B, T, H, K = p["B"], p["T"], p["H"], p["K"]
    N = B if p["lengths"] is None else len(p["lengths"])
    rand = lambda *shape: torch.rand(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    if p["zero_key"]:
        k[0, T // 2, 0] = 0
    beta = rand(B, T, H)
    r = 0.5 + 0.5 * rand(B, T, H) if p["has_r"] else None
    d0 = 0.5 + rand(N, H, K) if p["has_d0"] else None
    eta = {"float": 0.7, "zero": 0.0, "tensor": rand(H)}[p["eta_kind"]]
    # Round through the kernel's input dtype so that both sides see the same numbers.
    k, beta = k.to(p["dtype"]).double(), beta.to(p["dtype"]).double()
    return dict(k=k, beta=beta, r=r, d0=d0, eta=eta)


def reference(x, p):
    """osdn_ref per sequence (float64): (d_all [B, T, H, K], d_final [N, H, K])."""
    if p["lengths"] is None:
        out = osdn_ref.preconditioner_scan(x["k"], x["beta"], eta=x["eta"], r=x["r"], d0=x["d0"], **p["options"])
        return out.d, out.d_final
    ds, finals, start = [], [], 0
    for n, length in enumerate(p["lengths"]):
        part = slice(start, start + length)
        out = osdn_ref.preconditioner_scan(
            x["k"][:, part], x["beta"][:, part], eta=x["eta"], r=None if x["r"] is None else x["r"][:, part],
            d0=None if x["d0"] is None else x["d0"][n : n + 1], **p["options"],
        )
        ds.append(out.d)
        finals.append(out.d_final)
        start += length
    return torch.cat(ds, 1), torch.cat(finals)


def fenced(x: torch.Tensor, pad: int = 8192) -> torch.Tensor:
    """A contiguous copy of x inside NaN-filled storage: a kernel reading out of bounds returns NaN."""
    storage = torch.full((x.numel() + 2 * pad,), float("nan"), dtype=x.dtype, device=x.device)
    inner = storage[pad : pad + x.numel()].view(x.shape)
    inner.copy_(x)
    return inner


def fast(x, p, chunked, parallel=False, newton=False):
    """osdn_fast on the device: k, β in the problem's dtype; r, d_0, η in float32 (all fenced by NaNs)."""
    conv = lambda t, dt=torch.float32: fenced(t.detach().to(DEVICE, dt)).requires_grad_()  # noqa: E731
    y = dict(
        k=conv(x["k"], p["dtype"]), beta=conv(x["beta"], p["dtype"]),
        r=None if x["r"] is None else conv(x["r"]), d0=None if x["d0"] is None else conv(x["d0"]),
        eta=conv(x["eta"]) if isinstance(x["eta"], torch.Tensor) else x["eta"],
    )
    cu = None
    if p["lengths"] is not None:
        cu = torch.tensor([0] + p["lengths"], device=DEVICE).cumsum(0).to(torch.int32)
    d_all, d_final = preconditioner_scan(
        y["k"], y["beta"], eta=y["eta"], r=y["r"], d0=y["d0"], cu_seqlens=cu, chunked=chunked,
        parallel=parallel, newton=newton, chunk_size=p["chunk_size"], solver=p["solver"],
        chain_group=p.get("group"), **p["options"],
    )
    return y, d_all, d_final


def grads(inputs, d_all, d_final, w_all, w_final):
    """Gradients of ⟨w_all, d_all⟩ + ⟨w_final, d_final⟩ for every tensor input (None → zeros)."""
    loss = (d_all.double() * w_all.to(d_all.device)).sum() + (d_final.double() * w_final.to(d_final.device)).sum()
    names = [n for n, t in inputs.items() if isinstance(t, torch.Tensor)]
    got = torch.autograd.grad(loss, [inputs[n] for n in names], allow_unused=True)
    return {n: torch.zeros_like(inputs[n]) if g is None else g for n, g in zip(names, got)}


def against_reference(x, p, chunked):
    """float32 kernels on x against osdn_ref in float64: d_t, d_T, and every gradient for random cotangents."""
    leaves = {n: t.requires_grad_() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
    ref_all, ref_final = reference(leaves, p)
    y, d_all, d_final = fast(x, p, chunked)
    osdn_ref.check("d_all", d_all, ref_all, FORWARD_TOL)
    osdn_ref.check("d_final", d_final, ref_final, FORWARD_TOL)
    w_all, w_final = torch.randn_like(ref_all), torch.randn_like(ref_final)
    expected = grads(leaves, ref_all, ref_final, w_all, w_final)
    actual = grads(y, d_all, d_final, w_all, w_final)
    for name, g in expected.items():
        close(f"d{name}", actual[name], g, GRAD_TOL[torch.float32])


def close(label, actual, expected, tol, floor=1e-2):
    """‖actual − expected‖ ≤ tol · max(‖expected‖, floor): relative, except for gradients that vanish in exact
    arithmetic (e.g. ∂η at the fixed point d = 1 of the beta-free form), where float64 keeps only round-off."""
    err = (actual.detach().double().cpu() - expected.detach().double().cpu()).norm().item()
    assert err <= tol * max(expected.norm().item(), floor), f"{label}: error {err:.3e}, |expected| {expected.norm():.3e}"


def compare(p, chunked, parallel=False, newton=False):
    x = make_inputs(p)
    leaves = {n: t.requires_grad_() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
    ref_all, ref_final = reference(leaves, p)
    y, d_all, d_final = fast(x, p, chunked, parallel, newton)
    assert d_all.dtype == d_final.dtype == torch.float32
    assert d_all.shape == ref_all.shape and d_final.shape == ref_final.shape
    osdn_ref.check("d_all", d_all, ref_all, FORWARD_TOL)
    osdn_ref.check("d_final", d_final, ref_final, FORWARD_TOL)
    gen = torch.Generator().manual_seed(p["seed"] + 1)
    w_all = torch.randn(ref_all.shape, generator=gen, dtype=torch.float64)
    w_final = torch.randn(ref_final.shape, generator=gen, dtype=torch.float64)
    expected = grads(leaves, ref_all, ref_final, w_all, w_final)
    actual = grads(y, d_all, d_final, w_all, w_final)
    for name, g in expected.items():
        assert actual[name].dtype == y[name].dtype, name
        close(f"d{name}", actual[name], g, GRAD_TOL[p["dtype"]])


@settings(max_examples=15, deadline=None)
@given(phase1_problems())
def test_sequential_matches_reference(p):
    compare(p, chunked=False)


@settings(max_examples=12, deadline=None)
@given(phase1_problems())
def test_parallel_matches_reference(p):
    """The exact chunk-parallel form that chunk_osdn runs (clip included), through preconditioner_scan."""
    compare(p, chunked=False, parallel=True)


@settings(max_examples=12, deadline=None)
@given(phase1_problems())
def test_newton_matches_reference(p):
    """Phase 1 across chunks by Newton's method (clip included), through preconditioner_scan."""
    compare(p, chunked=False, newton=True)


@settings(max_examples=12, deadline=None)
@given(phase1_problems(clip=False))
def test_chunked_matches_reference(p):
    compare(p, chunked=True)


@settings(max_examples=6, deadline=None)
@given(phase1_problems(clip=False), st.sampled_from([33, 64, 90]), st.sampled_from(["both", "all", "final"]))
def test_chunked_matches_sequential_over_many_chunks(p, T, used):
    """Both Triton forms on the same float32 input, several chunks of 16 with a partial last one, forward and
    backward; the loss uses d_all, d_final or both (so either incoming gradient may be absent)."""
    p = dict(p, T=T, lengths=None, dtype=torch.float32, chunk_size=16)
    x = make_inputs(p)
    results = []
    for chunked in (False, True):
        y, d_all, d_final = fast(x, p, chunked=chunked)
        weighted = (d_all * torch.linspace(-1, 1, T, device=DEVICE)[:, None, None]).sum()
        loss = {"both": weighted + d_final.sum(), "all": weighted, "final": d_final.sum()}[used]
        names = [n for n, t in y.items() if isinstance(t, torch.Tensor)]
        results.append((d_all, d_final, dict(zip(names, torch.autograd.grad(loss, [y[n] for n in names])))))
    (seq_all, seq_final, seq_grads), (chk_all, chk_final, chk_grads) = results
    osdn_ref.check("d_all", chk_all, seq_all, FORWARD_TOL)
    osdn_ref.check("d_final", chk_final, seq_final, FORWARD_TOL)
    for name, g in seq_grads.items():
        # ∂η vanishes at the beta-free fixed point d = 1; what is left is the float32 round-off of 1 − ⟨d, k²⟩ summed
        # over T tokens, which the two forms sum in different orders (up to 5e-6 at T = 90 on the H200)
        close(f"d{name}", chk_grads[name], g, GRAD_TOL[torch.float32], floor=0.1 if name == "eta" else 1e-2)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_every_solver_matches_reference(solver, chunk_size):
    """Each way of forming the chunks' (I + L)⁻¹, on packed sequences with partial chunks, APF, a zero key and η
    large enough that d moves by O(1): forward and every gradient against float64."""
    p = dict(B=1, T=150, H=2, K=24, lengths=[70, 1, 79], options=dict(beta_aware=True, normalize=True, d_min=None,
             d_max=None), has_r=True, has_d0=True, eta_kind="tensor", zero_key=True, dtype=torch.float32,
             chunk_size=chunk_size, solver=solver, seed=11)
    against_reference(make_inputs(p), p, chunked=True)


@settings(max_examples=12, deadline=None)
@given(phase1_problems(clip=False), st.sampled_from([2, 4]))
def test_grouped_chains_match_reference(p, group):
    """The chunk form's chains walked in groups of chunks (chain_group: every group's affine map in parallel, a walk
    over the groups, a replay of each group's chunks), forward and backward, against float64."""
    compare(dict(p, group=group), chunked=True)


@pytest.mark.parametrize("group, bn", [(2, 64), (4, 16), (8, 16)])
def test_grouped_chains_over_many_chunks(group, bn, monkeypatch):
    """The same over ten chunks of 16 in packed sequences of 5, 1 and 4 chunks (partial groups, a partial chunk, a
    one-chunk sequence), APF, d_0, a zero key and η large enough that d moves by O(1); the maps formed in one
    block of columns (BN ≥ K) or two (BN = 16 at K = 24)."""
    from osdn_fast.ops.tuning import TUNING

    monkeypatch.setitem(TUNING, "phase1_group_map", dict(TUNING["phase1_group_map"], BN=bn))
    p = dict(B=1, T=150, H=2, K=24, lengths=[70, 1, 79], options=dict(beta_aware=True, normalize=True, d_min=None,
             d_max=None), has_r=True, has_d0=True, eta_kind="tensor", zero_key=True, dtype=torch.float32,
             chunk_size=16, solver="blockwise", seed=5, group=group)
    against_reference(make_inputs(p), p, chunked=True)


def test_grouped_chains_equal_the_chunk_walk_with_an_empty_sequence():
    """Grouped and ungrouped chains of phase1_fwd_chunk / phase1_bwd_chunk agree to float32 round-off on packed
    sequences one of which is empty (its d_final = d_0 and ∂d_0 = ∂L/∂d_final come from the walk alone); a group
    that is not a power of two is refused by name."""
    from osdn_fast.ops.phase1_chunk import phase1_bwd_chunk, phase1_fwd_chunk

    gen = torch.Generator().manual_seed(4)
    T, H, K = 150, 2, 32
    k = F.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1).to(DEVICE)
    beta, r = torch.rand(1, T, H, generator=gen).to(DEVICE), (0.9 + 0.1 * torch.rand(1, T, H, generator=gen)).to(DEVICE)
    d0 = (0.5 + torch.rand(3, H, K, generator=gen)).to(DEVICE)
    eta = torch.full((H,), 0.5, device=DEVICE)
    cu = torch.tensor([0, 40, 40, 150], dtype=torch.int32, device=DEVICE)
    gd_all, gd_final = torch.randn(1, T, H, K, generator=gen).to(DEVICE), torch.randn(3, H, K, generator=gen).to(DEVICE)
    opts = dict(beta_aware=True, normalize=True, cu_seqlens=cu, chunk_size=16, solver="blockwise")
    walked = phase1_fwd_chunk(k, beta, r, d0, eta, **opts)
    grouped = phase1_fwd_chunk(k, beta, r, d0, eta, **opts, group=2)
    assert torch.equal(grouped[1][1], d0[1])
    for a, b in zip(walked, grouped):
        osdn_ref.check("d", b, a, FORWARD_TOL)
    walked = phase1_bwd_chunk(k, beta, r, eta, walked[0], gd_all, gd_final, **opts)
    grouped = phase1_bwd_chunk(k, beta, r, eta, grouped[0], gd_all, gd_final, **opts, group=4)
    assert torch.equal(grouped[3][1], gd_final[1])
    for name, a, b in zip(("dk", "dbeta", "dr", "dd0", "deta"), walked, grouped):
        close(name, b, a, FORWARD_TOL)
    with pytest.raises(ValueError, match="group"):
        phase1_fwd_chunk(k, beta, r, d0, eta, **opts, group=3)
    with pytest.raises(ValueError, match="chain_group"):
        preconditioner_scan(k, beta, eta=0.5, chain_group=2)


@pytest.mark.parametrize("K", [128, 64])
@pytest.mark.parametrize("kb", [16, 32, 64])
def test_chunked_launch_settings_match_reference(kb, K, monkeypatch):
    """chunk_osdn runs phase 1's chunk form at the tiles of TUNING's `phase1_*` entries (phase1_chunk.TUNED_TILES:
    chunk.PHASE1_CHUNKED's chunk size, K = 128; their `_k64` entries at K = 64, tuning_key), and there the parallel
    kernels take those entries: with every key-channel block KB that the H200 sweep may pick
    (benchmarks/profile_phase2.py), d and every gradient match float64 over two chunks and a partial one."""
    from osdn_fast.ops import chunk, phase1_chunk
    from osdn_fast.ops.tuning import TUNING

    C = phase1_chunk.TUNED_TILES[0]
    assert chunk.PHASE1_CHUNKED["chunk_size"] == C and phase1_chunk.TUNED_TILES[1] == 128
    for stage in ("prep", "out", "bwd_prep", "bwd_out", "state", "bwd_state"):
        key = phase1_chunk.tuning_key(stage, C, K)
        assert key == f"phase1_{stage}" + ("" if K == 128 else "_k64") and key in TUNING
        if "state" not in stage:
            monkeypatch.setitem(TUNING, key, dict(TUNING[key], KB=kb))
            assert phase1_chunk._parallel_launch(stage, C, K)["KB"] == kb
    sum_key = phase1_chunk.tuning_key("bwd_out_sum", C, K)    # the backward's running sum without r (K = 128 only)
    assert (sum_key in TUNING) == (K == 128)
    if sum_key in TUNING:
        monkeypatch.setitem(TUNING, sum_key, dict(TUNING[sum_key], KB=kb))
    assert phase1_chunk.tuning_key("prep", 2 * C, K) is None   # off the tuned chunks: the rule
    assert phase1_chunk._parallel_launch("prep", 2 * C, K) == dict(KB=16, num_warps=8 if K == 128 else 4, num_stages=3)
    for has_r in (True, False):
        p = dict(B=1, T=2 * C + 22, H=1, K=K, lengths=None, options=dict(beta_aware=True, normalize=True, d_min=None,
                 d_max=None), has_r=has_r, has_d0=True, eta_kind="tensor", zero_key=True, dtype=torch.float32,
                 chunk_size=C, solver="blockwise", seed=3)
        against_reference(make_inputs(p), p, chunked=True)


def test_chunk_backward_reuses_the_forward_inverse():
    """chunk_osdn keeps the blockwise solver's P = (I + L)⁻¹ from the forward (`inverse_out`; chunk_inverses forms the
    same P alone), and each token's s_t = ⟨d_t, a_t⟩ and ‖k_t‖² (`stats`), and hands them to the backward: results
    bitwise those of the calls that form them themselves (the stats to float32 rounding); a P of the wrong shape or
    for another solver, or stats of the wrong shape, are refused by name."""
    from osdn_fast.ops.phase1_chunk import chunk_inverses, phase1_bwd_chunk, phase1_fwd_chunk

    gen = torch.Generator().manual_seed(8)
    B, T, H, K = 1, 100, 2, 16
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(DEVICE)
    beta, r = torch.rand(B, T, H, generator=gen).to(DEVICE), (0.9 + 0.1 * torch.rand(B, T, H, generator=gen)).to(DEVICE)
    eta = torch.full((H,), 0.4, device=DEVICE)
    gains = dict(beta_aware=True, normalize=True, cu_seqlens=None)
    opts = dict(gains, chunk_size=32, solver="blockwise", precision="ieee")
    inv = chunk_inverses(k, beta, r, eta, **gains, chunk_size=32, precision="ieee")
    assert inv.shape == (B * T, H, 32) and inv.dtype == torch.float32
    stats = torch.full((2, B, T, H), float("nan"), device=DEVICE)
    fresh, kept = phase1_fwd_chunk(k, beta, r, None, eta, **opts), phase1_fwd_chunk(k, beta, r, None, eta, **opts,
                                                                                    inverse=inv, stats=stats)
    assert all(torch.equal(a, b) for a, b in zip(fresh, kept))
    inv_out = torch.full_like(inv, float("nan"))  # the forward that forms P itself, in the launch that uses it
    formed = phase1_fwd_chunk(k, beta, r, None, eta, **opts, inverse_out=inv_out)
    assert torch.equal(inv_out, inv) and all(torch.equal(a, b) for a, b in zip(fresh, formed))
    a = k.float() ** 2
    torch.testing.assert_close(stats[0], (fresh[0] * a).sum(-1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats[1], a.sum(-1), rtol=1e-6, atol=1e-7)
    grads = (torch.randn(B, T, H, K, generator=gen).to(DEVICE), torch.randn(B, T, H, K, generator=gen).to(DEVICE),
             torch.randn(B, T, H, generator=gen).to(DEVICE))
    fresh = phase1_bwd_chunk(k, beta, r, eta, fresh[0], None, None, phase2_grads=grads, **opts)
    d_kept = kept[0]
    kept = phase1_bwd_chunk(k, beta, r, eta, d_kept, None, None, phase2_grads=grads, **opts, inverse=inv, stats=stats)
    for a, b in zip(fresh, kept):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    off = phase1_bwd_chunk(k, beta, r, eta, d_kept, None, None, phase2_grads=grads, **opts, stats=stats + 0.5)
    assert not torch.allclose(off[0], kept[0])  # the backward reads the stats it is given
    with pytest.raises(ValueError, match="stats"):
        phase1_bwd_chunk(k, beta, r, eta, d_kept, None, None, phase2_grads=grads, **opts, stats=stats[:, :, :50])
    with pytest.raises(ValueError, match="inverse"):
        phase1_fwd_chunk(k, beta, r, None, eta, **opts, inverse=inv[:, :, :16])
    with pytest.raises(ValueError, match="inverse"):
        phase1_fwd_chunk(k, beta, r, None, eta, **dict(opts, solver="substitution"), inverse=inv)
    with pytest.raises(ValueError, match="inverse_out"):
        phase1_fwd_chunk(k, beta, r, None, eta, **opts, inverse_out=inv_out[:, :, :16])
    with pytest.raises(ValueError, match="inverse_out"):
        phase1_fwd_chunk(k, beta, r, None, eta, **opts, inverse=inv, inverse_out=inv_out)


@pytest.mark.parametrize("cu", [None, [0, 40, 40, 100]])
def test_chunk_backward_forms_d_from_the_forward_entries(cu):
    """chunk_osdn's forward stores no d_t (version 29): it keeps the chain's entry states x_0 and u (`entries`), and
    the backward's out kernel forms d again from them as the forward's out kernel does. The d so formed is the one
    the forward stores with `store_d`, and the backward from the entries gives the backward from d_all (bitwise in
    the interpreter; to float32 round-off on a GPU, where two kernels run the same dot); perturbed entries move the
    gradients (the backward reads them); entries of the wrong shape, or none and no d_all, are refused by name."""
    from osdn_fast.ops.phase1_chunk import chunk_entries, phase1_bwd_chunk, phase1_fwd_chunk, replay_d

    gen = torch.Generator().manual_seed(11)
    B, T, H, K = 1, 100, 2, 24
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(DEVICE)
    beta, r = torch.rand(B, T, H, generator=gen).to(DEVICE), (0.9 + 0.1 * torch.rand(B, T, H, generator=gen)).to(DEVICE)
    d0 = (0.5 + torch.rand(1 if cu is None else len(cu) - 1, H, K, generator=gen)).to(DEVICE)
    eta = torch.full((H,), 0.5, device=DEVICE)
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    opts = dict(beta_aware=True, normalize=True, cu_seqlens=cu, chunk_size=32, solver="blockwise", precision="tf32")
    entries = tuple(torch.full_like(x, float("nan")) for x in chunk_entries(k, cu, 32))
    stored = phase1_fwd_chunk(k, beta, r, d0, eta, **opts)
    kept = phase1_fwd_chunk(k, beta, r, d0, eta, **opts, store_d=False, entries=entries)
    assert kept[0] is None and torch.equal(kept[1], stored[1])
    assert all(torch.isfinite(x).all() for x in entries)
    replayed = replay_d(k, r, entries, cu_seqlens=cu, chunk_size=32, precision="tf32")
    assert torch.equal(replayed, stored[0])
    grads = (torch.randn(B, T, H, K, generator=gen).to(DEVICE), torch.randn(B, T, H, K, generator=gen).to(DEVICE),
             torch.randn(B, T, H, generator=gen).to(DEVICE))
    dd_final = torch.randn(d0.shape, generator=gen).to(DEVICE)
    from_d = phase1_bwd_chunk(k, beta, r, eta, stored[0], None, dd_final, phase2_grads=grads, **opts)
    from_entries = phase1_bwd_chunk(k, beta, r, eta, None, None, dd_final, phase2_grads=grads, **opts,
                                    entries=entries)
    for name, a, b in zip(("dk", "dbeta", "dr", "dd0", "deta"), from_d, from_entries):
        if DEVICE == "cpu":
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    moved = (entries[0] * 1.01, entries[1])
    off = phase1_bwd_chunk(k, beta, r, eta, None, None, dd_final, phase2_grads=grads, **opts, entries=moved)
    assert not torch.allclose(off[0], from_entries[0])
    with pytest.raises(ValueError, match="entries"):
        phase1_bwd_chunk(k, beta, r, eta, None, None, dd_final, phase2_grads=grads, **opts)
    with pytest.raises(ValueError, match="entries"):
        phase1_bwd_chunk(k, beta, r, eta, stored[0], None, dd_final, phase2_grads=grads, **opts, entries=entries)
    with pytest.raises(ValueError, match="entries"):
        phase1_fwd_chunk(k, beta, r, d0, eta, **opts, entries=(entries[0][:1], entries[1]))
    with pytest.raises(ValueError, match="entries"):
        replay_d(k, r, (entries[0], entries[1].double()), cu_seqlens=cu, chunk_size=32)


@pytest.mark.parametrize("grouped, d_bound, deta_bound", [(False, 1e-6, 1e-5), (True, 5e-4, 3e-3)])
def test_chains_keep_the_beta_free_fixed_point_in_tf32(grouped, d_bound, deta_bound, monkeypatch):
    """With L2-normalised keys the β-free update has d = 1 as a fixed point (SPEC §2), so ∂η = Σ p_t (1 − ⟨d_t, k_t²⟩)
    is round-off. On the interpreter tl.dot's TF32 operands are cut here to 10-bit mantissas as the H200 cuts them
    (truncated: on the H200 this test's d left 1 by 1.3435e-4, truncation on the CPU gives 1.3388e-4, rounding to
    nearest 1.16e-5), so the test sees what the GPU sees. The walked chain has no dot: d stays at 1 to float32's
    round-off. The grouped chains' K×K maps are TF32 products: d leaves 1 by TF32's error (1.3e-4 here; TF32's
    truncation unit is 9.8e-4) and ∂η with it (9e-4 here, on the H200 9.04e-4; at η = 0.1 and longer chains up to
    6.1e-2, benchmarks/grouped_deta.py), within GRAD_TOL × GROUPED_DETA_FLOOR of test_fast_chunk.py on a GPU. The maps
    in 3xTF32 keep d at 1 but cost 41% of the forward at (1, 16384, 16, 128) on the H200 (NOTES, version 30); their
    operands rounded to nearest bring this test's d to 1.1e-5 for 1.6% (NOTES, after version 30; not kept)."""
    import numpy as np

    import osdn_fast
    from osdn_fast.ops import chunk

    if DEVICE == "cpu":
        import triton.runtime.interpreter as interp
        plain = interp.InterpreterBuilder.create_dot

        def tf32(x):
            u = x.astype(np.float32).view(np.uint32)
            return (u & np.uint32(0xFFFFE000)).view(np.float32)

        def rounded(self, a, b, d, input_precision, max_num_imprecise_acc):
            if a.data.dtype == b.data.dtype == np.float32 and str(input_precision).upper().endswith("TF32"):
                a, b = interp.TensorHandle(tf32(a.data), a.dtype), interp.TensorHandle(tf32(b.data), b.dtype)
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)

        monkeypatch.setattr(interp.InterpreterBuilder, "create_dot", rounded)
    monkeypatch.setattr(chunk, "PHASE1_CHUNKED_MIN_T", 1)
    monkeypatch.setattr(chunk, "PHASE1_GROUP_MIN_CHUNKS", 2 if grouped else 1 << 30)
    monkeypatch.setattr(chunk, "PHASE1_GROUP_MAX_CHAINS", 1 << 30)
    gen = torch.Generator().manual_seed(2)
    q, v = torch.randn(1, 70, 1, 3, generator=gen), torch.randn(1, 70, 1, 2, generator=gen)
    k = F.normalize(torch.randn(1, 70, 1, 3, generator=gen, dtype=torch.float64), dim=-1).float()
    beta = torch.rand(1, 70, 1, generator=gen)
    xs = [x.to(DEVICE).requires_grad_() for x in (q, k, v, beta)]
    eta = torch.full((1,), 0.003, device=DEVICE, requires_grad=True)
    assert chunk.phase1_group(xs[1], None) == (2 if grouped else None)
    o, (S, d) = osdn_fast.chunk_osdn(*xs, eta=eta, beta_aware=False, normalize=False, chunk_size=16,
                                     output_final_state=True)
    (o.double().sum() + d.double().sum()).backward()
    assert (d - 1).abs().max().item() < d_bound, (d - 1).abs().max().item()
    assert eta.grad.abs().max().item() < deta_bound, eta.grad.abs().max().item()


def test_eta_zero_keeps_d0():
    """η = 0 is DeltaNet: d stays at d_0 (ones) for every token, in both forms."""
    k = torch.randn(2, 9, 2, 7, device=DEVICE)
    beta = torch.rand(2, 9, 2, device=DEVICE)
    for chunked in (False, True):
        d_all, d_final = preconditioner_scan(k, beta, eta=0.0, chunked=chunked, chunk_size=16)
        assert torch.equal(d_all, torch.ones_like(d_all)) and torch.equal(d_final, torch.ones_like(d_final))


def test_clip_is_zero_gradient_on_clipped_coordinates():
    """A coordinate held at d_max by the clip passes no gradient back to d_0."""
    k = torch.zeros(1, 1, 1, 3, device=DEVICE)
    k[..., 0] = 1.0
    d0 = torch.tensor([[[1.0, 1.0, 1.0]]], device=DEVICE, requires_grad=True)
    beta = torch.full((1, 1, 1), 0.5, device=DEVICE)
    _, d_final = preconditioner_scan(k, beta, eta=1.0, d0=d0, d_max=1.1, chunked=False)
    assert d_final[0, 0, 0].item() == pytest.approx(1.1)  # 1 + 0.5 (1 − 0.5) / (1 + ε) > 1.1: clipped
    d_final.sum().backward()
    assert d0.grad[0, 0].tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("chunked", [False, True])
def test_zero_retention(chunked):
    """r_t = 0 (APF forgetting everything) at some tokens: d_{t+1} is the update alone; no NaN anywhere."""
    p = dict(B=1, T=37, H=2, K=5, lengths=None, options=dict(beta_aware=True, normalize=True, d_min=None, d_max=None),
             has_r=True, has_d0=True, eta_kind="tensor", zero_key=False, dtype=torch.float32, chunk_size=16,
             solver="substitution", seed=7)
    x = make_inputs(p)
    x["r"][0, ::5] = 0.0
    against_reference(x, p, chunked)


def test_chunk_size_must_be_a_power_of_two():
    k = torch.randn(1, 4, 1, 4, device=DEVICE)
    with pytest.raises(ValueError, match="chunk_size"):
        preconditioner_scan(k, torch.rand(1, 4, 1, device=DEVICE), eta=0.1, chunk_size=24, chunked=True)


def test_forms_exclude_each_other():
    k = torch.nn.functional.normalize(torch.randn(1, 4, 1, 16), dim=-1).to(DEVICE)
    for forms in (dict(chunked=True, parallel=True), dict(parallel=True, newton=True)):
        with pytest.raises(ValueError, match="pick one form"):
            preconditioner_scan(k, torch.rand(1, 4, 1, device=DEVICE), eta=0.1, **forms)


def test_chunked_refuses_the_clip():
    k = torch.randn(1, 4, 1, 4, device=DEVICE)
    with pytest.raises(ValueError, match="clip"):
        preconditioner_scan(k, torch.rand(1, 4, 1, device=DEVICE), eta=0.1, d_min=0.5, chunked=True)


def test_guarded_scan_runs_only_if_flagged():
    """`only_if` (chunk_osdn's redo of a failed speculation): a zero flag leaves `out` untouched, a nonzero one
    writes exactly the unguarded scan's results there."""
    k = torch.nn.functional.normalize(torch.randn(2, 9, 2, 7, device=DEVICE), dim=-1)
    beta, eta = torch.rand(2, 9, 2, device=DEVICE), torch.full((2,), 0.7, device=DEVICE)
    opts = dict(d_min=0.9, d_max=1.1, beta_aware=True, normalize=True, cu_seqlens=None, store_kt=True)
    expected = phase1_fwd_seq(k, beta, None, None, eta, **opts)
    for flag in (0, 3):
        out = tuple(torch.full_like(x, float("nan")) for x in expected)
        phase1_fwd_seq(k, beta, None, None, eta, **opts, out=out,
                       only_if=torch.tensor([flag], dtype=torch.int32, device=DEVICE))
        for got, want in zip(out, expected):
            assert torch.isnan(got).all() if flag == 0 else torch.equal(got, want)


@pytest.mark.parametrize("beta_aware", [True, False])
def test_fused_chunk_backward_sums_phase2_gradients(beta_aware):
    """phase1_bwd_chunk with phase2_grads = (∂k̃, ∂k, ∂β) (chunk_osdn's backward) equals the plain backward fed
    ∂d = ∂k̃ ⊙ k, plus ∂k̃ ⊙ d and phase 2's ∂k, ∂β, written in k's and β's dtypes."""
    from osdn_fast.ops.phase1_chunk import phase1_bwd_chunk, phase1_fwd_chunk

    gen = torch.Generator().manual_seed(5)
    B, T, H, K = 2, 70, 2, 12
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(DEVICE)
    beta, r = torch.rand(B, T, H, generator=gen).to(DEVICE), (0.9 + 0.1 * torch.rand(B, T, H, generator=gen)).to(DEVICE)
    eta = torch.full((H,), 0.4, device=DEVICE)
    opts = dict(beta_aware=beta_aware, normalize=True, cu_seqlens=None, chunk_size=16, solver="blockwise")
    d_all, _ = phase1_fwd_chunk(k, beta, r, None, eta, **opts)
    dkt, dk2, db2 = (torch.randn(*s, generator=gen).to(DEVICE) for s in ((B, T, H, K), (B, T, H, K), (B, T, H)))
    gd_final = torch.randn(B, H, K, generator=gen).to(DEVICE)
    plain = phase1_bwd_chunk(k, beta, r, eta, d_all, dkt * k, gd_final, **opts)
    fused = phase1_bwd_chunk(k, beta, r, eta, d_all, None, gd_final, phase2_grads=(dkt, dk2, db2), **opts)
    torch.testing.assert_close(fused[0], plain[0] + dkt * d_all + dk2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused[1], plain[1] + db2, rtol=1e-5, atol=1e-6)
    for a, b in zip(fused[2:], plain[2:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_wide_index_only_past_int32_and_bitwise_the_same(monkeypatch):
    """The sequential scans keep token indices in int32 unless an offset into k may pass int32
    (phase1_launch.wide_index); both index widths give the same bits, forward and backward."""
    from osdn_fast.ops import phase1 as seq
    from osdn_fast.ops.phase1_launch import wide_index

    assert not wide_index(torch.empty(8, 2048, 16, 128, device="meta"))
    assert wide_index(torch.empty(2**16, 2**10, 16, 2, device="meta"))  # 2^31 elements
    gen = torch.Generator().manual_seed(3)
    k = torch.nn.functional.normalize(torch.randn(2, 37, 2, 16, generator=gen), dim=-1).to(DEVICE)
    beta = torch.rand(2, 37, 2, generator=gen).to(DEVICE)
    eta = torch.full((2,), 0.5, device=DEVICE)
    g_all = torch.randn(2, 37, 2, 16, generator=gen).to(DEVICE)
    opts = dict(d_min=None, d_max=None, beta_aware=True, normalize=True, cu_seqlens=None)
    results = []
    for wide in (False, True):
        monkeypatch.setattr(seq, "wide_index", lambda k, wide=wide: wide)
        d_all, d_final, _ = seq.phase1_fwd_seq(k, beta, None, None, eta, **opts)
        grads = seq.phase1_bwd_seq(k, beta, None, eta, d_all, g_all, None, **opts)
        results.append([d_all, d_final, *[g for g in grads if g is not None]])
    assert all(torch.equal(a, b) for a, b in zip(*results))



@pytest.mark.parametrize("apf", [False, True])
def test_unclipped_blocks_agree_with_the_token_form(apf):
    """Without a clip the sequential scans take four tokens per reduction (_fwd_block, _bwd_block); with one, token
    by token. A floor of −∞ never acts, so the token form then computes the same scan: forward (d, d_T, k̃) and the
    fused backward (every gradient) agree to float32 rounding, over a length that leaves a partial last block."""
    from osdn_fast.ops.phase1 import phase1_bwd_seq

    gen = torch.Generator().manual_seed(11)
    B, T, H, K = 2, 41, 2, 20
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(DEVICE)
    beta = torch.rand(B, T, H, generator=gen).to(DEVICE)
    r = (0.9 + 0.1 * torch.rand(B, T, H, generator=gen)).to(DEVICE) if apf else None
    eta = torch.full((H,), 0.6, device=DEVICE)
    grads = (torch.randn(B, T, H, K, generator=gen).to(DEVICE), torch.randn(B, T, H, K, generator=gen).to(DEVICE),
             torch.randn(B, T, H, generator=gen).to(DEVICE))
    gd_final = torch.randn(B, H, K, generator=gen).to(DEVICE)
    results = []
    for d_min in (None, -math.inf):
        opts = dict(d_min=d_min, d_max=None, beta_aware=True, normalize=True, cu_seqlens=None)
        d_all, d_final, kt = phase1_fwd_seq(k, beta, r, None, eta, **opts, store_kt=True)
        back = phase1_bwd_seq(k, beta, r, eta, d_all, None, gd_final, **opts, phase2_grads=grads)
        results.append([d_all, d_final, kt, *[g for g in back if g is not None]])
    assert len(results[0]) == len(results[1]) == (8 if apf else 7)
    assert not all(torch.equal(a, b) for a, b in zip(*results))  # two forms, two roundings
    for block, token in zip(*results):
        torch.testing.assert_close(block, token, rtol=1e-5, atol=1e-6)

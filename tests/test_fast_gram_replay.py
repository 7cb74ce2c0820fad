"""gram_replay (phase 1's out kernel fused into phase 2's Gram, version 39) against the two kernels it replaces, and
chunk_osdn's choice of it: k̃, the backward's stats and A from the chain's entry states, in the CPU interpreter."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import osdn_fast  # noqa: E402
import osdn_fast.ops.chunk as chunk_ops  # noqa: E402
import osdn_fast.ops.gram_replay as gram_replay_mod  # noqa: E402
import osdn_fast.ops.phase1_chunk as phase1_chunk  # noqa: E402
import osdn_ref  # noqa: E402
from osdn_fast.ops.common import block_dims  # noqa: E402
from osdn_fast.ops.cumsum import chunk_cumsum  # noqa: E402
from osdn_fast.ops.index import chunk_layout  # noqa: E402
from strategies import make_tensors  # noqa: E402
from test_fast_chunk import DEVICE, FORWARD_TOL, HALF_TOL, Spy, compare  # noqa: E402

C1 = 32  # phase 1's chunks in chunk_osdn (PHASE1_CHUNKED)
# the same float32 sums replayed over 64 tokens instead of two chunks of 32: round-off apart (the GPU's order of
# summation differs more); chunk_osdn's replay products are TF32 on a GPU, so there the whole op's tolerance
REPLAY_TOL = 1e-6 if DEVICE == "cpu" else 1e-5
GRAM_TOL = 1e-6 if DEVICE == "cpu" else FORWARD_TOL  # float32 tl.dot is TF32 on a GPU
SAME_OP_TOL = 1e-5 if DEVICE == "cpu" else FORWARD_TOL


def gram_reference(k, kt, beta, G, cu, C):
    """A_ij = β_i ⟨k_i, k̃_j⟩ e^{G_i − G_j} for j < i in each chunk of C tokens of each packed sequence, float64,
    rows by token [ΣT, H, C] (zero elsewhere)."""
    T, H = k.shape[1], k.shape[2]
    A = torch.zeros(T, H, C, dtype=torch.float64)
    k, kt, beta = k[0].double(), kt[0].double(), beta[0].double()
    G = torch.zeros(T, H, dtype=torch.float64) if G is None else G[0].double()
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        for c0 in range(s, e, C):
            c1 = min(c0 + C, e)
            n = c1 - c0
            dots = torch.einsum("ihk,jhk->hij", k[c0:c1], kt[c0:c1])
            decay = (G[c0:c1].T[:, :, None] - G[c0:c1].T[:, None, :]).exp()
            lower = torch.ones(n, n, dtype=torch.bool).tril(-1)
            blk = torch.where(lower, dots * decay * beta[c0:c1].T[:, :, None], 0.0)  # [H, i, j]
            A[c0:c1, :, :n] = blk.permute(1, 0, 2)
    return A


@pytest.mark.parametrize("C, K, has_r, gate, cu", [(32, 20, False, False, None), (64, 20, True, True, None),
                                                   (64, 16, True, False, [0, 33, 100, 170]),
                                                   (32, 40, False, True, [0, 70, 71, 170])])
def test_gram_replay_matches_the_out_kernel_and_the_gram(C, K, has_r, gate, cu):
    """k̃ and the stats equal what phase 1's out kernel writes from the same chain (replayed over C = 32 or 64 tokens
    from the entry state of the first phase-1 chunk instead of over each chunk of 32: float32 round-off apart), and
    A is the Gram of k and that k̃ (float64), with r, the GDN gate, K not a power of two and packed sequences whose
    lengths are not multiples of either chunk size."""
    B, T, H = (2, 90, 2) if cu is None else (1, cu[-1], 2)
    gen, (q, k, v, beta) = make_tensors(7, B, T, H, K, 8, torch.float32)
    k, beta = k.to(DEVICE), beta.to(DEVICE)
    r = (0.8 + 0.2 * torch.rand(B, T, H, generator=gen)).to(DEVICE) if has_r else None
    g = (-0.2 * torch.rand(B, T, H, generator=gen)).to(DEVICE) if gate else None
    eta = torch.full((H,), 0.5, device=DEVICE)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    opts = dict(beta_aware=True, normalize=True, cu_seqlens=cu_t, chunk_size=C1, solver="blockwise",
                precision="ieee")
    entries = phase1_chunk.chunk_entries(k, cu_t, C1)
    stats_out = torch.empty(2, B, T, H, dtype=torch.float32, device=DEVICE)
    _, d_final, kt_out, _ = phase1_chunk.phase1_fwd_chunk(k, beta, r, None, eta, **opts, store_kt=True,
                                                          store_d=False, stats=stats_out, entries=entries)
    x0, u = [x.clone() for x in entries]
    none = phase1_chunk.phase1_fwd_chunk(k, beta, r, None, eta, **opts, store_d=False, entries=entries, out=False)
    assert none[0] is None and torch.equal(none[1], d_final) and torch.equal(entries[0], x0)

    cu_p = cu_t if cu_t is not None else torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=DEVICE)
    pk = lambda x: None if x is None else x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
    chunk_indices, _ = chunk_layout(cu_p, C)
    G = None if g is None else chunk_cumsum(pk(g), cu_p, chunk_indices, C)
    stats = torch.empty(2, B * T, H, dtype=torch.float32, device=DEVICE)
    offsets = None if cu is None else chunk_layout(cu_p, C1)[1]  # None: one length, the kernel forms them
    kt, A = gram_replay_mod.gram_replay(pk(k), pk(beta), G, pk(r), (x0, pk(u)), offsets, C1, stats, cu_p,
                                        chunk_indices, C, block_dims(K, 8)[0], "ieee")
    osdn_ref.check("k̃", kt.reshape(k.shape), kt_out, REPLAY_TOL)
    osdn_ref.check("stats", stats.reshape(stats_out.shape), stats_out, REPLAY_TOL)
    expected = gram_reference(pk(k).cpu(), kt.cpu(), pk(beta).cpu(), None if G is None else G.cpu(), cu_p.cpu(), C)
    osdn_ref.check("A", A[0], expected.to(A.device), GRAM_TOL)


def test_gram_replay_needs_whole_phase1_chunks():
    k = torch.zeros(1, 16, 1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="chunk_size 16 must be a multiple"):
        gram_replay_mod.gram_replay(k, k[..., 0], None, None, None, None, C1, None, None, None, 16, 16, "ieee")
    with pytest.raises(ValueError, match="out=False: pass `entries`"):
        phase1_chunk.phase1_fwd_chunk(k, k[..., 0], None, None, torch.ones(1, device=DEVICE), beta_aware=True,
                                      normalize=True, cu_seqlens=None, chunk_size=C1, store_d=False, out=False)


def launches(monkeypatch):
    """Count the launches of phase 1's out kernel and of gram_replay's kernel."""
    seen = dict(out=0, gram_replay=0)
    monkeypatch.setattr(phase1_chunk, "phase1_chunk_out_kernel", Spy(
        phase1_chunk.phase1_chunk_out_kernel, lambda args: seen.update(out=seen["out"] + 1)))
    monkeypatch.setattr(gram_replay_mod, "gram_replay_kernel", Spy(
        gram_replay_mod.gram_replay_kernel, lambda args: seen.update(gram_replay=seen["gram_replay"] + 1)))
    return seen


@pytest.mark.parametrize("chunk_size, clip, fused", [(64, False, True), (32, False, True), (16, False, False),
                                                     (64, True, False)])
def test_chunk_osdn_forms_kt_in_the_gram(chunk_size, clip, fused, monkeypatch):
    """The unclipped chunk form with phase-2 chunks of 32 or 64 launches no out kernel, forward or backward: the Gram
    forms k̃ (PHASE1_OUT_IN_GRAM); with chunks of 16, or the clip (speculation), the out kernel runs. Results and
    gradients against float64, and within float32 round-off of the same call with the fusion off."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    seen = launches(monkeypatch)
    gen, (q, k, v, beta) = make_tensors(2, 2, 100, 2, 16, 16, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=0.5, g=-0.1 * torch.rand(2, 100, 2, generator=gen, dtype=torch.float64),
                   r=0.9 + 0.1 * torch.rand(2, 100, 2, generator=gen, dtype=torch.float64), S0=None,
                   d0=0.5 + torch.rand(2, 2, 16, generator=gen, dtype=torch.float64))
    options = dict(d_max=5.0) if clip else {}  # with r, a ceiling alone speculates (a floor: quasi-Newton)
    compare(tensors, options, chunk_size)
    assert seen == (dict(out=0, gram_replay=1) if fused else dict(out=1, gram_replay=0))
    x = [t.to(DEVICE, torch.float32) for t in (q, k, v, beta)]
    rr = tensors["r"].to(DEVICE, torch.float32)
    runs = []
    for on in (True, False):
        monkeypatch.setattr(chunk_ops, "PHASE1_OUT_IN_GRAM", on)
        o, (S, d) = osdn_fast.chunk_osdn(*x, eta=0.5, r=rr, output_final_state=True, chunk_size=chunk_size,
                                         **options)
        runs.append((o, S, d))
    for name, a, b in zip(("o", "S", "d"), *runs):
        osdn_ref.check(name, a, b, SAME_OP_TOL)


def test_chunk_osdn_forms_kt_in_the_gram_in_bfloat16(monkeypatch):
    """bfloat16 inputs at chunks of 64 with APF's r: the fused path's output and gradients close to float64 on the
    bfloat16 values (k̃ rounded once, as the out kernel rounds it)."""
    monkeypatch.setattr(chunk_ops, "PHASE1_CHUNKED_MIN_T", 1)
    seen = launches(monkeypatch)
    gen, (q, k, v, beta) = make_tensors(12, 1, 130, 2, 16, 16, torch.float64)
    tensors = dict(q=q, k=k, v=v, beta=beta, eta=0.5, g=None,
                   r=0.9 + 0.1 * torch.rand(1, 130, 2, generator=gen, dtype=torch.float64), S0=None, d0=None)
    compare({n: (t.to(torch.bfloat16).double() if isinstance(t, torch.Tensor) else t) for n, t in tensors.items()},
            {}, 64, dtype=torch.bfloat16, fwd_tol=HALF_TOL, grad_tol=HALF_TOL)
    assert seen == dict(out=0, gram_replay=1)

"""Phase 1 across chunks by Newton's method (osdn_fast/ops/phase1_newton.py) against the sequential scan, with
the clip acting on long chains of chunks, and its chunk Jacobian against the float64 study's
(benchmarks/phase1_newton.py, itself checked against autograd in tests/test_phase1_newton.py)."""
import importlib.util
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from osdn_fast.ops.index import uniform_chunk_layout, uniform_cu_seqlens  # noqa: E402
from osdn_fast.ops.phase1 import phase1_bwd_seq, phase1_fwd_seq  # noqa: E402
from osdn_fast.ops.phase1_newton import (  # noqa: E402
    newton_chain_kernel, newton_chunk_kernel, phase1_bwd_newton, phase1_fwd_newton)
from osdn_ref.preconditioner import EPS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LO, HI = 2 / 3, 1.5
spec = importlib.util.spec_from_file_location(
    "phase1_newton_study", Path(__file__).resolve().parents[1] / "benchmarks" / "phase1_newton.py")
study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study)


def inputs(B, T, H, K, apf, seed):
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, generator=gen)
    r = 0.9 + 0.1 * torch.rand(B, T, H, generator=gen) if apf else None
    to = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    return to(k), to(beta), to(r)


def test_newton_matches_the_sequential_scan_over_many_chunks():
    """13 chunks of 16 per sequence, η large enough that the clip holds part of d: every d_t, the final d and k̃."""
    k, beta, r = inputs(1, 200, 2, 32, apf=False, seed=0)
    eta = torch.full((2,), 3.0, device=DEVICE)
    opts = dict(d_min=LO, d_max=HI, beta_aware=True, normalize=True, cu_seqlens=None, store_kt=True)
    seq = phase1_fwd_seq(k, beta, None, None, eta, **opts)
    *new, rounds = phase1_fwd_newton(k, beta, None, None, eta, chunk_size=16, **opts)
    held = ((seq[0] <= LO) | (seq[0] >= HI)).float().mean().item()
    assert 0.05 < held < 0.95, held  # the clip acts, not everywhere
    assert 2 <= rounds <= 8, rounds  # Newton: 6 here; iterating the chunk maps alone (Jacobi) takes 13 of the 14 possible
    for name, a, b in zip(("d_all", "d_final", "kt"), new, seq):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6, msg=name)


def test_diagonal_newton_matches_the_sequential_scan():
    """The quasi-Newton form (the chunk Jacobian's diagonal Π keep_t r_t only) reaches the same fixed point, in more
    rounds than Newton where the rank-one terms matter: here 12 without APF (Newton 6, chunks + 1 = 14 at most) and
    6 with APF r ∈ [0.9, 1] (Newton 5), where a coordinate held by the clip forgets its start."""
    opts = dict(d_min=LO, d_max=HI, beta_aware=True, normalize=True, cu_seqlens=None, store_kt=True)
    for apf, most in ((False, 13), (True, 7)):
        k, beta, r = inputs(1, 200, 2, 32, apf=apf, seed=0)
        eta = torch.full((2,), 3.0, device=DEVICE)
        seq = phase1_fwd_seq(k, beta, r, None, eta, **opts)
        *new, rounds = phase1_fwd_newton(k, beta, r, None, eta, chunk_size=16, jacobian="diagonal", **opts)
        assert 2 <= rounds <= most, (apf, rounds)
        for name, a, b in zip(("d_all", "d_final", "kt"), new, seq):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6, msg=f"{name}, apf={apf}")


def test_newton_packed_sequences_with_d0_and_apf():
    k, beta, r = inputs(1, 108, 1, 16, apf=True, seed=1)
    cu = torch.tensor([0, 5, 75, 108], dtype=torch.int32, device=DEVICE)
    d0 = (0.8 + 0.5 * torch.rand(3, 1, 16, generator=torch.Generator().manual_seed(2))).to(DEVICE)
    eta = torch.full((1,), 2.0, device=DEVICE)
    opts = dict(d_min=LO, d_max=HI, beta_aware=False, normalize=True, cu_seqlens=cu)
    seq = phase1_fwd_seq(k, beta, r, d0, eta, **opts)
    *new, rounds = phase1_fwd_newton(k, beta, r, d0, eta, chunk_size=16, **opts)
    for name, a, b in zip(("d_all", "d_final"), new, seq):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6, msg=name)


def test_chunk_jacobian_matches_the_float64_study():
    """One chunk of 16 from a guess off d's path: F and J of the kernel against the study's run_chunks."""
    K, C = 16, 16
    k, beta, _ = inputs(1, C, 1, K, apf=False, seed=3)
    guess = (1.0 + 0.3 * torch.randn(1, 1, K, generator=torch.Generator().manual_seed(4))).to(DEVICE)
    eta = torch.full((1,), 3.0, device=DEVICE)
    d_all, F = torch.empty(1, C, 1, K, device=DEVICE), torch.empty(1, 1, K, device=DEVICE)
    J = torch.empty(1, 1, K, K, device=DEVICE)
    indices, _ = uniform_chunk_layout(1, C, C, DEVICE)
    not_converged = torch.full((1, 1), float("inf"), device=DEVICE)
    newton_chunk_kernel[(1, 1)](k, beta, beta, eta, guess, d_all, d_all, F, J, uniform_cu_seqlens(1, C, DEVICE), indices,
                                not_converged, 1e-6, 1, K, EPS, LO, HI, HAS_R=False, BETA_AWARE=True, NORMALIZE=True, HAS_MIN=True,
                                HAS_MAX=True, BK=K, BT=C, STORE_KT=False, DIAGONAL=False)
    a = (k[0, :, 0].double().cpu() ** 2)[None]
    n = a.sum(-1) + EPS
    _, f, J64 = study.run_chunks(guess[0].double().cpu(), a, beta[0, :, 0].double().cpu()[None],
                                 torch.ones(1, C, dtype=torch.float64), n, 3.0, LO, HI)
    assert ((f > LO) & (f < HI)).any() and ((f <= LO) | (f >= HI)).any()
    torch.testing.assert_close(F[0].double().cpu(), f, rtol=0, atol=1e-5)
    torch.testing.assert_close(J[0, 0].double().cpu(), J64[0], rtol=0, atol=1e-5)


def test_reverse_quasi_newton_matches_the_reverse_scan():
    """The backward across chunks (fused with phase 2's gradients, clip and APF, packed sequences with a one-token
    one): every gradient equals the sequential reverse scan's once the rounds converge."""
    k, beta, r = inputs(1, 150, 2, 16, apf=True, seed=6)
    cu = torch.tensor([0, 1, 90, 150], dtype=torch.int32, device=DEVICE)
    eta = torch.full((2,), 3.0, device=DEVICE)
    opts = dict(d_min=LO, d_max=HI, beta_aware=True, normalize=True, cu_seqlens=cu)
    d_all, _, _ = phase1_fwd_seq(k, beta, r, None, eta, **opts)
    gen = torch.Generator().manual_seed(7)
    grads2 = tuple(torch.randn(*s, generator=gen).to(DEVICE) for s in ((1, 150, 2, 16), (1, 150, 2, 16), (1, 150, 2)))
    gd_final = torch.randn(3, 2, 16, generator=gen).to(DEVICE)
    seq = phase1_bwd_seq(k, beta, r, eta, d_all, None, gd_final, phase2_grads=grads2, **opts)
    *new, rounds = phase1_bwd_newton(k, beta, r, eta, d_all, gd_final, phase2_grads=grads2, chunk_size=16, **opts)
    assert 2 <= rounds <= 7, rounds
    for name, a, b in zip(("dk", "dbeta", "dr", "dd0"), new, seq):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(new[4].sum(0), seq[4].sum(0), rtol=1e-4, atol=1e-5, msg="deta")



def test_converged_chains_skip_later_rounds():
    """A (sequence, head) whose chain moved nothing (change <= tol) is left alone by both kernels of later rounds:
    its d_t, F and new guesses keep what the round that converged wrote; one with change > tol is recomputed."""
    K, C = 8, 16
    k, beta, _ = inputs(1, 2 * C, 2, K, apf=False, seed=3)
    cu, (indices, offsets) = uniform_cu_seqlens(1, 2 * C, DEVICE), uniform_chunk_layout(1, 2 * C, C, DEVICE)
    eta = torch.full((2,), 0.5, device=DEVICE)
    guess = torch.ones(2, 2, K, device=DEVICE)
    change = torch.tensor([[0.0, float("inf")]], device=DEVICE)  # head 0 converged, head 1 not
    d_all, F, J, new_guess, d_final = (torch.full(shape, -7.0, device=DEVICE) for shape in
                                       ((1, 2 * C, 2, K), (2, 2, K), (2, 2, K), (2, 2, K), (1, 2, K)))
    newton_chunk_kernel[(2, 2)](k, beta, beta, eta, guess, d_all, d_all, F, J, cu, indices, change, 1e-6, 2, K, EPS,
                                LO, HI, HAS_R=False, BETA_AWARE=True, NORMALIZE=True, HAS_MIN=True, HAS_MAX=True,
                                BK=K, BT=C, STORE_KT=False, DIAGONAL=True)
    newton_chain_kernel[(1, 2)](guess, F, J, new_guess, change, 1e-6, guess, d_final, offsets, 2, K, BK=K,
                                DIAGONAL=True)
    for x in (d_all[:, :, 0], F[:, 0], new_guess[:, 0], d_final[:, 0]):
        assert (x == -7.0).all()  # head 0: untouched
    for x in (d_all[:, :, 1], F[:, 1], new_guess[:, 1], d_final[:, 1]):
        assert (x != -7.0).all()  # head 1: computed
    assert change[0, 0] == 0.0 and torch.isfinite(change[0, 1])

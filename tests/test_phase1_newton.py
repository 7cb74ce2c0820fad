"""The study behind NOTES.md's next change for phase 1 across chunks (benchmarks/phase1_newton.py): the chunk
Jacobian is the derivative of the chunk map, and Newton's method over chunks lands on osdn_ref's sequential scan."""
import importlib.util
from pathlib import Path

import pytest
import torch

from osdn_ref import preconditioner_scan
from osdn_ref.preconditioner import EPS

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "phase1_newton.py"
spec = importlib.util.spec_from_file_location("phase1_newton", PATH)
nw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nw)

LO, HI = 2 / 3, 1.5


def problem(T, K, C, eta, apf, seed):
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(T, K, generator=gen, dtype=torch.float64), dim=-1)
    beta = torch.rand(T, generator=gen, dtype=torch.float64)
    r = 0.9 + 0.1 * torch.rand(T, generator=gen, dtype=torch.float64) if apf else torch.ones(T, dtype=torch.float64)
    a, n = k * k, (k * k).sum(-1) + EPS
    by_chunk = lambda x: x.reshape(T // C, C, *x.shape[1:])  # noqa: E731
    return k, beta, r, (by_chunk(a), by_chunk(beta), by_chunk(r), by_chunk(n))


def test_chunk_jacobian_is_the_derivative_of_the_chunk_map():
    """J from run_chunks against autograd's Jacobian of F_c(g), with the clip acting on some coordinates."""
    _, _, _, (a, b, r, n) = problem(T=32, K=8, C=16, eta=2.0, apf=True, seed=0)
    g = 1.0 + 0.3 * torch.randn(2, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _, f, J = nw.run_chunks(g, a, b, r, n, 2.0, LO, HI)
    assert ((f <= LO) | (f >= HI)).any() and ((f > LO) & (f < HI)).any()  # the clip acts, but not everywhere
    for c in range(2):
        F = lambda x, c=c: nw.run_chunks(x[None], a[c:c + 1], b[c:c + 1], r[c:c + 1], n[c:c + 1], 2.0, LO, HI,  # noqa: E731
                                         jacobian=None)[1][0]
        torch.testing.assert_close(J[c], torch.autograd.functional.jacobian(F, g[c]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("eta,apf", [(0.1, False), (0.5, False), (0.5, True)])
def test_newton_over_chunks_matches_the_sequential_scan(eta, apf):
    k, beta, r, chunks = problem(T=512, K=32, C=64, eta=eta, apf=apf, seed=2)
    ref = preconditioner_scan(k[None, :, None], beta[None, :, None], eta=eta, r=r[None, :, None] if apf else None,
                              d_min=LO, d_max=HI).d[0, :, 0]
    d, rounds = nw.solve_chain(*chunks, eta, LO, HI, jacobian="full")
    torch.testing.assert_close(d.reshape(ref.shape), ref, rtol=0, atol=1e-12)
    assert rounds <= 5, rounds  # 8 chunks: Jacobi takes up to 8 (one chunk per round, the last one confirming)
    d_diag, _ = nw.solve_chain(*chunks, eta, LO, HI, jacobian="diagonal")  # quasi-Newton: same fixed point
    torch.testing.assert_close(d_diag.reshape(ref.shape), ref, rtol=0, atol=1e-12)
    if not apf:  # without APF a wrong chunk start is barely damped: Jacobi walks the chain one chunk per round
        assert nw.solve_chain(*chunks, eta, LO, HI, jacobian=None)[1] == 8

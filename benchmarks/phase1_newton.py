"""Can phase 1 WITH the clip run in parallel ACROSS chunks? A float64 CPU study of Newton's method over chunks.

The sequential scan and the chunk-parallel fixed point (phase1_fixed_point.py) both walk the chunks of a sequence
in order: with B·H = 16 chains of T = 16384 steps, phase 1 cannot meet issue 6's targets that way (NOTES.md,
version 4). Across chunks, phase 1 is x_{c+1} = F_c(x_c): chunk c's map from the d entering it to the d leaving it.
F_c is piecewise affine (affine while the clip's active set stays the same), with Jacobian

    J_c = Π_t diag(keep_t) (r_t I − c_t a_t a_tᵀ),   c_t = η b_t² / n_t,  keep_t = [d_min < z_t < d_max],

so Newton's method on the whole chain (all chunks at once, as in DEER for nonlinear RNNs) reads

    every chunk from its guess g_c, in parallel:  F_c(g_c), J_c(g_c)
    new guesses by one linear scan over chunks:   g'_0 = d_0,  g'_{c+1} = F_c(g_c) + J_c (g'_c − g_c)

and it is exact as soon as every chunk's active set is right. Plain Jacobi (g'_{c+1} = F_c(g_c)) needs up to one
round per chunk: without APF the map barely contracts (c_t ‖a_t‖² ≈ 3η/K per step), so a wrong guess travels.
Between the two, a diagonal J (Π_t keep_t r_t, O(K) per token instead of O(K²)) is a quasi-Newton method: the
fixed point is the same, the convergence linear. This script counts the rounds of all three from the guess
g_c = 1 (d's initial value) and checks the result against osdn_ref's sequential scan:

    python benchmarks/phase1_newton.py                 # CPU, float64, about a minute
    python benchmarks/phase1_newton.py --T 16384 --seeds 1
    python benchmarks/phase1_newton.py --chunk 1 --methods newton --seeds 1   # Newton per token (DEER)
    python benchmarks/phase1_newton.py --T 4096 --methods diagonal --r-min 0.99 --tol 1e-6   # as chunk_osdn runs it
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from osdn_ref import preconditioner_scan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from phase1_fixed_point import study_inputs  # noqa: E402  (the same inputs as the within-chunk study)


def run_chunks(g, a, b, r, n, eta, lo, hi, jacobian="full"):
    """Every chunk from its entering d (g [N, K]), all chunks at once, token by token inside a chunk. Returns
    (d_t [N, C, K], F(g) [N, K], J): J [N, K, K] ("full"), its diagonal part Π keep_t r_t [N, K] ("diagonal"),
    or None."""
    N, C, K = a.shape
    d, ds = g.clone(), []
    J = {"full": torch.eye(K, dtype=g.dtype).expand(N, K, K).clone(), "diagonal": torch.ones_like(g)}.get(jacobian)
    for t in range(C):
        at, bt, rt, nt = a[:, t], b[:, t], r[:, t], n[:, t]
        ds.append(d)
        w = eta * bt * (1 - bt * (d * at).sum(-1)) / nt
        z = rt[:, None] * d + w[:, None] * at
        keep = ((z > lo) & (z < hi)).to(g.dtype)
        if jacobian == "full":  # J ← diag(keep)(r I − c a aᵀ) J
            c = eta * bt * bt / nt
            J = keep[:, :, None] * (rt[:, None, None] * J - c[:, None, None] * at[:, :, None] * (at[:, None, :] @ J))
        elif jacobian == "diagonal":
            J = keep * rt[:, None] * J
        d = z.clamp(lo, hi)
    return torch.stack(ds, 1), d, J


def solve_chain(a, b, r, n, eta, lo, hi, jacobian, tol=1e-13, max_rounds=None):
    """Rounds until the chunk-entering d stop changing (relative tol); `jacobian` "full" (Newton), "diagonal"
    (quasi-Newton) or None (Jacobi). Returns (d_t [N, C, K], rounds)."""
    N, _, K = a.shape
    g = torch.ones(N, K, dtype=a.dtype)
    for rounds in range(1, (max_rounds or N + 1) + 1):
        d_all, f, J = run_chunks(g, a, b, r, n, eta, lo, hi, jacobian=jacobian)
        new = torch.empty_like(g)
        new[0] = 1.0
        for c in range(N - 1):  # the linear scan over chunks (a parallel affine scan on a GPU)
            step = 0 if J is None else J[c] @ (new[c] - g[c]) if jacobian == "full" else J[c] * (new[c] - g[c])
            new[c + 1] = f[c] + step
        if (new - g).abs().max() <= tol * g.abs().max():
            return d_all, rounds
        g = new
    raise RuntimeError(f"no convergence in {rounds} rounds")


METHODS = {"newton": "full", "diagonal": "diagonal", "jacobi": None}


def study(T, K, eta, apf, keys, seed, C=64, d_min=2 / 3, d_max=1.5, methods=tuple(METHODS), r_min=0.9, tol=1e-13):
    k, beta, r, a, n = study_inputs(T, K, apf, keys, seed, r_min)
    ref = preconditioner_scan(k[None, :, None], beta[None, :, None], eta=eta, r=r[None, :, None] if apf else None,
                              d_min=d_min, d_max=d_max).d[0, :, 0]
    assert T % C == 0, "T must be a multiple of the chunk size"
    N = T // C
    by_chunk = lambda x: x.reshape(N, C, *x.shape[1:])  # noqa: E731
    out = {}
    for name in methods:
        d, rounds = solve_chain(by_chunk(a), by_chunk(beta), by_chunk(r), by_chunk(n), eta, d_min, d_max, METHODS[name],
                                tol=tol)
        out[name] = dict(rounds=rounds, err=(d.reshape(T, K) - ref).abs().max().item())
    out["clipped"] = ((ref <= d_min) | (ref >= d_max)).double().mean().item()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=64, help="tokens per chunk (1: Newton per token, as DEER)")
    ap.add_argument("--methods", default="newton,diagonal,jacobi", help="comma-separated, of " + ",".join(METHODS))
    ap.add_argument("--r-min", type=float, default=0.9, help="APF's r drawn from [r_min, 1] (bench_suite: 0.99)")
    ap.add_argument("--tol", type=float, default=1e-13, help="relative change of the chunk starts that ends the rounds "
                                                             "(osdn_fast's Newton kernels: 1e-6)")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    C = args.chunk
    print(f"T = {args.T} ({args.T // C} chunks of {C}), K = {args.K}, clip [2/3, 1.5], float64, guess d = 1, APF r in "
          f"[{args.r_min}, 1]; rounds until the chunk starts stop changing (relative {args.tol:g}), worst over seeds")
    print(f"{'keys':8s} {'eta':>6s} {'APF':>4s} " + "".join(f"{m:>9s}" for m in methods) + f" {'clipped':>8s} "
          + "".join(f"{'err ' + m:>15s}" for m in methods))
    for keys in ("random", "repeated"):
        for eta in (0.003, 0.1, 0.5):
            for apf in (False, True):
                t = time.perf_counter()
                runs = [study(args.T, args.K, eta, apf, keys, seed, C=C, methods=methods, r_min=args.r_min, tol=args.tol)
                        for seed in range(args.seeds)]
                worst = lambda m, f: max(run[m][f] for run in runs)  # noqa: E731
                print(f"{keys:8s} {eta:6.3f} {'yes' if apf else 'no':>4s} "
                      + "".join(f"{worst(m, 'rounds'):9d}" for m in methods)
                      + f" {sum(r['clipped'] for r in runs) / len(runs):8.1%} "
                      + "".join(f"{worst(m, 'err'):15.1e}" for m in methods)
                      + f"   ({time.perf_counter() - t:.1f}s)", flush=True)


if __name__ == "__main__":
    main()

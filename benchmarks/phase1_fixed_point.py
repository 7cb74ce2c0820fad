"""Can phase 1 WITH the clip run in parallel and stay exact? A float64 CPU study of the method NOTES.md proposes.

Given the scalars s_t = ⟨d_t, a_t⟩ (a_t = k_t²), every coordinate of d follows its own clamped affine recurrence

    d_{t+1} = clamp(r_t d_t + w_t a_t, d_min, d_max),     w_t = η b_t (1 − b_t s_t) / n_t,

and clamped affine maps f(x) = clamp(αx + c, L, U), α ≥ 0, are closed under composition:

    g∘f = (α_g α_f,  α_g c_f + c_g,  clamp(α_g L_f + c_g, L_g, U_g),  clamp(α_g U_f + c_g, L_g, U_g)),

so one associative (log-depth) scan over a chunk yields every d_t. The s_t are not known in advance: iterate
s ← ⟨d(s), a⟩ from s_t = ⟨d_in, a_t⟩ (Jacobi). Token t's s is exact once tokens < t are, so C sweeps always
suffice for a chunk of C tokens; the question is how many it takes in practice, chunk by chunk (d_in exact).
This script counts them, checks the fixed point against osdn_ref's sequential scan, and prints a table:

    python benchmarks/phase1_fixed_point.py            # CPU, float64, about a minute
"""
from __future__ import annotations

import argparse
import time

import torch

from osdn_ref import preconditioner_scan
from osdn_ref.preconditioner import EPS


def compose(f, g):
    """g∘f for maps (α, c, L, U) stacked on any leading shape."""
    a_f, c_f, lo_f, hi_f = f
    a_g, c_g, lo_g, hi_g = g
    return (a_g * a_f, a_g * c_f + c_g,
            torch.minimum(torch.maximum(a_g * lo_f + c_g, lo_g), hi_g),
            torch.minimum(torch.maximum(a_g * hi_f + c_g, lo_g), hi_g))


def inclusive_scan(maps):
    """Hillis-Steele scan along dim 0: out[t] = maps[t]∘…∘maps[0] (log2(C) rounds of compose)."""
    out = list(maps)
    step, C = 1, maps[0].shape[0]
    while step < C:
        prev = tuple(x[:-step] for x in out)
        cur = tuple(x[step:] for x in out)
        new = compose(prev, cur)
        out = [torch.cat([x[:step], y]) for x, y in zip(out, new)]
        step *= 2
    return out


def chunk_fixed_point(d_in, a, b, r, n, eta, lo, hi, tol):
    """d_t for the tokens of one chunk (a [C, K]) from d_in [K]; returns (d [C, K], d_out [K], sweeps)."""
    C = a.shape[0]
    s = a @ d_in
    for sweep in range(1, C + 2):
        w = eta * b * (1 - b * s) / n
        maps = (r[:, None].expand_as(a), w[:, None] * a, torch.full_like(a, lo), torch.full_like(a, hi))
        alpha, c, L, U = inclusive_scan(maps)
        after = torch.minimum(torch.maximum(alpha * d_in + c, L), U)  # d_{t+1} for t in the chunk
        d = torch.cat([d_in[None], after[:-1]])
        s_new = (d * a).sum(-1)
        if torch.equal(s_new, s) or (s_new - s).abs().max() <= tol * s.abs().max().clamp_min(1e-300):
            return d, after[-1], sweep
        s = s_new
    raise RuntimeError("no fixed point after C + 1 sweeps")


def study_inputs(T, K, apf, keys, seed, r_min=0.9):
    """One head's float64 phase-1 inputs: unit keys k [T, K] ("random", or "repeated": 32 directions reused, the
    case phase 1 is for), β [T], r [T] (APF, r ∈ [r_min, 1]: strong by default; or ones), a = k², n = ‖k‖² + ε."""
    gen = torch.Generator().manual_seed(seed)
    if keys == "random":
        k = torch.randn(T, K, generator=gen, dtype=torch.float64)
    else:
        k = torch.randn(32, K, generator=gen, dtype=torch.float64)[torch.randint(0, 32, (T,), generator=gen)]
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.randn(T, generator=gen, dtype=torch.float64).sigmoid()
    r = (r_min + (1 - r_min) * torch.rand(T, generator=gen, dtype=torch.float64)) if apf else \
        torch.ones(T, dtype=torch.float64)
    return k, beta, r, k * k, (k * k).sum(-1) + EPS


def study(T, K, eta, apf, keys, seed, C=64, d_min=2 / 3, d_max=1.5, tol=1e-15):
    k, beta, r, a, n = study_inputs(T, K, apf, keys, seed)
    d_in, sweeps, ds = torch.ones(K, dtype=torch.float64), [], []
    for c0 in range(0, T, C):
        d, d_in, m = chunk_fixed_point(d_in, a[c0:c0 + C], beta[c0:c0 + C], r[c0:c0 + C], n[c0:c0 + C], eta,
                                       d_min, d_max, tol)
        sweeps.append(m)
        ds.append(d)
    d = torch.cat(ds)
    ref = preconditioner_scan(k[None, :, None], beta[None, :, None], eta=eta, r=r[None, :, None] if apf else None,
                              d_min=d_min, d_max=d_max).d[0, :, 0]
    clipped = ((d <= d_min) | (d >= d_max)).double().mean().item()
    return dict(sweeps=sweeps, err=(d - ref).abs().max().item(), clipped=clipped)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"T = {args.T}, K = {args.K}, chunks of 64, clip [2/3, 1.5], float64; sweeps per chunk (C + 1 at most)")
    print(f"{'keys':8s} {'eta':>6s} {'APF':>4s} {'mean':>6s} {'max':>4s} {'clipped':>8s} {'max |d - seq|':>14s}")
    for keys in ("random", "repeated"):
        for eta in (0.003, 0.1, 0.5):
            for apf in (False, True):
                t = time.perf_counter()
                runs = [study(args.T, args.K, eta, apf, keys, seed) for seed in range(args.seeds)]
                sw = [m for run in runs for m in run["sweeps"]]
                print(f"{keys:8s} {eta:6.3f} {'yes' if apf else 'no':>4s} {sum(sw) / len(sw):6.2f} {max(sw):4d} "
                      f"{sum(r['clipped'] for r in runs) / len(runs):8.1%} {max(r['err'] for r in runs):14.1e}"
                      f"   ({time.perf_counter() - t:.1f}s)", flush=True)


if __name__ == "__main__":
    main()

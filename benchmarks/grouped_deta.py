"""∂η of phase 1's chunk form, chains walked or in groups, against the float64 reference, over a grid of small problems.

With L2-normalised keys the β-free update (beta_aware=False) has d = 1 as a fixed point (SPEC §2), so there the exact
∂η is 0 and what the kernels return is round-off: the walked chains keep it near float32's, the grouped chains' K×K
maps add their dots' (TF32 on a GPU). Each problem: B = 1, H = 2, one random cotangent each for o, S and d; the chunk
form forced at any length (PHASE1_CHUNKED_MIN_T = 1), its chains in groups of `chain_group`'s size (--chains grouped)
or walked. Prints one line per problem and a summary; the β-free errors are absolute.

    python benchmarks/grouped_deta.py --chains grouped              # GPU (or TRITON_INTERPRET=1 on the CPU)
    python benchmarks/grouped_deta.py --chains walked --eta 1.0 --lengths 70,130

The NOTES entry after version 30 ran this grid at η = 0.1 on the H200 for version 30 and for the rounding lead (then as
.work/deta_grouped.py: the same problems and sums, without this command line).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

import osdn_fast
import osdn_ref
from osdn_fast.ops import chunk


def problem(seed, T, K, V):
    """q, k (unit rows), v, β ∈ [0.05, 1] and the cotangents of (o, S, d), in float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, 2, K, generator=g, dtype=torch.float64)
    k = F.normalize(torch.randn(1, T, 2, K, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, 2, V, generator=g, dtype=torch.float64)
    beta = 0.05 + 0.95 * torch.rand(1, T, 2, generator=g, dtype=torch.float64)
    cot = (torch.randn(1, T, 2, V, generator=g, dtype=torch.float64), torch.randn(1, 2, K, V, generator=g,
           dtype=torch.float64), torch.randn(1, 2, K, generator=g, dtype=torch.float64))
    return (q, k, v, beta), cot


def deta(op, inputs, cot, eta, dtype, device, **options):
    """∂η [2] of Σ o·do + Σ S·dS + Σ d·dd for `op` in `dtype` on `device`, as float64 on the CPU."""
    xs = [x.to(device, dtype) for x in inputs]
    eta_t = torch.full((2,), eta, device=device, dtype=dtype, requires_grad=True)
    o, (S, d) = op(*xs, eta=eta_t, output_final_state=True, **options)
    loss = sum((y.double().cpu() * c).sum() for y, c in zip((o, S, d), cot))
    loss.backward()
    return eta_t.grad.double().cpu()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", choices=("grouped", "walked"), default="grouped")
    ap.add_argument("--eta", type=float, default=0.1)
    ap.add_argument("--lengths", default="33,70,130", help="comma-separated T")
    ap.add_argument("--dims", default="3,16", help="comma-separated K")
    ap.add_argument("--values", default="2,16", help="comma-separated V")
    ap.add_argument("--out", help="JSON file for the rows and the summary")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    chunk.PHASE1_CHUNKED_MIN_T = 1
    chunk.PHASE1_GROUP_MAX_CHAINS = 1 << 30
    chunk.PHASE1_GROUP_MIN_CHUNKS = 2 if args.chains == "grouped" else 1 << 30
    grid = itertools.product(*(map(int, a.split(",")) for a in (args.lengths, args.dims, args.values)),
                             (False, True), (False, True))
    rows = []
    for seed, (T, K, V, beta_aware, normalize) in enumerate(grid):
        inputs, cot = problem(seed, T, K, V)
        options = dict(beta_aware=beta_aware, normalize=normalize)
        ref = deta(osdn_ref.chunk_osdn, inputs, cot, args.eta, torch.float64, "cpu", **options)
        fast = deta(osdn_fast.chunk_osdn, inputs, cot, args.eta, torch.float32, device, chunk_size=16, **options)
        row = dict(T=T, K=K, V=V, beta_aware=beta_aware, normalize=normalize, deta_norm=ref.norm().item(),
                   abs_err=(fast - ref).norm().item())
        rows.append(row)
        print(f"T={T:3d} K={K:2d} V={V:2d} beta_aware={beta_aware:d} normalize={normalize:d}  "
              f"|deta|={row['deta_norm']:.3e}  abs err={row['abs_err']:.3e}  rel={row['abs_err'] / row['deta_norm']:.2e}")
    free = [r["abs_err"] for r in rows if not r["beta_aware"]]
    aware = [r["abs_err"] / r["deta_norm"] for r in rows if r["beta_aware"]]
    summary = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command=" ".join(["python"] + sys.argv), torch=torch.__version__, triton=triton.__version__,
                   gpu=torch.cuda.get_device_name() if device == "cuda" else None,
                   device=device, chains=args.chains, eta=args.eta, problems=len(rows),
                   beta_free_abs_err_median=statistics.median(free), beta_free_abs_err_max=max(free),
                   beta_aware_rel_err_max=max(aware))
    print(f"{args.chains} chains on {device}, eta {args.eta}: {len(rows)} problems; at the β-free fixed point ∂η off by "
          f"{summary['beta_free_abs_err_median']:.2e} (median), {summary['beta_free_abs_err_max']:.2e} (max); "
          f"β-aware relative error at most {summary['beta_aware_rel_err_max']:.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(summary=summary, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

"""Phase-1 timings: the sequential scan vs the chunk-parallel form, forward and forward+backward.

GPU run (the numbers issue 6 asks for):
    python benchmarks/bench_phase1.py --out benchmarks/results/phase1_h200.json
Script check on the CPU (tiny shapes, Triton interpreter, wall-clock medians):
    python benchmarks/bench_phase1.py --smoke --out /tmp/phase1_smoke.json

Rows: shape (B, T, H, K), variant (seq, seq+clip, chunk<C> per --chunk-sizes; each without and with the APF
gate r), median
milliseconds (triton.testing.do_bench on CUDA), microseconds per token of one sequence, and the chunked forward's
relative error against the sequential one as a sanity check.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.testing  # noqa: E402

import osdn_ref  # noqa: E402
from osdn_fast.ops.phase1 import preconditioner_scan  # noqa: E402

SHAPES = [(1, 16384, 16, 128), (4, 4096, 16, 128), (8, 2048, 16, 128)]
SMOKE_SHAPES = [(1, 40, 2, 20), (2, 17, 1, 8)]


def median_ms(fn, grad_to_none, cuda: bool) -> float:
    if cuda:
        return triton.testing.do_bench(fn, grad_to_none=grad_to_none, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def make_inputs(B, T, H, K, dtype, device, apf: bool):
    gen = torch.Generator(device="cpu").manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(device, dtype)
    beta = torch.rand(B, T, H, generator=gen).to(device, dtype)
    r = (0.99 + 0.01 * torch.rand(B, T, H, generator=gen)).to(device, torch.float32) if apf else None
    d0 = torch.ones(B, H, K, device=device)
    eta = torch.full((H,), 0.003, device=device)
    leaves = [x for x in (k, beta, r, d0, eta) if x is not None]
    for x in leaves:
        x.requires_grad_()
    return dict(k=k, beta=beta, r=r, d0=d0, eta=eta), leaves


def variants(chunk_sizes):
    """(name, chunk size or 0 for the sequential scan, clip or None)."""
    return [("seq", 0, None), ("seq+clip", 0, (2 / 3, 1.5))] + [(f"chunk{c}", c, None) for c in chunk_sizes]


def bench_shape(shape, dtype, device, chunk_sizes, cuda):
    B, T, H, K = shape
    rows = []
    for apf in (False, True):
        x, leaves = make_inputs(B, T, H, K, dtype, device, apf)
        gd_all = torch.randn(B, T, H, K, device=device)
        gd_final = torch.randn(B, H, K, device=device)
        reference = None
        for name, chunk_size, clip in variants(chunk_sizes):
            d_min, d_max = clip if clip else (None, None)

            def forward():
                return preconditioner_scan(
                    x["k"], x["beta"], eta=x["eta"], r=x["r"], d0=x["d0"], d_min=d_min, d_max=d_max,
                    chunked=chunk_size > 0, chunk_size=chunk_size or 64,
                )

            def forward_backward():
                d_all, d_final = forward()
                torch.autograd.backward([d_all, d_final], [gd_all, gd_final])

            with torch.no_grad():
                d_all, _ = forward()
            if clip is None:
                reference = d_all if reference is None else reference
            fwd = median_ms(lambda: forward(), None, cuda)
            fwd_bwd = median_ms(forward_backward, leaves, cuda)
            rows.append(dict(
                B=B, T=T, H=H, K=K, dtype=str(dtype).removeprefix("torch."), variant=name + ("+apf" if apf else ""),
                chunk_size=chunk_size or None, fwd_ms=round(fwd, 4), fwd_bwd_ms=round(fwd_bwd, 4),
                fwd_us_per_token=round(1e3 * fwd / T, 5), fwd_bwd_us_per_token=round(1e3 * fwd_bwd / T, 5),
                rel_err_vs_seq=None if clip else osdn_ref.rel_err(d_all, reference),
            ))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--chunk-sizes", default="32,64", help="comma-separated chunk sizes (powers of two >= 16)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    dtype = getattr(torch, args.dtype)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    chunk_sizes = [16] if args.smoke else [int(c) for c in args.chunk_sizes.split(",")]
    rows = [row for shape in shapes for row in bench_shape(shape, dtype, device, chunk_sizes, cuda)]
    result = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()}), interpreter",
        torch=torch.__version__, triton=triton.__version__, timer="do_bench median" if cuda else "perf_counter median",
        rows=rows,
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

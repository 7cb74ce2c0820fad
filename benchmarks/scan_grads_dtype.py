"""Phase 1's fused reverse scan alone, timed with phase 2's ∂k̃ and ∂k (its two [B, T, H, K] inputs) in float32 and in
bfloat16, on the same values.

The suite of 2026-12-03 (NOTES, "After 2026-12-03 (3)") found the whole op 175-291 µs slower at (8, 2048, 16, 128)
where this scan ran without r on 16-bit gradients, and 90-146 µs faster with r; `scan_sass.py` found +50 to +66 SASS
instructions per trip of its loop either way. This times the kernel itself (CUDA-graph medians, the two dtypes
alternating `--rounds` times) for the four builds the suite ran there (r or not, the clip or not), to say whether the
scan is where the time went, and checks that both dtypes give the same ∂k (relative RMSE, the 16-bit rounding of the
inputs only). Writes scan_grads_dtype.json into --out.

    python benchmarks/scan_grads_dtype.py --out $OUT                  # on the GPU, ~1 min cold
    TRITON_INTERPRET=1 python benchmarks/scan_grads_dtype.py --out /tmp/s --shape 1x8x2x16 --rounds 1   # CPU smoke

Under a profiler, `--rounds 0` runs each build once per dtype and times nothing, and `--builds` picks builds (r0c0 =
no r, no clip; r1c1 = r and the clip), so that the profiler sees one launch of each:

    ncu --clock-control none -k regex:phase1_bwd_seq --section WarpStateStats --section SchedulerStats \
        python benchmarks/scan_grads_dtype.py --out $OUT --rounds 0 --builds r0c0,r1c0
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import make_inputs  # noqa: E402

CLIP = dict(d_min=2 / 3, d_max=1.5)  # bench_suite's clipped variants
ETA = 0.003  # bench_suite's


def timer(fn, device):
    """Median ms of fn: CUDA-graph replay on the GPU; None under the interpreter (one plain call: a smoke run)."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    fn()
    return None


def rel_rmse(a, b):
    return float(((a.double() - b.double()).pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt().clamp_min(1e-30)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="8x2048x16x128", help="BxTxHxK")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (0: one untimed call per dtype)")
    parser.add_argument("--builds", default="r0c0,r0c1,r1c0,r1c1", help="r<0|1>c<0|1>: with r, with the clip")
    args = parser.parse_args(argv)
    from osdn_fast.ops.phase1 import phase1_bwd_seq, phase1_fwd_seq

    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, T, H, K = map(int, args.shape.split("x"))
    if not re.fullmatch(r"r[01]c[01](,r[01]c[01])*", args.builds):
        parser.error(f"--builds takes r0c0, r0c1, r1c0, r1c1 separated by commas, got {args.builds}")
    rows = []
    for has_r, clip in ((b[1] == "1", b[3] == "1") for b in args.builds.split(",")):
        x, _ = make_inputs(B, T, H, K, torch.bfloat16, device, gate=False, apf=has_r)
        k, beta, r = x["k"], x["beta"], x["r"]
        eta = torch.full((H,), ETA, dtype=torch.float32, device=device)
        p1 = dict(d_min=CLIP["d_min"] if clip else None, d_max=CLIP["d_max"] if clip else None,
                  beta_aware=True, normalize=True, cu_seqlens=None)
        d_all = phase1_fwd_seq(k, beta, r, None, eta, **p1)[0]
        gen = torch.Generator(device=device).manual_seed(1)
        dkt, dk2 = (torch.randn(B, T, H, K, generator=gen, device=device) for _ in range(2))
        dbeta2 = torch.randn(B, T, H, generator=gen, device=device)
        grads = {"fp32": (dkt, dk2), "bf16": (dkt.bfloat16(), dk2.bfloat16())}
        calls = {name: (lambda g=g: phase1_bwd_seq(k, beta, r, eta, d_all, None, None, phase2_grads=(*g, dbeta2),
                                                   **p1)) for name, g in grads.items()}
        dk = {name: call()[0] for name, call in calls.items()}
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(timer(call, device))
        med = {n: None if not t or None in t else statistics.median(t) for n, t in times.items()}
        diff = None if None in med.values() else 1e3 * (med["bf16"] - med["fp32"])
        row = dict(r=has_r, clip=clip, ms=times, median_ms=med, bf16_minus_fp32_us=diff,
                   dk_rel_rmse_bf16_vs_fp32=rel_rmse(dk["bf16"], dk["fp32"]))
        rows.append(row)
        timed = "" if diff is None else f"fp32 {med['fp32']:.4f} ms, bf16 {med['bf16']:.4f} ms ({diff:+.1f} µs), "
        print(f"r={has_r!s:5} clip={clip!s:5} {timed}∂k rel RMSE {row['dk_rel_rmse_bf16_vs_fp32']:.2e}", flush=True)
    meta = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), shape=[B, T, H, K],
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
                torch=torch.__version__, triton=__import__("triton").__version__, eta=ETA, clip=CLIP,
                kernels=os.path.dirname(sys.modules["osdn_fast"].__file__),
                command="python benchmarks/scan_grads_dtype.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scan_grads_dtype.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

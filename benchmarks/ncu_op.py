"""One forward+backward of each op, bracketed for Nsight Compute: every kernel of it, ours beside fla's.

profile_op.py says how long each kernel runs; this says why, from the hardware counters (throughput against the
chip's peaks, occupancy, registers, DRAM bytes, stall reasons). Each op is called twice unprofiled (compilation,
autotuning), then, with the gradients set to None (no accumulation kernels), once between cudaProfilerStart and
cudaProfilerStop, so that `ncu --profile-from-start off` sees that call's kernels alone, after one marker kernel
(torch.cuda._sleep's spin kernel) that tells ncu_summary.py where an op's kernels begin. Without a GPU (TRITON_INTERPRET=1) it runs the same calls on the CPU, bracketed by
nothing: a smoke run.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --csv --page details \
        python3 benchmarks/ncu_op.py --shapes 4x4096x16x128 --ops fla_delta_rule,osdn > $OUT/ncu_op.csv
    TRITON_INTERPRET=1 python benchmarks/ncu_op.py --shapes 1x40x2x16 --ops osdn,osdn_apf_clip --device cpu
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import make_inputs, osdn_variants  # noqa: E402
from profile_op import call_of  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x4096x16x128", help="comma-separated BxTxHxD")
    ap.add_argument("--ops", default="fla_delta_rule,osdn,osdn_apf_clip", help="OSDN variants and fla_delta_rule")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    unknown = set(ops) - set(osdn_variants()) - {"fla_delta_rule"}
    if unknown:
        ap.error(f"--ops: unknown {sorted(unknown)}")
    cuda = args.device == "cuda"
    for shape in args.shapes.split(","):
        B, T, H, D = map(int, shape.split("x"))
        for name in ops:
            gate, apf = (False, False) if name == "fla_delta_rule" else osdn_variants()[name][:2]
            x, do = make_inputs(B, T, H, D, torch.bfloat16, args.device, gate, apf)
            for n in ("q", "k", "v", "beta"):
                x[n].requires_grad_()
            fwd = call_of(name, x)
            for profiled in (False, False, True):
                for n in ("q", "k", "v", "beta"):
                    x[n].grad = None
                if profiled and cuda:
                    torch.cuda.synchronize()
                    torch.cuda.cudart().cudaProfilerStart()
                    torch.cuda._sleep(1000)  # the marker
                fwd().backward(do)
                if profiled and cuda:
                    torch.cuda.synchronize()
                    torch.cuda.cudart().cudaProfilerStop()
            print(f"{shape} {name}: profiled one forward+backward", flush=True)


if __name__ == "__main__":
    main()

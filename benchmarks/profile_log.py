"""Rebuild profile_phase2.py's JSON from its console log (for a run that stopped before writing it).

The v3 run of 2026-11-29 wrote its whole-op timings and kernel tables, then its launch sweep hit an illegal
memory access (a setting outside the committed TUNING; see benchmarks/NOTES.md) and the script died before its
JSON. This parses the log's first two sections into book/data/kernel_profile.json:

    python benchmarks/profile_log.py benchmarks/logs/profile_phase2_v3_2026-11-29.log --out book/data/kernel_profile.json
"""
from __future__ import annotations

import argparse
import json
import re

WHOLE = re.compile(r"^\s+(\S+)\s+fwd\s+([\d.]+) ms\s+fwd\+bwd\s+([\d.]+) ms")
TABLE = re.compile(r"^(.+): ([\d.]+) µs of kernels$")
KERNEL = re.compile(r"^\s+([\d.]+) µs\s+×\s*([\d.]+)\s+(.+)$")


def parse(lines):
    whole, tables, current = {}, {}, None
    for line in lines:
        if line.startswith("sweep:"):
            break
        if m := WHOLE.match(line):
            whole[m[1]] = dict(fwd_ms=float(m[2]), fwd_bwd_ms=float(m[3]))
        elif m := TABLE.match(line):
            current = tables[m[1]] = dict(total_us=float(m[2]), kernels=[])
        elif (m := KERNEL.match(line)) and current is not None:
            current["kernels"].append(dict(name=m[3].strip(), us=float(m[1]), launches=float(m[2])))
    return whole, tables


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.log) as f:
        whole, tables = parse(f.read().splitlines())
    result = dict(
        source=args.log, date="2026-11-29", gpu="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0", fla="0.6.0",
        command="python3 benchmarks/profile_phase2.py --out $OUT --sweep-budget 100",
        shape=[8, 2048, 16, 128], dtype="bfloat16", options=dict(eta=0.003, d_min=2 / 3, d_max=1.5),
        version="v3: bf16 phase 2, blockwise solve, fused phase-1 backward (tuning.py as committed)",
        timing="triton.testing.do_bench median (whole op); torch.profiler CUDA time per call, 10 calls (kernels)",
        kernels_note="the largest 14 kernels per table (the log prints no more); total_us counts all",
        whole_op=whole, kernels=tables)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

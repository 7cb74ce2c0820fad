"""Where a whole call's time goes: GPU kernels, or the host between them (issue 6, after version 6).

For each shape and each op (OSDN variants of `osdn_fast.chunk_osdn`, fla's `chunk_delta_rule`), forward and
forward+backward, in bfloat16 on the inputs of bench_suite.py:

- `median_ms`: triton.testing.do_bench median, as bench_suite.py times it (launches from Python every call);
- `graph_ms`: triton.testing.do_bench_cudagraph median (the same call replayed from a CUDA graph: no host work
  between kernels), or the reason the call cannot be captured (a read of a device flag on the host);
- `kernel_us`: the sum of the call's CUDA kernel times (torch.profiler, 10 calls), and the kernels themselves.

`median_ms` − `kernel_us` is time the GPU spends waiting for the host (launch latency, Python, synchronisations).
Writes profile_op.json into --out.

    python benchmarks/profile_op.py --out $OUT                                   # on the GPU
    python benchmarks/profile_op.py --out $OUT --shapes 1x16384x16x128 --ops osdn,osdn_apf_clip,fla_delta_rule
    python benchmarks/profile_op.py --out $OUT --tuning sweep/tuning.json --ops osdn,fla_delta_rule   # a sweep's pick
    python benchmarks/profile_op.py --out $OUT --ops osdn_clip --eta 2.0   # with the clip acting
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_suite import make_inputs, osdn_variants  # noqa: E402
from profile_phase2 import apply_tuning, kernel_table  # noqa: E402

SHAPES = ["8x2048x16x128", "4x4096x16x128", "1x16384x16x128", "2x4096x32x64"]
OPS = ["fla_delta_rule", "osdn", "osdn_clip", "osdn_apf_clip"]  # fla first: a failed graph capture of ours cannot cost its rows
ETA = 0.003


def call_of(name, x, eta=ETA):
    """Zero-argument forward of op `name` on inputs x, returning the output o."""
    if name == "fla_delta_rule":
        from fla.ops.delta_rule import chunk_delta_rule

        return lambda: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0]
    import osdn_fast

    _, _, extra = osdn_variants()[name]
    return lambda: osdn_fast.chunk_osdn(**x, eta=eta, **extra)[0]


def measure(fn, leaves):
    """(median_ms, graph_ms or error text, kernel_us, kernels) of one zero-argument call."""
    import triton.testing

    median = float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=leaves, return_mode="median"))
    try:
        graph = float(triton.testing.do_bench_cudagraph(fn, rep=100, grad_to_none=leaves, return_mode="median"))
    except Exception as err:  # noqa: BLE001 (a call that cannot be captured is reported, not fatal)
        graph = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        torch.cuda.synchronize()
    kernels = kernel_table(fn, leaves=leaves)
    return median, graph, sum(us for _, us, _ in kernels), kernels


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated BxTxHxD")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated OSDN variants and fla_delta_rule")
    ap.add_argument("--tuning", help="JSON {stage: launch settings} applied over TUNING (a sweep's tuning.json)")
    ap.add_argument("--eta", type=float, default=ETA, help=f"OSDN's η (default {ETA}; e.g. 2.0: the clip of "
                                                            "osdn_clip acts, version 30)")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    unknown = set(ops) - set(osdn_variants()) - {"fla_delta_rule"}
    if unknown:
        ap.error(f"--ops: unknown {sorted(unknown)}")
    if not torch.cuda.is_available():
        ap.error("profile_op.py needs a CUDA GPU")
    import triton

    result = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join(["python3"] + sys.argv), gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__, triton=triton.__version__, eta=args.eta,
                  applied_tuning=apply_tuning(args.tuning) if args.tuning else None, rows=[])
    for shape in args.shapes.split(","):
        B, T, H, D = map(int, shape.split("x"))
        for name in ops:
            gate, apf = (False, False) if name == "fla_delta_rule" else osdn_variants()[name][:2]
            x, do = make_inputs(B, T, H, D, torch.bfloat16, "cuda", gate, apf)
            leaves = [x[n].requires_grad_() for n in ("q", "k", "v", "beta")]
            fwd = call_of(name, x, args.eta)
            for mode, fn in (("fwd", fwd), ("fwdbwd", lambda fwd=fwd: fwd().backward(do))):
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    try:
                        median, graph, busy, kernels = measure(fn, leaves)
                    except Exception as err:  # noqa: BLE001
                        print(f"{shape} {name} {mode} failed: {err}", flush=True)
                        continue
                row = dict(shape=shape, op=name, mode=mode, median_ms=median, graph_ms=graph, kernel_us=busy,
                           kernels=[list(k) for k in kernels[:16]], n_kernels=sum(n for *_, n in kernels))
                result["rows"].append(row)
                g = f"{graph:.3f}" if isinstance(graph, float) else graph[:60]
                print(f"{shape:>16} {name:>15} {mode:>6} median {median:7.3f} ms | graph {g} | kernels "
                      f"{busy / 1e3:7.3f} ms in {row['n_kernels']:.0f} launches", flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "profile_op.json"), "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

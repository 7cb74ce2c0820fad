"""Where a model's step spends its GPU time: torch.profiler over one step of each variant of model_throughput.py, its
kernels summed by name. model_throughput.py gives each variant's time per step; this says which kernels make it up,
for instance how much of a training step the op's own kernels take and how much the layer's norms and convolutions.

    python benchmarks/model_profile.py --out $OUT --scale 340M --variants fla_delta_rule,identity_mixer --mode train
    TRITON_INTERPRET=1 python benchmarks/model_profile.py --out /tmp/mp --smoke     # a tiny model on the CPU

Output `model_profile.json`: per variant, the step's summed kernel time (`device_ms`) and the --top kernels by time
(name, calls, ms), each also tagged `op` if it is one of the op's kernels (a Triton kernel of osdn_fast or fla).
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("model_throughput", HERE / "model_throughput.py")
mt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mt)


def op_kernel(name: str, op_names: set[str]) -> bool:
    """Whether a kernel belongs to the op: a Triton kernel defined in osdn_fast.ops or fla.ops (by its function name;
    the profiler reports Triton kernels by their Python names, ATen's by their C++ templates)."""
    return name.split("(")[0].split(" ")[-1] in op_names


def triton_kernel_names() -> set[str]:
    """Names of the @triton.jit functions (also autotuned, or interpreted) of the loaded osdn_fast.ops and fla.ops."""
    import sys

    import triton
    from triton.runtime.interpreter import InterpretedFunction

    kinds = (triton.runtime.JITFunction, triton.runtime.Autotuner, triton.runtime.Heuristics, InterpretedFunction)
    names = set()
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("osdn_fast.ops", "fla.ops")):
            continue
        for attr in vars(module).values():
            if isinstance(attr, kinds):
                while hasattr(attr, "fn"):  # autotuner → heuristics → jit → the Python function
                    attr = attr.fn
                names.add(attr.__name__)
    return names


def profile_variant(model, batch, variant, mode, device, top):
    """(device_ms, kernels): one profiled step after the caller's warm-up; kernels sorted by total time."""
    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with mt.mixer_op(variant), profile(activities=activities) as prof:
        mt.step(model, batch, mode)
        if device == "cuda":
            torch.cuda.synchronize()
    names = triton_kernel_names()
    rows = []
    for e in prof.key_averages():
        us = e.device_time_total if device == "cuda" else e.self_cpu_time_total
        if us > 0 and (device != "cuda" or e.device_type.name == "CUDA"):
            rows.append(dict(name=e.key[:160], calls=e.count, ms=us / 1e3, op=op_kernel(e.key, names)))
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows)
    return dict(device_ms=total, op_ms=sum(r["ms"] for r in rows if r["op"]), kernels=rows[:top])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (CPU self time, not kernels)")
    ap.add_argument("--scale", default="340M", choices=list(mt.SCALES))
    ap.add_argument("--variants", default="fla_delta_rule,osdn,identity_mixer")
    ap.add_argument("--mode", default="train", choices=["inference", "train"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--conv", default="layer", choices=list(mt.CONVS), help="as model_throughput.py's")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - set(mt.VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}")
    mt.use_conv(args.conv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        scale_name, scale, vocab, dtype, B, T = "tiny", mt.SMOKE_SCALE["tiny"], 64, torch.float32, 1, 48
    else:
        scale_name, scale, vocab, dtype, B, T = args.scale, mt.SCALES[args.scale], mt.VOCAB, torch.bfloat16, 8, 2048
    if device != "cuda" and "fla_delta_rule" in variants:
        variants.remove("fla_delta_rule")
        print("no GPU: fla_delta_rule skipped")
    tokens = torch.randint(0, vocab, (B, T + 1), device=device, generator=torch.Generator(device).manual_seed(0))
    batch = tokens if args.mode == "train" else tokens[:, :T]
    result = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                            scale=scale_name, mode=args.mode, B=B, T=T, dtype=str(dtype),
                            conv=args.conv),
                  variants={})
    os.makedirs(args.out, exist_ok=True)
    for v in variants:
        model = mt.build(v, scale, vocab, device, dtype)
        with mt.mixer_op(v):
            for _ in range(args.warmup):
                mt.step(model, batch, args.mode)
        result["variants"][v] = profile_variant(model, batch, v, args.mode, device, args.top)
        r = result["variants"][v]
        print(f"{scale_name} {args.mode} {v}: kernels {r['device_ms']:.1f} ms, the op's {r['op_ms']:.1f} ms",
              flush=True)
        for k in r["kernels"][:8]:
            print(f"    {k['ms']:8.2f} ms {k['calls']:5d}x {'op ' if k['op'] else '   '}{k['name'][:100]}", flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        with open(os.path.join(args.out, "model_profile.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

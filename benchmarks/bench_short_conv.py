"""The layer's short convolution alone: osdn_fast.nn.short_conv (Triton, [B, T, C]) against the layer's torch path
(depthwise conv1d on [B, C, T], its output copied back to [B, T, C]: ShortConv with kernel='ref', the baseline), at
the models' shapes (one of q, k, v of a 340M and a 1.3B layer: C = H·K = 1024 and 2048, B × T = 8 × 2048) and one long
sequence, in bfloat16, forward and forward+backward.

Each round times both paths for --iters calls between two CUDA events, in an order that alternates from round to
round; a row keeps the median over rounds and the ratio to torch's in the same run. `gbs` is the forward's minimum
traffic (read x, write y: 2·B·T·C elements) over its time; forward+backward counts x, y, ∂y, ∂x once more each.
Before timing, the two paths are compared on one input (`agreement`: relative RMSE of y, ∂x, ∂w in the dtype).

    python benchmarks/bench_short_conv.py --out $OUT                               # on the GPU, ~30 s warm
    TRITON_INTERPRET=1 python benchmarks/bench_short_conv.py --smoke --out /tmp/sc # tiny shapes on the CPU
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys

import torch

from osdn_fast.nn.layer import ShortConv
from osdn_ref.checks import rel_err

SHAPES = ((8, 2048, 1024), (8, 2048, 2048), (1, 16384, 2048))  # (B, T, C): 340M's and 1.3B's q, k, v; one long one
SMOKE_SHAPES = ((2, 70, 40),)
IMPLS = ("torch", "triton")  # ShortConv's kernel 'ref' (the baseline) and 'fast'
MODES = ("fwd", "fwdbwd")


def convs(C, W, device, dtype):
    """The two paths with one weight: {impl: ShortConv}."""
    ref = ShortConv(C, W, kernel="ref").to(device, dtype)
    fast = ShortConv(C, W, kernel="fast").to(device, dtype)
    fast.load_state_dict(ref.state_dict())
    return dict(torch=ref, triton=fast)


def agreement(mods, x, dy):
    """Relative RMSE of the Triton path's y, ∂x, ∂w against torch's, on one input."""
    out = {}
    for impl, mod in mods.items():
        mod.zero_grad()
        xi = x.clone().requires_grad_()
        y = mod(xi)
        y.backward(dy)
        out[impl] = (y, xi.grad, mod.conv.weight.grad)
    return {name: rel_err(a, b) for name, a, b in zip(("y", "dx", "dw"), out["triton"], out["torch"])}


def call(mod, x, dy, mode):
    """One forward (no graph), or forward and both gradients (returned, not accumulated into .grad)."""
    if mode == "fwd":
        with torch.no_grad():
            return mod(x)
    return torch.autograd.grad(mod(x), (x, mod.conv.weight), dy)


def time_shape(shape, W, device, dtype, rounds, iters, log):
    B, T, C = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, C, generator=gen).to(device, dtype)
    dy = torch.randn(B, T, C, generator=gen).to(device, dtype)
    mods = convs(C, W, device, dtype)
    agree = agreement(mods, x, dy)
    log(f"{shape}: triton vs torch, relative RMSE " + ", ".join(f"{k} {v:.1e}" for k, v in agree.items()))
    cuda = device == "cuda"
    rows = []
    for mode in MODES:
        xs = x.requires_grad_(mode == "fwdbwd")
        for mod in mods.values():
            call(mod, xs, dy, mode)  # warm-up (compiles)
        times = {i: [] for i in IMPLS}
        for rnd in range(rounds):
            for impl in (IMPLS if rnd % 2 == 0 else IMPLS[::-1]):
                mod = mods[impl]
                if cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(iters):
                        call(mod, xs, dy, mode)
                    end.record()
                    torch.cuda.synchronize()
                    ms = start.elapsed_time(end) / iters
                else:
                    t0 = dt.datetime.now()
                    for _ in range(iters):
                        call(mod, xs, dy, mode)
                    ms = (dt.datetime.now() - t0).total_seconds() * 1e3 / iters
                times[impl].append(ms)
        med = {i: statistics.median(times[i]) for i in IMPLS}
        elems = B * T * C * (2 if mode == "fwd" else 6)
        for impl in IMPLS:
            rows.append(dict(shape=list(shape), W=W, mode=mode, impl=impl, ms=med[impl], rounds_ms=times[impl],
                             ratio_to_torch=med[impl] / med["torch"],
                             gbs=elems * x.element_size() / (med[impl] * 1e-3) / 1e9))
        log(f"{shape} {mode}: torch {med['torch'] * 1e3:.1f} us, triton {med['triton'] * 1e3:.1f} us "
            f"({med['triton'] / med['torch']:.3f}x torch's)")
    return rows, agree


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, float32, few calls (a CPU check)")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if args.width < 1:
        raise ValueError(f"--width must be at least 1, got {args.width}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("no GPU: run with --smoke (and TRITON_INTERPRET=1) for the CPU check")
    shapes, dtype = (SMOKE_SHAPES, torch.float32) if args.smoke else (SHAPES, torch.bfloat16)
    rounds, iters = (2, 1) if args.smoke else (args.rounds, args.iters)
    log = lambda msg: print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", flush=True)  # noqa: E731
    import triton

    meta = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                command="python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
                gpu=torch.cuda.get_device_name() if device == "cuda" else platform.machine(), torch=torch.__version__,
                triton=triton.__version__, dtype=str(dtype), rounds=rounds, iters=iters, smoke=args.smoke,
                baseline="torch: ShortConv(kernel='ref'), depthwise conv1d on [B, C, T] and a copy back to [B, T, C]",
                timing="CUDA events around --iters calls per path and round; median over rounds")
    rows, agree = [], {}
    for shape in shapes:
        r, a = time_shape(shape, args.width, device, dtype, rounds, iters, log)
        rows += r
        agree["x".join(map(str, shape))] = a
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_short_conv.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, agreement=agree, rows=rows), f, indent=1)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()

"""The layer's short convolution alone: osdn_fast.nn.short_conv (Triton, [B, T, C]) against the layer's torch path
(depthwise conv1d on [B, C, T], its output copied back to [B, T, C]: ShortConv with kernel='ref', the baseline), at
the models' shapes (one of q, k, v of a 340M and a 1.3B layer: C = H·K = 1024 and 2048, B × T = 8 × 2048) and one long
sequence, in bfloat16, forward and forward+backward. `--tiles` adds Triton launches other than the default
(short_conv.TILES), as impls named "triton BTxBC/Nw".

Each round times every path for --iters calls between two CUDA events (`ms`: eager, host included), then, on a GPU,
replays a CUDA graph of --iters calls captured once (`graph_ms`: the GPU's time alone), in an order that alternates
from round to round; a row keeps the medians over rounds and the ratios to torch's in the same run. `gbs` is the
minimum traffic (forward: read x, write y, 2·B·T·C elements; forward+backward: x, y, ∂y, ∂x once more each) over
graph_ms (over ms without a GPU). Before timing, each Triton path is compared with torch's on one input
(`agreement`: relative RMSE of y, ∂x, ∂w in the dtype).

    python benchmarks/bench_short_conv.py --out $OUT --tiles 64x128x4,64x128x8   # on the GPU, ~30 s warm
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
from osdn_fast.nn.short_conv import TILES, short_conv
from osdn_ref.checks import rel_err

SHAPES = ((8, 2048, 1024), (8, 2048, 2048), (1, 16384, 2048))  # (B, T, C): 340M's and 1.3B's q, k, v; one long one
SMOKE_SHAPES = ((2, 70, 40),)
MODES = ("fwd", "fwdbwd")


def impl_name(tiles):
    """A Triton path's name: "triton" at short_conv.TILES, else "triton BTxBC/Nw"."""
    return "triton" if tiles == TILES else f"triton {tiles[0]}x{tiles[1]}/{tiles[2]}w"


def convs(C, W, device, dtype, tiles):
    """{impl: (fn, weight)}: torch's path (ShortConv with kernel 'ref', the baseline) and the Triton kernels at each
    launch of `tiles` (the first is short_conv.TILES, named "triton"), all with one weight."""
    ref = ShortConv(C, W, kernel="ref").to(device, dtype)
    w = ref.conv.weight.detach().clone().requires_grad_()
    paths = dict(torch=(ref, ref.conv.weight))
    for t in tiles:
        paths[impl_name(t)] = ((lambda x, t=t: short_conv(x, w, t)), w)
    return paths


def agreement(paths, x, dy):
    """Relative RMSE of each Triton path's y, ∂x, ∂w against torch's, on one input: {impl: {y, dx, dw}}."""
    out = {}
    for impl, path in paths.items():
        xi = x.clone().requires_grad_()
        y = path[0](xi)
        out[impl] = (y, *torch.autograd.grad(y, (xi, path[1]), dy))
    return {impl: {name: rel_err(a, b) for name, a, b in zip(("y", "dx", "dw"), got, out["torch"])}
            for impl, got in out.items() if impl != "torch"}


def call(path, x, dy, mode):
    """One forward (no graph), or forward and both gradients (returned, not accumulated into .grad)."""
    fn, w = path
    if mode == "fwd":
        with torch.no_grad():
            return fn(x)
    return torch.autograd.grad(fn(x), (x, w), dy)


def capture(path, x, dy, mode, iters):
    """A CUDA graph of `iters` calls, after three on a side stream (torch.cuda.graph's recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call(path, x, dy, mode)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call(path, x, dy, mode)
    return graph


def events_ms(run, iters):
    """ms per call of run() (which makes `iters` calls), between two CUDA events."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def time_shape(shape, W, device, dtype, tiles, rounds, iters, log):
    B, T, C = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, C, generator=gen).to(device, dtype)
    dy = torch.randn(B, T, C, generator=gen).to(device, dtype)
    paths = convs(C, W, device, dtype, tiles)
    impls = list(paths)
    agree = agreement(paths, x, dy)
    for impl, a in agree.items():
        log(f"{shape}: {impl} vs torch, relative RMSE " + ", ".join(f"{k} {v:.1e}" for k, v in a.items()))
    cuda = device == "cuda"
    rows = []
    for mode in MODES:
        xs = x.detach().requires_grad_(mode == "fwdbwd")
        for path in paths.values():
            call(path, xs, dy, mode)  # warm-up (compiles)
        graphs = {i: capture(p, xs, dy, mode, iters) for i, p in paths.items()} if cuda else {}
        eager, replay = ({i: [] for i in impls} for _ in range(2))
        for rnd in range(rounds):
            for impl in (impls if rnd % 2 == 0 else impls[::-1]):
                path = paths[impl]
                if cuda:
                    eager[impl].append(events_ms(lambda: [call(path, xs, dy, mode) for _ in range(iters)], iters))
                    replay[impl].append(events_ms(graphs[impl].replay, iters))
                else:
                    t0 = dt.datetime.now()
                    for _ in range(iters):
                        call(path, xs, dy, mode)
                    eager[impl].append((dt.datetime.now() - t0).total_seconds() * 1e3 / iters)
        del graphs
        med = {i: statistics.median(eager[i]) for i in impls}
        gmed = {i: statistics.median(replay[i]) if cuda else None for i in impls}
        elems = B * T * C * (2 if mode == "fwd" else 6)
        for impl in impls:
            gpu_ms = gmed[impl] or med[impl]
            rows.append(dict(shape=list(shape), W=W, mode=mode, impl=impl, ms=med[impl], rounds_ms=eager[impl],
                             graph_ms=gmed[impl], graph_rounds_ms=replay[impl] if cuda else None,
                             ratio_to_torch=med[impl] / med["torch"],
                             graph_ratio_to_torch=gmed[impl] / gmed["torch"] if cuda else None,
                             gbs=elems * x.element_size() / (gpu_ms * 1e-3) / 1e9))
        log(f"{shape} {mode}: " + ", ".join(
            f"{i} {med[i] * 1e3:.1f} us" + (f" (graph {gmed[i] * 1e3:.1f})" if cuda else "") for i in impls))
    return rows, agree


def parse_tiles(text):
    """"64x128x4,16x128x4" → [(64, 128, 4), (16, 128, 4)]."""
    try:
        tiles = [tuple(int(n) for n in t.split("x")) for t in text.split(",") if t]
    except ValueError:
        tiles = None
    if tiles is None or any(len(t) != 3 or min(t) < 1 or any(n & (n - 1) for n in t) for t in tiles):
        raise ValueError(f"--tiles: expected BTxBCxWARPS[,...], powers of two, got {text!r}")
    return tiles


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, float32, few calls (a CPU check)")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tiles", default="", help="Triton launches besides short_conv.TILES: BTxBCxWARPS[,...]")
    args = ap.parse_args(argv)
    if args.width < 1:
        raise ValueError(f"--width must be at least 1, got {args.width}")
    tiles = [TILES] + [t for t in parse_tiles(args.tiles) if t != TILES]
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
                tiles={impl_name(t): list(t) for t in tiles},
                timing="CUDA events around --iters eager calls, and around a replay of a CUDA graph of --iters calls, "
                       "per path and round; medians over rounds")
    rows, agree = [], {}
    for shape in shapes:
        r, a = time_shape(shape, args.width, device, dtype, tiles, rounds, iters, log)
        rows += r
        agree["x".join(map(str, shape))] = a
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_short_conv.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, agreement=agree, rows=rows), f, indent=1)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()

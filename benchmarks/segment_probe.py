"""Would phase 1 hide beside phase 2 if the sequence were cut into segments? (NOTES, twelfth session.)

Phase 1's chain is a latency chain: at (4, 4096, 16, 128) its 64 programs leave half of the H200's 132 SMs idle for
~140 µs, and the forward waits on it because phase 2 reads d. But phase 2 of the first T/N tokens needs only phase 1 of
those tokens: cut the time axis into N segments and phase 1 of segment s+1 can run on a second stream while phase 2 of
segment s runs on the first. The two chains carry their states across segments exactly as `initial_state` = (S, d)
does in the public API, so the result is the whole op's. No waits inside kernels, only events between launches:

    side:  P1(1) ─ P1(2) ─ P1(3) ─ …                 (phase 1 of each segment, d carried on)
    main:        └ P2(1) ┴ P2(2) ┴ P2(3) ─ …         (phase 2 of segment s after P1(s) and P2(s-1), S carried on)

The forward alone (no autograd), `osdn` and `osdn_apf` without the clip, timed three ways, each the median of --reps
CUDA-graph replays: `whole` (chunk_osdn as it is), `serial` (the segments on one stream: what cutting costs) and
`pipelined` (two streams: what overlapping gains). Segments are sliced before the timing (a real version would index
them in its kernels) and the outputs are not concatenated. Each pipelined output is checked against the whole op's.

    python benchmarks/segment_probe.py --out $OUT      # on the GPU; 37 s on a cold H100 (2026-12-08)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import osdn_fast.ops.chunk as chunk_ops
from osdn_fast import chunk_osdn
from osdn_fast.ops.index import uniform_chunk_layout, uniform_cu_seqlens

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_probe import timed  # noqa: E402  (median µs of CUDA-graph replays)

SHAPES = ("4x4096x16x128", "8x2048x16x128", "1x16384x16x128", "2x4096x32x64")
ETA, CHUNK = 0.003, 64
P1 = dict(d_min=None, d_max=None, beta_aware=True, normalize=True)


def inputs(shape: str, apf: bool, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    B, T, H, D = map(int, shape.split("x"))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = dict(q=torch.randn(B, T, H, D, generator=gen),
             k=torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1),
             v=torch.randn(B, T, H, D, generator=gen), beta=torch.rand(B, T, H, generator=gen).sigmoid())
    if apf:
        x["r"] = 0.9 + 0.1 * torch.rand(B, T, H, generator=gen)
    return {n: t.to(device, dtype) for n, t in x.items()}


def cut(x: dict, n: int) -> list[dict]:
    """The inputs as n segments along T, each contiguous."""
    T = x["k"].shape[1]
    if T % (n * CHUNK):
        raise ValueError(f"n={n}: T={T} is not a multiple of n · {CHUNK}")
    return [{k: t[:, i * T // n:(i + 1) * T // n].contiguous() for k, t in x.items()} for i in range(n)]


def phase2_of(seg: dict, p1_result, S0, scale: float, last: bool):
    """Phase 2 of one segment from its phase 1, as ChunkOSDN.forward assembles it: (o [1, B·Ts, H, V], S_final)."""
    _, _, _, kt, _, kept = p1_result
    B, T = seg["k"].shape[:2]
    dev = seg["k"].device
    pk = lambda t: None if t is None else t.reshape(1, B * T, *t.shape[2:])  # noqa: E731
    replay = None
    if kt is None:  # the chunk form left d and k̃ to phase 2's Gram
        _, stats, (x0, u) = kept
        replay = (pk(seg.get("r")), (x0, pk(u)), None, chunk_ops.PHASE1_CHUNKED["chunk_size"],
                  None if stats is None else stats.reshape(2, B * T, -1), chunk_ops.PHASE1_CHUNKED["precision"])
    o, S, _, _ = chunk_ops.phase2_fwd(pk(seg["q"]), pk(seg["k"]), pk(kt), pk(seg["v"]), pk(seg["beta"]), None, S0,
                                      uniform_cu_seqlens(B, T, dev), scale, not last, CHUNK,
                                      uniform_chunk_layout(B, T, CHUNK, dev), replay)
    return o, S


def segmented_forward(segs: list[dict], eta: torch.Tensor, side: torch.cuda.Stream | None = None) -> list:
    """The forward over segments: every phase 1 queued first (on `side` if given), then each phase 2 after its own
    segment's phase 1 (an event) on the current stream. Returns the segments' outputs."""
    scale = segs[0]["k"].shape[-1] ** -0.5
    main = torch.cuda.current_stream() if side is not None else None
    if side is not None:
        side.wait_stream(main)
    d, firsts = None, []
    for seg in segs:
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            result = chunk_ops.phase1_fwd(seg["k"], seg["beta"], seg.get("r"), d, eta, None, P1, store_d=False,
                                          chunk_size=CHUNK)
            done = None
            if side is not None:
                done = torch.cuda.Event()
                done.record(side)
        d = result[2]
        firsts.append((result, done))
    S, outs = None, []
    for i, (seg, (result, done)) in enumerate(zip(segs, firsts)):
        if done is not None:
            main.wait_event(done)
        o, S = phase2_of(seg, result, S, scale, last=i == len(segs) - 1)
        outs.append(o)
    if side is not None:
        main.wait_stream(side)
    return outs


def whole_forward(x: dict, eta: torch.Tensor):
    return chunk_osdn(x["q"], x["k"], x["v"], x["beta"], eta=eta, r=x.get("r"), chunk_size=CHUNK)[0]


def joined(outs: list, shape) -> torch.Tensor:
    B = shape[0]
    return torch.cat([o.reshape(B, -1, *o.shape[2:]) for o in outs], dim=1)


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--segments", default="2,4", help="comma-separated segment counts")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    dev = torch.device("cuda")
    side = torch.cuda.Stream()
    rows = []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            H = int(shape.split("x")[2])
            eta = torch.full((H,), ETA, device=dev)
            for op, apf in (("osdn", False), ("osdn_apf", True)):
                x = inputs(shape, apf, dev)
                ref = whole_forward(x, eta)
                base = timed(lambda: whole_forward(x, eta), args.reps)
                for n in map(int, args.segments.split(",")):
                    segs = cut(x, n)
                    err = rel_rmse(joined(segmented_forward(segs, eta, side), x["k"].shape), ref)
                    serial = timed(lambda: segmented_forward(segs, eta), args.reps)
                    piped = timed(lambda: segmented_forward(segs, eta, side), args.reps)
                    again = timed(lambda: whole_forward(x, eta), args.reps)
                    rows.append(dict(shape=shape, op=op, segments=n, whole_us=[base, again], serial_us=serial,
                                     pipelined_us=piped, rel_rmse_vs_whole=err))
                    print(f"  {shape:<16}{op:<9} N={n}  whole {base:7.1f} / {again:7.1f}   serial {serial:7.1f}   "
                          f"pipelined {piped:7.1f} µs   ({piped / base:.3f}× whole)   rel RMSE {err:.1e}", flush=True)
    meta = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=__import__("triton").__version__, reps=args.reps,
                command="python3 benchmarks/segment_probe.py " + " ".join(f"--{n} {v}" for n, v in vars(args).items()))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "segment_probe.json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()

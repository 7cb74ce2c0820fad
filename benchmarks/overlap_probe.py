"""How much of phase 1's out work could hide under its chains if each kept its own launch (NOTES, next change 1 after
version 36's fourth session). The chunk form's forward (chunk.phase1_fwd) and backward (chunk.phase1_bwd_chunked) at
chunk_osdn's settings, timed three ways, each the median of --reps CUDA-graph replays:

  serial   as chunk_osdn runs them: prep, the chains, then the out kernel;
  overlap  the out kernel launched on a second stream as soon as the chain kernel is, with no wait between them (it
           then reads entry states the chains have not written yet: its results are wrong, the timing is the point);
  no_out   the out kernel not launched: the floor that any overlap could reach.

overlap near no_out: an out kernel on a second stream that waits per chunk would hide; overlap near serial or above:
the chains slow down as much as the out work is hidden, and overlapping them is not worth building.

    python benchmarks/overlap_probe.py --out $OUT     # on the GPU; ~1 min warm
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import osdn_fast.ops.chunk as chunk_ops
import osdn_fast.ops.phase1_chunk as p1c

SHAPES = ("8x2048x16x128", "4x4096x16x128", "16x1024x16x128", "2x4096x32x64")
KERNELS = dict(fwd=("phase1_chunk_state_kernel", "phase1_chunk_out_kernel"),
               bwd=("phase1_chunk_bwd_state_kernel", "phase1_chunk_bwd_out_kernel"))


class Chain:
    """Stands in for a chain kernel: records an event on the current stream just before its launch."""

    def __init__(self, kernel, probe):
        self.kernel, self.probe = kernel, probe

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.probe.started.record()
            return self.kernel[grid](*args, **kwargs)
        return call


class Out:
    """Stands in for an out kernel: launched as chunk_osdn does ("serial"), on the side stream from the chain's start
    ("overlap", the current stream then waits for it), or not at all ("no_out")."""

    def __init__(self, kernel, probe):
        self.kernel, self.probe = kernel, probe

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            mode, side = self.probe.mode, self.probe.side
            if mode == "serial":
                return self.kernel[grid](*args, **kwargs)
            if mode == "overlap":
                side.wait_event(self.probe.started)
                with torch.cuda.stream(side):
                    self.kernel[grid](*args, **kwargs)
                torch.cuda.current_stream().wait_stream(side)
        return call


class Probe:
    def __init__(self):
        self.mode, self.side, self.started = "serial", torch.cuda.Stream(), torch.cuda.Event()
        for chain, out in KERNELS.values():
            setattr(p1c, chain, Chain(getattr(p1c, chain), self))
            setattr(p1c, out, Out(getattr(p1c, out), self))


def inputs(shape: str, seed: int = 0):
    B, T, H, D = map(int, shape.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda", generator=gen), dim=-1).bfloat16()
    beta = torch.rand(B, T, H, device="cuda", generator=gen).bfloat16()
    eta = torch.full((H,), 0.003, device="cuda")
    grads = (torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16() * 1e-2,
             torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16() * 1e-2,
             torch.randn(B, T, H, device="cuda", generator=gen) * 1e-2)
    return k, beta, eta, grads


def timed(fn, reps: int) -> float:
    """Median µs of `reps` replays of fn() captured in a CUDA graph (GPU time: the host's launch gaps are out of it,
    which eager calls of these few-µs launches are not), each replay between two CUDA events."""
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    probe = Probe()
    p1 = dict(d_min=None, d_max=None, beta_aware=True, normalize=True)
    rows = []
    for shape in args.shapes.split(","):
        k, beta, eta, grads = inputs(shape)
        B, T, H, D = k.shape
        form = chunk_ops.phase1_form(T, None, None, None, chains=B * H)
        assert form == "chunked" and chunk_ops.phase1_group(k, None) is None, (shape, form)
        kept = chunk_ops.phase1_fwd(k, beta, None, None, eta, None, p1, store_d=True)[5]
        dd_final = torch.zeros(B, H, D, device="cuda")
        calls = dict(fwd=lambda: chunk_ops.phase1_fwd(k, beta, None, None, eta, None, p1, store_d=True),
                     bwd=lambda: chunk_ops.phase1_bwd_chunked(k, beta, None, eta, dd_final, None, grads, p1, kept))
        for direction, fn in calls.items():
            us = {}
            for mode in ("serial", "overlap", "no_out", "serial"):  # serial twice: first and last, for drift
                probe.mode = mode
                us.setdefault(mode, []).append(timed(fn, args.reps))
            row = dict(shape=shape, direction=direction, serial_us=us["serial"], overlap_us=us["overlap"][0],
                       no_out_us=us["no_out"][0])
            rows.append(row)
            print(f"  {shape:<16}{direction:<4} serial {us['serial'][0]:7.1f} / {us['serial'][1]:7.1f}   "
                  f"overlap {row['overlap_us']:7.1f}   no_out {row['no_out_us']:7.1f} µs", flush=True)
    meta = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=__import__("triton").__version__, reps=args.reps,
                command="python3 benchmarks/overlap_probe.py " + " ".join(f"--{n} {v}" for n, v in vars(args).items()))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "overlap_probe.json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()

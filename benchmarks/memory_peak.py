"""What is alive at the peak of one forward+backward: a CUDA memory trace of one call, replayed to its peak.

For each shape and op (`osdn`, `osdn_apf_clip`, fla's `chunk_delta_rule` when fla is importable) this warms the call
up, records the allocator's trace (`torch.cuda.memory._record_memory_history`) over one forward+backward from inputs
already on the GPU (as `bench_suite.py` measures peak memory), replays the trace to the moment the most bytes were
allocated, and groups the blocks alive then by the first source line of this repository or of fla that allocated
them. Sizes are in MiB and in units of one bfloat16 [B, T, H, K] tensor, the size of k̃. Writes memory_peak.json.

Without a GPU (`--cpu`, under TRITON_INTERPRET=1) the same forward+backward runs on the CPU, and a dispatch mode
(`LiveStorages`) counts the storages that torch operators return until their last tensor dies: the bytes alive at
the peak by the same sites, with the interpreter's own temporaries among torch's. Not the GPU's allocator (no
512-byte rounding, no caching), but the same tensors in the same order: a change that moves a buffer moves the peak
the same way on both (version 30: the speculative form's d_all). `--force-chunked` lets short sequences take the
forms chunk_osdn takes from T = 4096 on (chunk.PHASE1_CHUNKED_MIN_T = 1), so small shapes stay quick.

    python benchmarks/memory_peak.py --out $OUT --shapes 8x2048x16x128,1x16384x16x128     # on the GPU
    TRITON_INTERPRET=1 python benchmarks/memory_peak.py --out /tmp/m --cpu --force-chunked --shapes 1x256x2x64 \
        --ops osdn,osdn_clip --eta 2.0                                                       # the clip acting
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

OWN = ("osdn_fast", "osdn_ref", "fla/", "benchmarks")  # frames worth naming: ours and fla's, not torch's


def live_at_peak(events):
    """(peak bytes, blocks alive at the peak) of an allocator trace: 'alloc' adds a block, 'free_completed' removes it
    (blocks allocated before the trace began are not in it; their frees are ignored)."""
    live, now, peak, at_peak = {}, 0, 0, []
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > peak:
                peak, at_peak = now, list(live.values())
        elif e["action"] == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])["size"]
    return peak, at_peak


def site(frames):
    """The innermost frame in OWN, as 'path:line function' from the repository or package root."""
    for f in frames:
        name = f["filename"].replace("\\", "/")
        for mark in OWN:
            i = name.find(mark)
            if i >= 0:
                return f"{name[i:]}:{f['line']} {f['name']}"
    return "(torch internals)"


def by_site(blocks, unit):
    """[{site, mib, units, blocks}] of the blocks, largest first."""
    groups = {}
    for b in blocks:
        g = groups.setdefault(site(b.get("frames", [])), [0, 0])
        g[0] += b["size"]
        g[1] += 1
    return [dict(site=s, mib=n / 2**20, units=n / unit, blocks=c)
            for s, (n, c) in sorted(groups.items(), key=lambda kv: -kv[1][0])]


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages that operators return while it is active, each alive until its last tensor returned here
    dies; `peak` and `at_peak` (blocks as in an allocator trace: size, frames innermost first) of the most bytes."""

    def __init__(self):
        super().__init__()
        self.live, self.tensors, self.now, self.peak, self.at_peak = {}, {}, 0, 0, []

    def _release(self, key):
        self.tensors[key] -= 1
        if self.tensors[key] == 0:
            del self.tensors[key]
            self.now -= self.live.pop(key)["size"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in self.live:
                frames = [dict(filename=f.filename, line=f.lineno, name=f.name)
                          for f in reversed(traceback.extract_stack()[:-1])]  # not this frame
                self.live[key], self.tensors[key] = dict(size=key[1], frames=frames), 0
                self.now += key[1]
                if self.now > self.peak:
                    self.peak, self.at_peak = self.now, list(self.live.values())
            self.tensors[key] += 1
            weakref.finalize(t, self._release, key)
        return out


def cpu_peak(call, do, unit):
    """The bytes alive at the peak of one forward+backward on the CPU (LiveStorages) and their blocks by site."""
    with LiveStorages() as live:
        call().backward(do)
    return dict(peak_mib=live.peak / 2**20, trace_peak_mib=live.peak / 2**20, live=by_site(live.at_peak, unit))


def traced_peak(call, do, unit):
    """max_memory_allocated above the inputs, the trace's peak and its blocks, for one forward+backward."""
    call().backward(do)  # warm-up: compiles, autotunes, fills the caching allocator
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=200_000)
    call().backward(do)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks = live_at_peak(snapshot["device_traces"][torch.cuda.current_device()])
    return dict(peak_mib=(torch.cuda.max_memory_allocated() - base) / 2**20, trace_peak_mib=peak / 2**20,
                live=by_site(blocks, unit))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8x2048x16x128,1x16384x16x128", help="comma-separated BxTxHxD")
    ap.add_argument("--ops", default="osdn,osdn_apf_clip", help="comma-separated OSDN variants (fla's op is added "
                                                               "where fla is importable)")
    ap.add_argument("--eta", type=float, default=0.003, help="OSDN's η (2.0: osdn_clip's clip acts)")
    ap.add_argument("--cpu", action="store_true", help="on the CPU, under TRITON_INTERPRET=1: LiveStorages' count")
    ap.add_argument("--force-chunked", action="store_true", help="phase 1's long-sequence forms at any T")
    args = ap.parse_args(argv)
    if args.cpu and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--cpu runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1")
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("memory_peak.py needs a CUDA GPU (the allocator's trace), or --cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import osdn_fast
    from bench_suite import make_inputs, osdn_variants
    from osdn_fast.ops import chunk

    unknown = set(args.ops.split(",")) - set(osdn_variants())
    if unknown:
        ap.error(f"--ops: unknown {sorted(unknown)}")
    if args.force_chunked:
        chunk.PHASE1_CHUNKED_MIN_T = 1
    device, measure = ("cpu", cpu_peak) if args.cpu else ("cuda", traced_peak)

    try:
        from fla.ops.delta_rule import chunk_delta_rule
    except ImportError:
        chunk_delta_rule = None
        print("fla is not importable here: its rows are skipped", flush=True)
    import triton

    rows = []
    for shape in args.shapes.split(","):
        B, T, H, D = map(int, shape.split("x"))
        unit = B * T * H * D * 2
        ops = {name: osdn_variants()[name] for name in args.ops.split(",")}
        if chunk_delta_rule is not None and not args.cpu:
            ops["fla_delta_rule"] = (False, False, None)
        for name, (gate, apf, extra) in ops.items():
            x, do = make_inputs(B, T, H, D, torch.bfloat16, device, gate, apf)
            for n in ("q", "k", "v", "beta"):
                x[n].requires_grad_()
            if extra is None:
                call = lambda x=x: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0]  # noqa: E731
            else:
                call = lambda x=x, extra=extra: osdn_fast.chunk_osdn(**x, eta=args.eta, **extra)[0]  # noqa: E731
            row = dict(shape=shape, op=name, unit_mib=unit / 2**20, **measure(call, do, unit))
            rows.append(row)
            print(f"{shape:>16} {name:<15} peak {row['peak_mib']:7.1f} MiB (trace {row['trace_peak_mib']:7.1f})",
                  flush=True)
            for g in row["live"][:12]:
                print(f"{'':>18}{g['mib']:8.1f} MiB {g['units']:5.2f} units {g['blocks']:3d} blocks  {g['site']}",
                      flush=True)
            del x, do
            if not args.cpu:
                torch.cuda.empty_cache()
    result = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                  gpu=None if args.cpu else torch.cuda.get_device_name(), eta=args.eta,
                  method="LiveStorages (CPU, Triton interpreter)" if args.cpu else "CUDA allocator trace",
                  forced_chunked=args.force_chunked, torch=torch.__version__, triton=triton.__version__,
                  fla=__import__("fla").__version__ if chunk_delta_rule is not None and not args.cpu else None,
                  rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "memory_peak.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""Side-by-side GPU timings of OSDN against fla's DeltaNet / Gated DeltaNet and the PyTorch reference.

One run times, with CUDA events and medians (`triton.testing.do_bench`), forward and forward+backward of

- `osdn_fast.chunk_osdn`: OSDN and OSDN-APF, with and without the GDN gate, with and without the clip;
- its phase 1 alone (`osdn_fast.ops.phase1.preconditioner_scan` in the form chunk_osdn runs at that shape,
  `chunk.phase1_form`: the row's note says which), to report phase 1's share, and beside it the sequential scan,
  the unclipped chunk form and the exact chunk-parallel form at every shape;
- fla 0.6.0's `chunk_delta_rule` and `chunk_gated_delta_rule` (the named baselines; skipped, and said so, when
  fla is not importable);
- `osdn_ref.chunk_osdn` (PyTorch; only at the smallest shapes: its phase 1 is a Python loop over tokens),

at the issue's shapes plus a T sweep, and reports tokens/s, effective bandwidth against a measured copy
ceiling and peak memory. Writes `bench_suite.json` and `bench_suite.csv` into --out.

With --cudagraph every row also gets `graph_ms`, the median of the same call replayed from a CUDA graph
(`triton.testing.do_bench_cudagraph`): no host work between kernels, so a call whose launches take longer than its
kernels (fla's backward at D = 128: `benchmarks/profile_op.py`) is timed by its GPU work. A call that cannot be
captured (OSDN's backward with the clip reads a device flag on the host) gets NaN and the reason in `graph_note`.

    python benchmarks/bench_suite.py --out $OUT            # on the GPU
    python benchmarks/bench_suite.py --cudagraph --resume part1/bench_suite.json --out $OUT   # go on from a run
        # that a call's time limit cut: its shapes are kept, not re-timed (the settings must match)
    TRITON_INTERPRET=1 python benchmarks/bench_suite.py --smoke --out /tmp/bench   # script check on CPU
"""
from __future__ import annotations

import argparse
import copy
import csv
import datetime as dt
import json
import math
import os
import platform
import sys
import time

import torch

SHAPES = [(8, 2048, 16, 128), (4, 4096, 16, 128), (2, 8192, 16, 128), (1, 16384, 16, 128), (2, 4096, 32, 64)]
T_SWEEP = [(2, T, 16, 128) for T in (1024, 2048, 4096, 8192, 16384)]
SMOKE_SHAPES = [(1, 40, 2, 16)]
REF_MAX_T = 4096  # T above which the PyTorch reference is not timed (its phase 1 loops over tokens in Python:
#                   ~0.3 s per 1000 tokens forward, 3-4x that forward+backward; one call per mode, see timed_once)


def make_inputs(B, T, H, D, dtype, device, gate, apf, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn on the device: the CPU took seconds per shape
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device).to(dtype)  # noqa: E731
    q = rnd(B, T, H, D)
    k = torch.nn.functional.normalize(rnd(B, T, H, D).float(), dim=-1).to(dtype)
    v = rnd(B, T, H, D)
    beta = torch.rand(B, T, H, generator=gen, device=device).to(dtype)
    g = -torch.rand(B, T, H, generator=gen, device=device) * 0.1 if gate else None
    r = (0.99 + 0.01 * torch.rand(B, T, H, generator=gen, device=device)).to(dtype) if apf else None
    do = rnd(B, T, H, D)
    return dict(q=q, k=k, v=v, beta=beta, g=g, r=r), do


def osdn_variants():
    """name → (kind, extra kwargs of chunk_osdn)."""
    clip = dict(d_min=2 / 3, d_max=1.5)
    return {
        "osdn": (False, False, {}),
        "osdn_clip": (False, False, clip),
        "osdn_apf": (False, True, {}),
        "osdn_apf_clip": (False, True, clip),
        "osdn_gdn": (True, False, {}),
        "osdn_gdn_clip": (True, False, clip),
        "osdn_apf_gdn_clip": (True, True, clip),
    }


def timed(fn, grad_inputs, smoke):
    from triton.testing import do_bench

    if smoke:
        fn()
        return float("nan")
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_inputs, return_mode="median")


def graph_timed(fn, grad_inputs, smoke):
    """(median ms of fn replayed from a CUDA graph, None), or (NaN, why) when it cannot be captured."""
    if smoke:
        return float("nan"), "smoke run: no CUDA graph"
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=100, grad_to_none=grad_inputs, return_mode="median")), None
    except Exception as err:  # noqa: BLE001 (a call that reads a device flag on the host cannot be captured)
        torch.cuda.synchronize()
        return float("nan"), f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


def timed_once(fn, device):
    """(ms, peak MiB) of a single synchronized call: for the PyTorch reference, whose calls take seconds."""
    if device != "cuda":
        return float("nan"), float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start), (torch.cuda.max_memory_allocated() - base) / 2**20


def peak_memory(fn, device):
    if device != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_ceiling_gbs(device, smoke):
    """Device-to-device copy bandwidth in GB/s (bytes read + written)."""
    if smoke or device != "cuda":
        return float("nan")
    from triton.testing import do_bench

    x = torch.empty(2**29, dtype=torch.float32, device=device).normal_()
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9


def min_bytes(B, T, H, D, bwd, elem=2):
    """Fewest bytes: read q, k, v, beta, write o; backward also reads them and do, writes dq, dk, dv, dbeta."""
    per_token = (4 * D + 1) * elem
    if bwd:
        per_token += (4 * D + 1) * elem + (3 * D + 1) * elem
    return B * T * H * per_token


def phase1_form_used(x, eta, extra):
    """The phase-1 form chunk_osdn runs on these inputs ("chunked" or "sequential", chunk.phase1_fwd's choice,
    after the clip check: a speculation the clip contradicts is redone sequentially)."""
    from osdn_fast.ops.chunk import phase1_fwd

    H = x["k"].shape[2]
    p1 = dict(d_min=extra.get("d_min"), d_max=extra.get("d_max"), beta_aware=True, normalize=True)
    with torch.no_grad():
        form, _, _, _, outside, _ = phase1_fwd(x["k"], x["beta"], x["r"], None, torch.full((H,), eta, device=x["k"].device),
                                          None, p1)
    if form == "speculative":
        form = "sequential" if outside.item() else "chunked"
    return form


def bench_shape(shape, dtype, device, smoke, have_fla, rows, sweep_only=False, variants=None, cudagraph=False):
    import osdn_fast
    import osdn_ref
    from osdn_fast.ops.chunk import PHASE1_CHUNKED, phase1_group
    from osdn_fast.ops.phase1 import preconditioner_scan

    B, T, H, D = shape
    eta = 0.003

    def run(name, kind, call, inputs, do, once=False, note=None):
        grads = [x for x in inputs if x is not None and x.requires_grad]
        fwd = lambda: call()  # noqa: E731
        fwdbwd = lambda: call().backward(do)  # noqa: E731
        for mode, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            note = "one call (wall clock, synchronized), not a median" if once else note
            try:
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    if once and not smoke:
                        ms, mem = timed_once(fn, device)
                    else:
                        ms = timed(fn, grads, smoke)
                        mem = peak_memory(fn, device)
            except RuntimeError as err:  # fla refuses its gated backward on Hopper with Triton 3.4-3.7.0 (#640)
                ms, mem, note = float("nan"), float("nan"), str(err).splitlines()[0][:200]
                print(f"{name} {mode} refused: {note}", flush=True)
            rows.append(dict(shape=f"{B}x{T}x{H}x{D}", B=B, T=T, H=H, D=D, impl=name, kind=kind, mode=mode, note=note,
                             ms=ms, tokens_per_s=B * T / (ms * 1e-3) if ms == ms else float("nan"),
                             gbs=min_bytes(B, T, H, D, mode == "fwdbwd") / (ms * 1e-3) / 1e9 if ms == ms else float("nan"),
                             peak_mib=mem))
            if cudagraph and not once:
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    rows[-1]["graph_ms"], rows[-1]["graph_note"] = graph_timed(fn, grads, smoke)
            print(f"{rows[-1]['shape']:>16} {name:>20} {mode:>6} {ms:9.3f} ms", flush=True)

    names = ["osdn_clip"] if sweep_only else variants or list(osdn_variants())
    for name in names:
        gate, apf, extra = osdn_variants()[name]
        x, do = make_inputs(B, T, H, D, dtype, device, gate, apf)
        leaves = [x[n].requires_grad_() for n in ("q", "k", "v", "beta")]
        call = lambda x=x, extra=extra: osdn_fast.chunk_osdn(**x, eta=eta, **extra)[0]  # noqa: E731
        run(name, "osdn_fast", call, leaves, do)
        if not sweep_only and name in ("osdn", "osdn_clip", "osdn_apf_clip"):
            k, beta = x["k"], x["beta"]
            form, group = phase1_form_used(x, eta, extra), phase1_group(k, None)
            if form == "chunked":  # with its chains grouped where chunk_osdn groups them (version 11)
                scan = dict(chunked=True, dot_precision=PHASE1_CHUNKED["precision"], solver=PHASE1_CHUNKED["solver"],
                            chunk_size=PHASE1_CHUNKED["chunk_size"], chain_group=group)
                form += "" if group is None else f", chains grouped by {group}"
            elif form == "newton":  # rounds to convergence (host-synchronised), where chunk_osdn runs a fixed number
                scan = dict(extra, newton=True, newton_jacobian="diagonal", chunk_size=64)
            else:
                scan = dict(extra)
            p1 = lambda k=k, beta=beta, r=x["r"], scan=scan: preconditioner_scan(  # noqa: E731
                k, beta, eta=eta, r=r, **scan)[0]
            run(f"phase1[{name}]", "phase1", p1, [k, beta], torch.ones(B, T, H, D, device=device), note=form)
        if not sweep_only and name == "osdn_clip":  # the other forms, for comparison
            p1s = lambda k=k, beta=beta, extra=extra: preconditioner_scan(k, beta, eta=eta, **extra)[0]  # noqa: E731
            run(f"phase1_seq[{name}]", "phase1", p1s, [k, beta], torch.ones(B, T, H, D, device=device))
            p1p = lambda k=k, beta=beta, extra=extra: preconditioner_scan(  # noqa: E731
                k, beta, eta=eta, parallel=True, **extra)[0]
            run(f"phase1_parallel[{name}]", "phase1", p1p, [k, beta], torch.ones(B, T, H, D, device=device))
        if not sweep_only and name == "osdn":  # the unclipped chunk form at every shape
            p1c = lambda k=k, beta=beta, group=group: preconditioner_scan(  # noqa: E731
                k, beta, eta=eta, chunked=True, dot_precision=PHASE1_CHUNKED["precision"],
                solver=PHASE1_CHUNKED["solver"], chunk_size=PHASE1_CHUNKED["chunk_size"], chain_group=group)[0]
            run("phase1_chunked[osdn]", "phase1", p1c, [k, beta], torch.ones(B, T, H, D, device=device))
        if not sweep_only and name == "osdn" and T <= REF_MAX_T:
            call_ref = lambda x=x: osdn_ref.chunk_osdn(**x, eta=eta)[0]  # noqa: E731
            run("osdn_ref", "pytorch", call_ref, leaves, do, once=True)

    if have_fla:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        x, do = make_inputs(B, T, H, D, dtype, device, gate=False, apf=False)
        leaves = [x[n].requires_grad_() for n in ("q", "k", "v", "beta")]
        run("fla_delta_rule", "fla", lambda: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0], leaves, do)
        if not sweep_only and variants is None:
            x, do = make_inputs(B, T, H, D, dtype, device, gate=True, apf=False)
            leaves = [x[n].requires_grad_() for n in ("q", "k", "v", "beta")]
            run("fla_gated_delta_rule", "fla",
                lambda: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0], leaves, do)


def summarise(rows):
    """Ratios of medians against fla's chunk_delta_rule at each main shape and mode, and phase 1's share
    (the T-sweep rows are summarised by their log-log slope instead)."""
    by = {(r["shape"], r["impl"], r["mode"]): r["ms"] for r in rows if not r.get("sweep")}
    graph = {(r["shape"], r["impl"], r["mode"]): r["graph_ms"] for r in rows
             if not r.get("sweep") and r.get("graph_ms", float("nan")) == r.get("graph_ms")}
    out = []
    for (shape, impl, mode), ms in by.items():
        base = by.get((shape, "fla_delta_rule", mode))
        entry = dict(shape=shape, impl=impl, mode=mode, ms=ms,
                     vs_fla_delta_rule=ms / base if base else None)
        if (shape, impl, mode) in graph and (shape, "fla_delta_rule", mode) in graph:
            entry["graph_vs_fla_delta_rule"] = graph[(shape, impl, mode)] / graph[(shape, "fla_delta_rule", mode)]
        if impl.startswith("phase1["):
            whole = by.get((shape, impl[7:-1], mode))
            entry["share_of_osdn"] = ms / whole if whole else None
        out.append(entry)
    return out


def fit_slope(rows, impl, mode, field="ms"):
    """Least-squares slope of log(time) against log(T) over the sweep's rows that have `field` (ms: the do_bench
    medians; graph_ms: GPU time, which small T needs: there fla's medians are mostly host time)."""
    pts = [(math.log(r["T"]), math.log(r[field])) for r in rows
           if r["impl"] == impl and r["mode"] == mode and r.get("sweep") and field in r and r[field] == r[field]]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, one call each, no timing (CPU check)")
    ap.add_argument("--tuning", help="JSON {stage: launch settings} applied over osdn_fast.ops.tuning.TUNING")
    ap.add_argument("--cudagraph", action="store_true",
                    help="also time every call replayed from a CUDA graph (graph_ms: GPU time without host gaps)")
    ap.add_argument("--variants", help="comma-separated OSDN variants to time (default: all); fla's chunk_delta_rule "
                                       "and the T sweep always run, fla's gated rule only with all variants")
    ap.add_argument("--resume", help="a bench_suite.json cut short: keep its rows and time only the shapes it lacks "
                                     "(its GPU, versions, dtype, tuning, variants and --cudagraph must be this run's)")
    args = ap.parse_args(argv)
    variants = args.variants.split(",") if args.variants else None
    if variants and not set(variants) <= set(osdn_variants()):
        ap.error(f"--variants: unknown {sorted(set(variants) - set(osdn_variants()))}")
    from osdn_fast.ops.tuning import TUNING

    if args.tuning:
        with open(args.tuning) as f:
            TUNING.update(json.load(f))
    os.makedirs(args.out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        import fla  # noqa: F401

        have_fla = device == "cuda"
    except ImportError:
        have_fla = False
    if not have_fla:
        print("fla is not importable here (or no GPU): its baselines are skipped", flush=True)

    import triton

    meta = dict(
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        gpu=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, triton=triton.__version__,
        fla=__import__("fla").__version__ if have_fla else None,
        dtype=str(dtype), copy_ceiling_gbs=copy_ceiling_gbs(device, args.smoke),
        timing="triton.testing.do_bench, median, warmup 25 ms, rep 100 ms (osdn_ref: one call per mode, T <= 4096)",
        tuning=copy.deepcopy(TUNING), variants=variants or list(osdn_variants()), cudagraph=args.cudagraph,
    )
    rows = resumed_rows(args.resume, meta) if args.resume else []
    done = {(r["shape"], r["sweep"]) for r in rows}
    plan = [(shape, False) for shape in (SMOKE_SHAPES if args.smoke else SHAPES)]
    plan += [(shape, True) for shape in (SMOKE_SHAPES if args.smoke else T_SWEEP)]
    todo = [(shape, sweep) for shape, sweep in plan if ("x".join(map(str, shape)), sweep) not in done]
    for i, (shape, sweep) in enumerate(todo):
        new = []
        bench_shape(shape, dtype, device, args.smoke, have_fla, new, sweep_only=sweep, variants=variants,
                    cudagraph=args.cudagraph)
        for r in new:
            r["sweep"] = sweep
        rows += new
        write(args.out, meta, rows, complete=i == len(todo) - 1)
    if not todo:
        write(args.out, meta, rows, complete=True)


def resumed_rows(path, meta):
    """The rows of an earlier run of the same settings; `meta` gains `resumed_from` (that run's date, command and copy
    ceiling)."""
    with open(path) as f:
        earlier = json.load(f)
    same = ("gpu", "torch", "triton", "fla", "dtype", "tuning", "variants", "cudagraph")
    differ = [key for key in same if earlier["meta"].get(key) != meta[key]]
    if differ:
        raise ValueError(f"--resume: {path} was run with other {differ}; its rows cannot join this run's")
    meta["resumed_from"] = {key: earlier["meta"][key] for key in ("date", "command", "copy_ceiling_gbs")}
    return earlier["rows"]


def write(out, meta, rows, complete):
    """Rewrite the JSON and CSV after every shape, so a run cut short keeps what it measured."""
    slopes, graph_slopes = ({f"{impl}/{mode}": fit_slope(rows, impl, mode, field)
                             for impl in ("osdn_clip", "fla_delta_rule") for mode in ("fwd", "fwdbwd")}
                            for field in ("ms", "graph_ms"))
    result = dict(meta=meta, complete=complete, rows=rows, summary=summarise(rows), t_sweep_loglog_slope=slopes,
                  t_sweep_loglog_slope_graph=graph_slopes)
    with open(os.path.join(out, "bench_suite.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "bench_suite.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)
    if not complete:
        return
    print(json.dumps(meta))
    print("T-sweep log-log slopes, medians:", json.dumps(slopes), "GPU time:", json.dumps(graph_slopes))
    for s in result["summary"]:
        if s["vs_fla_delta_rule"] is not None:
            graph = f"  (CUDA graphs: x{s['graph_vs_fla_delta_rule']:.2f})" if "graph_vs_fla_delta_rule" in s else ""
            print(f"{s['shape']:>16} {s['impl']:>24} {s['mode']:>6} {s['ms']:9.3f} ms  x{s['vs_fla_delta_rule']:.2f} vs fla"
                  + graph)


if __name__ == "__main__":
    main()

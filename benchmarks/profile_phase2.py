"""Where the time of chunk_osdn goes, kernel by kernel, and which launch settings each phase-2 stage wants (issue 6).

1. A CUDA-kernel breakdown (torch.profiler) of `osdn_fast.chunk_osdn` (OSDN, clip) and of fla's
   `chunk_delta_rule`, forward and forward+backward, at (B, T, H, D) = (8, 2048, 16, 128) bfloat16.
2. A sweep of each phase-2 stage over value tile BV, warps and pipeline stages (`osdn_fast.ops.tuning.TUNING`),
   each stage timed alone (triton.testing.do_bench, median) on the same inputs; the fastest setting per stage. Phase
   1's chunk-parallel kernels (`phase1_*`) are swept over key-channel blocks KB, warps and stages, each timed by
   the phase-1 call that launches it.
3. The whole op with the committed TUNING and with the sweep's best, side by side with fla.

Writes profile_phase2.json and tuning.json (the best setting per stage) into --out; this script never changes
the committed settings. The best goes into osdn_fast/ops/tuning.py by hand, after validate_gpu.py has run with it:

    python benchmarks/profile_phase2.py --out $OUT                     # on the GPU, about 3-5 minutes cold
    python benchmarks/profile_phase2.py --out $OUT --shape 1x16384x16x128 --stages state_fwd,state_bwd  # long T
    python benchmarks/validate_gpu.py --out $OUT --tuning $OUT/tuning.json
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import itertools
import json
import os
import re
import time

import torch
import torch.nn.functional as F

SHAPE = (8, 2048, 16, 128)
OPTIONS = dict(eta=0.003, d_min=2 / 3, d_max=1.5)
SPACE = dict(BV=(32, 64), num_warps=(4, 8), num_stages=(1, 2, 3))
SOLVE_SPACE = dict(BV=(64,), num_warps=(1, 2, 4), num_stages=(1,))  # 16×16 tiles: few warps
# phase 1's chunk-parallel kernels: 2 and 4 warps, where their committed settings lie (2 since version 22, the backward's
# running sum 4 in version 41's lead); 8 never won and a space without 2 could not find the committed pick
PHASE1_SPACE = dict(KB=(16, 32, 64), num_warps=(2, 4), num_stages=(1, 2, 3))
CHAIN_SPACE = dict(num_warps=(2, 4, 8), num_stages=(1, 2, 3))  # phase 1's walked chains: one [C, K] tile per step
GROUP_SPACE = dict(BN=(32, 64, 128), num_warps=(4, 8), num_stages=(1,))  # the grouped chains' map (columns BN) and walk
STATE_SPACE = dict(BV=(16, 32, 64), num_warps=(4, 8), num_stages=(1, 2, 3))  # the state chain: narrower tiles, more programs
GRAM_REPLAY_SPACE = dict(KB=(16, 32, 64), num_warps=(2, 4, 8), num_stages=(1, 2))  # the Gram with phase 1's replay
# settings that have lost the CUDA context with an illegal access (`wu`: on its own launch, probe_launch.py, version 12;
# `output_fwd`: in version 23's sweep at (2, 4096, 32, 64)): the loss ends a sweep, so none is offered
FAULTS = {"wu": (dict(BV=32, num_warps=4, num_stages=1),), "output_fwd": (dict(BV=32, num_warps=4, num_stages=1),)}


def inputs(B, T, H, D, device, gate=False):
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = dict(q=torch.randn(B, T, H, D, generator=gen), k=F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1),
             v=torch.randn(B, T, H, D, generator=gen), beta=torch.rand(B, T, H, generator=gen).sigmoid())
    if gate:
        x["g"] = F.logsigmoid(torch.rand(B, T, H, generator=gen))
    return {n: t.to(device, torch.bfloat16).requires_grad_() for n, t in x.items()}


def kernel_table(fn, iters=10, leaves=()):
    """[(kernel name, µs per call of fn, launches per call)] from torch.profiler, slowest first. `leaves`' grads are
    reset before each call, as do_bench's grad_to_none does: otherwise a backward's gradients are added into the
    previous call's (one elementwise launch per leaf, ~35 µs each for a [1, 16384, 16, 128] bf16 tensor), which the
    tables up to version 11 counted."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for x in leaves:
                x.grad = None
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((e.key[:70], t / iters, e.count / iters))
    return sorted(rows, key=lambda r: -r[1])


def stage_calls(x, B, T, H, D):
    """{stage: zero-argument call} for every phase-2 stage, on intermediates computed once."""
    from osdn_fast.ops import common, output, solve, state, wy
    from osdn_fast.ops.common import block_dims
    from osdn_fast.ops.index import chunk_layout, uniform_cu_seqlens

    pk = lambda t: t.detach().reshape(1, B * T, *t.shape[2:]).contiguous()  # noqa: E731
    q, k, v, beta = pk(x["q"]), pk(x["k"]), pk(x["v"]), pk(x["beta"])
    kt = (k * 1.01).contiguous()
    cu = uniform_cu_seqlens(B, T, q.device)
    ci, co = chunk_layout(cu, 64)
    NT = ci.shape[0]
    BK, BV = block_dims(D, D)
    scale = D**-0.5
    grid = (NT, H)

    def launch_config(stage):
        return common.launch(stage, BK, BV)[1]

    A = torch.empty(1, B * T, H, 64, dtype=torch.float32, device=q.device)
    wy.gram_kernel[grid](k, kt, beta, None, A, cu, ci, H, K=D, BT=64, BK=BK, HAS_G=False, **launch_config("gram"))
    Ainv, w, u = wy.wy_fwd(k, kt, v, beta, None, cu, ci, 64, BK, BV)
    h, ubar, _ = state.state_fwd(w, u, kt, None, None, cu, co, NT, 64, BK, BV, False)
    do = torch.randn_like(v)
    du_local = output.output_bwd_local(q, kt, None, do, scale, cu, ci, 64, BK, BV)
    dh, du, _ = state.state_bwd(q, kt, w, None, do, du_local, None, scale, cu, co, NT, 64, BK, BV)
    dq, dkt, dw, _ = output.output_bwd(q, kt, None, h, dh, ubar, du, do, scale, cu, ci, 64, BK, BV)
    return {
        "gram": lambda: wy.gram_kernel[grid](k, kt, beta, None, A, cu, ci, H, K=D, BT=64, BK=BK, HAS_G=False,
                                             **launch_config("gram")),
        "solve": lambda: solve.unit_lower_inverse(A, cu, ci, k.dtype, **launch_config("solve")),
        "wu": lambda: wy.wy_fwd(k, kt, v, beta, None, cu, ci, 64, BK, BV, Ainv=Ainv),
        "state_fwd": lambda: state.state_fwd(w, u, kt, None, None, cu, co, NT, 64, BK, BV, False),
        "output_fwd": lambda: output.output_fwd(q, kt, None, h, ubar, scale, cu, ci, 64, BK, BV),
        "output_bwd_local": lambda: output.output_bwd_local(q, kt, None, do, scale, cu, ci, 64, BK, BV),
        "state_bwd": lambda: state.state_bwd(q, kt, w, None, do, du_local, None, scale, cu, co, NT, 64, BK, BV),
        "output_bwd": lambda: output.output_bwd(q, kt, None, h, dh, ubar, du, do, scale, cu, ci, 64, BK, BV),
        # wy_bwd reads output_bwd's float32 part of ∂k̃ from `dkt` and writes the total to a new buffer
        "wy_bwd": lambda: wy.wy_bwd(k, kt, v, beta, None, Ainv, dw, du, dkt, None, cu, ci, 64, BK, BV, k.dtype),
        "gram_replay": gram_replay_call(x, B, T, H, D, cu, ci, BK),
        **phase1_calls(x, H),
    }


def gram_replay_call(x, B, T, H, D, cu, ci, BK):
    """The Gram that forms k̃ from phase 1's chain (gram_replay.py, version 39), as chunk_osdn runs it after the
    chunk form without the clip: what it replaces is `gram` here plus `phase1_out`'s out kernel."""
    from osdn_fast.ops.chunk import PHASE1_CHUNKED
    from osdn_fast.ops.gram_replay import gram_replay
    from osdn_fast.ops.phase1_chunk import chunk_entries, phase1_fwd_chunk

    k, beta = x["k"].detach(), x["beta"].detach()
    eta = torch.full((H,), OPTIONS["eta"], dtype=torch.float32, device=k.device)
    C1 = PHASE1_CHUNKED["chunk_size"]
    x0, u = chunk_entries(k, None, C1)
    phase1_fwd_chunk(k, beta, None, None, eta, beta_aware=True, normalize=True, cu_seqlens=None, store_d=False,
                     entries=(x0, u), out=False, **PHASE1_CHUNKED)
    stats = torch.empty(2, B * T, H, dtype=torch.float32, device=k.device)
    pk = lambda t: t.reshape(1, B * T, *t.shape[2:])  # noqa: E731
    return lambda: gram_replay(pk(k), pk(beta), None, None, (x0, pk(u)), None, C1, stats, cu, ci, 64, BK,
                               PHASE1_CHUNKED["precision"])


def phase1_calls(x, H):
    """{stage: call} for the chunk-parallel phase 1 as chunk_osdn runs it (chunk.PHASE1_CHUNKED, no clip): each
    TUNING entry that the kernels take at this K (phase1_chunk.tuning_key: `phase1_<kernel>` at K = 128,
    `phase1_<kernel>_k64` at K = 64) is timed by the call that launches it, the forward (prep, out) or the backward
    (bwd_prep, bwd_out, and the chains state, bwd_state: warps and stages only) with phase 2's gradients fused in;
    the other kernels of the call run at fixed settings."""
    from osdn_fast.ops.chunk import PHASE1_CHUNKED
    from osdn_fast.ops.phase1_chunk import chain_group, chunk_entries, phase1_bwd_chunk, phase1_fwd_chunk, tuning_key
    from osdn_fast.ops.phase1_launch import block_k
    from osdn_fast.ops.tuning import TUNING

    k, beta = x["k"].detach(), x["beta"].detach()
    eta = torch.full((H,), OPTIONS["eta"], dtype=torch.float32, device=k.device)
    flags = dict(beta_aware=True, normalize=True, cu_seqlens=None, **PHASE1_CHUNKED)
    stats = torch.empty(2, *k.shape[:3], dtype=torch.float32, device=k.device)  # kept for the backward
    entries = chunk_entries(k, None, PHASE1_CHUNKED["chunk_size"])  # likewise: d is formed again (version 29)
    kept = dict(stats=stats, entries=entries)
    fwd = lambda: phase1_fwd_chunk(k, beta, None, None, eta, store_kt=True, store_d=False, **kept,  # noqa: E731
                                   **flags)
    fwd()
    grads = (torch.randn_like(k, dtype=torch.float32), torch.randn_like(k, dtype=torch.float32),
             torch.randn_like(beta, dtype=torch.float32))
    bwd = lambda: phase1_bwd_chunk(k, beta, None, eta, None, None, None, phase2_grads=grads,  # noqa: E731
                                   **kept, **flags)
    group = chain_group(k.shape[1] / PHASE1_CHUNKED["chunk_size"])  # the grouped chains: forward and backward

    def grouped():
        phase1_fwd_chunk(k, beta, None, None, eta, store_kt=True, store_d=False, group=group, **kept, **flags)
        phase1_bwd_chunk(k, beta, None, eta, None, None, None, phase2_grads=grads, group=group, **kept, **flags)

    C, BK = PHASE1_CHUNKED["chunk_size"], block_k(k.shape[3])
    calls = {tuning_key(stage, C, BK): call for stage, call in (
        ("bwd_out_sum", bwd), ("bwd_out", bwd), ("bwd_state", bwd), ("state", fwd), ("bwd_prep", bwd), ("out", fwd), ("prep", fwd))}
    calls = {name: call for name, call in calls.items() if name in TUNING}  # slowest first (version 8's profile)
    return {**calls, "phase1_group_map": grouped, "phase1_group_walk": grouped}


def sweep(calls, budget_s):
    """Time every stage under every setting of its space (SPACE; BV only where the stage has value tiles; phase 1's
    chunk-parallel kernels: PHASE1_SPACE, key-channel blocks KB; its walked chains: CHAIN_SPACE, warps and stages; the
    grouped chains: GROUP_SPACE, map columns BN; the state chain: STATE_SPACE, value tiles down to 16), but FAULTS."""
    import triton.testing

    from osdn_fast.ops.tuning import TUNING

    committed = copy.deepcopy(TUNING)
    results, start = {}, time.time()
    for stage, call in calls.items():
        results[stage] = []
        space = SOLVE_SPACE if stage == "solve" else GRAM_REPLAY_SPACE if stage == "gram_replay" else \
            GROUP_SPACE if stage.startswith("phase1_group") else \
            CHAIN_SPACE if stage.startswith(("phase1_state", "phase1_bwd_state")) else \
            PHASE1_SPACE if stage.startswith("phase1_") else STATE_SPACE if stage.startswith("state_") else SPACE
        tile = next((t for t in ("BV", "KB", "BN") if t in space), None)
        sizes = space[tile] if tile else (None,)
        for size, warps, stages in itertools.product(sizes, space["num_warps"], space["num_stages"]):
            if time.time() - start > budget_s:
                break
            if tile and tile not in committed[stage] and size != sizes[0]:
                continue
            cfg = dict(num_warps=warps, num_stages=stages)
            if tile and tile in committed[stage]:
                cfg[tile] = size
            if cfg in FAULTS.get(stage, ()):
                continue
            for name in (stage, stage + "_few", stage + "_some"):  # whichever entry chain_stage picks here
                if name in committed:
                    TUNING[name] = cfg
            try:
                ms = float(triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median"))
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (a setting that does not compile or fit is reported, not fatal)
                ms, cfg = float("nan"), dict(cfg, error=f"{type(e).__name__}: {str(e)[:200]}")
            results[stage].append(dict(cfg, ms=ms))
            print(f"  {stage:17s} {cfg}  {ms:.4f} ms", flush=True)
            if "illegal" in cfg.get("error", ""):  # the CUDA context is lost: nothing after this can run
                TUNING.update(committed)
                return results, {}, f"{stage} {cfg}"
        TUNING.update(committed)
    best = {}
    for stage, rows in results.items():
        ok = [r for r in rows if r["ms"] == r["ms"]]
        if ok:
            r = min(ok, key=lambda r: r["ms"])
            best[stage] = {k: r[k] for k in ("BV", "KB", "BN", "num_warps", "num_stages") if k in r}
    return results, best, None


def apply_tuning(path):
    """Apply a JSON {stage: launch settings} (a sweep's tuning.json) over TUNING; returns what it applied."""
    from osdn_fast.ops.tuning import TUNING

    with open(path) as f:
        settings = json.load(f)
    TUNING.update(settings)
    return settings


def save(out, name, obj):
    """Write obj as JSON now, so that a run cut short keeps what it measured."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        json.dump(obj, f, indent=1)


def whole_op(x, fla):
    """Median ms of forward and forward+backward: chunk_osdn (OSDN, clip) and, when installed, fla."""
    import triton.testing

    import osdn_fast

    do = torch.randn_like(x["v"])
    ops = {"osdn_clip": lambda: osdn_fast.chunk_osdn(x["q"], x["k"], x["v"], x["beta"], **OPTIONS)[0]}
    if fla is not None:
        ops["fla_delta_rule"] = lambda: fla(x["q"], x["k"], x["v"], x["beta"])[0]
    out = {}
    for name, fn in ops.items():
        fwd = float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))
        both = float(triton.testing.do_bench(lambda: fn().backward(do), warmup=10, rep=100, return_mode="median"))
        out[name] = dict(fwd_ms=fwd, fwd_bwd_ms=both)
        print(f"  {name:15s} fwd {fwd:7.3f} ms  fwd+bwd {both:7.3f} ms", flush=True)
    return out


def op_kernels(x, fla, osdn_fwd, do):
    """{table: kernel_table rows} of osdn's forward and forward+backward, and fla's when installed."""
    tables = {"osdn fwd": osdn_fwd, "osdn fwd+bwd": lambda: osdn_fwd().backward(do)}
    if fla is not None:
        fla_fwd = lambda: fla(x["q"], x["k"], x["v"], x["beta"])[0]  # noqa: E731
        tables.update({"fla fwd": fla_fwd, "fla fwd+bwd": lambda: fla_fwd().backward(do)})
    out = {}
    for name, fn in tables.items():
        rows = kernel_table(fn, leaves=[t for t in x.values() if torch.is_tensor(t) and t.requires_grad])
        out[name] = rows
        print(f"{name}: {sum(r[1] for r in rows):.1f} µs of kernels", flush=True)
        for kname, us, n in rows[:14]:
            print(f"  {us:9.1f} µs  ×{n:4.1f}  {kname}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep-budget", type=float, default=240.0, help="seconds for the sweep (0: no sweep)")
    ap.add_argument("--shape", default="x".join(map(str, SHAPE)), help="BxTxHxD (default: the tuning shape)")
    ap.add_argument("--stages", help="comma-separated stages to sweep (default: all), e.g. state_fwd,state_bwd or "
                                     "phase1_bwd_out (phase 1's chunk-form kernels: phase1_prep, phase1_out, "
                                     "phase1_bwd_prep, phase1_bwd_out, the chains phase1_state, phase1_bwd_state, and "
                                     "the grouped chains' phase1_group_map, phase1_group_walk)")
    ap.add_argument("--state-space", help="the state chain's sweep space instead of STATE_SPACE, as "
                                          "BV:warps:stages with comma-separated values, e.g. 32,64:4,8:3")
    ap.add_argument("--space", help="the other phase-2 stages' space instead of SPACE, as BV:warps:stages")
    ap.add_argument("--phase1-space", help="phase 1's chunk-parallel kernels' space instead of PHASE1_SPACE, as "
                                           "KB:warps:stages, e.g. 16,32,64:2,4:1,3")
    ap.add_argument("--group-space", help="the grouped chains' sweep space instead of GROUP_SPACE, as "
                                          "BN:warps:stages, e.g. 16,32,64:4,8:1")
    ap.add_argument("--sweep-only", action="store_true",
                    help="only the sweep, its best applied into tuning.json: no whole-op medians, kernel tables or "
                         "tuned run (a short device call)")
    ap.add_argument("--tuning", help="JSON {stage: launch settings} applied over TUNING before anything runs (an "
                                     "earlier sweep's tuning.json: the next sweep starts from it)")
    args = ap.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split("x"))
    for flag, value, space, tile in (("--state-space", args.state_space, STATE_SPACE, "BV"),
                                     ("--space", args.space, SPACE, "BV"),
                                     ("--phase1-space", args.phase1_space, PHASE1_SPACE, "KB"),
                                     ("--group-space", args.group_space, GROUP_SPACE, "BN")):
        if value:
            values = [tuple(int(v) for v in part.split(",")) for part in value.split(":")]
            if len(values) != 3:
                ap.error(f"{flag}: {tile}:warps:stages")
            space.update(zip((tile, "num_warps", "num_stages"), values))
    import triton

    import osdn_fast
    from osdn_fast.ops import common, tuning

    committed = copy.deepcopy(tuning.TUNING)
    applied = apply_tuning(args.tuning) if args.tuning else None

    try:
        from fla.ops.delta_rule import chunk_delta_rule as fla
    except ImportError:
        fla = None
    B, T, H, D = shape
    x = inputs(B, T, H, D, "cuda")
    do = torch.randn_like(x["v"])
    osdn_fwd = lambda: osdn_fast.chunk_osdn(x["q"], x["k"], x["v"], x["beta"], **OPTIONS)[0]  # noqa: E731
    result = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  fla="missing" if fla is None else "0.6.0", shape=shape, options=OPTIONS,
                  committed_tuning=committed, applied_tuning=applied)
    result["state_space"], result["space"], result["phase1_space"] = STATE_SPACE, SPACE, PHASE1_SPACE
    result["group_space"], result["gram_replay_space"] = GROUP_SPACE, GRAM_REPLAY_SPACE
    if not args.sweep_only:
        result["committed"], result["kernels"] = whole_op(x, fla), op_kernels(x, fla, osdn_fwd, do)
        save(args.out, "profile_phase2.json", result)
    if args.sweep_budget <= 0:
        return
    print("sweep:", flush=True)
    calls = stage_calls(x, B, T, H, D)
    if args.stages:  # phase 1's stages by kernel name: the entry this K takes (`_k64` at K = 64)
        wanted = set(args.stages.split(","))
        generic = {name: re.sub(r"_k\d+$", "", name) for name in calls}
        unknown = wanted - set(calls) - set(generic.values())
        if unknown:
            ap.error(f"--stages: unknown {sorted(unknown)}")
        calls = {name: call for name, call in calls.items() if name in wanted or generic[name] in wanted}
    result["sweep"], result["best"], result["sweep_fault"] = sweep(calls, args.sweep_budget)
    save(args.out, "profile_phase2.json", result)
    if result["sweep_fault"]:
        print(f"sweep stopped: illegal memory access at {result['sweep_fault']}; no tuned run", flush=True)
        return
    print("best:", json.dumps(result["best"]), flush=True)
    for stage, cfg in result["best"].items():  # the chain stages: every tier's entry, whichever this shape takes
        tuning.TUNING.update({name: cfg for name in (stage, stage + "_few", stage + "_some") if name in tuning.TUNING})
    if args.sweep_only:
        save(args.out, "tuning.json", tuning.TUNING)
        return
    print("best TUNING, whole op:", flush=True)
    result["tuned"] = whole_op(x, fla)
    save(args.out, "profile_phase2.json", result)
    save(args.out, "tuning.json", tuning.TUNING)


if __name__ == "__main__":
    main()

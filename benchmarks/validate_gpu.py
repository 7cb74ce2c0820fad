"""GPU validation of osdn_fast.chunk_osdn against osdn_ref.chunk_osdn in float64 (issue 4, item 5).

For fla's test shapes (B, T, H, D) and packed variable-length sequences, in bfloat16 and float16, without a
gate and with the GDN gate, with the clip and in bfloat16 also without it, it compares the output, both final
states (S, d) and the gradient of every input (q, k, v, β, g, S0, d0, and η, given as a per-head tensor [H] so
that ∂η, a sum over every token and channel of its head, is checked too) by relative RMSE ‖fast − ref‖ / ‖ref‖,
the reference running in float64 on the same device from the same rounded inputs, and checks that a forward
without gradients (where phase 1 skips d_all) gives the same outputs and states bit for bit. Thresholds: 0.006 for outputs and
states, 0.008 for gradients, and fla's tolerance for gate gradients, 0.02 (its gated delta rule tests hold dg and dβ
to it), for the gradient of APF's retention r, a per-token gate: the one gradient that exceeded 0.008 (9.15e-3 at
(1, 63, 1, 64), 63 values; the first validation with APF, 2026-11-29), and for ∂η, a per-head scalar that sums
over every token and channel as a gate's gradient does (up to 0.0166 in bfloat16 in its first validation, 2026-12-03).
Then first timings (triton.testing.do_bench, median) of forward and forward+backward at (4, 4096, 16, 128)
bfloat16, for the whole op and for phase 2 alone.

Writes gpu_validation.json and gpu_validation.csv into --out, with the date, GPU, torch and triton versions;
exits 1 when a row is above its threshold (after writing).

    python benchmarks/validate_gpu.py --out $OUT                                     # on the GPU
    TRITON_INTERPRET=1 python benchmarks/validate_gpu.py --smoke --out /tmp/val     # script check on the CPU
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

OUTPUT_THRESHOLD = 0.006
GRAD_THRESHOLD = 0.008
GATE_GRAD_THRESHOLD = 0.02
# dg and dβ stay at GRAD_THRESHOLD, which they meet; ∂η, a per-head scalar summed over every token and channel as a
# gate's gradient is, gets the gate tolerance: the first validation with ∂η rows (2026-12-03, a lead's tree) had 11 of
# 84 bfloat16 rows between 0.008 and 0.0166 (float16 at most 0.0027; NOTES)
GATE_GRADS = ("dr", "deta")
# fla's four test shapes, then more sequence-heads: on the H200 (132 SMs) the state chain takes its `_few` launch
# (common.chain_stage: value tiles of 16) at the first four, its standard one at both (8, 512) shapes and the packed
# sequences (20 sequence-heads); each row records the tier
SHAPES = [(1, 63, 1, 64), (2, 1000, 3, 128), (3, 2000, 4, 128), (4, 2048, 8, 64), (8, 512, 16, 64), (8, 512, 16, 128)]
VARLEN = [((0, 15, 100, 300, 1200, 2000), 4, 128)]  # (cu_seqlens, H, D)
TIMING_SHAPE = (4, 4096, 16, 128)
SMOKE_SHAPES = [(1, 20, 1, 16), (2, 70, 2, 20)]
SMOKE_VARLEN = [((0, 5, 40, 71), 2, 16)]
SMOKE_TIMING_SHAPE = (1, 64, 2, 16)
OPTIONS = dict(eta=0.5, d_min=2 / 3, d_max=1.5)  # a large η so that d moves; the authors' clip
UNCLIPPED = dict(eta=0.5)  # the same without the clip (run in bfloat16)
IDLE_CLIP = dict(eta=0.003, d_min=2 / 3, d_max=1.5)  # the authors' η: over these lengths d stays inside the clip
APF_CLIP = dict(OPTIONS, apf=True)  # OSDN-APF with the clip: the floor binds (chunk_osdn's quasi-Newton form)
APF_UNCLIPPED = dict(UNCLIPPED, apf=True)  # OSDN-APF without the clip: forced, the chunk form with r (version 27)
# chunk_osdn picks phase 1's form by length and number of chains (chunk.phase1_form; since version 36 the chunk forms
# at most shapes above, "auto"); the runs marked "sequential" force the scan, "chunked" the chunk form (and the
# quasi-Newton form for APF with a floor) at any length, "grouped" also makes its chains walk groups of chunks
# (phase1_forced). Each row records the form its run took before any redo (`form`)


def kernel_digest() -> str:
    """sha256 of osdn_fast/ops/*.py but tuning.py (kernels and glue): the committed validation must match it,
    and its recorded launch settings must equal TUNING."""
    ops = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "osdn_fast", "ops")
    h = hashlib.sha256()
    for name in sorted(f for f in os.listdir(ops) if f.endswith(".py") and f != "tuning.py"):
        with open(os.path.join(ops, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def make_case(B, T, H, D, dtype, gate, N, device, eta, seed=0, apf=False):
    """Inputs (in `dtype`; states, the APF retention r ∈ [0.9, 1] and η [H] (every head `eta`) float32) and float64
    cotangents for (o, S, d), fla-style value ranges."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=rnd(B, T, H, D), k=F.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, D),
             beta=torch.rand(B, T, H, generator=gen).sigmoid(),
             g=F.logsigmoid(torch.rand(B, T, H, generator=gen)) if gate else None)
    x = {n: None if t is None else t.to(device, dtype) for n, t in x.items()}
    x["S0"] = rnd(N, H, D, D).to(device)
    x["d0"] = (0.8 + 0.4 * torch.rand(N, H, D, generator=gen)).to(device)
    x["r"] = (0.9 + 0.1 * torch.rand(B, T, H, generator=gen)).to(device) if apf else None
    x["eta"] = torch.full((H,), float(eta), dtype=torch.float32, device=device)
    cot = [rnd(B, T, H, D), rnd(N, H, D, D), rnd(N, H, D)]
    return x, [c.to(device, torch.float64) for c in cot]


def forward(op, x, cu_seqlens, options):
    """(o, S, d) of op on the inputs x; η is x["eta"], a per-head tensor [H] (so that ∂η is a gradient like the
    others), when x has one."""
    if "eta" in x:
        options = dict(options, eta=x["eta"])
    return op(x["q"], x["k"], x["v"], x["beta"], g=x["g"], r=x["r"], initial_state=(x["S0"], x["d0"]),
              output_final_state=True, cu_seqlens=cu_seqlens, **options)


def run(op, x, cot, cu_seqlens, options):
    """Forward, then the backward of Σ o·do + Σ S·dS + Σ d·dd; returns {name: result or gradient}."""
    leaves = {n: None if t is None else t.detach().clone().requires_grad_() for n, t in x.items()}
    o, (S, d) = forward(op, leaves, cu_seqlens, options)
    ((o.double() * cot[0]).sum() + (S.double() * cot[1]).sum() + (d.double() * cot[2]).sum()).backward()
    out = {"o": o, "S": S, "d": d}
    out.update({f"d{n}": t.grad for n, t in leaves.items() if t is not None})
    return out


def rel_rmse(a, e):
    a, e = a.detach().double(), e.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


@contextlib.contextmanager
def phase1_forced(chunk_ops, phase1):
    """chunk_osdn's choice of phase-1 form for one case: "auto" as shipped; "sequential" forces the scan below
    chunk.PHASE1_CHUNKED_MIN_T (every case here); "chunked" forces the chunk form at any length; "grouped" also makes
    its chains walk groups of chunks (chunk.phase1_group) at any length and count."""
    forced = dict(sequential=dict(PHASE1_FEW_CHAINS=0), chunked=dict(PHASE1_CHUNKED_MIN_T=1),
                  grouped=dict(PHASE1_CHUNKED_MIN_T=1, PHASE1_GROUP_MIN_CHUNKS=2, PHASE1_GROUP_MAX_CHAINS=1 << 30))
    saved = {name: getattr(chunk_ops, name) for name in forced.get(phase1, {})}
    try:
        for name, value in forced.get(phase1, {}).items():
            setattr(chunk_ops, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(chunk_ops, name, value)


def reference_key(shape, dtype, gate, cu, options):
    """What a case's float64 reference depends on: its inputs (make_case's arguments, seed 0) and the options; not
    the phase-1 form that chunk_osdn is forced to (several runs validate different forms on the same cases)."""
    return (tuple(shape), str(dtype), bool(gate), None if cu is None else tuple(cu), options["eta"],
            options.get("apf", False), options.get("d_min"), options.get("d_max"))


class References:
    """Each case's reference computed once however many runs use it, and dropped after its last use: built from the
    keys (reference_key) of the cases a validation will run, in any order. The reference is the slow part of a case
    on the GPU (osdn_ref's token loop in float64: ~10⁵ small launches at T = 1000), and 3 of the 15 runs differ from
    another only in phase 1's form."""

    def __init__(self, keys):
        self.left = collections.Counter(keys)
        self.kept = {}
        self.computed = 0

    def get(self, key, compute):
        if self.left[key] <= 0:
            raise KeyError(f"reference {key} was not planned (or is used more often than planned)")
        self.left[key] -= 1
        ref = self.kept.pop(key) if key in self.kept else None
        if ref is None:
            ref = compute()
            self.computed += 1
        if self.left[key] > 0:
            self.kept[key] = ref
        return ref


def validate(shape, dtype, gate, cu, device, options, phase1="auto", refs: References | None = None):
    import osdn_fast
    import osdn_fast.ops.chunk as chunk_ops
    import osdn_ref
    from osdn_fast.ops.common import block_dims, chain_launch, chain_stage

    B, T, H, D = shape
    N = B if cu is None else len(cu) - 1
    options = dict(options)
    apf = options.pop("apf", False)
    eta = options.pop("eta")
    key = reference_key(shape, dtype, gate, cu, dict(options, eta=eta, apf=apf))
    x, cot = make_case(B, T, H, D, dtype, gate, N, device, eta, apf=apf)
    state_bv = chain_launch("state_fwd", *block_dims(D, D), D, N * H, torch.device(device))[0]
    state_tier = chain_stage("state_bwd", *block_dims(D, D), D, N * H, torch.device(device))[len("state_bwd_"):] \
        or "standard"
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    with phase1_forced(chunk_ops, phase1):
        form = chunk_ops.phase1_form(B * T / N, x["r"], options.get("d_min"), options.get("d_max"), chains=N * H)
        fast = run(osdn_fast.chunk_osdn, x, cot, cu_t, options)
        with torch.no_grad():  # a forward that no backward follows (phase 1 then skips d_all): the same results
            o, (S, d) = forward(osdn_fast.chunk_osdn, x, cu_t, options)
    without_grad = {"o": o, "S": S, "d": d}
    compute = lambda: {n: t.detach() for n, t in run(  # noqa: E731
        osdn_ref.chunk_osdn, {n: None if t is None else t.double() for n, t in x.items()}, cot,
        None if cu is None else cu_t.long(), options).items()}
    ref = compute() if refs is None else refs.get(key, compute)
    rows = []
    for name, expected in ref.items():
        kind = "output" if name in ("o", "S", "d") else "gradient"
        threshold = OUTPUT_THRESHOLD if kind == "output" else GATE_GRAD_THRESHOLD if name in GATE_GRADS else \
            GRAD_THRESHOLD
        err = rel_rmse(fast[name], expected)
        rows.append(dict(B=B, T=T, H=H, D=D, varlen=cu is not None, cu_seqlens=None if cu is None else list(cu),
                         dtype=str(dtype).replace("torch.", ""), gate="gdn" if gate else "none",
                         clip="d_min" in options, eta=eta, apf=apf, phase1=phase1, form=form, name=name,
                         kind=kind, rel_rmse=err, threshold=threshold, ok=bool(err <= threshold), state_bv=state_bv, state_tier=state_tier))
        if kind == "output":
            rows[-1]["same_without_grad"] = bool(torch.equal(without_grad[name], fast[name].detach()))
            rows[-1]["ok"] &= rows[-1]["same_without_grad"]
    return rows


def bench(fn, device):
    """Median milliseconds: triton.testing.do_bench on CUDA, wall clock (3 runs) elsewhere."""
    if device == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def timings(shape, device):
    """fwd and fwd+bwd of chunk_osdn (phase 1 + phase 2) and of phase 2 alone, bfloat16, with and without GDN."""
    from osdn_fast.ops.chunk import ChunkOSDNPhase2
    from osdn_fast.ops.index import uniform_cu_seqlens

    B, T, H, D = shape
    import osdn_fast
    rows = []
    for gate in (False, True):
        x, _ = make_case(B, T, H, D, torch.bfloat16, gate, B, device, OPTIONS["eta"])
        del x["eta"]  # OPTIONS' η, a float
        for n in ("q", "k", "v", "beta"):
            x[n].requires_grad_()
        do = torch.randn_like(x["v"])
        full = lambda: osdn_fast.chunk_osdn(x["q"], x["k"], x["v"], x["beta"], g=x["g"], **OPTIONS)[0]  # noqa: E731
        kt = (x["k"].detach() * 1.01).requires_grad_()  # k̃ in k's dtype, as chunk_osdn passes it
        cu = uniform_cu_seqlens(B, T, device)
        pk = lambda t: None if t is None else t.reshape(1, B * T, *t.shape[2:])  # noqa: E731
        phase2 = lambda: ChunkOSDNPhase2.apply(pk(x["q"]), pk(x["k"]), pk(kt), pk(x["v"]), pk(x["beta"]),  # noqa: E731
                                               pk(x["g"]), None, cu, D**-0.5, False, 64)[0]
        for what, fn in (("chunk_osdn", full), ("phase2", phase2)):
            fwd = bench(lambda: fn(), device)
            fwd_bwd = bench(lambda: fn().backward(pk(do) if what == "phase2" else do), device)
            rows.append(dict(op=what, B=B, T=T, H=H, D=D, dtype="bfloat16", gate="gdn" if gate else "none",
                             fwd_ms=fwd, fwd_bwd_ms=fwd_bwd))
            print(f"timing {what:10s} gate={rows[-1]['gate']:4s} fwd {fwd:9.3f} ms  fwd+bwd {fwd_bwd:9.3f} ms",
                  flush=True)
    return rows


def case_key(dtype, gate, clip, eta, apf, phase1, shape, cu_seqlens):
    """What tells one validated case from another: its run (dtype, gate, options, phase-1 form) and its shape."""
    return dtype, bool(gate), bool(clip), eta, bool(apf), phase1, tuple(shape), str(cu_seqlens)


def write(out_dir, result):
    """(Re)write gpu_validation.json and .csv: called after every case, so a run cut short keeps its rows."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_validation.json"), "w") as f:
        json.dump(result, f, indent=1)
    if result["rows"]:
        with open(os.path.join(out_dir, "gpu_validation.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(result["rows"][0]))
            writer.writeheader()
            writer.writerows(result["rows"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_validation.json / .csv")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter check of the script)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--tuning", help="JSON {stage: launch settings} applied over osdn_fast.ops.tuning.TUNING "
                                         "(e.g. profile_phase2.py's best) and recorded")
    parser.add_argument("--resume", help="a gpu_validation.json cut short (same kernels and TUNING): keep its rows and "
                                         "run only the cases it lacks")
    args = parser.parse_args(argv)
    import triton

    from osdn_fast.ops.tuning import TUNING

    if args.tuning:
        from profile_phase2 import apply_tuning  # benchmarks/ is on sys.path when this script runs

        apply_tuning(args.tuning)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    varlen = SMOKE_VARLEN if args.smoke else VARLEN
    cases = [(s, None) for s in shapes] + [((1, cu[-1], H, D), cu) for cu, H, D in varlen]
    result = dict(
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        # what the launches depend on besides the tree: the target the kernels compile for and the SMs that
        # common.chain_stage counts (an H100 SXM and an H200 agree on both: sm_90, 132 SMs)
        capability=".".join(map(str, torch.cuda.get_device_capability())) if device == "cuda" else None,
        sm_count=torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else None,
        torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        interpreter=os.environ.get("TRITON_INTERPRET") == "1", smoke=args.smoke,
        thresholds=dict(output=OUTPUT_THRESHOLD, gradient=GRAD_THRESHOLD, gate_gradient=GATE_GRAD_THRESHOLD),
        options=OPTIONS, unclipped=UNCLIPPED, idle_clip=IDLE_CLIP,
        kernel_digest=kernel_digest(), tuning=TUNING, complete=False, all_ok=None, rows=[], timings=[],
    )
    done = set()
    if args.resume:
        with open(args.resume) as f:
            cut = json.load(f)
        if (cut["kernel_digest"], cut["tuning"], cut["smoke"]) != (result["kernel_digest"], TUNING, args.smoke):
            sys.exit(f"--resume: {args.resume} validated other kernels, launch settings or shapes")
        result["rows"] = cut["rows"]
        result["resumed_from"] = dict(date=cut["date"], rows=len(cut["rows"]))
        done = {case_key(r["dtype"], r["gate"] == "gdn", r["clip"], r["eta"], r["apf"], r["phase1"],
                         (r["B"], r["T"], r["H"], r["D"]), r["cu_seqlens"]) for r in cut["rows"]}
    runs = [(dtype, gate, OPTIONS, p1) for dtype, p1 in ((torch.bfloat16, "auto"), (torch.float16, "sequential"))
            for gate in (False, True)]
    runs += [(torch.bfloat16, gate, UNCLIPPED, "sequential") for gate in (False, True)]
    runs += [(torch.bfloat16, gate, UNCLIPPED, "chunked") for gate in (False, True)]
    runs += [(torch.bfloat16, False, IDLE_CLIP, "chunked"), (torch.float16, True, UNCLIPPED, "chunked")]
    runs += [(torch.bfloat16, False, APF_CLIP, "sequential"), (torch.bfloat16, True, APF_CLIP, "chunked")]
    runs += [(torch.bfloat16, False, UNCLIPPED, "grouped")]
    runs += [(torch.bfloat16, False, APF_UNCLIPPED, "chunked"), (torch.bfloat16, True, APF_UNCLIPPED, "grouped")]
    todo = [(dtype, gate, options, phase1, shape, cu) for dtype, gate, options, phase1 in runs for shape, cu in cases
            if case_key(str(dtype).replace("torch.", ""), gate, "d_min" in options, options["eta"],
                        options.get("apf", False), phase1, shape, None if cu is None else list(cu)) not in done]
    refs = References(reference_key(shape, dtype, gate, cu, options) for dtype, gate, options, _, shape, cu in todo)
    for dtype, gate, options, phase1, shape, cu in todo:
        t = time.perf_counter()
        new = validate(shape, dtype, gate, cu, device, options, phase1, refs=refs)
        result["rows"] += new
        write(args.out, result)
        worst = max(new, key=lambda r: r["rel_rmse"] / r["threshold"])
        print(f"{str(shape):22s} varlen={cu is not None!s:5s} {str(dtype):15s} gate={int(gate)} "
              f"clip={int('d_min' in options)} apf={int(options.get('apf', False))} eta={options['eta']} phase1={phase1:7s}  "
              f"worst {worst['name']:6s} {worst['rel_rmse']:.2e} (≤ {worst['threshold']})  "
              f"{'ok' if all(r['ok'] for r in new) else 'FAIL'}  {time.perf_counter() - t:.1f}s",
              flush=True)
    rows = result["rows"]
    result["all_ok"] = all(r["ok"] for r in rows)
    if not args.no_timing:
        result["timings"] = timings(SMOKE_TIMING_SHAPE if args.smoke else TIMING_SHAPE, device)
    result["complete"] = True
    write(args.out, result)
    for r in rows:
        if not r["ok"]:
            print(f"FAIL {r['B'], r['T'], r['H'], r['D']} {r['dtype']} gate={r['gate']} clip={r['clip']} varlen={r['varlen']} "
                  f"{r['name']}: {r['rel_rmse']:.2e} > {r['threshold']}")
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} rows within thresholds ({refs.computed} references for "
          f"{len(todo)} cases); wrote {args.out}/gpu_validation.json")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Phase-1 timings: the sequential scan vs the chunk-parallel form, forward and forward+backward.

GPU run (the numbers issue 6 asks for):
    python benchmarks/bench_phase1.py --out benchmarks/results/phase1_h200.json
Script check on the CPU (tiny shapes, Triton interpreter, wall-clock medians):
    python benchmarks/bench_phase1.py --smoke --out /tmp/phase1_smoke.json
Registers and spills of every kernel for sm_90, compiled on any machine (no GPU, no timing):
    python benchmarks/bench_phase1.py --ptxas --out /tmp/phase1_ptxas.json

Rows: shape (B, T, H, K) and variant: seq, seq+clip, and chunk<C>-<solver>-<precision> for every chunk size,
solver and tl.dot precision asked for, then seq+clip+kt and seq+clip+kt-no-d_all (forward only: the scan as
chunk_osdn launches it, keeping d_all for a backward or not; `-op`: with r in k's dtype and no d_0, as the suite
passes them); each without and with the APF gate r (+apf). Per row: median milliseconds
(triton.testing.do_bench on CUDA) forward and forward+backward, microseconds per token of one sequence, and, for
the unclipped variants, the relative error of d and of dk against the sequential scan. A configuration that fails
(e.g. a precision this Triton does not support) is reported with its error instead of stopping the run.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import time

import torch

SMOKE = "--smoke" in sys.argv
if "--ptxas" in sys.argv:
    os.environ.pop("TRITON_INTERPRET", None)  # compile for real (the interpreter compiles nothing)
elif SMOKE or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.testing  # noqa: E402

import osdn_ref  # noqa: E402
from osdn_fast.ops.phase1 import phase1_fwd_seq, preconditioner_scan  # noqa: E402
from osdn_fast.ops.phase1_chunk import SOLVERS  # noqa: E402

SHAPES = [(1, 16384, 16, 128), (4, 4096, 16, 128), (8, 2048, 16, 128)]
SMOKE_SHAPES = [(1, 40, 2, 20), (2, 17, 1, 8)]


def median_ms(fn, grad_to_none, cuda: bool) -> float:
    if cuda:
        return triton.testing.do_bench(fn, grad_to_none=grad_to_none, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def make_inputs(B, T, H, K, dtype, device, apf: bool):
    gen = torch.Generator(device="cpu").manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(device, dtype)
    beta = torch.rand(B, T, H, generator=gen).to(device, dtype)
    r = (0.99 + 0.01 * torch.rand(B, T, H, generator=gen)).to(device, torch.float32) if apf else None
    d0 = torch.ones(B, H, K, device=device)
    eta = torch.full((H,), 0.003, device=device)
    leaves = [x for x in (k, beta, r, d0, eta) if x is not None]
    for x in leaves:
        x.requires_grad_()
    return dict(k=k, beta=beta, r=r, d0=d0, eta=eta), leaves


def variants(chunk_sizes, solvers, precisions, newton=False, groups=(None,)):
    """(name, scan options): the sequential scan without and with the clip, Newton over chunks of 64 with the clip
    (if asked), then every chunk configuration, its chains walked one chunk at a time or in groups (`-g<G>`)."""
    out = [("seq", dict(chunked=False)), ("seq+clip", dict(chunked=False, d_min=2 / 3, d_max=1.5))]
    if newton:
        out.append(("newton64+clip", dict(newton=True, chunk_size=64, d_min=2 / 3, d_max=1.5)))
        out.append(("newton64-diag+clip", dict(newton=True, newton_jacobian="diagonal", chunk_size=64, d_min=2 / 3,
                                               d_max=1.5)))
    for c in chunk_sizes:
        for solver in solvers:
            for prec in precisions:
                for group in groups:
                    out.append((f"chunk{c}-{solver}-{prec}" + (f"-g{group}" if group else ""),
                                dict(chunked=True, chunk_size=c, solver=solver, dot_precision=prec, chain_group=group)))
    return out


def bench_shape(shape, dtype, device, configs, cuda):
    B, T, H, K = shape
    rows = []
    for apf in (False, True):
        x, leaves = make_inputs(B, T, H, K, dtype, device, apf)
        gd_all = torch.randn(B, T, H, K, device=device)
        gd_final = torch.randn(B, H, K, device=device)
        reference = None  # the unclipped sequential scan: d_all and dk
        for name, options in configs:

            def forward(options=options):
                return preconditioner_scan(x["k"], x["beta"], eta=x["eta"], r=x["r"], d0=x["d0"], **options)

            def forward_backward(forward=forward):
                d_all, d_final = forward()
                torch.autograd.backward([d_all, d_final], [gd_all, gd_final])

            row = dict(B=B, T=T, H=H, K=K, dtype=str(dtype).removeprefix("torch."),
                       variant=name + ("+apf" if apf else ""), chunk_size=options.get("chunk_size"))
            try:
                d_all, _ = forward()
                for leaf in leaves:
                    leaf.grad = None
                forward_backward()
                dk = x["k"].grad.float().clone()
                if "d_min" not in options:
                    reference = (d_all.detach(), dk) if reference is None else reference
                    row.update(rel_err_d_vs_seq=osdn_ref.rel_err(d_all, reference[0]),
                               rel_err_dk_vs_seq=osdn_ref.rel_err(dk, reference[1]))
                fwd = median_ms(forward, None, cuda)
                fwd_bwd = median_ms(forward_backward, leaves, cuda)
                row.update(fwd_ms=round(fwd, 4), fwd_bwd_ms=round(fwd_bwd, 4), fwd_us_per_token=round(1e3 * fwd / T, 5),
                           fwd_bwd_us_per_token=round(1e3 * fwd_bwd / T, 5))
            except Exception as error:  # a configuration that does not compile here is reported, not fatal
                row.update(error=f"{type(error).__name__}: {str(error)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
        rows += scan_as_chunk_osdn(x, B, T, H, K, dtype, apf, cuda)
    return rows


def scan_as_chunk_osdn(x, B, T, H, K, dtype, apf, cuda):
    """The forward scan as chunk_osdn launches it (k̃ written, the clip on), keeping d_all for a backward and
    without it (a forward that no backward follows): two compiled variants of one kernel, forward only. Then the
    same with the op's inputs as the suite passes them (`-op`: r in k's dtype, no d_0), which version 9's profile
    found slower without d_all at (8, 2048) where these float32-r rows were not (benchmarks/NOTES.md)."""
    rows = []
    r_op = None if x["r"] is None else x["r"].detach().to(dtype)
    with torch.no_grad():
        for op_inputs, store_d in itertools.product((False, True), (True, False)):
            r, d0 = (r_op, None) if op_inputs else (x["r"], x["d0"])

            def forward(store_d=store_d, r=r, d0=d0):
                return phase1_fwd_seq(x["k"], x["beta"], r, d0, x["eta"], d_min=2 / 3, d_max=1.5,
                                      beta_aware=True, normalize=True, cu_seqlens=None, store_kt=True,
                                      store_d=store_d)
            fwd = median_ms(forward, None, cuda)
            name = "seq+clip+kt" + ("-op" if op_inputs else "") + ("" if store_d else "-no-d_all") + ("+apf" if apf else "")
            row = dict(B=B, T=T, H=H, K=K, dtype=str(dtype).removeprefix("torch."), variant=name,
                       chunk_size=None, fwd_ms=round(fwd, 4), fwd_us_per_token=round(1e3 * fwd / T, 5))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def profile(shape, dtype, device, options, name):
    """µs per forward+backward call of each CUDA kernel of one variant (torch.profiler, 10 calls), slowest first."""
    from profile_phase2 import kernel_table  # benchmarks/ is on sys.path when this script runs

    B, T, H, K = shape
    x, leaves = make_inputs(B, T, H, K, dtype, device, apf=False)
    gd_all = torch.randn(B, T, H, K, device=device)

    def forward_backward():
        d_all, _ = preconditioner_scan(x["k"], x["beta"], eta=x["eta"], r=x["r"], d0=x["d0"], **options)
        torch.autograd.backward([d_all], [gd_all])

    table = [dict(kernel=n, us=round(us, 2), launches=c) for n, us, c in kernel_table(forward_backward, leaves=leaves)]
    print(f"profile {name} {shape}:", json.dumps(table), flush=True)
    return dict(B=B, T=T, H=H, K=K, variant=name, kernels=table)


def ptxas_report(chunk_sizes, solvers, precisions, K=128):
    """Registers and stack (spills) per thread of every phase-1 kernel, compiled for sm_90 without a GPU
    (triton.compile to a cubin, then cuobjdump -res-usage from Triton's bundled CUDA tools)."""
    import re
    import subprocess

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from osdn_fast.ops import phase1 as seq, phase1_chunk as chk
    from osdn_fast.ops.phase1_launch import block_k

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    types = dict(T="i32", H="i32", K="i32", eps="fp32", d_min="fp32", d_max="fp32", k="*bf16", beta="*bf16",
                 cu_seqlens="*i32", chunk_seq="*i32", chunk_start="*i32", chunk_offsets="*i32", group_seq="*i32",
                 group_first="*i32")

    def usage(fn, constexprs, num_warps, num_stages=3, **options):  # options: e.g. the chain's maxnreg
        constexprs = {n: v for n, v in constexprs.items() if n in fn.arg_names}  # drop flags it does not take
        signature = {n: "constexpr" if n in constexprs else types.get(n, "*fp32") for n in fn.arg_names}
        marks = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)  # as the launcher's (compile_check)
                 if signature[n] not in ("constexpr", "fp32")}
        kernel = triton.compile(ASTSource(fn, signature, constexprs, marks), target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=num_warps, num_stages=num_stages, **options))
        path = f"/tmp/{fn.__name__}.cubin"
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        out = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path], capture_output=True, text=True)
        regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", out.stdout).groups()
        return dict(kernel=fn.__name__, num_warps=num_warps, num_stages=num_stages, **options, registers=int(regs), stack_bytes=int(stack),
                    shared_bytes=kernel.metadata.shared, **{k: v for k, v in constexprs.items() if k in ("C", "PREC")})

    BK = block_k(K)
    flags = dict(HAS_R=True, BETA_AWARE=True, NORMALIZE=True, IS_VARLEN=False, BK=BK)
    rows = [usage(seq.phase1_fwd_seq_kernel, dict(flags, HAS_D0=True, HAS_MIN=True, HAS_MAX=True, STORE_KT=True,
                                                  HAS_GUARD=True, WIDE_INDEX=False),
                  seq._seq_warps(BK)),
            usage(seq.phase1_bwd_seq_kernel, dict(flags, HAS_MIN=True, HAS_MAX=True, HAS_GD_ALL=False,
                                                  HAS_GD_FINAL=True, FUSED=True, WIDE_INDEX=False), seq._seq_warps(BK))]
    for C in chunk_sizes:
        def tiled(fn, stage, constexprs):
            launch = chk._parallel_launch(stage, C, BK)
            return usage(fn, dict(constexprs, KB=launch["KB"]), launch["num_warps"], launch["num_stages"])

        for solver in solvers:
            if solver == "blockwise" and C > 64:  # solve.py's blockwise inverse takes chunks of at most 64
                continue
            for prec in precisions:
                solve = chk._solver_flags(C, solver, prec)
                base = dict(flags, C=C)
                blockwise = solver == "blockwise"
                rows += [tiled(chk.phase1_chunk_prep_kernel, "prep", dict(base, **solve, HAS_INV=False,
                                                                           BLOCKWISE=blockwise, P_ONLY=False)),
                         tiled(chk.phase1_chunk_out_kernel, "out", dict(HAS_R=True, IS_VARLEN=False, C=C, BK=BK, PREC=prec,
                                                                       STORE_KT=True, HAS_MIN=True, HAS_MAX=True, STORE_D=True)),
                         tiled(chk.phase1_chunk_bwd_prep_kernel, "bwd_prep", dict(base, **solve, HAS_INV=blockwise,
                                                                                   FUSED=True)),
                         tiled(chk.phase1_chunk_bwd_out_kernel, "bwd_out", dict(base, **solve, FUSED=True))]
                rows[-4]["solver"] = rows[-2]["solver"] = solver
                if blockwise:  # P alone (chunk_inverses; the backward without the forward's P)
                    rows.append(tiled(chk.phase1_chunk_prep_kernel, "prep", dict(base, **solve, HAS_INV=False,
                                                                                  BLOCKWISE=True, P_ONLY=True)))
                    rows[-1]["solver"] = "blockwise P"
        chain = {st: chk._chain_launch(st, C, BK) for st in ("state", "bwd_state")}
        rows += [usage(chk.phase1_chunk_state_kernel, dict(flags, C=C, HAS_D0=True, G=0), **chain["state"]),
                 usage(chk.phase1_chunk_bwd_state_kernel, dict(flags, C=C, HAS_GD_FINAL=True, G=0), **chain["bwd_state"])]
        for bn, warps in ((32, 4), (32, 8), (64, 4), (64, 8), (128, 4), (128, 8)):  # the grouped chains' map, [K, BN] of M per program
            rows += [usage(chk.phase1_chunk_group_map_kernel, dict(flags, C=C, G=16, PREC="tf32", REVERSE=reverse,
                                                                   BN=bn, VEC=vec), warps, 1)
                     for reverse in (False, True) for vec in (False, True)]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--chunk-sizes", default="32,64,128", help="comma-separated chunk sizes (powers of two >= 16)")
    parser.add_argument("--solvers", default=",".join(SOLVERS), help="comma-separated chunk solvers")
    parser.add_argument("--precisions", default="ieee,tf32x3", help="comma-separated tl.dot input precisions")
    parser.add_argument("--ptxas", action="store_true",
                        help="no timing: compile every kernel for sm_90 (no GPU needed) and report registers/spills")
    parser.add_argument("--newton", action="store_true", help="also time Newton over chunks (clip included)")
    parser.add_argument("--groups", default="0", help="comma-separated chain groups of the chunk form (0: ungrouped)")
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                        help="comma-separated BxTxHxK shapes (default: the three of issue 6 at 16K tokens)")
    parser.add_argument("--profile", default="",
                        help="comma-separated variants (e.g. seq,chunk64-blockwise-ieee) to break into CUDA kernels "
                             "(torch.profiler, forward+backward) at every shape")
    args = parser.parse_args()
    if args.ptxas:
        rows = ptxas_report([int(c) for c in args.chunk_sizes.split(",")], args.solvers.split(","),
                            args.precisions.split(","))
        with open(args.out, "w") as f:
            json.dump(dict(triton=triton.__version__, target="cuda sm_90", K=128, rows=rows), f, indent=1)
        print(f"wrote {args.out}")
        return
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    dtype = getattr(torch, args.dtype)
    shapes = SMOKE_SHAPES if args.smoke else [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    chunk_sizes = [16] if args.smoke else [int(c) for c in args.chunk_sizes.split(",")]
    groups = [int(g) or None for g in args.groups.split(",")]
    configs = variants(chunk_sizes, args.solvers.split(","), args.precisions.split(","), args.newton, groups)
    rows = [row for shape in shapes for row in bench_shape(shape, dtype, device, configs, cuda)]
    profiles = [profile(shape, dtype, device, dict(configs)[name], name) for name in filter(None, args.profile.split(","))
                for shape in shapes] if cuda else []
    result = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()}), interpreter",
        torch=torch.__version__, triton=triton.__version__, timer="do_bench median" if cuda else "perf_counter median",
        rows=rows, profiles=profiles,
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

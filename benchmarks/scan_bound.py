"""Where phase 1's sequential scan spends its ~0.2 µs per token: its forward with parts switched off, each timed alone.

benchmarks/NOTES.md (version 13 attempts) found that neither the reduction across K nor the packing of the loaded key
sets the scan's pace. This probe rebuilds the plain forward (phase1.py's step: no clip, no APF, β-aware, normalised)
from the same helpers and switches off one part at a time:

    full       per token: load k_t and β_t, reduce ⟨d_t, a_t⟩ and ‖k_t‖², store d_t and k̃_t (the scan's work)
    no-store   without the two stores
    no-load    the first token's k and β for every token (loaded once, before the loop)
    no-reduce  the two reductions replaced by their per-lane terms (no shuffles); the update still reads d
    update     none of the three: the dependent multiply-adds alone

GPU (do_bench medians, beside phase1_fwd_seq as chunk_osdn launches it, four tokens per reduction since version 14, and
its token-by-token form, which `full` rebuilds to the bit):
    python benchmarks/scan_bound.py --out $OUT/scan_bound.json
CPU check (Triton interpreter, tiny shape; `full` must equal the token form):
    python benchmarks/scan_bound.py --smoke --out /tmp/scan_bound.json
Instructions per loop iteration (four tokens) of each variant and of the sequential kernels (both forms, forward and
backward), compiled for sm_90 with and without the launcher's divisibility marks (no GPU; the Triton of the GPU image, with its cuobjdump):
    python benchmarks/scan_bound.py --sass --out /tmp/scan_bound_sass.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time

import torch

if "--smoke" in sys.argv or not (torch.cuda.is_available() or "--sass" in sys.argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402

from osdn_fast.ops.phase1 import _gains, _load_token, phase1_fwd_seq  # noqa: E402
from osdn_fast.ops.phase1_launch import block_k, seq_bounds  # noqa: E402

VARIANTS = {  # name: (LOAD, STORE, REDUCE)
    "full": (True, True, True),
    "no-store": (True, False, True),
    "no-load": (False, True, True),
    "no-reduce": (True, True, False),
    "update": (False, False, False),
}


@triton.jit
def _probe_step(d, kt, b, t, ok, d_all, kt_out, h, H, K, offs, eta_h, eps, STORE: tl.constexpr,
                REDUCE: tl.constexpr):
    """phase1._fwd_step without the clip and r; STORE and REDUCE switch off its stores and its reductions."""
    m = offs < tl.where(ok, K, 0)
    row = (t * H + h) * K + offs
    kt = kt.to(tl.float32)
    if STORE:
        tl.store(d_all + row, d, mask=m)
        tl.store(kt_out + row, d * kt, mask=m)
    b = b.to(tl.float32)
    a = kt * kt
    if REDUCE:
        w, _, _ = _gains(eta_h, b, tl.sum(d * a, axis=0), a, eps, True)
    else:
        w = eta_h * b * (1.0 - b * d * a) / (a + eps)
    return tl.where(ok, d + w * a, d)


@triton.jit
def scan_probe_kernel(k, beta, eta, d_all, d_final, kt_out, T, H, K, eps, BK: tl.constexpr, LOAD: tl.constexpr,
                      STORE: tl.constexpr, REDUCE: tl.constexpr):
    """phase1_fwd_seq_kernel's loop (four load slots, d_0 = 1) with the probe's switches."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    bos, eos = seq_bounds(k, n, T, False)
    bos, eos = bos.to(tl.int32), eos.to(tl.int32)  # as phase1_fwd_seq_kernel where offsets fit int32 (WIDE_INDEX off)
    offs = tl.arange(0, BK)
    d = tl.where(offs < K, 1.0, 0.0)
    eta_h = tl.load(eta + h).to(tl.float32)
    src = (k, beta, beta)
    loc = (h, H, K, offs)
    step = (d_all, kt_out, h, H, K, offs, eta_h, eps)  # the switches go by name: a constexpr in a tuple is not one
    k1, b1, _ = _load_token(*src, bos, bos < eos, *loc, False, True)
    k2, b2, _ = _load_token(*src, bos + 1, bos + 1 < eos, *loc, False, True)
    k3, b3, _ = _load_token(*src, bos + 2, bos + 2 < eos, *loc, False, True)
    k4, b4, _ = _load_token(*src, bos + 3, bos + 3 < eos, *loc, False, True)
    for t in range(bos, eos, 4):
        if LOAD:
            d = _probe_step(d, k1, b1, t, t < eos, *step, STORE, REDUCE)
            k1, b1, _ = _load_token(*src, t + 4, t + 4 < eos, *loc, False, True)
            d = _probe_step(d, k2, b2, t + 1, t + 1 < eos, *step, STORE, REDUCE)
            k2, b2, _ = _load_token(*src, t + 5, t + 5 < eos, *loc, False, True)
            d = _probe_step(d, k3, b3, t + 2, t + 2 < eos, *step, STORE, REDUCE)
            k3, b3, _ = _load_token(*src, t + 6, t + 6 < eos, *loc, False, True)
            d = _probe_step(d, k4, b4, t + 3, t + 3 < eos, *step, STORE, REDUCE)
            k4, b4, _ = _load_token(*src, t + 7, t + 7 < eos, *loc, False, True)
        else:
            for j in tl.static_range(4):
                d = _probe_step(d, k1, b1, t + j, t + j < eos, *step, STORE, REDUCE)
    tl.store(d_final + (n * H + h) * K + offs, d, mask=offs < K)


def probe(k, beta, eta, variant):
    """(d_all, d_final, k̃) of one variant (d_all and k̃ left empty where it stores nothing); k [B, T, H, K]."""
    B, T, H, K = k.shape
    LOAD, STORE, REDUCE = VARIANTS[variant]
    d_all = torch.empty(k.shape, dtype=torch.float32, device=k.device)
    d_final = torch.empty(B, H, K, dtype=torch.float32, device=k.device)
    kt = torch.empty_like(k)
    scan_probe_kernel[(B, H)](k, beta, eta, d_all, d_final, kt, T, H, K, 1e-6, BK=block_k(K), LOAD=LOAD,
                              STORE=STORE, REDUCE=REDUCE, num_warps=1 if block_k(K) <= 128 else 2)
    return d_all, d_final, kt


def production(k, beta, eta):
    """phase1_fwd_seq as chunk_osdn launches it below T = 4096 without the clip (four tokens per reduction since
    version 14): (d_all, d_final, k̃)."""
    return phase1_fwd_seq(k, beta, None, None, eta, d_min=None, d_max=None, beta_aware=True, normalize=True,
                          cu_seqlens=None, store_kt=True)


def token_form(k, beta, eta):
    """phase1_fwd_seq's token-by-token form, which runs where a clip is given: here a floor of −∞, which never acts,
    so that its d equals `full`'s bit for bit (version 13's unclipped scan, plus one maximum per element)."""
    return phase1_fwd_seq(k, beta, None, None, eta, d_min=-math.inf, d_max=None, beta_aware=True, normalize=True,
                          cu_seqlens=None, store_kt=True)


def median_ms(fn, cuda):
    if cuda:
        return triton.testing.do_bench(fn, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def loop_counts(sass: str) -> dict:
    """The innermost loop of a SASS listing (the span of its backward branch): instructions, loads, stores, PRMTs."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    loops = [(int(m.group(1), 16), addr) for addr, text in ins
             if (m := re.search(r"BRA\s+0x([0-9a-f]+)", text)) and int(m.group(1), 16) < addr]
    lo, hi = min(loops, key=lambda span: span[1] - span[0])
    body = [text for addr, text in ins if lo <= addr <= hi]
    return dict(instructions=len(body), LDG=sum("LDG" in t for t in body), STG=sum("STG" in t for t in body),
                PRMT=sum("PRMT" in t for t in body))


def sass_rows(K: int = 128, arch: int = 90) -> list[dict]:
    """Each variant and the two sequential kernels as chunk_osdn launches them (β-aware, no clip, d and k̃ stored; the
    backward fused with phase 2's gradients), each also in its token-by-token form (a floor given), compiled for
    sm_`arch`, bf16 keys, with pointers and T, H, K marked divisible by 16 as Triton's launcher marks them at such
    shapes, and without."""
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from osdn_fast.ops.phase1 import phase1_bwd_seq_kernel, phase1_fwd_seq_kernel

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    pointers = dict(k="*bf16", beta="*bf16", kt_out="*bf16", dk="*bf16", dbeta="*bf16")
    kernels = {v: (scan_probe_kernel, dict(BK=K, LOAD=L, STORE=S, REDUCE=R)) for v, (L, S, R) in VARIANTS.items()}
    common = dict(HAS_R=False, BETA_AWARE=True, NORMALIZE=True, HAS_MAX=False, IS_VARLEN=False, BK=K, HAS_GUARD=False,
                  WIDE_INDEX=False, r=None, cu_seqlens=None, guard=None)
    fwd = dict(common, HAS_D0=False, STORE_KT=True, STORE_D=True, d0=None)
    bwd = dict(common, HAS_GD_ALL=False, HAS_GD_FINAL=True, FUSED=True, gd_all=None, dr=None)
    for name, kernel, consts in (("phase1_fwd_seq", phase1_fwd_seq_kernel, fwd),
                                 ("phase1_bwd_seq", phase1_bwd_seq_kernel, bwd)):
        kernels[name] = (kernel, dict(consts, HAS_MIN=False))
        kernels[name + "_token_form"] = (kernel, dict(consts, HAS_MIN=True))
    rows = []
    for marked in (True, False):
        for name, (kernel, consts) in kernels.items():
            types, attrs = {}, {}
            for i, arg in enumerate(kernel.arg_names):
                if arg in consts:
                    types[arg] = "constexpr"
                    continue
                types[arg] = "i32" if arg in ("T", "H", "K") else "fp32" if arg in ("eps", "d_min", "d_max") else \
                    pointers.get(arg, "*fp32")
                if marked and types[arg] != "fp32":
                    attrs[(i,)] = [["tt.divisibility", 16]]
            compiled = triton.compile(ASTSource(kernel, types, consts, attrs), target=GPUTarget("cuda", arch, 32),
                                      options=dict(num_warps=1))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
            row = dict(K=K, arch=f"sm_{arch}", divisibility_marks=marked, variant=name, **loop_counts(sass))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="tiny shape on the CPU interpreter")
    parser.add_argument("--shapes", default="8x2048x16x128,2x4096x32x64", help="comma-separated BxTxHxK")
    parser.add_argument("--sass", action="store_true", help="no timings: each loop's instructions, compiled for sm_90")
    args = parser.parse_args(argv)
    if args.sass:
        rows = sass_rows()
        with open(args.out, "w") as f:
            json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           triton=triton.__version__, command=" ".join(["python3", "benchmarks/scan_bound.py",
                                                                        *(argv if argv is not None else sys.argv[1:])]),
                           rows=rows), f, indent=1)
        print(f"wrote {args.out}")
        return 0
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    shapes = [(2, 13, 2, 16)] if args.smoke else [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for B, T, H, K in shapes:
        gen = torch.Generator().manual_seed(0)
        k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).to(device, torch.bfloat16)
        beta = torch.rand(B, T, H, generator=gen).to(device, torch.bfloat16)
        eta = torch.full((H,), 0.003, device=device)
        full = probe(k, beta, eta, "full")
        same = all(torch.equal(a, b) for a, b in zip(full, token_form(k, beta, eta)))
        block = production(k, beta, eta)
        block_err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(block, full))
        calls = {"phase1_fwd_seq": lambda: production(k, beta, eta), "token_form": lambda: token_form(k, beta, eta)}
        calls.update({v: (lambda v=v: probe(k, beta, eta, v)) for v in VARIANTS})
        for name, fn in calls.items():
            ms = median_ms(fn, cuda)
            row = dict(B=B, T=T, H=H, K=K, variant=name, ms=round(ms, 4), us_per_token=round(1e3 * ms / T, 5))
            if name == "full":
                row["equals_token_form"] = same
            if name == "phase1_fwd_seq":
                row["max_rel_diff_to_full"] = block_err
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=torch.cuda.get_device_name() if cuda else "cpu, interpreter", torch=torch.__version__,
                  triton=triton.__version__, timer="do_bench median" if cuda else "perf_counter median",
                  command=" ".join(["python3", "benchmarks/scan_bound.py", *(argv if argv is not None else sys.argv[1:])]),
                  rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0 if all(r.get("equals_token_form", True) and r.get("max_rel_diff_to_full", 0) < 1e-2 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

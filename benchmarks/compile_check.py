"""Compile every phase-1 and phase-2 kernel ahead of time for an NVIDIA target (default sm_90, the H200), no GPU needed.

Uses the installed Triton and its bundled ptxas, so a kernel that the GPU's compiler would reject (an API
missing in that Triton version, shared memory above the limit) fails here first. Each line also gives the
kernel's registers and stack per thread (cuobjdump -res-usage): stack beyond a few locals is registers spilled.
Run it with the Triton version of the GPU image (e.g. in a virtual environment with triton==3.6) before spending GPU time:

    python benchmarks/compile_check.py --dims 64 128 256          # must not run under TRITON_INTERPRET=1

Whether a change moves any machine code (a refactor, a docstring, a comment): write each build's SASS fingerprint
from one tree, then compare another tree's with it; the same instructions run the same on the GPU, to the bit:

    PYTHONPATH=OLD_TREE python benchmarks/compile_check.py --dims 64 128 --sass-out /tmp/old.json
    PYTHONPATH=NEW_TREE python benchmarks/compile_check.py --dims 64 128 --same-as /tmp/old.json

What one loop trip costs in instructions, barriers and shared-memory traffic (a chain's step, after version 41):

    python benchmarks/compile_check.py --kernels "phase1_chunk_(bwd_)?state" --loops
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

SHARED_LIMIT = 227 * 1024  # bytes of shared memory one H100/H200 block may use


def jobs(K, V, chunk_size=64):
    """(kernel, constexprs, arguments passed as None, launch options): the launches of osdn_fast.ops.chunk."""
    from osdn_fast.ops import cumsum, output, phase1, phase1_newton, phase1_parallel, solve, state, wy
    from osdn_fast.ops.common import block_dims, launch
    from osdn_fast.ops.phase1_launch import block_k

    BK, BV = block_dims(K, V)
    BKS = min(BK, 64)  # the key slice of the two backward kernels

    def stage(name, bk=BK, **flags):
        bv, options = launch(name, bk, BV)
        return dict(K=K, V=V, BT=chunk_size, BK=bk, BV=bv, **flags), options

    out = [(cumsum.chunk_cumsum_kernel, dict(BT=chunk_size, REVERSE=rev), (), {}) for rev in (False, True)]
    out.append((solve.solve_kernel, dict(BT=chunk_size), (), launch("solve", BK, BV)[1]))
    for has_g in (False, True):
        none = () if has_g else ("G", "dg_in", "dg")
        for kernel, name, bk, flags in (
            (wy.gram_kernel, "gram", BK, {}),
            (wy.wu_kernel, "wu", BK, {}),
            (wy.wy_bwd_kernel, "wy_bwd", BKS, {}),
            (state.state_fwd_kernel, "state_fwd", BK, dict(HAS_S0=True, STORE_FINAL=True)),
            (state.state_bwd_kernel, "state_bwd", BK, dict(HAS_DSF=True)),
            (state.state_fwd_kernel, "state_fwd_few", BK, dict(HAS_S0=True, STORE_FINAL=True)),
            (state.state_bwd_kernel, "state_bwd_few", BK, dict(HAS_DSF=True)),
            (state.state_fwd_kernel, "state_fwd_some", BK, dict(HAS_S0=True, STORE_FINAL=True)),
            (state.state_bwd_kernel, "state_bwd_some", BK, dict(HAS_DSF=True)),
            (output.output_fwd_kernel, "output_fwd", BK, {}),
            (output.output_bwd_local_kernel, "output_bwd_local", BK, {}),
            (output.output_bwd_kernel, "output_bwd", BKS, {}),
        ):
            constexprs, options = stage(name, bk, HAS_G=has_g, **flags)
            constexprs = {n: c for n, c in constexprs.items() if n in kernel.arg_names}
            out.append((kernel, constexprs, none, options))
    BK1 = block_k(K)
    p1_options = dict(num_warps=phase1._seq_warps(BK1))
    for full in (True, False):  # every option on (clip, APF, β-aware, packed, 64-bit indices), then the plainest form
        flags = dict(HAS_R=full, BETA_AWARE=full, NORMALIZE=True, HAS_MIN=full, HAS_MAX=full, IS_VARLEN=full, BK=BK1)
        out.append((phase1.phase1_fwd_seq_kernel, dict(flags, HAS_D0=full, STORE_KT=True, HAS_GUARD=full,
                                                        STORE_D=full, WIDE_INDEX=full), (), p1_options))
        out.append((phase1.phase1_bwd_seq_kernel, dict(flags, HAS_GD_ALL=not full, HAS_GD_FINAL=full, FUSED=full,
                                                        HAS_GUARD=full, WIDE_INDEX=full), (), p1_options))
        out.append((phase1_parallel.phase1_fwd_parallel_kernel, dict(flags, HAS_D0=full, STORE_KT=True,
                                                                     BT=chunk_size), (), dict(num_warps=4)))
        out.append((phase1_parallel.phase1_bwd_parallel_kernel, dict(flags, HAS_GD_ALL=not full, HAS_GD_FINAL=full,
                                                                     FUSED=full, BT=chunk_size), (), dict(num_warps=4)))
        newton_flags = {n: v for n, v in flags.items() if n in phase1_newton.newton_chunk_kernel.arg_names}
        out.append((phase1_newton.newton_chunk_kernel, dict(newton_flags, BT=chunk_size, STORE_KT=True,
                                                            DIAGONAL=full), (), dict(num_warps=1 if full else 4)))
    for diagonal, reverse in ((False, False), (True, False), (True, True)):
        out.append((phase1_newton.newton_chain_kernel, dict(BK=BK1, DIAGONAL=diagonal, REVERSE=reverse,
                                                            HAS_D0=not reverse), (), dict(num_warps=1 if diagonal else 4)))
    bwd_flags = dict(HAS_R=True, BETA_AWARE=True, NORMALIZE=True, HAS_MIN=True, HAS_MAX=True, BK=BK1, BT=chunk_size)
    out.append((phase1_newton.newton_bwd_chunk_kernel, bwd_flags, (), dict(num_warps=1)))
    out += chunked_phase1_jobs(BK1)
    return out


def chunked_phase1_jobs(BK):
    """The unclipped chunk form of phase 1 with chunk_osdn's settings (chunk.PHASE1_CHUNKED), every flag on."""
    from osdn_fast.ops import phase1_chunk as chk
    from osdn_fast.ops.chunk import PHASE1_CHUNKED
    from osdn_fast.ops.tuning import TUNING

    C = PHASE1_CHUNKED["chunk_size"]
    solve = chk._solver_flags(C, PHASE1_CHUNKED["solver"], PHASE1_CHUNKED["precision"])
    flags = dict(HAS_R=True, BETA_AWARE=True, NORMALIZE=True, IS_VARLEN=True, C=C, BK=BK)

    def tiled(stage, constexprs):  # a parallel kernel: its constexprs with KB, and its warps and stages
        launch = chk._parallel_launch(stage, C, BK)
        return dict(constexprs, KB=launch.pop("KB")), (), launch

    solved = dict(flags, **solve)
    chain = chk._chain_launch("state", C, BK)
    state_launch = {0: chain, 16: dict(chain, **chk.CHAIN_REGISTERS)}  # HAS_R: the launches with r, walked and replayed
    map_launch = dict(TUNING["phase1_group_map"])
    map_bn = map_launch.pop("BN")
    out_flags = dict(HAS_R=True, IS_VARLEN=True, C=C, BK=BK, PREC=solve["PREC"], STORE_KT=True, HAS_MIN=True,
                     HAS_MAX=True, STORE_D=True, STORE_STATS=True)
    prep_modes = ((False, True, False), (False, True, True), (True, False, False))  # P formed, P alone, P given
    return [(chk.phase1_chunk_prep_kernel, *tiled("prep", dict(solved, HAS_INV=has_inv, BLOCKWISE=blockwise,
                                                               P_ONLY=p_only)))
            for has_inv, blockwise, p_only in prep_modes] + [
            (chk.phase1_chunk_out_kernel, *tiled("out", out_flags)),
            (chk.phase1_chunk_out_kernel, *tiled("out", dict(out_flags, STORE_D=False))),  # chunk_osdn's (version 29)
            (chk.phase1_chunk_bwd_prep_kernel, *tiled("bwd_prep", dict(solved, HAS_INV=True, FUSED=True)))] + [
            (chk.phase1_chunk_bwd_out_kernel, *tiled("bwd_out", dict(solved, FUSED=True, HAS_STATS=stats,
                                                                      REPLAY=replay)))
            for stats, replay in ((True, True), (True, False), (False, True), (False, False))] + [
            # without r (OSDN): the interpreter runs constexpr branches that a compiled kernel may reject, so these
            # builds are compiled here too (version 41's lead failed on the GPU only, 2026-12-07); d and λ by running
            # sums, the backward's at its own launch entry
            (chk.phase1_chunk_out_kernel, *tiled("out", dict(out_flags, HAS_R=False, STORE_D=False))),
            (chk.phase1_chunk_bwd_out_kernel, *tiled("bwd_out_sum", dict(solved, HAS_R=False, FUSED=True,
                                                                          HAS_STATS=True, REPLAY=True)))] + [
            gram_replay_job(BK, C, solve["PREC"], has_r, has_g, stats, uniform)
            for has_r, has_g, stats, uniform in ((False, False, True, True), (True, True, True, False),
                                                 (False, True, False, False))] + [
        job for G in (0, 16) for job in (  # the chains, one chunk at a time and replaying groups of 16
            (chk.phase1_chunk_state_kernel, dict(flags, HAS_D0=True, G=G), (), state_launch[G]),
            (chk.phase1_chunk_state_kernel, dict(flags, HAS_D0=True, G=G, HAS_MIN=True, HAS_MAX=True), (),
             state_launch[G]),  # the speculative forward's: it also checks the final d
            (chk.phase1_chunk_bwd_state_kernel, dict(flags, HAS_GD_FINAL=True, G=G), (),
             chk._chain_launch("bwd_state", C, BK)))] + [
        (chk.phase1_chunk_group_map_kernel, dict(flags, G=16, PREC=solve["PREC"], REVERSE=reverse, BN=map_bn,
                                                 VEC=vec), (), map_launch)
        for reverse in (False, True) for vec in (False, True)] + [
        (chk.phase1_chunk_group_walk_kernel, dict(HAS_INIT=True, IS_VARLEN=True, C=C, BK=BK, G=16, REVERSE=reverse,
                                                  ONES=not reverse), (), TUNING["phase1_group_walk"])
        for reverse in (False, True)]


def gram_replay_job(BK, C1, PREC, has_r, has_g, stats, uniform, chunk_size=64):
    """phase 2's Gram that forms k̃ from phase 1's chain (gram_replay.py), at chunk_osdn's launch."""
    from osdn_fast.ops.common import launch
    from osdn_fast.ops.gram_replay import gram_replay_kernel
    from osdn_fast.ops.tuning import TUNING

    none = () if has_g else ("G",)
    return (gram_replay_kernel, dict(K=BK, BT=chunk_size, BK=BK, KB=min(TUNING["gram_replay"]["KB"], BK), C1=C1,
                                     HAS_R=has_r, HAS_G=has_g, STORE_STATS=stats, PREC=PREC, UNIFORM=uniform),
            none, launch("gram_replay", BK, BK)[1])


# Pointers in the input dtype: the inputs and every intermediate between stages (see osdn_fast/ops/common.py);
# the rest (gates' cumulative sums, states in and out, the float32 gradients) are float32.
INPUT_DTYPE = {"q", "k", "kt", "kt_out", "v", "beta", "do", "o", "g", "x", "w", "u", "h", "ubar", "Ainv", "dh", "du",
               "du_local", "dM_scratch", "dq", "dw", "dv"}  # A (the solve's input) is float32
FLOAT32_IN = {"osdn_fast.ops.phase1_chunk": {"u"}, "osdn_fast.ops.gram_replay": {"u"}}  # names that are float32 in one module: phase 1's chunk-form u


def signature(kernel, constexprs, none_args, dtype):
    """Argument types: INPUT_DTYPE pointers in `dtype`, indices int32, the rest float32 pointers; and the attributes
    that Triton's launcher gives them at the shapes compiled here: every pointer 16-byte aligned and T, H, K multiples
    of 16 (`tt.divisibility` 16). Without them the compiler cannot prove a row aligned and emits scalar loads where
    the GPU's binary has vector loads (benchmarks/NOTES.md, version 13). A constexpr left out takes its default, as
    at a launch that does not pass it."""
    types, consts, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        if name in constexprs or name in none_args:
            types[name], consts[name] = "constexpr", constexprs.get(name)
            continue
        if param.is_constexpr and param.has_default:
            types[name], consts[name] = "constexpr", param.default
            continue
        if name in ("H", "T", "K"):
            types[name] = "i32"
        elif name in ("scale", "eps", "d_min", "d_max", "tol"):
            types[name] = "fp32"
        elif name in ("cu_seqlens", "chunk_indices", "chunk_offsets", "chunk_seq", "chunk_start", "outside", "guard",
                      "group_seq", "group_first", "group_offsets", "p1_offsets"):
            types[name] = "*i32"
        else:
            as_input = name in INPUT_DTYPE and name not in FLOAT32_IN.get(kernel.fn.__module__, ())
            types[name] = f"*{dtype}" if as_input else "*fp32"
        if types[name] != "fp32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return types, consts, attrs


def usage(compiled):
    """(registers, stack bytes) per thread of a compiled kernel, by the cuobjdump bundled with Triton: a stack above
    the kernel's own locals means ptxas spilled registers to local memory."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return -1, -1
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else (-1, -1)


def sass_text(compiled) -> str:
    """A compiled kernel's SASS as cuobjdump -sass prints it (the cuobjdump bundled with Triton)."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def sass_instructions(compiled) -> list[str]:
    """The instructions of a compiled kernel's SASS (cuobjdump -sass), addresses and encodings dropped."""
    sass = sass_text(compiled)
    return [" ".join(m.group(1).split()) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", sass)]


def loop_mix(compiled) -> dict | None:
    """The instruction mix of a compiled kernel's longest loop (the span from a backward branch's target to the
    branch, in SASS): instructions, barriers, shared-memory loads and stores, warp shuffles, global loads. A chain's
    step costs about its instructions times the cycles per issued instruction that Nsight Compute measures; each
    barrier is a point where the warps wait for each other (the cross-warp reductions). None: no loop."""
    ins = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass_text(compiled))]
    spans = [(int(t.group(1), 16), a) for a, text in ins if "BRA" in text
             for t in [re.search(r"0x([0-9a-f]+)", text)] if t and int(t.group(1), 16) < a]
    if not spans:
        return None
    lo, hi = max(spans, key=lambda span: span[1] - span[0])
    ops = [text.split()[1] if text.startswith("@") else text.split()[0] for a, text in ins if lo <= a <= hi]
    count = lambda *prefixes: sum(op.startswith(prefixes) for op in ops)  # noqa: E731
    return dict(instructions=len(ops), barriers=count("BAR"), shared_loads=count("LDS"), shared_stores=count("STS"),
                shuffles=count("SHFL"), global_loads=count("LDG"))


def sass_fingerprint(compiled) -> dict:
    """A compiled kernel's SASS instructions: their number and a sha256 of the sequence, so that two builds compare
    without keeping their listings."""
    ins = sass_instructions(compiled)
    return dict(instructions=len(ins), sha256=hashlib.sha256("\n".join(ins).encode()).hexdigest())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[128], help="K = V values to compile for")
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], help="input dtypes: bf16 fp16 fp32")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--sass-out", help="write every build's SASS fingerprint (JSON) to this file")
    parser.add_argument("--same-as", help="compare every build's SASS with a file that --sass-out wrote")
    parser.add_argument("--kernels", help="only the kernels whose name matches this regular expression")
    parser.add_argument("--loops", action="store_true", help="also print each build's longest loop's instruction mix")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("compile_check compiles real kernels: unset TRITON_INTERPRET")
    import triton
    from triton.backends.compiler import GPUTarget

    target, failures, prints = GPUTarget("cuda", args.arch, 32), 0, {}
    print(f"triton {triton.__version__}, target sm_{args.arch}")
    for D in args.dims:
        for dtype in args.dtypes:
            for kernel, constexprs, none_args, options in jobs(D, D):
                if args.kernels and not re.search(args.kernels, kernel.__name__):
                    continue
                types, consts, attrs = signature(kernel, constexprs, none_args, dtype)
                t = time.perf_counter()
                label = (f"K=V={D:<4d} {dtype:4s} {kernel.__name__:24s} HAS_G={constexprs.get('HAS_G', '-')!s:5s}"
                         f" BV={constexprs.get('BV', '-')!s:3s} {options}")
                try:
                    compiled = triton.compile(triton.compiler.ASTSource(kernel, types, consts, attrs), target=target,
                                              options=options)
                except Exception as e:  # noqa: BLE001 (report every failing kernel, then fail)
                    failures += 1
                    print(f"FAIL {label} {type(e).__name__}: {str(e)[:2000]}", flush=True)
                    continue
                shared = compiled.metadata.shared
                over = shared > SHARED_LIMIT
                failures += over
                regs, stack = usage(compiled)
                if args.sass_out or args.same_as:
                    key = f"K=V={D} {dtype} {kernel.__name__} {json.dumps(constexprs, sort_keys=True, default=str)} {options}"
                    prints[key] = sass_fingerprint(compiled)  # keyed by every constexpr: the label shows only some
                print(f"{'FAIL' if over else 'ok  '} {label} shared {shared:6d} B  registers {regs:3d}  stack {stack:5d} B"
                      f"  {time.perf_counter() - t:4.1f}s", flush=True)
                if args.loops:
                    mix = loop_mix(compiled)
                    print("     loop: " + (", ".join(f"{k} {v}" for k, v in mix.items()) if mix else "none"), flush=True)
    print("all kernels compile" if not failures else f"{failures} kernel(s) failed")
    if args.sass_out:
        with open(args.sass_out, "w") as f:
            json.dump(dict(triton=triton.__version__, arch=args.arch, builds=prints), f, indent=1)
        print(f"wrote the SASS fingerprints of {len(prints)} builds to {args.sass_out}")
    if args.same_as:
        with open(args.same_as) as f:
            old = json.load(f)["builds"]
        moved = sorted(b for b in prints if b in old and old[b] != prints[b])
        for b in moved:
            print(f"SASS moved: {b} ({old[b]['instructions']} -> {prints[b]['instructions']} instructions)")
        new, gone = sorted(prints.keys() - old.keys()), sorted(old.keys() - prints.keys())
        print(f"the same SASS as {args.same_as}: {len(prints) - len(moved) - len(new)} of {len(prints)} builds; moved "
              f"{len(moved)}, new {len(new)}, no longer built {len(gone)}")
        failures += bool(moved or new or gone)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Phase 1's reverse scan compiled for sm_90 with phase 2's ∂k̃ and ∂k (its fused inputs) in float32 or bfloat16.

The suite of 2026-12-03 (NOTES, "After 2026-12-03 (3)") found the scan without r slower and the scan with r faster
when those two inputs are 16-bit. This compiles the four builds it ran at (8, 2048, 16, 128), r or not and the clip
or not (β-aware, normalised, no ∂d_T, dense), both ways, with the installed Triton's ptxas (no GPU needed), and
prints each build's SASS instruction count, that of its token loop (four tokens per trip), its opcodes that
changed, its registers and stack per thread:

    python benchmarks/scan_sass.py --dim 128            # with the GPU image's triton (3.6); not under TRITON_INTERPRET

The builds are typed as `scan_grads_dtype.py` and the suite launch them (∂k and ∂β written in k's dtype, r in bf16);
until version 35 they wrote float32 and read r in float32, builds the GPU never ran. With `--scoreboards` it also
decodes each instruction's scheduling fields and lists, per build, the loop's *borrowed waits*: an instruction that
waits on a scoreboard on which a global load it does not read is still counted, so that it waits for that load.
In the four builds Nsight Compute profiled (NOTES, "Version 35"), 73-97% of the long-scoreboard stall samples fall
on such waits, the worst on loads issued 12 and 17 instructions earlier:

    python benchmarks/scan_sass.py --dim 128 --scoreboards
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def opcode(instruction: str) -> str:
    """The opcode of one SASS instruction, its predicate (@P0, @!UP1, ...) dropped."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0]


def loop_span(instructions: list[str]) -> tuple[int, int]:
    """(first, last) indices of the longest loop: from the target of a backward branch to the branch (sm_90
    instructions are 16 bytes each and cuobjdump lists them in order from address 0)."""
    spans = [(int(m.group(1), 16) // 16, i) for i, ins in enumerate(instructions)
             for m in [re.search(r"BRA 0x([0-9a-f]+)", ins)] if m and int(m.group(1), 16) // 16 < i]
    return max(spans, key=lambda span: span[1] - span[0])


def loop_body(instructions: list[str]) -> list[str]:
    """The instructions of the longest loop (loop_span)."""
    first, last = loop_span(instructions)
    return instructions[first:last + 1]


def control(high: int) -> dict:
    """The scheduling fields of an sm_70+ instruction, bits 105-125 of its 128 (from bit 41 of its second 64-bit
    word): stall cycles, the scoreboards it sets when its result is written and when its operands are read (7: none),
    and the mask of scoreboards it waits on before it issues."""
    c = high >> 41
    return dict(stall=c & 15, write_sb=(c >> 5) & 7, read_sb=(c >> 8) & 7, wait=(c >> 11) & 63)


def sass_with_control(sass: str) -> list[tuple[str, dict]]:
    """cuobjdump -sass text as (instruction, control fields), in order."""
    lines = sass.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+([^;]*);\s*/\*\s*0x[0-9a-f]{16}\s*\*/", line)
        if m:
            high = int(re.search(r"0x([0-9a-f]{16})", lines[i + 1]).group(1), 16)
            out.append((" ".join(m.group(1).split()), control(high)))
    return out


def registers(operand: str, width: int = 1) -> set[str]:
    """The registers an operand names: R<n> and, for a load of `width` words, the ones after it."""
    m = re.fullmatch(r"-?\|?R(\d+)(\.\w+)*\|?", operand.strip())
    return {f"R{int(m.group(1)) + i}" for i in range(width)} if m else set()


def borrowed_waits(listing: list[tuple[str, dict]]) -> list[tuple[int, str, int, str]]:
    """(index, instruction, distance, load) for each instruction that waits on a scoreboard still counting a global
    load's result, which it does not read: the nearest such load, `distance` instructions earlier. A scoreboard counts
    every instruction that set it since the last wait on it, so the walk back stops there."""
    found = []
    for i, (ins, ctl) in enumerate(listing):
        if not ctl["wait"] or "LDG" in ins:
            continue
        sources = set().union(*(registers(op) for op in re.split(r"[ ,\[\]]+", ins.split(None, 1)[-1])[1:]))
        nearest = None
        for b in range(6):
            if not ctl["wait"] >> b & 1:
                continue
            for j in range(i - 1, -1, -1):
                prev, pctl = listing[j]
                if pctl["wait"] >> b & 1:
                    break
                if pctl["write_sb"] == b and "LDG" in prev:  # held until the load's data arrives (read_sb: its operands)
                    op = re.sub(r"^@!?U?P\w+\s+", "", prev).split()
                    width = 4 if ".128" in op[0] else 2 if ".64" in op[0] else 1
                    if not registers(op[1].rstrip(","), width) & sources and (nearest is None or i - j < nearest[0]):
                        nearest = (i - j, prev)
                    break
        if nearest:
            found.append((i, ins, *nearest))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=128, help="K")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--scoreboards", action="store_true", help="also list each build's borrowed waits in its loop")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("scan_sass compiles real kernels: unset TRITON_INTERPRET")
    import triton
    from triton.backends.compiler import GPUTarget

    import compile_check
    from osdn_fast.ops import phase1
    from osdn_fast.ops.phase1_launch import block_k

    BK, kernel = block_k(args.dim), phase1.phase1_bwd_seq_kernel
    print(f"triton {triton.__version__}, sm_{args.arch}, phase1_bwd_seq_kernel, K = {args.dim}, FUSED")
    for has_r in (False, True):
        for clip in (False, True):
            builds = {}
            for grads in ("fp32", "bf16"):
                constexprs = dict(HAS_R=has_r, BETA_AWARE=True, NORMALIZE=True, HAS_MIN=clip, HAS_MAX=clip,
                                  HAS_GD_ALL=False, HAS_GD_FINAL=False, IS_VARLEN=False, BK=BK, FUSED=True,
                                  HAS_GUARD=False, WIDE_INDEX=False)
                none = ("gd_all", "gd_final") + (() if has_r else ("r", "dr"))
                types, consts, attrs = compile_check.signature(kernel, constexprs, none, "bf16")
                types.update(dkt_in=f"*{grads}", dk_in=f"*{grads}", dk="*bf16", dbeta="*bf16",
                             **({"r": "*bf16"} if has_r else {}))  # as launched: outputs in k's, β's dtypes
                compiled = triton.compile(triton.compiler.ASTSource(kernel, types, consts, attrs),
                                          target=GPUTarget("cuda", args.arch, 32),
                                          options=dict(num_warps=phase1._seq_warps(BK)))
                builds[grads] = (compile_check.sass_instructions(compiled), *compile_check.usage(compiled))
                if args.scoreboards:
                    listing = sass_with_control(compile_check.sass_text(compiled))
                    first, last = loop_span([ins for ins, _ in listing])
                    waits = [w for w in borrowed_waits(listing) if first <= w[0] <= last]
                    near = sorted(waits, key=lambda w: w[2])[:3]
                    print(f"  r={has_r!s:5} clip={clip!s:5} {grads}: {len(waits)} borrowed waits in the loop, the nearest "
                          + "; ".join(f"`{ins}` on `{load}` {d} earlier" for _, ins, d, load in near))
            (a, ra, sa), (b, rb, sb) = builds["fp32"], builds["bf16"]
            moved = collections.Counter(map(opcode, b))
            moved.subtract(collections.Counter(map(opcode, a)))
            top = ", ".join(f"{op} {n:+d}" for op, n in sorted(moved.items(), key=lambda x: -abs(x[1]))[:6] if n)
            la, lb = len(loop_body(a)), len(loop_body(b))
            print(f"r={has_r!s:5} clip={clip!s:5} instructions {len(a)} -> {len(b)} ({len(b) - len(a):+d}), in the token "
                  f"loop {la} -> {lb} ({lb - la:+d}), registers {ra} -> {rb}, stack {sa} -> {sb} B; opcodes: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

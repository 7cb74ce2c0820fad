"""Phase 1's reverse scan compiled for sm_90 with phase 2's ∂k̃ and ∂k (its fused inputs) in float32 or bfloat16.

The suite of 2026-12-03 (NOTES, "After 2026-12-03 (3)") found the scan without r slower and the scan with r faster
when those two inputs are 16-bit. This compiles the four builds it ran at (8, 2048, 16, 128), r or not and the clip
or not (β-aware, normalised, no ∂d_T, dense), both ways, with the installed Triton's ptxas (no GPU needed), and
prints each build's SASS instruction count, that of its token loop (four tokens per trip), its opcodes that
changed, its registers and stack per thread:

    python benchmarks/scan_sass.py --dim 128            # with the GPU image's triton (3.6); not under TRITON_INTERPRET
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


def loop_body(instructions: list[str]) -> list[str]:
    """The instructions of the longest loop: from the target of a backward branch to the branch (sm_90 instructions
    are 16 bytes each and cuobjdump lists them in order from address 0)."""
    spans = [(int(m.group(1), 16) // 16, i) for i, ins in enumerate(instructions)
             for m in [re.search(r"BRA 0x([0-9a-f]+)", ins)] if m and int(m.group(1), 16) // 16 < i]
    first, last = max(spans, key=lambda span: span[1] - span[0])
    return instructions[first:last + 1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=128, help="K")
    parser.add_argument("--arch", type=int, default=90)
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
                types.update(dkt_in=f"*{grads}", dk_in=f"*{grads}")
                compiled = triton.compile(triton.compiler.ASTSource(kernel, types, consts, attrs),
                                          target=GPUTarget("cuda", args.arch, 32),
                                          options=dict(num_warps=phase1._seq_warps(BK)))
                builds[grads] = (compile_check.sass_instructions(compiled), *compile_check.usage(compiled))
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

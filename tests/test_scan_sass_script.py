"""benchmarks/scan_sass.py compiles phase 1's reverse scan for sm_90 on the CPU (Triton's bundled ptxas, no GPU):
each of its four builds both ways, with phase 2's gradients in float32 and in bfloat16."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_compiles_the_four_scan_builds_both_ways():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_sass.py"), "--dim", "32"], cwd=ROOT,
                         env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    builds = re.findall(r"^r=(\w+)\s+clip=(\w+)\s+instructions (\d+) -> (\d+) \(([+-]\d+)\), in the token loop "
                        r"(\d+) -> (\d+)", res.stdout, re.M)
    assert [(r, c) for r, c, *_ in builds] == [("False", "False"), ("False", "True"), ("True", "False"), ("True", "True")]
    for *_, fp32, bf16, moved, loop32, loop16 in builds:
        assert int(fp32) > 100 and int(bf16) > 100 and int(bf16) - int(fp32) == int(moved)
        assert 50 < int(loop32) < int(fp32) and 50 < int(loop16) < int(bf16)  # the loop is most of the kernel


def test_refuses_the_interpreter():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_sass.py")], cwd=ROOT,
                         env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT)), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "unset TRITON_INTERPRET" in res.stderr

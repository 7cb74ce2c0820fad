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


def test_borrowed_waits_are_waits_on_a_load_not_read():
    """The decoder reads the scheduling fields where sm_70+ keeps them, and a wait counts as borrowed only where the
    scoreboard holds a load's result the waiting instruction does not read (Nsight Compute's 12-instruction case)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scan_sass

    def ctl(write_sb=7, read_sb=7, wait=0, stall=1):
        return (stall | write_sb << 5 | read_sb << 8 | wait << 11) << 41

    assert scan_sass.control(ctl(write_sb=4, read_sb=2, wait=0b010001, stall=5)) == \
        dict(stall=5, write_sb=4, read_sb=2, wait=0b010001)
    listing = [(ins, scan_sass.control(c)) for ins, c in [
        ("@P0 LDG.E R71, desc[UR22][R6.64]", ctl(write_sb=4, read_sb=1)),   # 0: the next token's load
        ("SHFL.BFLY PT, R59, R58, 0x2, 0x1f", ctl(write_sb=4)),            # 1: shares scoreboard 4
        ("IADD3 R6, R6, 0x4, RZ", ctl(wait=0b000010)),                     # 2: waits on the load's operand read only
        ("FADD R59, R58, R59", ctl(wait=0b010000)),                        # 3: waits for the shuffle, and the load
        ("@P1 LDG.E.128 R80, desc[UR22][R8.64]", ctl(write_sb=3)),          # 4
        ("FADD R1, R83, R2", ctl(wait=0b001000)),                          # 5: reads R83 = R80 + 3: a genuine wait
    ]]
    assert scan_sass.borrowed_waits(listing) == [(3, "FADD R59, R58, R59", 3, "@P0 LDG.E R71, desc[UR22][R6.64]")]
    assert scan_sass.registers("R80", 4) == {"R80", "R81", "R82", "R83"} and scan_sass.registers("-R5.reuse") == {"R5"}


def test_lists_borrowed_waits_of_each_build():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_sass.py"), "--dim", "32", "--scoreboards"],
                         cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = re.findall(r"^  r=(\w+)\s+clip=(\w+)\s+(fp32|bf16): (\d+) borrowed waits in the loop", res.stdout, re.M)
    assert [(r, c, g) for r, c, g, _ in lines] == [(r, c, g) for r in ("False", "True") for c in ("False", "True")
                                                   for g in ("fp32", "bf16")]

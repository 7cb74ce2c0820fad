"""benchmarks/probe_launch.py runs on the CPU (the interpreter): each launch setting in a process of its own, a
setting that runs is compared with the committed one, and one that fails is reported as an error, not fatal."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_probe_reports_each_setting(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    settings = "BV=16,num_warps=4,num_stages=3;BV=24,num_warps=4,num_stages=1"  # a narrower tile; one no arange takes
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_launch.py"), "--out", str(tmp_path),
                          "--device", "cpu", "--shape", "2x64x1x32", "--stage", "state_fwd", "--settings", settings],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "probe_state_fwd.json").read_text())
    assert result["shape"] == [2, 64, 1, 32] and result["stage"] == "state_fwd"
    ok, bad = result["rows"]
    assert (ok["BV"], ok["status"]) == (16, "ok") and ok["max_abs_diff"] < 1e-2  # value tiles split the state exactly
    assert (bad["BV"], bad["status"]) == (24, "error") and bad["error"], bad

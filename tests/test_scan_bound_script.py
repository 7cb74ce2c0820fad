"""benchmarks/scan_bound.py runs on the CPU (the interpreter): its `full` variant is phase1_fwd_seq's scan to the bit,
and every variant with a part switched off runs and is timed."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_probe_rebuilds_the_scan_and_times_every_variant(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "scan_bound.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_bound.py"), "--smoke", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["phase1_fwd_seq", "full", "no-store", "no-load", "no-reduce", "update"]
    assert rows[1]["equals_phase1_fwd_seq"] is True
    assert all(r["ms"] > 0 and r["us_per_token"] > 0 for r in rows)

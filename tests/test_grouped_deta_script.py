"""benchmarks/grouped_deta.py runs on the CPU (the interpreter): on a small grid its JSON has one row per problem and
a summary, and on the CPU, where the group maps' dots are float32, ∂η at the β-free fixed point stays at round-off
for both chain forms (the bounds test_fast_chunk.py's GROUPED_DETA_FLOOR rests on)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


# The CPU's bounds. On the GPU machine the interpreter is its image's triton 3.6, whose interpreter stops in the chunk
# form's state kernel (TypeError: only 0-dimensional arrays can be converted to Python scalars; 3.9 runs it); the GPU's
# numbers are call 5 of benchmarks/logs/gpu_v31_2026-12-03.log.
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU (interpreter) measurement; the GPU grid is in the log")
@pytest.mark.parametrize("chains", ["walked", "grouped"])
def test_grid_reports_deta_at_the_fixed_point(chains, tmp_path):
    out = tmp_path / "deta.json"
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grouped_deta.py"), "--chains", chains,
                          "--lengths", "70", "--dims", "3", "--values", "2", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    rows, summary = data["rows"], data["summary"]
    assert (summary["device"], summary["chains"], summary["eta"], summary["problems"]) == ("cpu", chains, 0.1, 4)
    assert [(r["beta_aware"], r["normalize"]) for r in rows] == [(False, False), (False, True), (True, False),
                                                                 (True, True)]
    assert all(r["deta_norm"] < 1e-12 for r in rows if not r["beta_aware"])      # the exact ∂η vanishes there
    assert all(r["deta_norm"] > 1e-1 for r in rows if r["beta_aware"])
    assert summary["beta_free_abs_err_max"] == max(r["abs_err"] for r in rows if not r["beta_aware"]) < 3e-5
    assert summary["beta_aware_rel_err_max"] < 1e-5

"""benchmarks/bench_short_conv.py: its smoke run on the CPU (Triton's interpreter) compares the Triton paths (the default
launch and one from --tiles) with torch's, which agree, and times all in both modes, with ratios to torch's path from
the same rounds (no CUDA graphs without a GPU); it refuses a GPU run without a GPU and a malformed --tiles."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from osdn_fast.nn.short_conv import TILES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_short_conv.py"


def run(*args):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_smoke_run(tmp_path):
    res = run("--smoke", "--out", str(tmp_path), "--tiles", "16x32x1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "bench_short_conv.json").read_text())
    impls = ("torch", "triton", "triton 16x32/1w")
    assert result["meta"]["smoke"] and result["meta"]["dtype"] == str(torch.float32)
    assert result["meta"]["tiles"] == {"triton": list(TILES), "triton 16x32/1w": [16, 32, 1]}
    (shape, agree), = result["agreement"].items()
    assert set(agree) == set(impls[1:])
    for a in agree.values():
        assert set(a) == {"y", "dx", "dw"} and max(a.values()) < 1e-5   # float32: the same function
    rows = {(r["mode"], r["impl"]): r for r in result["rows"]}
    assert set(rows) == {(m, i) for m in ("fwd", "fwdbwd") for i in impls}
    for (mode, impl), r in rows.items():
        assert len(r["rounds_ms"]) == result["meta"]["rounds"] and all(t > 0 for t in r["rounds_ms"])
        assert r["graph_ms"] is None and r["graph_ratio_to_torch"] is None   # no GPU, no graphs
        assert math.isclose(r["ratio_to_torch"], r["ms"] / rows[(mode, "torch")]["ms"])
        B, T, C = r["shape"]
        elems = B * T * C * (2 if mode == "fwd" else 6)
        assert math.isclose(r["gbs"], elems * 4 / (r["ms"] * 1e-3) / 1e9)


def test_refuses_a_gpu_run_without_a_gpu(tmp_path):
    res = run("--out", str(tmp_path))
    assert res.returncode != 0 and "no GPU" in res.stderr
    assert not (tmp_path / "bench_short_conv.json").exists()


def test_refuses_malformed_tiles(tmp_path):
    res = run("--smoke", "--out", str(tmp_path), "--tiles", "16x32")
    assert res.returncode != 0 and "tiles: expected" in res.stderr

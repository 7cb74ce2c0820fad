"""benchmarks/bench_suite.py runs end to end on the CPU (--smoke: tiny shapes, one call each, the interpreter),
so a broken script is found here rather than in a GPU call; its JSON lists every implementation it promises."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_every_row(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_suite.py"), "--smoke", "--cudagraph",
                          "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "bench_suite.json").read_text())
    assert result["complete"] and (tmp_path / "bench_suite.csv").exists()
    impls = {(r["impl"], r["mode"]) for r in result["rows"]}
    spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "benchmarks" / "bench_suite.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    expected = set(bench.osdn_variants()) | {"phase1[osdn]", "phase1[osdn_clip]", "phase1[osdn_apf_clip]",
                                       "phase1_parallel[osdn_clip]", "phase1_seq[osdn_clip]", "phase1_chunked[osdn]",
                                       "osdn_ref"}
    for name in expected:
        assert {(name, "fwd"), (name, "fwdbwd")} <= impls, name
    assert result["meta"]["tuning"] and result["meta"]["date"]  # the launch settings and the date are recorded
    assert result["meta"]["cudagraph"]
    for r in result["rows"]:  # every timed row has its CUDA-graph column (NaN on the CPU, with the reason)
        assert r["impl"] == "osdn_ref" or ("graph_ms" in r and r["graph_note"]), r

"""benchmarks/bench_suite.py runs end to end on the CPU (--smoke: tiny shapes, one call each, the interpreter),
so a broken script is found here rather than in a GPU call; its JSON lists every implementation it promises."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def smoke(out, *extra):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_suite.py"), "--smoke", "--cudagraph",
                           "--out", str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    res = smoke(out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_smoke_run_writes_every_row(smoke_run):
    tmp_path = smoke_run
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
    assert set(result["t_sweep_loglog_slope_graph"]) == set(result["t_sweep_loglog_slope"])  # None here: no GPU time
    for r in result["rows"]:  # every timed row has its CUDA-graph column (NaN on the CPU, with the reason)
        assert r["impl"] == "osdn_ref" or ("graph_ms" in r and r["graph_note"]), r


def test_resume_keeps_the_rows_of_a_cut_run_and_times_the_rest(smoke_run, tmp_path):
    """A run cut after its first shape (as a call's time limit cuts it) goes on with --resume: the kept rows are
    carried over unchanged, only the missing shapes are timed, and settings that differ are refused."""
    full = json.loads((smoke_run / "bench_suite.json").read_text())
    cut = dict(full, complete=False, rows=[r for r in full["rows"] if not r["sweep"]])
    assert cut["rows"] and len(cut["rows"]) < len(full["rows"])
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    res = smoke(tmp_path / "out", "--resume", str(tmp_path / "cut.json"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed = json.loads((tmp_path / "out" / "bench_suite.json").read_text())
    assert resumed["complete"] and resumed["meta"]["resumed_from"]["date"] == full["meta"]["date"]
    assert resumed["rows"][:len(cut["rows"])] == cut["rows"]
    new = resumed["rows"][len(cut["rows"]):]
    assert new and all(r["sweep"] for r in new)
    assert {(r["impl"], r["mode"]) for r in new} == {(r["impl"], r["mode"]) for r in full["rows"] if r["sweep"]}

    other = dict(cut, meta=dict(cut["meta"], cudagraph=False))
    (tmp_path / "other.json").write_text(json.dumps(other))
    res = smoke(tmp_path / "refused", "--resume", str(tmp_path / "other.json"))
    assert res.returncode != 0 and "--resume" in res.stderr and "cudagraph" in res.stderr


def test_the_sweep_slope_of_each_time_field():
    """fit_slope fits log(time) against log(T) over the sweep's rows of one field; NaN rows and the main shapes' rows
    are left out, and fewer than two points give None."""
    spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "benchmarks" / "bench_suite.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(T, ms, graph, sweep=True):
        return dict(T=T, impl="osdn_clip", mode="fwd", sweep=sweep, ms=ms, graph_ms=graph)

    rows = [row(1024, 3.0, 0.1), row(2048, 3.0, 0.2), row(4096, 3.0, 0.4), row(8192, 9.0, float("nan")),
            row(16384, 99.0, 99.0, sweep=False)]
    assert bench.fit_slope(rows, "osdn_clip", "fwd", "graph_ms") == pytest.approx(1.0)
    assert bench.fit_slope(rows, "osdn_clip", "fwd") == pytest.approx(0.3 * math.log(3) / math.log(2))
    assert bench.fit_slope(rows[:1], "osdn_clip", "fwd") is None

"""benchmarks/scan_grads_dtype.py under the interpreter: the four scan builds run with phase 2's gradients in float32
and in bfloat16, and their ∂k differ by the inputs' 16-bit rounding only (no time on the CPU)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_runs_the_four_builds_both_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import scan_grads_dtype

    assert scan_grads_dtype.main(["--out", str(tmp_path), "--shape", "1x8x2x16", "--rounds", "1"]) == 0
    data = json.loads((tmp_path / "scan_grads_dtype.json").read_text())
    assert [(r["r"], r["clip"]) for r in data["rows"]] == [(False, False), (False, True), (True, False), (True, True)]
    for row in data["rows"]:
        assert 1e-4 < row["dk_rel_rmse_bf16_vs_fp32"] < 8e-3, row  # bf16 inputs: rounded, and only rounded
        assert row["median_ms"] == {"fp32": None, "bf16": None} and row["bf16_minus_fp32_us"] is None
    assert data["meta"]["shape"] == [1, 8, 2, 16]



def test_one_untimed_call_per_build_for_a_profiler(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import scan_grads_dtype

    assert scan_grads_dtype.main(["--out", str(tmp_path), "--shape", "1x8x2x16", "--rounds", "0", "--builds", "r1c0"]) == 0
    (row,) = json.loads((tmp_path / "scan_grads_dtype.json").read_text())["rows"]
    assert (row["r"], row["clip"], row["ms"], row["median_ms"]) == (True, False, {"fp32": [], "bf16": []},
                                                                     {"fp32": None, "bf16": None})


def test_refuses_an_unknown_build(tmp_path):
    import scan_grads_dtype

    with pytest.raises(SystemExit):
        scan_grads_dtype.main(["--out", str(tmp_path), "--builds", "r2c0"])

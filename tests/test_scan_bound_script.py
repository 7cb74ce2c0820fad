"""benchmarks/scan_bound.py runs on the CPU (the interpreter): its `full` variant is phase1_fwd_seq's token-by-token
form to the bit, the four-token blocks that chunk_osdn runs without a clip agree with it, and every variant with a part
switched off runs and is timed."""
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
    assert [r["variant"] for r in rows] == ["phase1_fwd_seq", "token_form", "full", "no-store", "no-load", "no-reduce",
                                            "update"]
    assert rows[2]["equals_token_form"] is True
    assert 0 <= rows[0]["max_rel_diff_to_full"] < 1e-2  # bf16 k̃ may round the other way
    assert all(r["ms"] > 0 and r["us_per_token"] > 0 for r in rows)


def test_sass_counts_the_scan_loop_with_and_without_the_launchers_marks(tmp_path):
    """--sass compiles the variants and both sequential kernels for sm_90 (no GPU needed): the probe's `full` loop
    has the loads and stores of production's token form and fewer instructions (no floor), the unclipped blocks the
    same loads and stores, each switch removes what it names, and with the divisibility marks that the launcher gives
    at K = 128 the key is read with fewer (vector) loads."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_bound.py"), "--sass", "--out", str(out)],
                         cwd=ROOT, env=dict(env, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = {(r["divisibility_marks"], r["variant"]): r for r in json.loads(out.read_text())["rows"]}
    for marked in (True, False):
        full, token, block = (rows[marked, v] for v in ("full", "phase1_fwd_seq_token_form", "phase1_fwd_seq"))
        assert full["instructions"] < token["instructions"]
        assert {k: full[k] for k in ("LDG", "STG")} == {k: token[k] for k in ("LDG", "STG")} == \
            {k: block[k] for k in ("LDG", "STG")}
        assert rows[marked, "phase1_bwd_seq"]["instructions"] > 0 and rows[marked, "phase1_bwd_seq_token_form"]["LDG"] > 0
        assert rows[marked, "no-load"]["LDG"] == 0 < full["LDG"] and rows[marked, "no-store"]["STG"] == 0 < full["STG"]
        assert rows[marked, "update"]["instructions"] < rows[marked, "no-load"]["instructions"] < full["instructions"]
    assert rows[True, "full"]["LDG"] < rows[False, "full"]["LDG"]

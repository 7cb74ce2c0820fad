"""benchmarks/bandwidth_view.py: the bytes, the forward/backward split and phase 1's budget, on a profile made up here
(every number known) and on the committed Nsight Compute profiles the book reads."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bandwidth_view as bv  # noqa: E402


def made_up():
    """fla: two forward kernels and one backward; osdn: a phase-1 kernel, two phase-2 forward kernels, one backward
    phase-2 kernel and one backward phase-1 kernel. dram% chosen so that bytes come out round at 4.8 TB/s."""
    def k(op, name, us, pct):
        return dict(op=op, kernel=name, duration_us=us, dram_pct=pct)
    return dict(meta=dict(device="NVIDIA H200 (some runtime)", shape="2x100x3x50", dtype="bfloat16"),
                kernels=[k("fla_delta_rule", "chunk_scaled_dot_kkt_fwd_kernel", 10.0, 50.0),   # 24 MB
                         k("fla_delta_rule", "chunk_fwd_kernel_o", 20.0, 25.0),                # 24 MB
                         k("fla_delta_rule", "prepare_wy_repr_bwd_kernel", 30.0, 50.0),        # 72 MB
                         k("osdn", "phase1_chunk_prep_kernel", 40.0, 12.5),                    # 24 MB
                         k("osdn", "gram_kernel", 5.0, 100.0),                                 # 24 MB
                         k("osdn", "output_fwd_kernel", 15.0, 50.0),                           # 36 MB
                         k("osdn", "wy_bwd_kernel", 25.0, 50.0),                               # 60 MB
                         k("osdn", "phase1_chunk_bwd_out_kernel", 50.0, 10.0)])                # 24 MB


def test_bytes_directions_and_phases():
    rows = bv.kernels(made_up(), "osdn", 4.8)
    assert [round(r["mb"], 9) for r in rows] == [24.0, 24.0, 36.0, 60.0, 24.0]
    assert [r["direction"] for r in rows] == ["fwd", "fwd", "fwd", "bwd", "bwd"]
    assert [r["phase"] for r in rows] == [1, 2, 2, 2, 1]
    t = bv.totals(rows)
    assert t[("fwd", 1)] == pytest.approx((40.0, 24.0)) and t[("fwd", 2)] == pytest.approx((20.0, 60.0))
    assert t[("bwd", 0)] == pytest.approx((75.0, 84.0)) and t[("fwdbwd", 0)] == pytest.approx((135.0, 168.0))


def test_budget_arithmetic():
    b = bv.phase1_budget(made_up())
    unit = 2 * 100 * 3 * 50 * 2 / 1e6
    fwd, both = b["fwd"], b["fwdbwd"]
    assert fwd["fla_us"] == pytest.approx(30.0) and fwd["allowed_us"] == pytest.approx(30.0 - 20.0)
    assert fwd["needed_tbs"] == pytest.approx(24.0 / 10.0) and fwd["needed_of_peak"] == pytest.approx(2.4 / 4.8)
    assert fwd["ratio_now"] == pytest.approx(60.0 / 30.0)
    assert fwd["phase2_tbs"] == pytest.approx(3.0) and fwd["ratio_at_phase2_bw"] == pytest.approx((8.0 + 20.0) / 30.0)
    assert fwd["floor_mb"] == pytest.approx(2 * unit) and both["floor_mb"] == pytest.approx(5 * unit)
    assert fwd["ratio_at_floor_peak"] == pytest.approx((2 * unit / 4.8 + 20.0) / 30.0)
    assert both["allowed_us"] == pytest.approx(60.0 * 1.05 - 45.0)
    assert both["ratio_now"] == pytest.approx(135.0 / 60.0)


def test_no_room_left_is_infinite_bandwidth():
    p = made_up()
    p["kernels"][4]["duration_us"] = 50.0   # osdn's phase 2 forward alone now slower than fla's whole forward
    b = bv.phase1_budget(p)["fwd"]
    assert b["allowed_us"] < 0 and b["needed_tbs"] == float("inf")


def test_bad_input_names_what_is_wrong():
    p = made_up()
    with pytest.raises(ValueError, match="op 'nope'"):
        bv.kernels(p, "nope", 4.8)
    p["meta"]["device"] = "NVIDIA A100"
    with pytest.raises(ValueError, match="no peak bandwidth"):
        bv.phase1_budget(p)
    q = made_up()
    q["kernels"] = [k for k in q["kernels"] if k["kernel"] != "output_fwd_kernel"]
    with pytest.raises(ValueError, match="no output kernel"):
        bv.kernels(q, "osdn", 4.8)


@pytest.mark.parametrize("shape", ["4x4096", "8x2048"])
def test_committed_profiles(shape):
    with open(os.path.join(ROOT, "book", "data", f"ncu_op_v35_{shape}.json")) as f:
        profile = json.load(f)
    fla = bv.kernels(profile, "fla_delta_rule", 4.8)
    ours = bv.kernels(profile, "osdn", 4.8)
    fwd = [r["kernel"] for r in ours if r["direction"] == "fwd"]
    # the forward: phase 1, then phase 2's five kernels once each, ending at the output kernel
    assert [k for k in fwd if ours_phase2_kernel(k)] == ["gram_kernel", "solve_kernel", "wu_kernel", "state_fwd_kernel",
                                               "output_fwd_kernel"]
    assert [r["kernel"] for r in fla if r["direction"] == "fwd"][-1] == "chunk_fwd_kernel_o"
    assert all(r["phase"] == 2 for r in fla)
    assert all(0 < r["tbs"] < 4.8 for r in fla + ours)   # no kernel above the card's peak
    b = bv.phase1_budget(profile)
    total = sum(k["duration_us"] for k in profile["kernels"] if k["op"] == "osdn")
    assert b["fwdbwd"]["phase1_us"] + b["fwdbwd"]["phase2_us"] == pytest.approx(total)
    assert b["fwd"]["phase1_us"] + b["fwd"]["phase2_us"] < 0.5 * total
    for d in ("fwd", "fwdbwd"):
        assert b[d]["ratio_now"] > b[d]["ratio_at_phase2_bw"] > b[d]["ratio_at_floor"] > b[d]["ratio_at_floor_peak"]

def ours_phase2_kernel(name):
    """A Triton kernel of phase 2 (not phase 1's, not one of torch's small ones)."""
    return name.endswith("_kernel") and not name.startswith(bv.PHASE1_PREFIXES) and "::" not in name

"""benchmarks/ncu_op.py under the interpreter (the calls it brackets for Nsight Compute run), and ncu_summary.py on
small reports written in ncu's formats: the numbers it keeps are the ones the reports hold, per launch, per op."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

DETAILS = """[1] python3.12@127.0.0.1
  phase1_bwd_seq_kernel (8, 16, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    Duration                         us       612.61
    Section: Warp State Statistics
    Warp Cycles Per Issued Instruction             cycle         2.60
    Stall Short Scoreboard          inst         0.71
    Stall Long Scoreboard           inst         0.15
    Executed Instructions                           inst   58,948,096
    Registers Per Thread             register/thread             168
  phase1_bwd_seq_kernel (8, 16, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         ms         0.92547
    Warp Cycles Per Issued Instruction             cycle         3.66
    Stall Short Scoreboard          inst         0.22
    Stall Long Scoreboard           inst         1.88
    Executed Instructions                           inst   63,475,584
    Registers Per Thread             register/thread             168
"""
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb"\n')
SOURCE = ('"Kernel Name","phase1_bwd_seq_kernel",\n' + HEADER + '"0x10","  FADD R1, R2, R3","50","64","10"\n'
          '"0x20","  LDG.E R2, desc[UR4][R6.64]","30","64","0"\n'
          '"Kernel Name","phase1_bwd_seq_kernel",\n' + HEADER + '"0x10","  FMUL R1, R2, R3","1,200","64","900"\n')


def op_csv(kernels):
    """A details page (--csv --page details) with one Duration and one registers row per kernel."""
    head = '"ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit","Metric Value"'
    lines = ["==PROF== Connected to process 1", "4x4096x16x128 osdn: profiled one forward+backward", head]
    for i, (name, us) in enumerate(kernels):
        lines += [f'"{i}","{name}","(32, 1, 1)","(4, 16, 1)","GPU Speed Of Light Throughput","Duration","us","{us}"',
                  f'"{i}","{name}","(32, 1, 1)","(4, 16, 1)","Launch Statistics","Registers Per Thread",'
                  f'"register/thread","{i + 30}"']
    return "\n".join(lines) + "\n"


def test_scan_summary_keeps_each_launch_and_its_stalls(tmp_path):
    import ncu_summary

    (tmp_path / "d.txt").write_text(DETAILS)
    (tmp_path / "s.csv").write_text(SOURCE)
    out = tmp_path / "scan.json"
    assert ncu_summary.main(["scan", "--details", str(tmp_path / "d.txt"), "--source", str(tmp_path / "s.csv"),
                             "--labels", "a,b", "--out", str(out), "--meta", '{"date": "x"}']) == 0
    a, b = json.loads(out.read_text())["launches"]
    assert (a["label"], a["duration_us"], a["instructions"], a["cycles_per_issue"], a["registers"]) == \
        ("a", 612.61, 58948096.0, 2.6, 168.0)
    assert b["duration_us"] == pytest.approx(925.47)  # milliseconds read as such
    assert a["stall_cycles_per_issue"] == {"Short Scoreboard": 0.71, "Long Scoreboard": 0.15}
    assert b["stall_cycles_per_issue"]["Long Scoreboard"] == 1.88
    assert (a["samples"], a["long_scoreboard_samples"], a["sass_instructions"]) == (80, 10, 2)
    assert a["top_long_scoreboard"][0] == dict(sass="FADD R1, R2, R3", samples=10, executed=64)
    assert (b["samples"], b["long_scoreboard_samples"]) == (1200, 900)
    with pytest.raises(SystemExit):  # three labels for two launches
        ncu_summary.main(["scan", "--details", str(tmp_path / "d.txt"), "--source", str(tmp_path / "s.csv"),
                          "--labels", "a,b,c", "--out", str(out)])


def test_kernels_summary_names_each_launch(tmp_path):
    import ncu_summary

    page = DETAILS.replace("Throughput\n", "Throughput\n    L1/TEX Cache Throughput                 %        85.21\n", 1)
    (tmp_path / "d.txt").write_text(page)
    out = tmp_path / "k.json"
    assert ncu_summary.main(["kernels", "--details", str(tmp_path / "d.txt"), "--labels", "fwd,bwd", "--out", str(out),
                             "--meta", '{"date": "x"}']) == 0
    a, b = json.loads(out.read_text())["launches"]
    assert (a["label"], a["kernel"], a["grid"], a["block"]) == ("fwd", "phase1_bwd_seq_kernel", "(8, 16, 1)", "(32, 1, 1)")
    assert (a["duration_us"], a["l1_pct"], a["registers"], a["cycles_per_issue"]) == (612.61, 85.21, 168.0, 2.6)
    assert "l1_pct" not in b and b["duration_us"] == pytest.approx(925.47)
    assert b["stall_cycles_per_issue"] == {"Short Scoreboard": 0.22, "Long Scoreboard": 1.88}
    with pytest.raises(SystemExit):  # one label for two launches
        ncu_summary.main(["kernels", "--details", str(tmp_path / "d.txt"), "--labels", "fwd", "--out", str(out)])


def test_op_summary_splits_the_launches_at_the_markers(tmp_path):
    import ncu_summary

    spin = "void at::cuda::<unnamed>::spin_kernel(long)"
    report = op_csv([(spin, 1.0), ("chunk_fwd_kernel_o", 113.3), (spin, 1.0), ("wy_bwd_kernel", 256.9),
                     ("state_bwd_kernel", 146.1)])
    (tmp_path / "op.csv").write_text(report)
    out = tmp_path / "op.json"
    assert ncu_summary.main(["op", "--csv", str(tmp_path / "op.csv"), "--ops", "fla_delta_rule,osdn",
                             "--out", str(out)]) == 0
    kernels = json.loads(out.read_text())["kernels"]
    assert [(k["op"], k["kernel"], k["duration_us"], k["registers"]) for k in kernels] == [
        ("fla_delta_rule", "chunk_fwd_kernel_o", 113.3, 31.0), ("osdn", "wy_bwd_kernel", 256.9, 33.0),
        ("osdn", "state_bwd_kernel", 146.1, 34.0)]
    with pytest.raises(ValueError, match="marker"):  # one op more than the report marks
        ncu_summary.op_kernels(report, ["fla_delta_rule", "osdn", "osdn_apf"])


def test_ncu_op_runs_each_call_on_the_cpu(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import ncu_op

    ncu_op.main(["--shapes", "1x20x2x16", "--ops", "osdn", "--device", "cpu"])
    assert capsys.readouterr().out.strip() == "1x20x2x16 osdn: profiled one forward+backward"
    with pytest.raises(SystemExit):
        ncu_op.main(["--ops", "osdn_fast", "--device", "cpu"])

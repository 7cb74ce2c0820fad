"""benchmarks/profile_phase2.py's launch sweep, its bookkeeping only: every setting of a stage's space is timed but
the FAULTS (settings that have lost the CUDA context), TUNING is the committed one again afterwards, and the pick is
the fastest setting. The timer is replaced by one that reads the setting in force (the real one runs on the GPU)."""
import importlib.util
import itertools
from pathlib import Path

import pytest
import torch
import triton.testing

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("profile_phase2", ROOT / "benchmarks" / "profile_phase2.py")
profile_phase2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_phase2)


@pytest.fixture
def timed(monkeypatch):
    """(stage, setting) of every timing, each timing's ms a function of the setting (BV 64 / 2 warps is fastest)."""
    from osdn_fast.ops.tuning import TUNING

    seen = []

    def bench(call, **kwargs):
        stage, cfg = call()
        seen.append((stage, cfg))
        return cfg.get("BV", 64) / 64 + cfg["num_warps"] / 4 + cfg["num_stages"] / 10

    monkeypatch.setattr(triton.testing, "do_bench", bench)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls = {stage: (lambda stage=stage: (stage, dict(TUNING[stage]))) for stage in profile_phase2.FAULTS}
    return calls, seen, TUNING


def test_sweep_times_every_setting_but_the_faults(timed):
    calls, seen, TUNING = timed
    committed = {stage: dict(TUNING[stage]) for stage in calls}
    results, best, fault = profile_phase2.sweep(calls, budget_s=60)
    space = profile_phase2.SPACE
    for stage, faults in profile_phase2.FAULTS.items():
        offered = [dict(num_warps=w, num_stages=s, BV=b)
                   for b, w, s in itertools.product(space["BV"], space["num_warps"], space["num_stages"])]
        assert faults and all(f in offered for f in faults)  # each fault is a setting the space would offer
        timed_here = [cfg for st, cfg in seen if st == stage]
        assert len(timed_here) == len(offered) - len(faults) == len(results[stage])
        assert all(f not in timed_here for f in faults) and all(c in timed_here for c in offered if c not in faults)
        assert best[stage] == min(timed_here, key=lambda c: c["BV"] / 64 + c["num_warps"] / 4 + c["num_stages"] / 10)
        assert TUNING[stage] == committed[stage]  # the committed setting is back after the sweep
    assert fault is None

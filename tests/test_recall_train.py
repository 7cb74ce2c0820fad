"""Recall training: schedule, a short run that learns, presets, the summary, the CLI's tiny path, and a
2-process gloo DDP run through torchrun."""
import copy
import json
import os
import subprocess
import sys

import pytest

from osdn_fast.recall import RecallTask, RunConfig, train_run
from osdn_fast.recall.cli import build_preset, main, parse_args, run
from osdn_fast.recall.merge import MergeError, merge
from osdn_fast.recall.merge import main as merge_main
from osdn_fast.recall.presets import MODELS, PRESETS, expand
from osdn_fast.recall.report import summarize, table
from osdn_fast.recall.sweep import is_complete
from osdn_fast.recall.train import ModelSpec, lr_at

SHORT = ["--steps", "3", "--eval-every", "3", "--num-train", "64", "--num-test", "32", "--quiet", "--seeds", "0"]


def test_lr_schedule_warmup_then_cosine():
    cfg = RunConfig(steps=100, lr=1.0, warmup_frac=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] < 0.01


def test_short_run_learns_and_reports_diagnostics():
    task = RecallTask(vocab_size=32, seq_len=16, num_kv_pairs=2)
    cfg = RunConfig(task=task, model=ModelSpec(preconditioner="apf", eta=0.1), d_model=32, steps=60,
                    batch_size=16, lr=3e-3, num_train=512, num_test=64, eval_every=30)
    record = train_run(cfg, progress=False)
    assert record["history"][-1]["loss"] < record["history"][0]["loss"] or record["accuracy"] > 0.2
    assert record["accuracy"] > 1 / 16  # above chance among 16 values
    assert 0 < record["q_geo"] < 1 and 0 <= record["clip_fraction"] <= 1
    assert len(record["layers"]) == 2 and record["ranks_in_sync"] is None
    assert RunConfig.from_dict(record["config"]) == cfg


def test_presets_expand_seed_major():
    runs = expand(PRESETS["gpu"])
    p = PRESETS["gpu"]
    assert len(runs) == len(p["settings"]) * len(p["models"]) * len(p["seeds"]) * len(p["lrs"])
    seeds = [cfg.seed for _, _, cfg in runs]
    assert seeds == sorted(seeds)
    passes = {cfg.task.num_passes for _, _, cfg in runs}
    assert passes == {1, 2}
    forms = {(cfg.model.preconditioner, cfg.model.beta_aware) for _, m, cfg in runs if m.startswith("osdn")}
    assert forms == {("osdn", True), ("osdn", False)}
    assert all(m in MODELS for preset in PRESETS.values() for m in preset["models"])


def test_summary_picks_best_lr_and_relative_change():
    def rec(model, seed, lr, acc, q):
        return dict(setting="s", model=model, accuracy=acc, q_geo=q, clip_fraction=0.0, truncated=False,
                    config=dict(lr=lr, seed=seed))
    runs = [rec("deltanet", s, lr, acc, 0.4) for s, (lr, acc) in enumerate([(1e-3, 0.2), (1e-3, 0.2)])]
    runs += [rec("deltanet", s, 3e-3, 0.1, 0.4) for s in range(2)]
    runs += [rec("osdn-ba", 0, 1e-3, 0.2, 0.3), rec("osdn-ba", 1, 1e-3, 0.3, 0.2)]
    rows = {r["model"]: r for r in summarize(runs)}
    assert rows["deltanet"]["lr"] == 1e-3 and rows["deltanet"]["acc_change"] is None
    assert rows["osdn-ba"]["accuracy"]["mean"] == pytest.approx(0.25)
    assert rows["osdn-ba"]["accuracy"]["std"] == pytest.approx(0.05)
    assert rows["osdn-ba"]["acc_change"] == pytest.approx(0.25)
    assert rows["osdn-ba"]["q_geo_change"] == pytest.approx(-0.375)
    assert "+25%" in table(list(rows.values()))


def test_cli_tiny_short_schedule(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "exit")] + SHORT) == 0  # console-script exit status
    rows = run(["--out", str(tmp_path)] + SHORT)
    printed = capsys.readouterr().out
    assert {r["model"] for r in rows} == {"deltanet", "osdn-ba", "apf-ba"}
    assert "accuracy" in printed and "osdn-ba" in printed
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["complete"] and len(data["runs"]) == 3 and data["preset"] == "tiny"
    for key in ("date", "command", "device", "versions", "wall_time_s", "eta_note"):
        assert key in data
    assert all(0 <= r["q_geo"] <= 1 for r in data["runs"])
    assert (tmp_path / "accuracy.png").stat().st_size > 0 and (tmp_path / "q_geo.png").exists()


def test_cli_overrides():
    preset = build_preset(parse_args(["--preset", "gpu", "--steps", "10", "--seeds", "5", "--models", "gdn",
                                      "--settings", "T256-P64-x2", "--workers", "2", "--device", "cpu"]))
    assert preset["base"]["steps"] == 10 and preset["base"]["eval_every"] == 10
    assert preset["seeds"] == [5] and preset["models"] == ["gdn"] and preset["workers"] == 2
    assert [s["name"] for s in preset["settings"]] == ["T256-P64-x2"]
    assert PRESETS["gpu"]["base"]["steps"] != 10  # the table of presets is not modified


def test_torchrun_gloo_two_processes(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29531",
           "-m", "osdn_fast.recall.cli", "--out", str(tmp_path), "--models", "deltanet", "osdn-ba"] + SHORT
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["world_size"] == 2 and len(data["runs"]) == 2
    assert all(r["world_size"] == 2 and r["ranks_in_sync"] is True for r in data["runs"])
    assert done.stdout.count("wall time") == 1  # only rank 0 prints the table


def test_workers_and_failed_runs_are_recorded(tmp_path):
    """Two worker processes share the runs; a run that raises is recorded as failed, the sweep goes on."""
    rc = run(["--out", str(tmp_path), "--workers", "2", "--models", "deltanet", "osdn-bf"] + SHORT)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["workers"] == 2 and len(data["runs"]) == 2 and not data["failed"] and len(rc) == 2
    bad = run(["--out", str(tmp_path / "bad"), "--models", "deltanet"] + SHORT + ["--num-test", "0"])
    data = json.loads((tmp_path / "bad" / "results.json").read_text())
    assert bad == [] and len(data["failed"]) == 1 and "ValueError" in data["failed"][0]["error"]


def test_budget_that_skips_runs_is_not_complete(tmp_path):
    """A zero budget skips every run: results.json must say complete = false (as for any skip, failure or
    truncation)."""
    rows = run(["--out", str(tmp_path), "--max-minutes", "0"] + SHORT)
    data = json.loads((tmp_path / "results.json").read_text())
    assert rows == [] and not data["runs"] and len(data["skipped"]) == 3 and data["complete"] is False
    done = [dict(truncated=False), dict(truncated=False)]
    assert is_complete(2, done, [], [])
    assert not is_complete(3, done, [], [])
    assert not is_complete(2, [done[0], dict(truncated=True)], [], [])
    assert not is_complete(2, done, [dict(seed=2)], []) and not is_complete(2, done, [], [dict(error="x")])


def _results(preset: dict, keep, truncated=(), acc=0.5, **meta) -> dict:
    """A synthetic results.json dict of `preset` holding the planned runs for which keep(setting, model, seed)."""
    runs = [dict(setting=s, model=m, config=cfg.to_dict(), accuracy=acc + 0.1 * cfg.seed, q_geo=0.3,
                 clip_fraction=0.0, truncated=(s, m, cfg.seed) in truncated)
            for s, m, cfg in expand(preset) if keep(s, m, cfg.seed)]
    data = dict(preset="p", config=preset, command="osdn-recall", date="d", device="cpu", wall_time_s=1.0,
                summary=[], runs=runs, skipped=[], failed=[], complete=False)
    return dict(data, **meta)


def test_merge_results(tmp_path):
    preset = dict(base=dict(task=dict(vocab_size=64, seq_len=32, num_kv_pairs=6), d_model=32, steps=10),
                  settings=[dict(name="A", num_passes=1), dict(name="B", num_passes=2)],
                  models=["deltanet", "osdn-ba"], seeds=[0, 1], lrs=[3e-3], eta=0.1, workers=4, max_minutes=7.0)
    small = dict(copy.deepcopy(preset), seeds=[1], settings=preset["settings"][1:], workers=1, max_minutes=8.0)
    base = _results(preset, lambda s, m, seed: seed == 0 or s == "A", truncated={("A", "osdn-ba", 1)},
                    versions="v0")
    extra = _results(small, lambda s, m, seed: True, acc=0.6, date="d2")
    fix = _results(dict(small, settings=preset["settings"][:1], models=["osdn-ba"]), lambda s, m, seed: True)
    merged = merge([("base", base), ("extra", extra)])
    assert len(merged["runs"]) == 8 and not merged["skipped"] and merged["versions"] == "v0"
    assert merged["complete"] is False  # ("A", "osdn-ba", 1) is still truncated
    assert [m["n_runs"] for m in merged["merged_from"]] == [6, 2] and merged["merged_from"][1]["date"] == "d2"
    rows = {(r["setting"], r["model"]): r for r in merged["summary"]}
    assert rows["B", "deltanet"]["n_seeds"] == 2 and rows["A", "osdn-ba"]["n_seeds"] == 1
    assert rows["B", "deltanet"]["accuracy"]["mean"] == pytest.approx((0.5 + 0.7) / 2)
    full = merge([("base", base), ("extra", extra), ("fix", fix)])  # a truncated run is replaced by a later one
    assert full["complete"] is True and len(full["runs"]) == 8 and not any(r["truncated"] for r in full["runs"])
    assert merge([("base", base)])["skipped"] == [dict(setting="B", model=m, seed=1, lr=3e-3)
                                                  for m in preset["models"]]
    with pytest.raises(MergeError, match="also in base"):  # a duplicate of an untruncated run
        merge([("base", base), ("again", _results(dict(small, seeds=[0]), lambda s, m, seed: True))])
    with pytest.raises(MergeError, match="not planned"):
        merge([("base", base), ("more", _results(dict(small, seeds=[5]), lambda s, m, seed: True))])
    for change in (dict(eta=0.2), dict(lrs=[1e-3]), dict(base=dict(preset["base"], steps=20)),
                   dict(settings=[dict(name="B", num_passes=3)])):
        with pytest.raises(MergeError, match=r"extra: (config|setting)"):
            merge([("base", base), ("extra", _results(dict(small, **change), lambda s, m, seed: True))])
    # the command line: files in, merged file and plots out
    for name, data in (("base", base), ("extra", extra)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(data))
    out = tmp_path / "merged.json"
    assert merge_main([str(tmp_path / "base" / "results.json"), str(tmp_path / "extra" / "results.json"),
                       "--out", str(out), "--plots", str(tmp_path / "plots")]) == 0
    data = json.loads(out.read_text())
    assert [m["file"] for m in data["merged_from"]] == ["base/results.json", "extra/results.json"]
    assert data["summary"] == merged["summary"] and (tmp_path / "plots" / "q_geo.png").stat().st_size > 0

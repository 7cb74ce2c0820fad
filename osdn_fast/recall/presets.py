"""Named models and sweep presets of `osdn-recall`.

Model names say the backbone, the preconditioner and the gradient form of the d update:
`-ba` beta-aware ∇h = −β(1 − β⟨d,k²⟩)k²/‖k‖² (the authors' GDN form), `-bf` beta-free
∇h = −(1 − ⟨d,k²⟩)k²/‖k‖² (the authors' DeltaNet form; with L2-normalised keys d = 1 is its fixed point,
so it moves away from DeltaNet only through the learned d_0 and, for APF, the retention gate).
"""
from __future__ import annotations

import itertools

from .tasks import RecallTask
from .train import ModelSpec, RunConfig

MODELS = {}
for _bb, _prefix in (("deltanet", ""), ("gdn", "gdn-")):
    MODELS[_bb] = dict(backbone=_bb, preconditioner="off")
    for _pre, _form in itertools.product(("osdn", "apf"), ("ba", "bf")):
        MODELS[f"{_prefix}{_pre}-{_form}"] = dict(backbone=_bb, preconditioner=_pre, beta_aware=_form == "ba")


def baseline_of(name: str) -> str:
    """The preconditioner-off model with the same backbone."""
    return "gdn" if name.startswith("gdn") else "deltanet"


# A preset: `base` (RunConfig fields; `task` holds RecallTask fields), `settings` (named overrides of the task
# and of d_model), `models` (names in MODELS), `seeds`, `lrs` (the best mean over seeds is reported),
# `eta` (for every preconditioned model), `workers` (processes sharing the device), `max_minutes`.
PRESETS = {
    # CPU, a few minutes: DeltaNet vs OSDN vs OSDN-APF (beta-aware), two seeds, eta raised for a short run.
    # MQAR learning is a sharp transition: this setting is mid-transition at 600 steps (DeltaNet ~0.55), while
    # T64-P12 reached 0.94 at width 64 and stayed at chance (0.02) at width 32 in the same budget.
    "tiny": dict(
        base=dict(task=dict(vocab_size=64, seq_len=32, num_kv_pairs=6), d_model=32, num_layers=2, num_heads=2,
                  steps=600, batch_size=32, num_train=8_000, num_test=256, eval_every=150, device="cpu"),
        settings=[dict(name="T32-P6-d32")],
        models=["deltanet", "osdn-ba", "apf-ba"],
        seeds=[0, 1], lrs=[3e-3], eta=0.1, workers=1, max_minutes=None,
    ),
    # One H200: over capacity, so that no model saturates. 64 pairs in 2 heads of 32 key dims (twice the key
    # dimension), read once and twice; both backbones, off / OSDN (both forms) / APF, 3 seeds. One learning
    # rate: in `gpu-t128` (seed 0, both lrs, every model) 3e-3 beat 1e-3 in all 16 model-settings.
    # Measured on the H200: a run takes ~140 s with 12 workers sharing the GPU, so the 48 runs need ~9-10 min,
    # more than one 600-s call; the 7-min budget leaves ~39 (book/data/recall_sweep.json). The sweep is made
    # in two calls (the second with --seeds/--settings/--models for the skipped runs) and the results.json
    # files are combined with `python3 -m osdn_fast.recall.merge`.
    "gpu": dict(
        base=dict(task=dict(vocab_size=256, seq_len=256, num_kv_pairs=64), d_model=64, num_layers=2, num_heads=2,
                  steps=1500, batch_size=64, num_train=60_000, num_test=1024, eval_every=250, device="cuda"),
        settings=[dict(name="T256-P64-x1", num_passes=1), dict(name="T256-P64-x2", num_passes=2)],
        models=["deltanet", "osdn-ba", "osdn-bf", "apf-ba", "gdn", "gdn-osdn-ba", "gdn-osdn-bf", "gdn-apf-ba"],
        seeds=[0, 1, 2], lrs=[3e-3], eta=0.1, workers=12, max_minutes=7.0,
    ),
    # The first H200 sweep (book/data/recall_sweep_t128.json, seed 0 complete): 32 pairs at T = 128 and the
    # learning-rate pair. At 3e-3 every model reached >= 0.995 by step 750: saturated, hence `gpu` above.
    "gpu-t128": dict(
        base=dict(task=dict(vocab_size=256, seq_len=128, num_kv_pairs=32), d_model=64, num_layers=2, num_heads=2,
                  steps=1500, batch_size=64, num_train=60_000, num_test=1024, eval_every=250, device="cuda"),
        settings=[dict(name="T128-P32-x1", num_passes=1), dict(name="T128-P32-x2", num_passes=2)],
        models=["deltanet", "osdn-ba", "osdn-bf", "apf-ba", "gdn", "gdn-osdn-ba", "gdn-osdn-bf", "gdn-apf-ba"],
        seeds=[0, 1, 2], lrs=[1e-3, 3e-3], eta=0.1, workers=12, max_minutes=None,
    ),
    # Later, with more GPU time: lengths and pairs at capacity, two widths, passes, the key-frequency variant.
    "gpu-large": dict(
        base=dict(task=dict(vocab_size=8192, seq_len=256, num_kv_pairs=64), d_model=128, num_layers=2, num_heads=2,
                  steps=3000, batch_size=128, num_train=200_000, num_test=2048, eval_every=500, device="cuda"),
        settings=[dict(name=f"T{T}-P{P}-d{D}-x{x}", seq_len=T, num_kv_pairs=P, d_model=D, num_passes=x)
                  for (T, P), D, x in itertools.product(((128, 32), (256, 64), (512, 128)), (64, 128), (1, 2))]
        + [dict(name=f"T256-P48-U16-d128-x{x}", num_kv_pairs=48, num_updates=16, num_passes=x) for x in (1, 2)],
        models=list(MODELS), seeds=[0, 1, 2], lrs=[1e-3, 3e-3], eta=0.1, workers=12, max_minutes=None,
    ),
}

TASK_FIELDS = set(RecallTask.__dataclass_fields__)


def expand(preset: dict) -> list[tuple[str, str, RunConfig]]:
    """All runs of a preset as (setting name, model name, RunConfig), seed-major so that a run cut short
    by the time budget leaves whole seeds of every setting rather than whole settings of every seed."""
    runs = []
    for seed, setting, model, lr in itertools.product(preset["seeds"], preset["settings"], preset["models"],
                                                      preset["lrs"]):
        base = {k: v for k, v in preset["base"].items() if k != "task"}
        task = dict(preset["base"]["task"])
        for key, value in setting.items():
            if key in TASK_FIELDS:
                task[key] = value
            elif key != "name":
                base[key] = value
        spec = dict(MODELS[model], eta=preset["eta"])
        cfg = RunConfig(task=RecallTask(**task), model=ModelSpec(**spec), seed=seed, lr=lr, **base)
        runs.append((setting["name"], model, cfg))
    return runs

"""`osdn-recall`: train DeltaNet / GDN with and without the OSDN preconditioner on synthetic recall.

    osdn-recall                                   the tiny CPU preset (a few minutes), prints a table
    osdn-recall --preset gpu --out runs/gpu       the one-H200 sweep (7-min budget: ~39 of 48 runs; see presets)
    torchrun --nproc-per-node 2 -m osdn_fast.recall.cli --preset gpu --workers 1   DDP over 2 ranks
"""
from __future__ import annotations

import argparse
import copy
import time

import matplotlib

from .presets import MODELS, PRESETS, expand
from .report import table


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="osdn-recall", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--out", default=None, help="output folder (default: osdn-recall-out/<preset>)")
    p.add_argument("--steps", type=int, help="override the number of training steps")
    p.add_argument("--eval-every", type=int, help="override the evaluation period")
    p.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    p.add_argument("--lrs", type=float, nargs="+", help="override the learning rates")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), help="override the models")
    p.add_argument("--settings", nargs="+", help="keep only these setting names")
    p.add_argument("--eta", type=float, help="override eta of the preconditioned models")
    p.add_argument("--device", help="override the device (cpu, cuda)")
    p.add_argument("--kernel", choices=("auto", "ref", "fast"), help="chunk op: auto = osdn_fast on CUDA")
    p.add_argument("--workers", type=int, help="processes sharing the device, each running whole runs")
    p.add_argument("--max-minutes", type=float, help="start no run after this; in-flight runs stop 1 min later")
    p.add_argument("--num-train", type=int, help="override the training-set size")
    p.add_argument("--num-test", type=int, help="override the test-set size")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def build_preset(args: argparse.Namespace) -> dict:
    """The chosen preset with the command-line overrides applied."""
    preset = copy.deepcopy(PRESETS[args.preset])
    base = preset["base"]
    for key, attr in (("steps", "steps"), ("eval_every", "eval_every"), ("device", "device"),
                      ("kernel", "kernel"), ("num_train", "num_train"), ("num_test", "num_test")):
        if getattr(args, attr) is not None:
            base[key] = getattr(args, attr)
    if base.get("eval_every", 0) > base["steps"]:
        base["eval_every"] = base["steps"]
    for key in ("seeds", "lrs", "models", "eta", "workers", "max_minutes"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    if args.settings:
        preset["settings"] = [s for s in preset["settings"] if s["name"] in args.settings]
        if not preset["settings"]:
            raise SystemExit(f"no setting named {args.settings}")
    return preset


def run(argv=None) -> list[dict]:
    """Parse the arguments, run the sweep, print the table on rank 0; return the summary rows."""
    matplotlib.use("Agg")
    from .sweep import run_sweep

    args = parse_args(argv)
    preset = build_preset(args)
    out = args.out or f"osdn-recall-out/{args.preset}"
    start = time.time()
    rows = run_sweep(expand(preset), out, preset_name=args.preset, preset=preset, workers=preset["workers"],
                     max_minutes=preset["max_minutes"], progress=not args.quiet)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank:
            return rows
    print()
    print(table(rows))
    print(f"\neta = {preset['eta']} (preconditioned models); -ba beta-aware, -bf beta-free gradient form")
    print(f"wall time {time.time() - start:.0f} s; results in {out}/results.json")
    return rows


def main(argv=None) -> int:
    """Console-script entry point: exit status 0 (the rows are in results.json)."""
    run(argv)
    return 0


if __name__ == "__main__":
    main()

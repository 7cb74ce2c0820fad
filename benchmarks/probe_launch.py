"""Does one phase-2 stage run, and agree with its committed launch, under other launch settings (issue 6)?

profile_phase2.py's sweep stops at the first illegal memory access: the CUDA context is lost, and the fault may
belong to any kernel launched since the last synchronisation. This probe runs each setting in a process of its
own with CUDA_LAUNCH_BLOCKING=1, so that a fault is pinned to the launch that made it and the next setting starts
clean. A child runs the stage's call (profile_phase2.stage_calls) once with the committed TUNING and once with the
setting, and reports `ok` with the largest difference of the outputs, or the error.

    python benchmarks/probe_launch.py --out $OUT --shape 8x2048x16x128 --stage wu \
        --settings "BV=32,num_warps=4,num_stages=1;BV=32,num_warps=4,num_stages=2"
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch


def parse_setting(text: str) -> dict:
    """'BV=32,num_warps=4,num_stages=1' -> {'BV': 32, 'num_warps': 4, 'num_stages': 1}."""
    pairs = (item.split("=") for item in text.split(",") if item)
    return {name.strip(): int(value) for name, value in pairs}


def outputs(result) -> list[torch.Tensor]:
    """The tensors a stage call returned, flattened (None dropped)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if torch.is_tensor(t)]


def child(shape: tuple, stage: str, setting: dict, device: str) -> dict:
    """Run in a fresh process: the stage under the committed setting, then under `setting`; max |difference|."""
    sys.path.insert(0, os.path.dirname(__file__))
    from profile_phase2 import inputs, stage_calls

    from osdn_fast.ops.tuning import TUNING

    B, T, H, D = shape
    call = stage_calls(inputs(B, T, H, D, device), B, T, H, D)[stage]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    committed = [t.clone() for t in outputs(call())]
    sync()
    for name in (stage, stage + "_few", stage + "_some"):
        if name in TUNING:
            TUNING[name] = dict(setting)
    probed = outputs(call())
    sync()
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(committed, probed))
    return dict(status="ok", max_abs_diff=diff)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8x2048x16x128", help="BxTxHxD")
    ap.add_argument("--stage", required=True, help="a stage of profile_phase2.stage_calls, e.g. wu")
    ap.add_argument("--settings", required=True, help="';'-separated settings, e.g. 'BV=32,num_warps=4,num_stages=1'")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a check of the probe)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split("x"))
    if args.child:
        print(json.dumps(child(shape, args.stage, parse_setting(args.child), args.device)), flush=True)
        return
    rows = []
    for text in args.settings.split(";"):
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        cmd = [sys.executable, __file__, "--out", args.out, "--shape", args.shape, "--stage", args.stage,
               "--settings", text, "--device", args.device, "--child", text]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        last = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
        row = dict(parse_setting(text), **(json.loads(last[0]) if last else
                                           dict(status="error", error=proc.stderr.strip().splitlines()[-8:])))
        rows.append(row)
        print(f"{args.stage} {text}: {json.dumps({k: v for k, v in row.items() if k not in parse_setting(text)})}",
              flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"probe_{args.stage}.json"), "w") as f:
            gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)"
            json.dump(dict(shape=shape, stage=args.stage, gpu=gpu, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

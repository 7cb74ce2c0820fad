"""Run a list of recall runs and write results.json (+ plots) into an output folder.

Three ways to run, by what the launcher gives:
- plain, one process: runs one after another;
- `workers > 1`: that many processes share the device, each taking whole runs (small models leave a GPU
  mostly idle, so concurrent runs raise throughput); with several GPUs, worker i uses GPU i mod count;
  no collective communication;
- under `torchrun` (WORLD_SIZE > 1): every run is data-parallel over all ranks (DDP; NCCL on CUDA, gloo on
  CPU) and rank 0 writes the results.
results.json is rewritten after every finished run, so a sweep cut short still leaves its data.
A time budget stops new runs from starting; runs in flight are stopped at the budget plus a grace period
and recorded as truncated (left out of the summary). The budget is ignored under torchrun.
`complete` in results.json is true only when every planned run finished untruncated (see `is_complete`).
"""
from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .report import plot, summarize, table
from .train import RunConfig, train_run

GRACE_S = 60.0


def environment(device: str) -> dict:
    """Device and versions, for the record."""
    import numpy
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
    else:
        name = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    versions = dict(python=platform.python_version(), torch=torch.__version__, numpy=numpy.__version__)
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version
        versions["osdn"] = version("osdn")
    except Exception:  # not installed as a distribution
        pass
    return dict(device=name, versions=versions, platform=platform.platform())


def _init_worker(counter, threads: int) -> None:
    """Pool initializer: worker i uses i-th GPU modulo the GPUs present (for device 'cuda'), `threads` CPU threads."""
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())


def _worker(job):
    """Pool entry point: one run in a worker process."""
    setting, model, cfg_dict, deadline = job
    if deadline is not None and time.time() > deadline - GRACE_S:
        return dict(setting=setting, model=model, config=cfg_dict, skipped=True)
    return _guarded(setting, model, RunConfig.from_dict(cfg_dict), progress=False, deadline=deadline)


def _guarded(setting: str, model: str, cfg: RunConfig, **kwargs) -> dict:
    """train_run, with a failure recorded (error and traceback) instead of ending the sweep."""
    try:
        return dict(setting=setting, model=model, **train_run(cfg, **kwargs))
    except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
        return dict(setting=setting, model=model, config=cfg.to_dict(), error=repr(exc),
                    traceback=traceback.format_exc())


def _init_distributed(device: str) -> tuple[int, int, str]:
    """Start torch.distributed when launched by torchrun; returns (rank, world, device for this rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    cuda = device.startswith("cuda")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return dist.get_rank(), world, device


def is_complete(planned: int, runs: list[dict], skipped: list, failed: list) -> bool:
    """True when all `planned` runs finished: none skipped, none failed, none truncated."""
    return not skipped and not failed and len(runs) == planned and not any(r.get("truncated") for r in runs)


class Sweep:
    """Collects run records and writes results.json + plots into `out` (rank 0 only)."""

    def __init__(self, out, meta: dict, write: bool):
        self.out, self.meta, self.write = Path(out), meta, write
        self.runs, self.skipped, self.failed, self.total = [], [], [], 0
        self.start = time.time()
        if write:
            self.out.mkdir(parents=True, exist_ok=True)

    def add(self, record: dict, echo) -> None:
        done = len(self.runs) + len(self.skipped) + len(self.failed) + 1
        head = (f"  [{done}/{self.total} {(time.time() - self.start) / 60:.1f} min] {record['setting']:<18} "
                f"{record['model']:<12} seed {record['config']['seed']} lr {record['config']['lr']:.0e}:")
        if record.get("skipped"):
            self.skipped.append(dict(setting=record["setting"], model=record["model"],
                                     seed=record["config"]["seed"], lr=record["config"]["lr"]))
        elif record.get("error"):
            self.failed.append(record)
            echo(f"{head} FAILED {record['error']}")
        else:
            self.runs.append(record)
            echo(f"{head} acc {record['accuracy']:.3f}  q_geo {record['q_geo']:.3f}  "
                 f"clip {100 * record['clip_fraction']:.0f}%  {record['seconds']:.0f}s"
                 + ("  (truncated)" if record["truncated"] else ""))
        self.save()

    def save(self, final: bool = False) -> list[dict]:
        rows = summarize(self.runs)
        if self.write:
            complete = final and is_complete(self.total, self.runs, self.skipped, self.failed)
            data = dict(self.meta, wall_time_s=time.time() - self.start, complete=complete, summary=rows,
                        runs=self.runs, skipped=self.skipped, failed=self.failed)
            (self.out / "results.json").write_text(json.dumps(data, indent=1))
            if final and rows:
                plot(rows, "accuracy", self.out / "accuracy.png")
                plot(rows, "q_geo", self.out / "q_geo.png")
        return rows


def run_sweep(runs: list[tuple[str, str, RunConfig]], out, *, preset_name: str, preset: dict, workers: int = 1,
              max_minutes: float | None = None, progress: bool = True, echo=print) -> list[dict]:
    """Run every (setting, model, cfg) and return the summary rows; see the module docstring."""
    device = runs[0][2].device if runs else "cpu"
    rank, world, rank_device = _init_distributed(device)
    meta = dict(preset=preset_name, config=preset, command=" ".join(["osdn-recall"] + sys.argv[1:]), argv0=sys.argv[0],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                world_size=world, workers=workers, max_minutes=max_minutes, **environment(device))
    meta["eta_note"] = (f"eta = {preset['eta']} for every preconditioned model (SPEC default 0.003; "
                        "recall experiments may use a larger eta)")
    sweep = Sweep(out, meta, write=rank == 0)
    sweep.total = len(runs)
    # Under DDP the ranks' clocks could disagree on the budget and leave one rank waiting in a collective.
    deadline = None if max_minutes is None or world > 1 else time.time() + 60 * max_minutes
    say = echo if rank == 0 else (lambda *_: None)
    say(f"{len(runs)} runs, device {meta['device']}, world {world}, workers {workers}")
    if workers > 1 and world == 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        jobs = [(s, m, c.to_dict(), None if deadline is None else deadline + GRACE_S) for s, m, c in runs]
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(ctx.Value("i", 0), threads)) as pool:
            for record in pool.imap_unordered(_worker, jobs):
                sweep.add(record, say)
    else:
        for setting, model, cfg in runs:
            if deadline is not None and time.time() > deadline:
                sweep.add(dict(setting=setting, model=model, config=cfg.to_dict(), skipped=True), say)
                continue
            cfg.device = rank_device
            kwargs = dict(progress=progress, deadline=None if deadline is None else deadline + GRACE_S)
            if world > 1:  # under DDP a failure must stop every rank, or the others hang in a collective
                sweep.add(dict(setting=setting, model=model, **train_run(cfg, **kwargs)), say)
            else:
                sweep.add(_guarded(setting, model, cfg, **kwargs), say)
    rows = sweep.save(final=True)
    if world > 1:
        dist.barrier()
    return rows

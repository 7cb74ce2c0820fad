"""Merge the results.json files of one sweep made in several calls (e.g. a sweep cut by its time budget and
the runs it missed, run later):

    python3 -m osdn_fast.recall.merge BASE.json EXTRA.json [...] --out MERGED.json [--plots DIR]

Every input must hold the base file's preset config up to `seeds`, `settings`, `models`, `workers` and
`max_minutes` (a setting of the same name must be the same setting), and each of its runs must be a run that
the base config plans, with exactly the planned RunConfig; otherwise the merge stops with an error.
A run (setting, model, seed, lr) found in several files is taken from the later file only when the earlier
copy was truncated; any other duplicate is an error. The output keeps the base file's metadata (command,
date, device, versions, wall time) and adds `merged_from` (file, command, date, device, wall_time_s, n_runs of
every input; file = parent folder and name). `summary` is recomputed with `report.summarize`, `skipped` is
the base config's planned runs present in no file (neither finished nor failed), `failed` keeps failures not
re-run, and `complete` follows `sweep.is_complete`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .presets import expand
from .report import plot, summarize
from .sweep import is_complete

FREE = ("seeds", "settings", "models", "workers", "max_minutes")  # config keys that may differ between inputs


class MergeError(ValueError):
    """Inputs that are not parts of one sweep."""


def _key(record: dict) -> tuple:
    return record["setting"], record["model"], record["config"]["seed"], record["config"]["lr"]


def _check_config(base: dict, other: dict, name: str) -> None:
    """Raise MergeError when `other`'s preset or config differs from `base` outside FREE."""
    if other.get("preset") != base.get("preset"):
        raise MergeError(f"{name}: preset {other.get('preset')!r}, the base file has {base.get('preset')!r}")
    a, b = base["config"], other["config"]
    for key in sorted(set(a) | set(b)):
        if key not in FREE and a.get(key) != b.get(key):
            raise MergeError(f"{name}: config[{key!r}] = {b.get(key)!r}, the base file has {a.get(key)!r}")
    settings = {s["name"]: s for s in a["settings"]}
    for s in b["settings"]:
        if settings.get(s["name"]) != s:
            raise MergeError(f"{name}: setting {s!r} differs from the base file's {settings.get(s['name'])!r}")


def merge(inputs: list[tuple[str, dict]]) -> dict:
    """Merge (file name, results dict) pairs, the base first; returns the merged results dict."""
    (base_name, base), extra = inputs[0], inputs[1:]
    for name, data in extra:
        _check_config(base, data, name)
    plan = {(s, m, cfg.seed, cfg.lr): cfg.to_dict() for s, m, cfg in expand(base["config"])}
    order = {key: i for i, key in enumerate(plan)}
    runs, failed = {}, {}
    for name, data in inputs:
        for record in data["runs"] + data.get("failed", []):
            key = _key(record)
            if key not in plan:
                raise MergeError(f"{name}: run {key} is not planned by the base config")
            if record["config"] != plan[key]:
                diff = sorted(k for k in plan[key] if record["config"].get(k) != plan[key][k])
                raise MergeError(f"{name}: run {key} differs from the planned RunConfig in {diff}")
        for record in data["runs"]:
            key = _key(record)
            if key in runs and not runs[key][1].get("truncated"):
                raise MergeError(f"{name}: run {key} is also in {runs[key][0]} (untruncated there)")
            runs[key] = (name, record)
            failed.pop(key, None)
        for record in data.get("failed", []):
            if _key(record) not in runs:
                failed[_key(record)] = record
    merged_runs = [runs[k][1] for k in sorted(runs, key=order.get)]
    merged_failed = [failed[k] for k in sorted(failed, key=order.get)]
    skipped = [dict(setting=s, model=m, seed=seed, lr=lr) for (s, m, seed, lr) in plan
               if (s, m, seed, lr) not in runs and (s, m, seed, lr) not in failed]
    out = {k: v for k, v in base.items() if k not in ("summary", "runs", "skipped", "failed", "complete")}
    out.update(complete=is_complete(len(plan), merged_runs, skipped, merged_failed),
               merged_from=[dict(file=name, command=data.get("command"), date=data.get("date"),
                                 device=data.get("device"), wall_time_s=data.get("wall_time_s"),
                                 n_runs=len(data["runs"])) for name, data in inputs],
               summary=summarize(merged_runs), runs=merged_runs, skipped=skipped, failed=merged_failed)
    return out


def main(argv=None) -> int:
    """Read the inputs, merge, write --out (and the plots into --plots); exit status 0."""
    p = argparse.ArgumentParser(prog="python3 -m osdn_fast.recall.merge", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="results.json files, the base first")
    p.add_argument("--out", required=True, help="merged results.json to write")
    p.add_argument("--plots", help="folder for accuracy.png and q_geo.png")
    args = p.parse_args(argv)
    inputs = [(f"{Path(f).resolve().parent.name}/{Path(f).name}", json.loads(Path(f).read_text()))
              for f in args.files]
    try:
        merged = merge(inputs)
    except MergeError as exc:
        raise SystemExit(f"merge refused: {exc}") from None
    Path(args.out).write_text(json.dumps(merged, indent=1))
    if args.plots and merged["summary"]:
        import matplotlib
        matplotlib.use("Agg")
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        plot(merged["summary"], "accuracy", Path(args.plots) / "accuracy.png")
        plot(merged["summary"], "q_geo", Path(args.plots) / "q_geo.png")
    print(f"{len(merged['runs'])} runs, {len(merged['skipped'])} skipped, {len(merged['failed'])} failed, "
          f"complete {merged['complete']}: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

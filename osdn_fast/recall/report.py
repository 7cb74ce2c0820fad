"""Summaries of a sweep: per (setting, model) the best learning rate by mean accuracy over seeds, and at that
learning rate the mean, standard deviation, min and max over seeds of accuracy and q_geo; the relative change
from the same backbone without preconditioner; a text table; PNG plots with error bars (± std, whiskers to
min/max). Used by the CLI and by book/07_recall.ipynb (the same code reads results.json files).
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from .presets import baseline_of


def _stats(xs: list[float]) -> dict:
    return dict(mean=statistics.fmean(xs), std=statistics.pstdev(xs) if len(xs) > 1 else 0.0, min=min(xs), max=max(xs))


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (setting, model): n seeds, best lr, accuracy and q_geo statistics, clip fraction, change vs off."""
    groups = defaultdict(list)
    for run in runs:
        if not run.get("truncated"):
            groups[(run["setting"], run["model"], run["config"]["lr"])].append(run)
    best = {}
    for (setting, model, lr), members in groups.items():
        acc = statistics.fmean(r["accuracy"] for r in members)
        if (setting, model) not in best or acc > best[(setting, model)][0]:
            best[(setting, model)] = (acc, lr, members)
    rows = []
    for (setting, model), (_, lr, members) in best.items():
        rows.append(dict(setting=setting, model=model, lr=lr, n_seeds=len(members),
                         accuracy=_stats([r["accuracy"] for r in members]),
                         q_geo=_stats([r["q_geo"] for r in members]),
                         clip_fraction=statistics.fmean(r["clip_fraction"] for r in members)))
    index = {(r["setting"], r["model"]): r for r in rows}
    for row in rows:
        base = index.get((row["setting"], baseline_of(row["model"])))
        ok = base is not None and base["model"] != row["model"]
        row["acc_change"] = (row["accuracy"]["mean"] / base["accuracy"]["mean"] - 1
                             if ok and base["accuracy"]["mean"] > 0 else None)
        row["q_geo_change"] = (row["q_geo"]["mean"] / base["q_geo"]["mean"] - 1
                               if ok and base["q_geo"]["mean"] > 0 else None)
    order = {m: i for i, m in enumerate(dict.fromkeys(run["model"] for run in runs))}
    return sorted(rows, key=lambda r: (r["setting"], order[r["model"]]))


def table(rows: list[dict]) -> str:
    """A fixed-width text table of `summarize` rows."""
    head = f"{'setting':<22} {'model':<12} {'n':>2} {'lr':>7}  {'accuracy':>15} {'vs off':>7}  {'q_geo':>15} {'vs off':>7} {'clip':>5}"
    lines = [head, "-" * len(head)]
    pct = lambda x: "" if x is None else f"{100 * x:+.0f}%"  # noqa: E731
    for r in rows:
        a, q = r["accuracy"], r["q_geo"]
        lines.append(f"{r['setting']:<22} {r['model']:<12} {r['n_seeds']:>2} {r['lr']:>7.0e}  "
                     f"{a['mean']:>7.3f} ± {a['std']:.3f} {pct(r['acc_change']):>7}  "
                     f"{q['mean']:>7.3f} ± {q['std']:.3f} {pct(r['q_geo_change']):>7} {100 * r['clip_fraction']:>4.0f}%")
    return "\n".join(lines)


def plot(rows: list[dict], key: str, path=None, ax=None, title=None):
    """Grouped bars of `key` ('accuracy' or 'q_geo') per setting and model: mean, ± std, whiskers to min/max."""
    import matplotlib.pyplot as plt

    settings = sorted({r["setting"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(settings) * max(1, len(models)) / 3), 3.6))
    else:
        fig = ax.figure
    width = 0.8 / len(models)
    index = {(r["setting"], r["model"]): r for r in rows}
    for j, model in enumerate(models):
        xs, means, lo, hi, stds = [], [], [], [], []
        for i, setting in enumerate(settings):
            row = index.get((setting, model))
            if row is None:
                continue
            s = row[key]
            xs.append(i + (j - (len(models) - 1) / 2) * width)
            means.append(s["mean"])
            stds.append(s["std"])
            lo.append(s["mean"] - s["min"])
            hi.append(s["max"] - s["mean"])
        ax.bar(xs, means, width, yerr=stds, capsize=2, label=model)
        ax.errorbar(xs, means, yerr=[lo, hi], fmt="none", ecolor="gray", elinewidth=0.6, capsize=0)
    ax.set_xticks(range(len(settings)), settings, rotation=20, fontsize=8)
    ax.set_ylabel(key)
    ax.set_title(title or f"{key}: mean ± std over seeds (gray: min–max)", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, len(models)))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


# The paper's headline numbers (Zhou et al. 2026): recall accuracy with JRT-style repeated context, and q_geo.
PAPER = dict(
    recall_340M=dict(deltanet=0.150, osdn=0.198, change=0.32, apf_change=0.17),
    q_geo_1_3B=dict(deltanet=0.432, osdn=0.265, change=0.265 / 0.432 - 1),
)


def versus_baseline(rows: list[dict]) -> list[dict]:
    """Per preconditioned row: the change in mean accuracy and q_geo against the same backbone with the
    preconditioner off, and whether the accuracy gap exceeds the seed spread (|Δmean| > std_a + std_b)."""
    index = {(r["setting"], r["model"]): r for r in rows}
    out = []
    for r in rows:
        base = index.get((r["setting"], baseline_of(r["model"])))
        if base is None or base is r:
            continue
        gap = r["accuracy"]["mean"] - base["accuracy"]["mean"]
        spread = r["accuracy"]["std"] + base["accuracy"]["std"]
        out.append(dict(setting=r["setting"], model=r["model"], baseline=base["model"],
                        acc_base=base["accuracy"]["mean"], acc=r["accuracy"]["mean"], acc_change=r["acc_change"],
                        q_geo_base=base["q_geo"]["mean"], q_geo=r["q_geo"]["mean"], q_geo_change=r["q_geo_change"],
                        beyond_spread=abs(gap) > spread and r["n_seeds"] > 1 and base["n_seeds"] > 1))
    return out

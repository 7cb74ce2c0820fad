"""What each kernel moves and how fast, from `ncu_op.py`'s profiles (`ncu_summary.py op` files), and what issue 6's
targets ask of phase 1 if phase 2 stays as it is.

A kernel's DRAM bytes are read off its profile as  bytes ≈ dram% × peak × duration  (Nsight Compute's DRAM
throughput is an average over the kernel's duration, as a share of the card's peak; `PEAK_TBS` holds the peaks this
uses, the vendors' figures). The forward of one forward+backward is every kernel up to and including the op's output
kernel (`OUTPUT_KERNELS`), the backward the rest (phase 2's backward starts by forming W, U and the states again).
Phase 1's kernels are those named in `PHASE1_PREFIXES`.

The budget: with phase 2's time P2 and fla's F for one direction, phase 1 may take  F·ratio − P2  for `chunk_osdn` to
meet `ratio` × fla's time; over phase 1's bytes that needs a bandwidth, which the report sets against the card's peak.
The floor: whatever its form, a phase 1 that runs as a pass of its own reads k and writes k̃ (two [B, T, H, K] tensors
in the input dtype, `FLOOR_UNITS`), and its backward reads k and ∂k̃ and writes ∂k (three); every other tensor it
touches is a scalar per token or a vector per chunk. At phase 2's bandwidth that is the least phase 1 can cost.

    python benchmarks/bandwidth_view.py book/data/ncu_op_v35_4x4096.json --op osdn
"""
from __future__ import annotations

import argparse
import json

PEAK_TBS = {"H200": 4.8, "H100": 3.35}  # HBM3e / HBM3 peaks, TB/s (NVIDIA's data sheets for the SXM cards)
OUTPUT_KERNELS = ("chunk_fwd_kernel_o", "output_fwd_kernel")  # fla's and ours: the forward's last kernel
PHASE1_PREFIXES = ("phase1_", "newton_")
TARGETS = dict(fwd=1.00, fwdbwd=1.05)  # issue 6: forward ≤ 1.00× fla's, forward+backward ≤ 1.05×
FLOOR_UNITS = dict(fwd=2, fwdbwd=5)  # [B, T, H, K] tensors a separate phase 1 must move: k, k̃; then k, ∂k̃, ∂k
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def card(meta: dict) -> str:
    """"H200" or "H100" from the profile's device string."""
    for name in PEAK_TBS:
        if name in meta["device"]:
            return name
    raise ValueError(f"device {meta['device']!r}: no peak bandwidth known for it")


def kernels(profile: dict, op: str, peak_tbs: float) -> list[dict]:
    """The op's kernels in launch order, each with `mb` (DRAM bytes / 1e6, from dram% × peak × duration), `tbs`
    (achieved TB/s), `phase` (1 or 2: everything not phase 1's, fla's included) and `direction` ("fwd"/"bwd")."""
    rows = [k for k in profile["kernels"] if k["op"] == op]
    if not rows:
        raise ValueError(f"op {op!r}: not in this profile ({sorted({k['op'] for k in profile['kernels']})})")
    ends = [i for i, k in enumerate(rows) if k["kernel"].startswith(OUTPUT_KERNELS)]
    if not ends:
        raise ValueError(f"op {op!r}: no output kernel ({', '.join(OUTPUT_KERNELS)}) among its kernels")
    out = []
    for i, k in enumerate(rows):
        mb = k["dram_pct"] / 100 * peak_tbs * k["duration_us"]  # TB/s × µs = MB
        out.append(dict(kernel=k["kernel"], us=k["duration_us"], mb=mb, tbs=mb / k["duration_us"],
                        phase=1 if k["kernel"].startswith(PHASE1_PREFIXES) else 2,
                        direction="fwd" if i <= ends[0] else "bwd"))
    return out


def totals(rows: list[dict]) -> dict:
    """{(direction, phase): (µs, MB)} summed, directions "fwd", "bwd" and "fwdbwd"; phase 0 is both phases."""
    out = {}
    for d in ("fwd", "bwd", "fwdbwd"):
        for p in (0, 1, 2):
            sel = [r for r in rows if (d == "fwdbwd" or r["direction"] == d) and (p == 0 or r["phase"] == p)]
            out[(d, p)] = (sum(r["us"] for r in sel), sum(r["mb"] for r in sel))
    return out


def unit_mb(meta: dict) -> float:
    """One [B, T, H, K] tensor of the profile's shape and dtype, in MB."""
    B, T, H, K = map(int, meta["shape"].split("x"))
    return B * T * H * K * DTYPE_BYTES[meta["dtype"]] / 1e6


def phase1_budget(profile: dict, op: str = "osdn", baseline: str = "fla_delta_rule") -> dict:
    """Per direction ("fwd", "fwdbwd"): phase 1's time and bytes now, its time allowed by issue 6's target for that
    direction with phase 2 as it is (`allowed_us` = fla's × target − phase 2's), and the bandwidth that takes at
    phase 1's present bytes (`needed_tbs`, `needed_of_peak`); also phase 2's own achieved bandwidth (`phase2_tbs`),
    the op's time if phase 1 ran at it (`ratio_at_phase2_bw`, against fla's), and the same with phase 1 moving only
    its floor (`floor_mb`, `ratio_at_floor`; at the card's peak: `ratio_at_floor_peak`)."""
    peak = PEAK_TBS[card(profile["meta"])]
    ours, fla = totals(kernels(profile, op, peak)), totals(kernels(profile, baseline, peak))
    out = {}
    for d, target in TARGETS.items():
        p1_us, p1_mb = ours[(d, 1)]
        p2_us, p2_mb = ours[(d, 2)]
        allowed = fla[(d, 0)][0] * target - p2_us
        p2_tbs = p2_mb / p2_us
        floor = FLOOR_UNITS[d] * unit_mb(profile["meta"])
        out[d] = dict(target=target, fla_us=fla[(d, 0)][0], fla_mb=fla[(d, 0)][1], phase1_us=p1_us, phase1_mb=p1_mb,
                      phase2_us=p2_us, phase2_mb=p2_mb, phase2_tbs=p2_tbs, allowed_us=allowed,
                      needed_tbs=p1_mb / allowed if allowed > 0 else float("inf"),
                      needed_of_peak=p1_mb / allowed / peak if allowed > 0 else float("inf"),
                      ratio_now=(p1_us + p2_us) / fla[(d, 0)][0],
                      ratio_at_phase2_bw=(p1_mb / p2_tbs + p2_us) / fla[(d, 0)][0], floor_mb=floor,
                      ratio_at_floor=(floor / p2_tbs + p2_us) / fla[(d, 0)][0],
                      ratio_at_floor_peak=(floor / peak + p2_us) / fla[(d, 0)][0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", help="ncu_summary.py op files (book/data/ncu_op_*.json)")
    ap.add_argument("--op", default="osdn")
    args = ap.parse_args(argv)
    for path in args.profiles:
        with open(path) as f:
            profile = json.load(f)
        peak = PEAK_TBS[card(profile["meta"])]
        print(f"{path}: {profile['meta']['shape']}, {card(profile['meta'])} (peak {peak} TB/s)")
        for op in ("fla_delta_rule", args.op):
            for r in kernels(profile, op, peak):
                print(f"  {op:<15}{r['direction']:<7}phase {r['phase']}  {r['kernel'][:40]:<41}{r['us']:7.1f} µs "
                      f"{r['mb']:6.0f} MB {r['tbs']:5.2f} TB/s")
        for d, b in phase1_budget(profile, args.op).items():
            print(f"  {d}: fla {b['fla_us']:.0f} µs, {b['fla_mb']:.0f} MB; phase 2 {b['phase2_us']:.0f} µs, "
                  f"{b['phase2_mb']:.0f} MB at {b['phase2_tbs']:.2f} TB/s; phase 1 {b['phase1_us']:.0f} µs, "
                  f"{b['phase1_mb']:.0f} MB; for {b['target']:.2f}x fla phase 1 may take {b['allowed_us']:.0f} µs: "
                  f"{b['needed_tbs']:.2f} TB/s ({b['needed_of_peak']:.0%} of peak); now {b['ratio_now']:.2f}x, "
                  f"{b['ratio_at_phase2_bw']:.2f}x with phase 1 at phase 2's bandwidth, {b['ratio_at_floor']:.2f}x "
                  f"moving only its floor ({b['floor_mb']:.0f} MB; {b['ratio_at_floor_peak']:.2f}x at peak)")


if __name__ == "__main__":
    main()

"""Nsight Compute's text and CSV reports, cut down to the numbers the book plots (a JSON of a few kB).

`scan`: the reverse scan profiled by `scan_grads_dtype.py --rounds 0` (one launch per build and dtype, in the order
the script runs them): per launch its duration, instructions, cycles per issued instruction and what they stalled on
(the WarpStateStats section's cycles per issued instruction, by reason), registers, and, from the source page's
per-instruction samples, the share of all samples that waited on the long scoreboard (global memory) and the SASS
instructions that waited most.

    ncu ... -o scan python3 benchmarks/scan_grads_dtype.py --out /tmp/s --rounds 0 --builds r0c0,r1c0
    ncu -i scan.ncu-rep --page details --print-details all > scan_details.txt
    ncu -i scan.ncu-rep --page source --csv --print-source sass > scan_source.csv
    python benchmarks/ncu_summary.py scan --details scan_details.txt --source scan_source.csv \
        --labels "r0 fp32,r0 bf16,r1 fp32,r1 bf16" --out book/data/ncu_scan_v35.json
    (--details takes several pages of the same launches, comma-separated: a second profile's SpeedOfLight durations)

`kernels`: any details page (`--page details --print-details all`), e.g. gpu_session.sh's `ncu_op` step: per launch
its kernel, grid, block, duration, throughputs (SM, memory, DRAM, L1, L2), occupancy, registers, instructions and
cycles per issued instruction by stall reason, each launch named by --labels.

    python benchmarks/ncu_summary.py kernels --details ncu_op.txt --labels "osdn prep,osdn state,..." --out k.json

`op`: `ncu_op.py`'s one forward+backward per op (`--csv --page details`): per kernel, in launch order, its op, grid,
duration, SM and memory throughput against the peak, achieved occupancy and registers. The report does not say which
op launched a kernel: each op's call begins with a marker kernel (torch's spin kernel), in `--ops` order.

    python benchmarks/ncu_summary.py op --csv ncu_op.csv --ops fla_delta_rule,osdn,osdn_apf_clip --out ncu_op.json
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys

OP_METRICS = {"Duration": "duration_us", "Compute (SM) Throughput": "sm_pct", "Memory Throughput": "memory_pct",
              "DRAM Throughput": "dram_pct", "Achieved Occupancy": "achieved_occupancy_pct",
              "Registers Per Thread": "registers", "Warp Cycles Per Issued Instruction": "cycles_per_issue"}
SCAN_METRICS = {"Duration": "duration_us", "Executed Instructions": "instructions",
                "Warp Cycles Per Issued Instruction": "cycles_per_issue", "Registers Per Thread": "registers"}
KERNEL_METRICS = dict(OP_METRICS, **SCAN_METRICS, **{"L1/TEX Cache Throughput": "l1_pct", "L2 Cache Throughput": "l2_pct",
                                                   "Theoretical Occupancy": "theoretical_occupancy_pct"})
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "nsecond": 1e-3}


def number(text: str) -> float:
    return float(text.replace(",", ""))


HEADER = re.compile(r"^  (\S+) (\(\d+, \d+, \d+\))x(\(\d+, \d+, \d+\))", re.M)


def page_launches(text: str, metrics: dict) -> list[dict]:
    """Per launch (a block of the details page, in launch order): its kernel, grid and block, `metrics` {ncu's name:
    key} (the first value of each; durations in µs) and `stall_cycles_per_issue` {reason: cycles}."""
    heads = list(HEADER.finditer(text))
    launches = []
    for head, nxt in zip(heads, heads[1:] + [None]):
        row, stalls = dict(kernel=head.group(1), grid=head.group(2), block=head.group(3)), {}
        for line in text[head.end():nxt.start() if nxt else len(text)].splitlines():
            m = re.match(r"\s+(Stall [A-Za-z ]+?)\s+inst\s+([\d.,]+)\s*$", line)
            if m:
                stalls[m.group(1)[len("Stall "):]] = number(m.group(2))
                continue
            m = re.match(r"\s+(.+?)\s{2,}(\S+)\s+([\d.,]+)\s*$", line)
            if m and m.group(1) in metrics and metrics[m.group(1)] not in row:
                value = number(m.group(3))
                row[metrics[m.group(1)]] = value * TIME_UNITS.get(m.group(2), 1.0) if m.group(1) == "Duration" else value
        row["stall_cycles_per_issue"] = stalls
        launches.append(row)
    return launches


def scan_details(text: str) -> list[dict]:
    """Per launch: SCAN_METRICS and `stall_cycles_per_issue` {reason: cycles}."""
    return [{k: v for k, v in row.items() if k not in ("kernel", "grid", "block")} for row in page_launches(text, SCAN_METRICS)]


def scan_source(text: str, top: int = 4) -> list[dict]:
    """Per launch (a "Kernel Name" block of the source page's CSV): all samples, long-scoreboard samples, and the
    `top` instructions by long-scoreboard samples (SASS text, samples, executions)."""
    launches = []
    for block in re.split(r'^"Kernel Name",.*\n', text, flags=re.M)[1:]:
        rows = list(csv.DictReader(io.StringIO(block)))
        count = lambda r, key: int(number(r[key] or "0"))  # noqa: E731
        ranked = sorted(rows, key=lambda r: -count(r, "stall_long_sb"))[:top]
        launches.append(dict(samples=sum(count(r, "Warp Stall Sampling (All Samples)") for r in rows),
                             long_scoreboard_samples=sum(count(r, "stall_long_sb") for r in rows),
                             sass_instructions=len(rows),
                             top_long_scoreboard=[dict(sass=r["Source"].strip(), samples=count(r, "stall_long_sb"),
                                                       executed=count(r, "Instructions Executed")) for r in ranked]))
    return launches


def op_kernels(text: str, ops: list[str]) -> list[dict]:
    """Per kernel of the details CSV (lines not starting with a quote are the program's and ncu's own output)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    kernels: dict[str, dict] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        k = kernels.setdefault(r["ID"], dict(kernel=r["Kernel Name"], grid=r["Grid Size"], block=r["Block Size"]))
        key = OP_METRICS.get(r["Metric Name"])
        if key and key not in k and r["Metric Value"]:
            value = number(r["Metric Value"])
            k[key] = value * TIME_UNITS.get(r["Metric Unit"], 1.0) if key == "duration_us" else value
    ordered = [kernels[i] for i in sorted(kernels, key=int)]
    marks = [i for i, k in enumerate(ordered) if "spin_kernel" in k["kernel"]]
    if len(marks) != len(ops) or (marks and marks[0] != 0):
        raise ValueError(f"{len(marks)} marker kernels for {len(ops)} ops (--ops): not a report of ncu_op.py's calls")
    rows = []
    for op, start, end in zip(ops, marks, marks[1:] + [len(ordered)]):
        rows += [dict(op=op, **k) for k in ordered[start + 1:end]]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    scan = sub.add_parser("scan")
    scan.add_argument("--details", required=True, help="comma-separated details pages of the same launches (the "
                      "first file's value wins where two hold a metric)")
    scan.add_argument("--source", required=True)
    scan.add_argument("--labels", required=True, help="comma-separated, one per launch in order")
    op = sub.add_parser("op")
    op.add_argument("--csv", required=True)
    op.add_argument("--ops", required=True)
    kern = sub.add_parser("kernels")
    kern.add_argument("--details", required=True)
    kern.add_argument("--labels", required=True, help="comma-separated, one per launch in order")
    for p in (scan, op, kern):
        p.add_argument("--out", required=True)
        p.add_argument("--meta", default="{}", help="JSON object stored as the file's `meta` (command, date)")
    args = ap.parse_args(argv)
    meta = json.loads(args.meta)
    if args.what == "scan":
        labels = args.labels.split(",")
        details = [scan_details(open(path).read()) for path in args.details.split(",")]
        details = [{k: v for d in reversed(per_file) for k, v in d.items()} for per_file in zip(*details)]
        source = scan_source(open(args.source).read())
        if not len(labels) == len(details) == len(source):
            ap.error(f"--labels names {len(labels)} launches, the details hold {len(details)}, the source {len(source)}")
        result = dict(meta=meta, launches=[dict(label=a, **b, **c) for a, b, c in zip(labels, details, source)])
    elif args.what == "kernels":
        labels, launches = args.labels.split(","), page_launches(open(args.details).read(), KERNEL_METRICS)
        if len(labels) != len(launches):
            ap.error(f"--labels names {len(labels)} launches, the details hold {len(launches)}")
        result = dict(meta=meta, launches=[dict(label=a, **b) for a, b in zip(labels, launches)])
    else:
        result = dict(meta=meta, ops=args.ops.split(","), kernels=op_kernels(open(args.csv).read(), args.ops.split(",")))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

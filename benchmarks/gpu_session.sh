#!/usr/bin/env bash
# One device call that refreshes book/data for the kernels in the tree: validation, benchmark suite, kernel
# profile (no launch sweep unless SWEEP_S > 0), in that order (a kernel change is worthless unvalidated), each
# under its own time limit so that one slow step cannot eat the next. Data files and one log (logs.txt) go to $OUT: 7 files, under the tool's 8.
#
#   bash benchmarks/gpu_session.sh            # from the repo root, with .whl/ (fla wheels) carried; ~9.5 min cold
#   VALIDATE_S=240 BENCH_S=200 PROFILE_S=120 SWEEP_S=40 bash benchmarks/gpu_session.sh
set -u
: "${OUT:?set OUT to the output folder}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || echo "fla wheels not installed (is .whl/ carried?): its baselines will be skipped"
export PYTHONPATH="/tmp/site:$PWD"

step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s, $(date -u +%T))" | tee -a "$OUT/logs.txt"
    timeout "$limit" "$@" >> "$OUT/logs.txt" 2>&1
    echo "== $name: exit $? ($(date -u +%T))" | tee -a "$OUT/logs.txt"
}
step validate "${VALIDATE_S:-290}" python3 benchmarks/validate_gpu.py --out "$OUT"
step bench "${BENCH_S:-230}" python3 benchmarks/bench_suite.py --out "$OUT"
step profile "${PROFILE_S:-55}" python3 benchmarks/profile_phase2.py --out "$OUT" --sweep-budget "${SWEEP_S:-0}"
rm -f "$OUT/tuning.json"  # a sweep's pick is read from profile_phase2.json; keep the file count down
grep -v -i "warn" "$OUT/logs.txt" | tail -n 80

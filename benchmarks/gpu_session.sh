#!/usr/bin/env bash
# A device call that refreshes book/data for the kernels in the tree: the steps of STEPS (default: the validation,
# then phase 1 alone; the suite and the profile fit only in calls of their own since version 7), in this order
# (a kernel change is worthless unvalidated), each under its own time limit so that one slow step cannot eat the
# next. Data files and one log (logs.txt) go to $OUT: at most 7 files, under the tool's 8.
# STEPS picks the steps, in this order: validate, pytest (the CUDA run of the phase-1 form tests), phase1
# (bench_phase1.py: the chunk form and the quasi-Newton forms), bench, profile (profile_phase2.py: kernels and launch
# sweeps), sweep_phase1 (profile_phase2.py's sweeps of phase 1's chunk-form kernels, into $OUT/walked and
# $OUT/grouped), profile_op (profile_op.py: median, CUDA-graph replay and kernels of whole ops beside fla's), ab
# (profile_op.py with this tree's kernels and a base tree's, alternating), overlap (overlap_probe.py), memory
# (memory_peak.py: what is alive at the peak of one forward+backward), model (model_throughput.py: whole models with
# OSDN mixers against the same models on fla's DeltaNet, training step and inference), short_conv (bench_short_conv.py),
# short_conv_ab (the same in this tree and AB_TREES, alternating), model_convs (model per short convolution).
#
#   bash benchmarks/gpu_session.sh            # from the repo root, with .whl/ (fla wheels) carried: validation + phase 1, ~7.5 min cold
#   STEPS=bench BENCH_S=570 bash benchmarks/gpu_session.sh          # the suite alone (~6 min cold): a call of its own
#   STEPS="validate pytest phase1" bash benchmarks/gpu_session.sh    # a new phase-1 form: checks, then its timings
#   STEPS="validate phase1 profile_op" PHASE1_ARGS="--chunk-sizes 64 --solvers blockwise --precisions tf32 --groups 0,8,16" ...
#       (phase 1's chains walked in groups, version 11: validated, timed alone per group size, then the whole op)
#   STEPS=pytest PYTEST_TESTS=tests/test_fast_chunk.py PYTEST_K="newton or speculates" bash benchmarks/gpu_session.sh
#   STEPS=validate VALIDATE_S=580 bash benchmarks/gpu_session.sh   # a validation to commit, in a call of its own: on a
#       cold machine the 875 rows took ~470 s and a 475-s limit cut the timings after them (2026-11-30);
#       VALIDATE_ARGS=--no-timing checks the rows only (a file without timings does not pass the data tests)
#   STEPS=validate VALIDATE_ARGS="--resume .work/v24val/gpu_validation.json" bash benchmarks/gpu_session.sh
#       (carry the file of a validation its limit cut: only the cases it lacks run, then the timings; version 24)
#   STEPS=bench BENCH_ARGS=--cudagraph BENCH_S=590 bash benchmarks/gpu_session.sh   # the suite with CUDA-graph medians
#   STEPS=bench BENCH_ARGS="--cudagraph --resume .work/suite/bench_suite.json" BENCH_S=570 bash benchmarks/gpu_session.sh
#       (carry .work/suite, the files of a call whose limit cut the suite: the next call times only what it lacks)
#   STEPS=profile SWEEP_S=60 PROFILE_ARGS="--shape 1x16384x16x128 --stages state_fwd,state_bwd" bash benchmarks/gpu_session.sh
#   STEPS="sweep_phase1 profile_op" PROFILE_OP_ARGS='--ops osdn --tuning $OUT/grouped/tuning.json' bash benchmarks/gpu_session.sh
#       (phase 1's chunk-form kernels swept at chunk_osdn's tiles: the walked chains' stages at (2, 4096, 32, 64) for
#       K = 64 (version 19), at (4, 4096) from that pick, then the grouped chains' at (1, 16384) from both, then the
#       whole op with all picks; version 18; the --tuning then names $OUT/grouped/tuning.json)
#       SWEEP_ARGS go to the K = 64 and K = 128 sweeps, e.g. "--phase1-space 16,32,64:2,4:1,3" (version 22: two warps),
#       GROUP_ARGS to the grouped one, e.g. "--group-space 16,32,64:4,8:1"; a limit of 0 skips a sweep, and the grouped
#       sweep starts from the walked sweep's picks, else from the K = 64 sweep's
#   STEPS="sweep_phase1 ab" SWEEP_WALKED_S=0 AB_TREE_ARGS='--tuning $OUT/grouped/tuning.json' AB_TREES="v29=.work/v29" ...
#       (sweeps, then the A/B with this tree at the sweeps' picks and the base tree at its own settings; version 30)
#   STEPS="pytest ab" AB_BASE=.work/base AB_ARGS="--ops osdn --shapes 4x4096x16x128" bash benchmarks/gpu_session.sh
#       (a kernel change before its validation: the whole op, this tree against a base checkout carried as .work/base,
#       alternating AB_ROUNDS times in one call; version 20; AB_TREES="base=.work/base alt=.work/alt" for more than one)
#   STEPS="validate profile_op" PROFILE_OP_ARGS="--shapes 1x16384x16x128,4x4096x16x128 --ops fla_delta_rule,osdn" bash benchmarks/gpu_session.sh
#       (a launch-settings change: its validation and its GPU time beside fla's in one call, ~8 min cold; version 9)
#   STEPS=ncu_op NCU_KERNELS="phase1_chunk.*out|gram_replay" bash benchmarks/gpu_session.sh
#       (Nsight Compute's details, stall reasons included, of the kernels of one forward+backward the regex matches)
#   STEPS=overlap bash benchmarks/gpu_session.sh   # phase 1's out kernel beside its chains on a second stream, timing
#       only (benchmarks/overlap_probe.py; after version 36)
#   STEPS="scan_ab ncu_scan" AB_TREES="lead=.work/lead" bash benchmarks/gpu_session.sh
#       (a change to phase 1's reverse scan: the scan alone in both trees, alternating, then Nsight Compute's stall
#       reasons per build in both; version 36)
#   STEPS=model bash benchmarks/gpu_session.sh     # whole models at the paper's 340M and 1.3B shapes, ours beside fla's
#       DeltaNet (benchmarks/model_throughput.py; ~5 min cold)
#   STEPS="pytest short_conv model_convs" PYTEST_TESTS=tests/test_fast_short_conv.py PYTEST_K=conv \
#       MODEL_CONVS="layer torch" MODEL_ARGS="--scales 340M --variants osdn,identity_mixer --modes train,inference" \
#       bash benchmarks/gpu_session.sh   (the Triton short convolution: its CUDA tests, the convolution alone beside
#       the layer's torch path, then the models with each; call 10 of the model log, 2026-12-06; calls 11 to 14 ran
#       bench_short_conv.py --tiles and the models by hand, each step on one line of the log)
#   STEPS="short_conv_ab model_convs" AB_TREES="dz=.work/dz" MODEL_CONVS=layer MODEL_ARGS="--scales 1.3B ..." ...
#       (a change to the short convolution: the other tree's CUDA tests of it, then the convolution alone in both trees,
#       alternating; 2026-12-06, fourth session)
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
steps=" ${STEPS:-validate phase1} "  # the validation alone takes ~6 min since version 7 (696 rows, each also without grad)
has() { [[ $steps == *" $1 "* ]]; }
has validate && step validate "${VALIDATE_S:-420}" python3 benchmarks/validate_gpu.py --out "$OUT" ${VALIDATE_ARGS:-}
# the default selection took 194 s warm (version 27) and 273 s cold (version 26) before "grouped" joined it (the grouped
# chains with APF's r had then been run on the GPU only by the validation's grouped runs)
has pytest && step pytest "${PYTEST_S:-420}" python3 -m pytest -q -x -p no:cacheprovider ${PYTEST_TESTS:-\
    tests/test_fast_phase1_newton.py tests/test_fast_phase1.py tests/test_fast_chunk.py} \
    -k "${PYTEST_K:-newton or guarded or fused or chunked or grouped or speculates or solver or entries}"
has phase1 && step phase1 "${PHASE1_S:-90}" python3 benchmarks/bench_phase1.py --out "$OUT/phase1_bench.json" \
    ${PHASE1_ARGS:---newton --chunk-sizes 64 --solvers blockwise --precisions tf32}
has bench && step bench "${BENCH_S:-230}" python3 benchmarks/bench_suite.py --out "$OUT" ${BENCH_ARGS:-}
has profile && step profile "${PROFILE_S:-55}" python3 benchmarks/profile_phase2.py --out "$OUT" --sweep-budget "${SWEEP_S:-0}" ${PROFILE_ARGS:-}
if has sweep_phase1; then  # K = 64, then K = 128 from its pick, then the grouped chains from both (a limit of 0 skips one)
    P1_STAGES=phase1_bwd_out,phase1_bwd_state,phase1_bwd_prep,phase1_state,phase1_out,phase1_prep
    from() { [[ -f $1 ]] && echo "--tuning $1"; }
    (( ${SWEEP_K64_S:-150} > 0 )) && step sweep_k64 "${SWEEP_K64_S:-150}" python3 benchmarks/profile_phase2.py \
        --out "$OUT/k64" --sweep-only --sweep-budget "$(( ${SWEEP_K64_S:-150} - 40 ))" --shape 2x4096x32x64 \
        --stages "${SWEEP_K64_STAGES:-$P1_STAGES}" ${SWEEP_ARGS:-}
    (( ${SWEEP_WALKED_S:-330} > 0 )) && step sweep_walked "${SWEEP_WALKED_S:-330}" python3 benchmarks/profile_phase2.py \
        --out "$OUT/walked" --sweep-only --sweep-budget "$(( ${SWEEP_WALKED_S:-330} - 40 ))" --shape 4x4096x16x128 \
        --stages "${SWEEP_WALKED_STAGES:-$P1_STAGES}" ${SWEEP_ARGS:-} $(from "$OUT/k64/tuning.json")
    (( ${SWEEP_GROUPED_S:-90} > 0 )) && step sweep_grouped "${SWEEP_GROUPED_S:-90}" python3 benchmarks/profile_phase2.py \
        --out "$OUT/grouped" --sweep-only --sweep-budget "$(( ${SWEEP_GROUPED_S:-90} - 40 ))" --shape 1x16384x16x128 \
        --stages phase1_group_map,phase1_group_walk ${GROUP_ARGS:-} \
        $(from "$OUT/walked/tuning.json" || from "$OUT/k64/tuning.json")
fi
has profile_op && step profile_op "${PROFILE_OP_S:-120}" python3 benchmarks/profile_op.py --out "$OUT" ${PROFILE_OP_ARGS:-}
if has ab; then  # the whole op with this tree's kernels and other trees' (AB_TREES "name=dir ...", checkouts carried;
    # AB_BASE alone means "base=$AB_BASE"), in turn, AB_ROUNDS times: $OUT/ab_tree1, $OUT/ab_<name>1, ...
    for i in $(seq "${AB_ROUNDS:-2}"); do
        step "ab_tree$i" "${AB_S:-90}" python3 benchmarks/profile_op.py --out "$OUT/ab_tree$i" ${AB_ARGS:-} \
            $(eval echo "${AB_TREE_ARGS:-}")  # e.g. '--tuning $OUT/grouped/tuning.json': this tree's sweep picks only
        for tree in ${AB_TREES:-base=${AB_BASE:?set AB_BASE or AB_TREES}}; do
            PYTHONPATH="/tmp/site:${tree#*=}" step "ab_${tree%%=*}$i" "${AB_S:-90}" \
                python3 "${tree#*=}/benchmarks/profile_op.py" --out "$OUT/ab_${tree%%=*}$i" ${AB_ARGS:-}
        done
    done
fi
if has scan_ab; then  # phase 1's reverse scan alone (scan_grads_dtype.py), this tree and AB_TREES in turn, AB_ROUNDS times:
    # $OUT/scan_tree1/scan_grads_dtype.json, $OUT/scan_<name>1/..., ...; ~60 s a run warm
    for i in $(seq "${AB_ROUNDS:-2}"); do
        step "scan_tree$i" "${SCAN_S:-120}" python3 benchmarks/scan_grads_dtype.py --out "$OUT/scan_tree$i" ${SCAN_ARGS:-}
        for tree in ${AB_TREES:-base=${AB_BASE:?set AB_BASE or AB_TREES}}; do
            PYTHONPATH="/tmp/site:${tree#*=}" step "scan_${tree%%=*}$i" "${SCAN_S:-120}" \
                python3 "${tree#*=}/benchmarks/scan_grads_dtype.py" --out "$OUT/scan_${tree%%=*}$i" ${SCAN_ARGS:-}
        done
    done
fi
if has ncu_scan; then  # Nsight Compute on one launch of each scan build and gradient dtype (NCU_BUILDS), this tree and
    # AB_TREES, each cut to $OUT/ncu_scan_<name>.json by ncu_summary.py (the clocks left as found: --clock-control none)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    builds=${NCU_BUILDS:-r0c0,r1c0}
    labels=$(python3 -c "import sys; print(','.join(f'r{b[1]} {d}' for b in sys.argv[1].split(',') for d in ('fp32', 'bf16')))" "$builds")
    for tree in "tree=$PWD" ${AB_TREES:-}; do
        name=${tree%%=*} dir=${tree#*=}
        PYTHONPATH="/tmp/site:$dir" step "ncu_$name" "${NCU_S:-150}" "$NCU" --clock-control none -k regex:phase1_bwd_seq \
            --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats \
            --section LaunchStats --import-source yes -o "/tmp/ncu_$name" -f \
            python3 "$dir/benchmarks/scan_grads_dtype.py" --out "/tmp/ncu_out_$name" --rounds 0 --builds "$builds"
        "$NCU" -i "/tmp/ncu_$name.ncu-rep" --page details --print-details all > "/tmp/ncu_$name.txt" 2>&1
        "$NCU" -i "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu_$name.csv" 2>&1
        step "ncu_summary_$name" 60 python3 benchmarks/ncu_summary.py scan --details "/tmp/ncu_$name.txt" \
            --source "/tmp/ncu_$name.csv" --labels "$labels" --out "$OUT/ncu_scan_$name.json" \
            --meta "{\"tree\": \"$name\", \"builds\": \"$builds\", \"date\": \"$(date -u +%FT%TZ)\"}"
    done
fi
if has ncu_op; then  # Nsight Compute on the kernels of one forward+backward matching NCU_KERNELS (ncu_op.py's calls), the
    # details page kept whole in $OUT/ncu_op.txt (stall reasons per kernel; the clocks left as found); after version 40
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_op "${NCU_S:-150}" "$NCU" --clock-control none --profile-from-start off -k "regex:${NCU_KERNELS:-phase1_chunk}" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --page details -o /tmp/ncu_op -f \
        python3 benchmarks/ncu_op.py ${NCU_OP_ARGS:---shapes 4x4096x16x128 --ops osdn}
    "$NCU" -i /tmp/ncu_op.ncu-rep --page details --print-details all > "$OUT/ncu_op.txt" 2>&1
fi
has overlap && step overlap "${OVERLAP_S:-150}" python3 benchmarks/overlap_probe.py --out "$OUT" ${OVERLAP_ARGS:-}
has model && step model "${MODEL_S:-420}" python3 benchmarks/model_throughput.py --out "$OUT" ${MODEL_ARGS:-}
has short_conv && step short_conv "${SHORT_CONV_S:-90}" python3 benchmarks/bench_short_conv.py --out "$OUT"
if has short_conv_ab; then  # the short convolution alone (bench_short_conv.py), this tree and AB_TREES in turn, AB_ROUNDS
    # times, after each other tree's CUDA tests of it: $OUT/sc_tree1/bench_short_conv.json, $OUT/sc_<name>1/..., ...
    for tree in ${AB_TREES:?set AB_TREES}; do
        (cd "${tree#*=}" && PYTHONPATH="/tmp/site:$PWD" step "pytest_${tree%%=*}" "${PYTEST_S:-150}" python3 -m pytest -q -x \
            -p no:cacheprovider tests/test_fast_short_conv.py)
    done
    for i in $(seq "${AB_ROUNDS:-2}"); do
        step "short_conv_tree$i" "${SHORT_CONV_S:-90}" python3 benchmarks/bench_short_conv.py --out "$OUT/sc_tree$i"
        for tree in ${AB_TREES}; do
            PYTHONPATH="/tmp/site:${tree#*=}" step "short_conv_${tree%%=*}$i" "${SHORT_CONV_S:-90}" \
                python3 "${tree#*=}/benchmarks/bench_short_conv.py" --out "$OUT/sc_${tree%%=*}$i"
        done
    done
fi
if has model_convs; then  # the layer's short convolution: model_throughput.py once per --conv of MODEL_CONVS, each in a
    for conv in ${MODEL_CONVS:-layer torch}; do  # folder of its own (the first run compiles, the later ones reuse it)
        mkdir -p "$OUT/model_$conv"
        step "model_$conv" "${MODEL_S:-420}" python3 benchmarks/model_throughput.py --out "$OUT/model_$conv" --conv "$conv" \
            ${MODEL_ARGS:-}
    done
fi
has memory && step memory "${MEMORY_S:-150}" python3 benchmarks/memory_peak.py --out "$OUT" ${MEMORY_ARGS:-}
rm -f "$OUT/tuning.json" "$OUT"/*/tuning.json  # a sweep's picks are in its profile_phase2.json; keep the file count down
grep -v -i "warn" "$OUT/logs.txt" | tail -n 80

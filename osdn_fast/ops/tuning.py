"""Launch settings (value tile BV, key-channel block KB or map-column block BN, warps, pipeline stages) of the
kernels' stages, for K <= 128.

Measured, not guessed: the fastest setting of each stage in the H200 sweep of benchmarks/profile_phase2.py at
(8, 2048, 16, 128) bf16 (see benchmarks/NOTES.md), the state chain's agreeing with its sweep at
(4, 4096, 16, 128); its `_few` entries, taken when few sequence-heads run (common.chain_stage), from its sweep at
(1, 16384, 16, 128); its `_some` entries (BV 32, taken when the `_few` tiles make more programs than SMs but tiles
of 32 do not) from its sweep at (2, 8192, 16, 128); phase 1's chunk form at its tiles (phase1_chunk.TUNED_TILES:
chunks of 32, K = 128; version 18): the chunk-parallel kernels (`phase1_*`: key-channel block KB, warps, stages;
phase1_chunk._parallel_launch) and the walked chains (`phase1_state`, `phase1_bwd_state`; phase1_chunk._chain_launch)
from their sweep at (4, 4096, 16, 128), each timed by the phase-1 forward or backward that launches it (the
backward's with the forward's kept stats), and their `_k64` entries (phase1_chunk.tuning_key: the same chunks at K = 64;
version 19) from their sweep at (2, 4096, 32, 64); the grouped chains' map (map-column block BN) and walk (`phase1_group_*`)
from theirs at (1, 16384, 16, 128), each timed by a grouped phase-1 forward+backward. The four chunk-parallel kernels
run two warps (version 22: swept over 2 and 4 warps at both key blocks; more programs in flight per multiprocessor), and so does
the `wu` stage of phase 2 (version 23: phase 2's stages swept over 2 and 4 warps at (4, 4096, 16, 128); only `wu` gained).
The Gram that forms k̃ from phase 1's chain (`gram_replay`, version 39) from its sweep alone at (4, 4096, 16, 128) over
KB 16/32/64, 2/4/8 warps and 1/2 stages (H200; with the replay's TF32 product, before d without r became a running sum).
Kept apart from the kernels: these numbers change only how the work is split (at most the order of float32 sums), so
the GPU validation (book/data/gpu_validation.json) records them and a test compares them, while the kernels' digest
covers every other file of osdn_fast/ops. BK > 128 takes 8 warps (common.launch).
"""

TUNING = {
    "gram": dict(num_warps=4, num_stages=1),
    "gram_replay": dict(KB=32, num_warps=2, num_stages=2),
    "solve": dict(num_warps=2, num_stages=1),
    "wu": dict(BV=64, num_warps=2, num_stages=3),
    "wy_bwd": dict(num_warps=4, num_stages=3),
    "state_fwd": dict(BV=64, num_warps=4, num_stages=3),
    "state_bwd": dict(BV=64, num_warps=8, num_stages=3),
    "state_fwd_few": dict(BV=16, num_warps=4, num_stages=3),
    "state_bwd_few": dict(BV=16, num_warps=4, num_stages=3),
    "state_fwd_some": dict(BV=32, num_warps=4, num_stages=3),
    "state_bwd_some": dict(BV=32, num_warps=4, num_stages=3),
    "output_fwd": dict(BV=64, num_warps=4, num_stages=2),
    "output_bwd_local": dict(BV=64, num_warps=4, num_stages=3),
    "output_bwd": dict(BV=64, num_warps=4, num_stages=2),
    "phase1_prep": dict(KB=16, num_warps=2, num_stages=3),
    "phase1_out": dict(KB=32, num_warps=2, num_stages=3),
    "phase1_bwd_prep": dict(KB=32, num_warps=2, num_stages=1),
    "phase1_bwd_out": dict(KB=32, num_warps=2, num_stages=3),
    "phase1_bwd_out_sum": dict(KB=64, num_warps=4, num_stages=2),  # without r: λ by a running sum (version 41)
    "phase1_state": dict(num_warps=4, num_stages=1),
    "phase1_bwd_state": dict(num_warps=4, num_stages=1),
    "phase1_prep_k64": dict(KB=16, num_warps=2, num_stages=1),
    "phase1_out_k64": dict(KB=64, num_warps=2, num_stages=1),
    "phase1_bwd_prep_k64": dict(KB=64, num_warps=2, num_stages=1),
    "phase1_bwd_out_k64": dict(KB=64, num_warps=2, num_stages=2),
    "phase1_state_k64": dict(num_warps=4, num_stages=2),
    "phase1_bwd_state_k64": dict(num_warps=4, num_stages=2),
    "phase1_group_map": dict(BN=128, num_warps=4, num_stages=1),
    "phase1_group_walk": dict(num_warps=8, num_stages=1),
}



"""osdn_ref: the readable PyTorch oracle for OSDN (Online Scaled DeltaNet); see SPEC §2-4.

- `recurrent_osdn`   the token loop (recurrent.py)
- `chunk_osdn`       the two-phase WY chunkwise form: preconditioner_scan, then memory_pass (chunk.py)
- phase 1 pieces     `surrogate_loss`, `surrogate_grad`, `preconditioner_step`, `preconditioner_scan`,
                     `phase1_as_delta_rule`, `vector_delta_rule`
- diagnostics        `residual_ratios`, `q_geo`
- `validate_inputs`  the SPEC §4 input checks, shared with osdn_fast
- `check`, `rel_err` the book's and the tests' relative-error check
"""
from .chunk import chunk_osdn, memory_pass, decayed_gram, state_pass, to_chunks, ut_transform, wy_representation, chunk_output
from .checks import check, rel_err
from .diagnostics import q_geo, residual_ratios
from .preconditioner import (
    EPS,
    Phase1,
    phase1_as_delta_rule,
    preconditioner_scan,
    preconditioner_step,
    surrogate_grad,
    surrogate_loss,
    vector_delta_rule,
)
from .recurrent import delta_rule_step, recurrent_osdn
from .validate import Dims, validate_inputs

__all__ = [
    "recurrent_osdn", "chunk_osdn", "memory_pass", "delta_rule_step",
    "to_chunks", "decayed_gram", "ut_transform", "wy_representation", "state_pass", "chunk_output",
    "EPS", "Phase1", "surrogate_loss", "surrogate_grad", "preconditioner_step", "preconditioner_scan",
    "phase1_as_delta_rule", "vector_delta_rule", "residual_ratios", "q_geo", "Dims", "validate_inputs", "check", "rel_err",
]

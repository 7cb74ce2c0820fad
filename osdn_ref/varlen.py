"""Packed variable-length sequences (`cu_seqlens`, fla's convention): run an op once per sequence."""
from __future__ import annotations

import torch


def run_per_sequence(op, q, k, v, beta, *, g, r, initial_state, output_final_state, cu_seqlens, **kwargs):
    """Split [1, T, ...] inputs at `cu_seqlens`, run `op` on each sequence, and pack the results again.

    Sequence n starts from initial_state[.][n]; final states come back stacked as [N, ...].
    """
    S0, d0 = initial_state if initial_state is not None else (None, None)
    outputs, finals = [], []
    bounds = cu_seqlens.tolist()
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = lambda x: None if x is None else x[:, a:b]  # noqa: E731
        state = (None if S0 is None else S0[n : n + 1], None if d0 is None else d0[n : n + 1])
        o, final = op(
            q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], g=part(g), r=part(r),
            initial_state=state, output_final_state=output_final_state, **kwargs,
        )
        outputs.append(o)
        finals.append(final)
    o = torch.cat(outputs, dim=1)
    if not output_final_state:
        return o, None
    return o, (torch.cat([f[0] for f in finals]), torch.cat([f[1] for f in finals]))

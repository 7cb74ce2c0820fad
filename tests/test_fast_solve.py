"""osdn_fast.ops.solve (phase 2's (I + A)⁻¹ per chunk, its diagonal blocks substituted side by side) against the
float64 inverse of each chunk built in PyTorch, on packed sequences whose last chunks are cut short."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from osdn_fast.ops.index import chunk_layout  # noqa: E402
from osdn_fast.ops.solve import unit_lower_inverse  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def chunk_inverse_f64(A, cu_seqlens, C):
    """(I + A_c)⁻¹ of every chunk c, from torch.linalg.inv in float64, rows laid out as the kernel stores them."""
    out = torch.zeros(A.shape, dtype=torch.float64)
    bounds = cu_seqlens.tolist()
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for t0 in range(bos, eos, C):
            n = min(C, eos - t0)
            block = A[0, t0:t0 + n, :, :n].double().permute(1, 0, 2).tril(-1)  # [H, n, n]
            out[0, t0:t0 + n, :, :n] = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + block).permute(1, 0, 2)
    return out


@settings(max_examples=6, deadline=None)
@given(C=st.sampled_from([16, 32, 64]), H=st.integers(1, 2),
       lengths=st.lists(st.integers(1, 150), min_size=1, max_size=3), scale=st.sampled_from([0.05, 0.3]),
       seed=st.integers(0, 2**16))
def test_solve_matches_float64_inverse(C, H, lengths, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    A = scale * torch.randn(1, T, H, C, generator=gen)
    chunk_indices, _ = chunk_layout(cu_seqlens, C)
    got = unit_lower_inverse(A.to(DEVICE), cu_seqlens.to(DEVICE), chunk_indices.to(DEVICE), torch.float32).cpu()
    want = chunk_inverse_f64(A, cu_seqlens, C)
    rel = (got.double() - want).norm() / want.norm()  # every row is written, zeros above the diagonal included
    assert rel < 1e-5, f"relative error {rel:.2e} at C={C}, lengths={lengths}"

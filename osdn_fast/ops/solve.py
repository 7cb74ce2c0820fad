"""(I + A)⁻¹ of each chunk's strictly lower A [C, C] (C = 16, 32 or 64), blockwise in 16×16 tiles.

Diagonal blocks by forward substitution, one row per step, each row read from memory (no reduction over a
whole tile to pull a row out of registers):

    N = D − I:   N_i = −A_i − Σ_{m<i} A_im N_m          (rows 0 and 1 are −A_i already)

The C/16 diagonal blocks are independent: SIDE_BY_SIDE steps them together on a [C/16, 16, 16] tile (14 dependent
steps in all instead of 14 per block), at the cost of the registers that tile holds.

Off-diagonal blocks from the block rows above (X = (I + A)⁻¹, D_b its diagonal blocks):

    X_bc = −D_b Σ_{c≤m<b} A_bm X_mc

All in float32 (IEEE dots: 16×16 tiles are too small for the tensor cores to matter); the result is stored in
the input dtype for the W, U products that follow. Phase 1's chunk form runs the same inverse in place inside its
prep kernel (`invert_chunk`, IN_PLACE, its diagonal blocks side by side), on the L it has just stored.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _block(A, t0, eos, b, c, i_h, H, BT: tl.constexpr):
    """Block (b, c) of the chunk starting at token t0: A[t0 + 16b + i, 16c + j], zero past the sequence end."""
    o = tl.arange(0, 16)
    rows = t0 + 16 * b + o
    return tl.load(A + (rows[:, None] * H + i_h) * BT + 16 * c + o[None, :], mask=(rows < eos)[:, None], other=0.0)


@triton.jit
def _store_block(Ainv, X, t0, eos, b, c, i_h, H, BT: tl.constexpr):
    o = tl.arange(0, 16)
    rows = t0 + 16 * b + o
    tl.store(Ainv + (rows[:, None] * H + i_h) * BT + 16 * c + o[None, :], X.to(Ainv.dtype.element_ty),
             mask=(rows < eos)[:, None])


@triton.jit
def _diagonal_inverse(A, t0, eos, b, i_h, H, BT: tl.constexpr):
    """(I + A_bb)⁻¹ of diagonal block b by forward substitution."""
    o = tl.arange(0, 16)
    N = -tl.where(o[:, None] > o[None, :], _block(A, t0, eos, b, b, i_h, H, BT), 0.0)
    for i in range(2, 16):
        row = t0 + 16 * b + i
        a = -tl.load(A + (row * H + i_h) * BT + 16 * b + o, mask=o < tl.where(row < eos, i, 0), other=0.0)
        a = a + tl.sum(a[:, None] * N, axis=0)
        N = tl.where((o == i)[:, None], a[None, :], N)
    return N + tl.where(o[:, None] == o[None, :], 1.0, 0.0)


@triton.jit
def _diagonal_inverses(A, t0, eos, i_h, H, BT: tl.constexpr):
    """(I + A_bb)⁻¹ of every diagonal block b < BT/16, the blocks stepped side by side: [BT/16, 16, 16]."""
    o, blk = tl.arange(0, 16), tl.arange(0, BT // 16)
    rows = t0 + 16 * blk[:, None, None] + o[None, :, None]
    N = -tl.load(A + (rows * H + i_h) * BT + 16 * blk[:, None, None] + o[None, None, :],
                 mask=(o[None, :, None] > o[None, None, :]) & (rows < eos), other=0.0)
    for i in range(2, 16):
        row = t0 + 16 * blk + i
        a = -tl.load(A + (row[:, None] * H + i_h) * BT + 16 * blk[:, None] + o[None, :],
                     mask=(o[None, :] < i) & (row < eos)[:, None], other=0.0)
        a = a + tl.sum(a[:, :, None] * N, axis=1)
        N = tl.where((o == i)[None, :, None], a[:, None, :], N)
    return N + tl.where(o[:, None] == o[None, :], 1.0, 0.0)[None, :, :]


@triton.jit
def _diagonal(A, Ds, t0, eos, b, i_h, H, BT: tl.constexpr, SIDE_BY_SIDE: tl.constexpr):
    """Diagonal block b of (I + A)⁻¹: taken from _diagonal_inverses' Ds by a masked sum, or substituted alone."""
    if SIDE_BY_SIDE:
        return tl.sum(tl.where((tl.arange(0, BT // 16) == b)[:, None, None], Ds, 0.0), axis=0)
    else:
        return _diagonal_inverse(A, t0, eos, b, i_h, H, BT)


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def invert_chunk(A, Ainv, t0, eos, i_h, H, BT: tl.constexpr, IN_PLACE: tl.constexpr, SIDE_BY_SIDE: tl.constexpr):
    """(I + A)⁻¹ of the chunk starting at token t0, stored in Ainv. IN_PLACE (Ainv is A): a barrier before each
    group of stores, so that no thread overwrites a block that another has yet to read (each group's rows are read
    only by the blocks stored in it). SIDE_BY_SIDE: the diagonal blocks substituted together, first."""
    zero = tl.zeros([16, 16], dtype=tl.float32)
    Ds = _diagonal_inverses(A, t0, eos, i_h, H, BT) if SIDE_BY_SIDE else None
    D0 = _diagonal(A, Ds, t0, eos, 0, i_h, H, BT, SIDE_BY_SIDE)
    if IN_PLACE:
        tl.debug_barrier()
    _store_block(Ainv, D0, t0, eos, 0, 0, i_h, H, BT)
    if BT >= 32:
        D1 = _diagonal(A, Ds, t0, eos, 1, i_h, H, BT, SIDE_BY_SIDE)
        X10 = -_mm(D1, _mm(_block(A, t0, eos, 1, 0, i_h, H, BT), D0))
        if IN_PLACE:
            tl.debug_barrier()
        _store_block(Ainv, zero, t0, eos, 0, 1, i_h, H, BT)
        _store_block(Ainv, X10, t0, eos, 1, 0, i_h, H, BT)
        _store_block(Ainv, D1, t0, eos, 1, 1, i_h, H, BT)
        if BT == 64:
            D2 = _diagonal(A, Ds, t0, eos, 2, i_h, H, BT, SIDE_BY_SIDE)
            D3 = _diagonal(A, Ds, t0, eos, 3, i_h, H, BT, SIDE_BY_SIDE)
            A20 = _block(A, t0, eos, 2, 0, i_h, H, BT)
            A21 = _block(A, t0, eos, 2, 1, i_h, H, BT)
            A30 = _block(A, t0, eos, 3, 0, i_h, H, BT)
            A31 = _block(A, t0, eos, 3, 1, i_h, H, BT)
            A32 = _block(A, t0, eos, 3, 2, i_h, H, BT)
            X21 = -_mm(D2, _mm(A21, D1))
            X20 = -_mm(D2, _mm(A20, D0) + _mm(A21, X10))
            X32 = -_mm(D3, _mm(A32, D2))
            X31 = -_mm(D3, _mm(A31, D1) + _mm(A32, X21))
            X30 = -_mm(D3, _mm(A30, D0) + _mm(A31, X10) + _mm(A32, X20))
            if IN_PLACE:
                tl.debug_barrier()
            for c in range(2, 4):
                _store_block(Ainv, zero, t0, eos, 0, c, i_h, H, BT)
                _store_block(Ainv, zero, t0, eos, 1, c, i_h, H, BT)
            _store_block(Ainv, zero, t0, eos, 2, 3, i_h, H, BT)
            _store_block(Ainv, X20, t0, eos, 2, 0, i_h, H, BT)
            _store_block(Ainv, X21, t0, eos, 2, 1, i_h, H, BT)
            _store_block(Ainv, D2, t0, eos, 2, 2, i_h, H, BT)
            _store_block(Ainv, X30, t0, eos, 3, 0, i_h, H, BT)
            _store_block(Ainv, X31, t0, eos, 3, 1, i_h, H, BT)
            _store_block(Ainv, X32, t0, eos, 3, 2, i_h, H, BT)
            _store_block(Ainv, D3, t0, eos, 3, 3, i_h, H, BT)


@triton.jit
def solve_kernel(A, Ainv, cu_seqlens, chunk_indices, H, BT: tl.constexpr):
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunk_indices + i_t * 2)
    i_c = tl.load(chunk_indices + i_t * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    invert_chunk(A, Ainv, bos + i_c * BT, eos, i_h, H, BT, IN_PLACE=False, SIDE_BY_SIDE=True)


def unit_lower_inverse(A: torch.Tensor, cu_seqlens, chunk_indices, dtype, **launch_options) -> torch.Tensor:
    """A [1, ΣT, H, C] float32 (each chunk's strictly lower block) → (I + A)⁻¹ [1, ΣT, H, C] in `dtype`."""
    _, T, H, C = A.shape
    Ainv = torch.empty(1, T, H, C, dtype=dtype, device=A.device)
    solve_kernel[(chunk_indices.shape[0], H)](A, Ainv, cu_seqlens, chunk_indices, H, BT=C, **launch_options)
    return Ainv

"""The layer's short convolution in Triton: causal, depthwise over time, then SiLU, in the layer's [B, T, C] layout.

    z_t = Σ_{i<W} w_i ⊙ x_{t−W+1+i}    (x_s = 0 for s < 0)        y_t = SiLU(z_t) = z_t σ(z_t)

Backward, with ∂z_t = ∂y_t ⊙ σ(z_t) (1 + z_t (1 − σ(z_t))) (z recomputed from x, never stored):

    ∂x_s = Σ_i w_i ⊙ ∂z_{s+W−1−i}        ∂w_i = Σ_{b,t} ∂z_t ⊙ x_{t−W+1+i}

torch's depthwise conv1d wants [B, C, T]: between the layer's projections and the op that costs a copy each way and a
depthwise kernel at about a tenth of the copy bandwidth (benchmarks/NOTES.md, "The layer's layout"). Here one program
takes a [BT, BC] tile of one sequence and reads its W − 1 earlier rows from the cache. The backward runs in two
kernels: the first writes ∂z (float32) and each tile's share of ∂w, the second gathers ∂x from W shifted rows of ∂z
(one kernel that recomputed ∂z at every shift took 1.3 ms at [8, 2048, 2048] on an H100, more than torch's
backward). The tiles' partial sums of ∂w are added by torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILES = (64, 128, 4)  # (BT, BC, warps): a program's tile of tokens × channels and its warps. Measured on an H100
# (bench_short_conv.py, call 11): forward+backward 351 µs at [8, 2048, 2048] against 386 for [32, 128], 417 for [32, 64]
# and 525 for [16, 128]; its forward within 6 µs (9%) of the best (58 µs)


@triton.jit
def _conv_tile(x, w, o_t, o_c, m_c, base, T, C, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """z [BT, BC] (float32) at rows o_t, channels o_c of the sequence that starts at element `base`."""
    z = tl.zeros([BT, BC], dtype=tl.float32)
    for i in tl.static_range(W):
        src = o_t - (W - 1) + i
        m = ((src >= 0) & (src < T))[:, None] & m_c[None, :]
        xi = tl.load(x + base + src[:, None] * C + o_c[None, :], mask=m, other=0.0).to(tl.float32)
        z += xi * tl.load(w + o_c * W + i, mask=m_c, other=0.0).to(tl.float32)[None, :]
    return z


@triton.jit
def short_conv_fwd_kernel(x, w, y, T, C, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """y = SiLU(causal depthwise conv of x), one [BT, BC] tile of sequence program_id(2)."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t, o_c = i_t * BT + tl.arange(0, BT), i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    base = i_b.to(tl.int64) * T * C
    z = _conv_tile(x, w, o_t, o_c, m_c, base, T, C, W, BT, BC)
    m = (o_t < T)[:, None] & m_c[None, :]
    tl.store(y + base + o_t[:, None] * C + o_c[None, :], (z * tl.sigmoid(z)).to(y.dtype.element_ty), mask=m)


@triton.jit
def short_conv_dz_kernel(x, w, dy, dz, dw_part, T, C, NT, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """∂z = ∂y ⊙ SiLU'(z) on one [BT, BC] tile (z recomputed), stored in float32, and the tile's share of ∂w into
    dw_part [B·NT, C, W] (float32)."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t, o_c = i_t * BT + tl.arange(0, BT), i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    base = i_b.to(tl.int64) * T * C
    m = (o_t < T)[:, None] & m_c[None, :]
    z = _conv_tile(x, w, o_t, o_c, m_c, base, T, C, W, BT, BC)
    s = tl.sigmoid(z)
    dy_t = tl.load(dy + base + o_t[:, None] * C + o_c[None, :], mask=m, other=0.0).to(tl.float32)
    g = dy_t * s * (1.0 + z * (1.0 - s))
    tl.store(dz + base + o_t[:, None] * C + o_c[None, :], g, mask=m)
    for i in tl.static_range(W):  # ∂w_i = Σ_t ∂z_t x_{t−W+1+i}
        src = o_t - (W - 1) + i
        mi = ((src >= 0) & (src < T))[:, None] & m_c[None, :]
        xi = tl.load(x + base + src[:, None] * C + o_c[None, :], mask=mi, other=0.0).to(tl.float32)
        tl.store(dw_part + ((i_b * NT + i_t) * C + o_c) * W + i, tl.sum(g * xi, axis=0), mask=m_c)


@triton.jit
def short_conv_dx_kernel(dz, w, dx, T, C, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """∂x_s = Σ_i w_i ⊙ ∂z_{s+W−1−i} on one [BT, BC] tile (∂z_t = 0 for t ≥ T)."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_s, o_c = i_t * BT + tl.arange(0, BT), i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    base = i_b.to(tl.int64) * T * C
    g = tl.zeros([BT, BC], dtype=tl.float32)
    for i in tl.static_range(W):
        src = o_s + (W - 1 - i)
        m = (src < T)[:, None] & m_c[None, :]
        g += tl.load(dz + base + src[:, None] * C + o_c[None, :], mask=m, other=0.0) * \
            tl.load(w + o_c * W + i, mask=m_c, other=0.0).to(tl.float32)[None, :]
    tl.store(dx + base + o_s[:, None] * C + o_c[None, :], g.to(dx.dtype.element_ty),
             mask=(o_s < T)[:, None] & m_c[None, :])


class ShortConvFunction(torch.autograd.Function):
    """y = SiLU(causal depthwise conv(x; w)): x [B, T, C] contiguous, w [C, W] → y [B, T, C] in x's dtype."""

    @staticmethod
    def forward(ctx, x, w, tiles):
        B, T, C = x.shape
        BT, BC, warps = tiles
        y = torch.empty_like(x)
        grid = (triton.cdiv(T, BT), triton.cdiv(C, BC), B)
        short_conv_fwd_kernel[grid](x, w, y, T, C, W=w.shape[1], BT=BT, BC=BC, num_warps=warps)
        ctx.save_for_backward(x, w)
        ctx.tiles = tiles
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        B, T, C = x.shape
        (BT, BC, warps), W = ctx.tiles, w.shape[1]
        NT = triton.cdiv(T, BT)
        grid = (NT, triton.cdiv(C, BC), B)
        dz = torch.empty(B, T, C, dtype=torch.float32, device=x.device)
        dw_part = torch.empty(B * NT, C, W, dtype=torch.float32, device=x.device)
        short_conv_dz_kernel[grid](x, w, dy.contiguous(), dz, dw_part, T, C, NT, W=W, BT=BT, BC=BC, num_warps=warps)
        dx = torch.empty_like(x)
        short_conv_dx_kernel[grid](dz, w, dx, T, C, W=W, BT=BT, BC=BC, num_warps=warps)
        return dx, dw_part.sum(0).to(w.dtype), None


def short_conv(x: torch.Tensor, weight: torch.Tensor, tiles: tuple[int, int, int] = TILES) -> torch.Tensor:
    """SiLU(causal depthwise conv over time) of x [B, T, C] with nn.Conv1d's depthwise weight [C, 1, W] (or [C, W]),
    the same function as ShortConv's torch path; y [B, T, C] contiguous, in x's dtype. `tiles` = (BT, BC, warps):
    powers of two, the launch of every kernel (benchmarks/bench_short_conv.py --tiles compares them)."""
    if x.dim() != 3:
        raise ValueError(f"x: expected [B, T, C], got shape {list(x.shape)}")
    if not x.is_floating_point() or not weight.is_floating_point():
        raise ValueError(f"x and weight: expected floating-point tensors, got {x.dtype} and {weight.dtype}")
    if weight.dim() not in (2, 3) or weight.shape[0] != x.shape[2] or (weight.dim() == 3 and weight.shape[1] != 1):
        raise ValueError(f"weight: expected [C, 1, W] with C = {x.shape[2]} (x's channels), got {list(weight.shape)}")
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    if w.device != x.device:
        raise ValueError(f"weight is on {w.device}, x on {x.device}")
    if len(tiles) != 3 or any(not isinstance(n, int) or n < 1 or n & (n - 1) for n in tiles):
        raise ValueError(f"tiles: expected (BT, BC, warps), powers of two, got {tiles}")
    return ShortConvFunction.apply(x.contiguous(), w.contiguous(), tuple(tiles))

"""osdn_fast.nn.short_conv (Triton; the CPU interpreter without a GPU) against the layer's torch path in float64:
y = SiLU(causal depthwise conv), ∂x and ∂w, at random batch, length (shorter than the filter included), channels
(off the tile), filter widths and launch tiles; 16-bit inputs against the float64 result; and its input checks."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from osdn_fast.nn.layer import ShortConv  # noqa: E402
from osdn_fast.nn.short_conv import TILES, short_conv  # noqa: E402
from osdn_ref.checks import rel_err  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BT, BC, _ = TILES


def reference(x, weight, dy):
    """y, ∂x, ∂w of the torch path (conv1d on [B, C, T]) in float64."""
    conv = ShortConv(x.shape[2], weight.shape[-1], kernel="ref").double()
    with torch.no_grad():
        conv.conv.weight.copy_(weight)
    x = x.double().requires_grad_()
    y = conv(x)
    dx, dw = torch.autograd.grad(y, (x, conv.conv.weight), dy.double())
    return y, dx, dw


@settings(max_examples=12)
@given(B=st.integers(1, 2), T=st.integers(1, BT + 9), C=st.integers(1, BC + 5), W=st.integers(2, 5),
       tiles=st.sampled_from([TILES, (16, 32, 1), (64, 128, 8)]), seed=st.integers(0, 2**16))
def test_matches_torch_conv(B, T, C, W, tiles, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen)
    weight = torch.randn(C, 1, W, generator=gen) / W**0.5
    dy = torch.randn(B, T, C, generator=gen)
    y_ref, dx_ref, dw_ref = reference(x, weight, dy)
    xs, ws = x.to(DEVICE).requires_grad_(), weight.to(DEVICE).requires_grad_()
    y = short_conv(xs, ws, tiles)
    dx, dw = torch.autograd.grad(y, (xs, ws), dy.to(DEVICE))
    assert y.shape == (B, T, C) and y.is_contiguous() and dw.shape == weight.shape
    assert rel_err(y.cpu(), y_ref) < 1e-5
    assert rel_err(dx.cpu(), dx_ref) < 1e-5
    assert rel_err(dw.cpu(), dw_ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    B, T, C, W = 2, 2 * BT + 3, BC + 17, 4
    x, weight, dy = (torch.randn(*s, generator=gen).to(dtype) for s in ((B, T, C), (C, 1, W), (B, T, C)))
    y_ref, dx_ref, dw_ref = reference(x.double(), weight.double(), dy.double())
    xs, ws = x.to(DEVICE).requires_grad_(), weight.to(DEVICE).requires_grad_()
    y = short_conv(xs, ws)
    dx, dw = torch.autograd.grad(y, (xs, ws), dy.to(DEVICE))
    assert y.dtype == dx.dtype == dw.dtype == dtype
    # fla's 16-bit tolerances (relative RMSE): 0.006 outputs, 0.008 gradients; the inputs are exact in both
    for got, want, tol in ((y, y_ref, 0.006), (dx, dx_ref, 0.008), (dw, dw_ref, 0.008)):
        assert rel_err(got.cpu(), want) < tol


def test_strided_input_is_taken_as_its_values():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 9, generator=gen).transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, C], stride 1 on T
    weight = torch.randn(9, 1, 4, generator=gen)
    y = short_conv(x.to(DEVICE), weight.to(DEVICE))
    y_ref, _, _ = reference(x.contiguous(), weight, torch.zeros(2, 7, 9))
    assert rel_err(y.cpu(), y_ref) < 1e-5


def test_bad_input_names_the_argument():
    x = torch.zeros(1, 4, 6, device=DEVICE)
    with pytest.raises(ValueError, match="x: expected"):
        short_conv(x[0], torch.zeros(6, 1, 4, device=DEVICE))
    with pytest.raises(ValueError, match="weight: expected"):
        short_conv(x, torch.zeros(5, 1, 4, device=DEVICE))
    with pytest.raises(ValueError, match="weight: expected"):
        short_conv(x, torch.zeros(6, 2, 4, device=DEVICE))               # not depthwise
    with pytest.raises(ValueError, match="floating-point"):
        short_conv(x.int(), torch.zeros(6, 1, 4, device=DEVICE))
    for tiles in ((32, 128), (32, 100, 4), (0, 128, 4), (32.0, 128, 4)):
        with pytest.raises(ValueError, match="tiles: expected"):
            short_conv(x, torch.zeros(6, 1, 4, device=DEVICE), tiles)

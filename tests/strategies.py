"""Hypothesis strategies shared by the test suite: OSDN problems (SPEC §4) of modest size.

Hypothesis draws the *structure* (sizes, flags, which gates, which options) and one integer seed; the
tensors come from a seeded torch.Generator. That keeps shrinking meaningful (a failure shrinks to the
smallest shape and the simplest options) while drawing tensors stays fast.

Value ranges keep every problem well conditioned, so that a mismatch means a bug and not round-off:
keys are L2-normalised (the layer's convention, SPEC §1), β ∈ [0.05, 1], log-decays g ∈ [-1, 0]
(sometimes exactly 0), retention r ∈ [0.5, 1] (sometimes exactly 1), η ∈ [0, 1] (sometimes exactly 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from hypothesis import settings
from hypothesis import strategies as st

DTYPES = (torch.float64, torch.float32)
DIMS = (1, 2, 3, 4, 5, 7, 8, 12, 16)  # K and V, including non powers of two
CHUNK_SIZES = (1, 2, 3, 4, 5, 8, 16, 32, 64)

# T from 1 to a few hundred; most draws short (fast), some long (many chunks, T not a multiple of C).
lengths = st.one_of(st.integers(1, 24), st.integers(25, 96), st.integers(97, 300))
chunk_sizes = st.sampled_from(CHUNK_SIZES)


def examples(percent: int) -> settings:
    """A fraction of the loaded profile's max_examples (for the slower tests), at least 2."""
    return settings(max_examples=max(2, settings.default.max_examples * percent // 100))


@dataclass
class Problem:
    """One OSDN call: the tensors, the keyword options and the chunk size."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    options: dict = field(default_factory=dict)  # eta, g, r, scale, initial_state, d_min, d_max, beta_aware, normalize
    chunk_size: int = 64

    @property
    def dims(self):
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    def args(self):
        return self.q, self.k, self.v, self.beta

    def with_options(self, **changes) -> "Problem":
        return replace(self, options={**self.options, **changes})


def _uniform(gen, shape, lo, hi, dtype):
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype)


def make_tensors(seed, B, T, H, K, V, dtype):
    """q, v ~ N(0, 1); k L2-normalised over K; β ∈ [0.05, 1]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    beta = _uniform(gen, (B, T, H), 0.05, 1.0, torch.float64)
    return gen, tuple(x.to(dtype) for x in (q, k, v, beta))


@st.composite
def etas(draw, H: int, dtype=torch.float64, allow_zero=True):
    """η: a float, or a per-head tensor [H]; either may be exactly 0."""
    kind = draw(st.sampled_from(["zero", "float", "tensor"] if allow_zero else ["float", "tensor"]))
    if kind == "zero":
        return draw(st.sampled_from([0.0, torch.zeros(H, dtype=dtype)]))
    if kind == "float":
        return draw(st.floats(0.01, 1.0))
    values = draw(st.lists(st.sampled_from([0.0, 0.003, 0.1, 0.5, 1.0]) | st.floats(0.0, 1.0),
                           min_size=H, max_size=H))
    return torch.tensor(values, dtype=dtype)


@st.composite
def problems(
    draw,
    dtypes=DTYPES,
    T=lengths,
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    K=st.sampled_from(DIMS),
    V=st.sampled_from(DIMS),
    gates=("none", "gdn", "kda"),
    retention=True,
    clip=True,
    initial_state=True,
    eta=None,
):
    """A random OSDN problem with every option of SPEC §4 (each can be switched off by the caller)."""
    B, T, H, K, V = draw(B), draw(T), draw(H), draw(K), draw(V)
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    gen, (q, k, v, beta) = make_tensors(seed, B, T, H, K, V, dtype)

    options = dict(eta=draw(eta if eta is not None else etas(H, dtype)))
    gate = draw(st.sampled_from(gates))
    if gate != "none":
        shape = (B, T, H) if gate == "gdn" else (B, T, H, K)
        g = _uniform(gen, shape, -1.0, 0.0, dtype)
        if draw(st.booleans()):
            g = g * (torch.rand(shape, generator=gen) < 0.7).to(dtype)  # some exact zeros: no decay
        options["g"] = g
    if retention and draw(st.booleans()):
        r = _uniform(gen, (B, T, H), 0.5, 1.0, dtype)
        if draw(st.booleans()):
            r = torch.where(torch.rand((B, T, H), generator=gen) < 0.3, torch.ones_like(r), r)
        options["r"] = r
    if clip:
        options["d_min"] = draw(st.none() | st.sampled_from([0.0, 2 / 3, 0.9]))
        options["d_max"] = draw(st.none() | st.sampled_from([1.1, 1.5, 3.0]))
    if initial_state and draw(st.booleans()):
        S0 = (0.5 * torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)).to(dtype)
        d0 = _uniform(gen, (B, H, K), 0.5, 1.5, dtype)
        options["initial_state"] = (draw(st.sampled_from([S0, None])), draw(st.sampled_from([d0, None])))
    options["scale"] = draw(st.sampled_from([None, 1.0, 0.3]))
    options["beta_aware"] = draw(st.booleans())
    options["normalize"] = draw(st.booleans())
    return Problem(q, k, v, beta, options, chunk_size=draw(chunk_sizes))

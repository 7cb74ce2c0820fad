"""Input checks of SPEC §4, shared by `osdn_ref` and `osdn_fast`.

Every malformed input raises a `ValueError` that names the argument and the expected shape, before any
computation (and so before any kernel launch) happens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


_UNCHUNKED = object()  # chunk_size of an op that has none (the token loop)


@dataclass(frozen=True)
class Dims:
    """Sizes of one call: batch B, length T, heads H, key dim K, value dim V, sequences N."""

    B: int
    T: int
    H: int
    K: int
    V: int
    N: int


def _shape(x: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in x.shape) + "]"


def _need_tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not (x.is_floating_point()):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def _need_shape(name: str, x: torch.Tensor, expected: tuple[int, ...], spelled: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {spelled} = {list(expected)}, got {_shape(x)}")


def validate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    eta,
    g: torch.Tensor | None = None,
    r: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state=None,
    d_min: float | None = None,
    d_max: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size=_UNCHUNKED,
    max_k: int | None = None,
    max_v: int | None = None,
) -> Dims:
    """Check every argument of `recurrent_osdn` / `chunk_osdn` (SPEC §4) and return the sizes."""
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        _need_tensor(name, x)
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, T, H, K] (rank 4), got {_shape(q)}")
    B, T, H, K = q.shape
    _need_shape("k", k, (B, T, H, K), "[B, T, H, K] like q")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] = [{B}, {T}, {H}, V], got {_shape(v)}")
    V = v.shape[3]
    if T == 0 or H == 0 or K == 0 or V == 0 or B == 0:
        raise ValueError(f"q, k, v must be non-empty, got q {_shape(q)} and v {_shape(v)}")
    _need_shape("beta", beta, (B, T, H), "[B, T, H]")

    if g is not None:
        _need_tensor("g", g)
        if tuple(g.shape) not in ((B, T, H), (B, T, H, K)):
            raise ValueError(
                f"g must have shape [B, T, H] = {[B, T, H]} (GDN) or [B, T, H, K] = {[B, T, H, K]} (KDA), "
                f"got {_shape(g)}"
            )
    if r is not None:
        _need_tensor("r", r)
        _need_shape("r", r, (B, T, H), "[B, T, H]")

    if isinstance(eta, torch.Tensor):
        _need_tensor("eta", eta)
        if tuple(eta.shape) not in ((H,), ()):
            raise ValueError(f"eta must be a float or a tensor of shape [H] = [{H}], got {_shape(eta)}")
    elif isinstance(eta, (int, float)) and not isinstance(eta, bool):
        if not math.isfinite(eta):
            raise ValueError(f"eta must be finite, got {eta}")
    else:
        raise ValueError(f"eta must be a float or a tensor of shape [H] = [{H}], got {type(eta).__name__}")

    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float or None, got {scale!r}")
    if d_min is not None and d_max is not None and d_min > d_max:
        raise ValueError(f"d_min must not exceed d_max, got d_min={d_min}, d_max={d_max}")
    if chunk_size is not _UNCHUNKED and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool)
                                         or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

    N = B
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
            raise ValueError("cu_seqlens must be a 1-D integer tensor of shape [N+1]")
        if cu_seqlens.device != q.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}: "
                             "all inputs must share one device")
        if B != 1:
            raise ValueError(f"cu_seqlens needs q of shape [1, T, H, K] (packed sequences), got batch B = {B}")
        if cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must have shape [N+1] with N >= 1, got {_shape(cu_seqlens)}")
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != T:
            raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {bounds[0]} ... {bounds[-1]}")
        if any(b <= a for a, b in zip(bounds[:-1], bounds[1:])):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {bounds}")
        N = len(bounds) - 1

    if initial_state is not None:
        if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
            raise ValueError("initial_state must be None or a pair (S0 [N, H, K, V], d0 [N, H, K])")
        S0, d0 = initial_state
        if S0 is not None:
            _need_tensor("initial_state[0] (S0)", S0)
            _need_shape("initial_state[0] (S0)", S0, (N, H, K, V), "[N, H, K, V]")
        if d0 is not None:
            _need_tensor("initial_state[1] (d0)", d0)
            _need_shape("initial_state[1] (d0)", d0, (N, H, K), "[N, H, K]")

    if max_k is not None and K > max_k:
        raise ValueError(f"q and k: key dim K = {K} exceeds the largest this kernel supports ({max_k})")
    if max_v is not None and V > max_v:
        raise ValueError(f"v: value dim V = {V} exceeds the largest this kernel supports ({max_v})")

    device = q.device
    named = [("k", k), ("v", v), ("beta", beta), ("g", g), ("r", r), ("cu_seqlens", cu_seqlens)]
    if isinstance(eta, torch.Tensor):
        named.append(("eta", eta))
    if initial_state is not None:
        named += [("initial_state[0] (S0)", initial_state[0]), ("initial_state[1] (d0)", initial_state[1])]
    for name, x in named:
        if x is not None and x.device != device:
            raise ValueError(f"{name} is on {x.device} but q is on {device}: all inputs must share one device")
    return Dims(B=B, T=T, H=H, K=K, V=V, N=N)


def sequence_bounds(dims: Dims, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of each of the N sequences: B rows, or the packed segments of `cu_seqlens`."""
    if cu_seqlens is None:
        return [(n, 0, dims.T) for n in range(dims.B)]
    bounds = cu_seqlens.tolist()
    return [(0, a, b) for a, b in zip(bounds[:-1], bounds[1:])]

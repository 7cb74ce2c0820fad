"""The `check` of the book's ladder: relative error of a result against its reference, against a tolerance."""
from __future__ import annotations

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64 (fla's relative RMSE); 0-norm references compare absolutely."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {list(a.shape)} vs {list(e.shape)}")
    if not torch.isfinite(a).all():
        return float("inf")
    denom = e.norm().item()
    return (a - e).norm().item() / (denom if denom > 0 else 1.0)


def check(label: str, actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """Raise AssertionError unless rel_err(actual, expected) <= tol; print a stable one-line verdict."""
    err = rel_err(actual, expected)
    if not err <= tol:
        raise AssertionError(f"{label}: relative error {err:.3e} exceeds {tol:.0e}")
    print(f"ok  {label}: relative error below {tol:.0e}")

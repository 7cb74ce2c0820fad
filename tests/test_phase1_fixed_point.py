"""The study behind NOTES.md's proposal for a parallel, exact phase 1 with the clip
(benchmarks/phase1_fixed_point.py): clamped affine maps compose associatively, the log-depth scan equals the
token loop, and the chunkwise fixed point equals osdn_ref's sequential scan."""
import importlib.util
from pathlib import Path

import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "phase1_fixed_point.py"
spec = importlib.util.spec_from_file_location("phase1_fixed_point", PATH)
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)


def random_maps(n, K, gen):
    lo = 0.3 + 0.4 * torch.rand(n, K, generator=gen, dtype=torch.float64)
    return (torch.rand(n, K, generator=gen, dtype=torch.float64), torch.randn(n, K, generator=gen, dtype=torch.float64),
            lo, lo + torch.rand(n, K, generator=gen, dtype=torch.float64))


def apply(f, x):
    a, c, lo, hi = f
    return torch.minimum(torch.maximum(a * x + c, lo), hi)


def test_composition_is_associative_and_exact():
    gen = torch.Generator().manual_seed(0)
    f, g, h = (tuple(t[i] for t in random_maps(3, 50, gen)) for i in range(3))
    x = torch.randn(50, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(apply(fp.compose(f, g), x), apply(g, apply(f, x)), rtol=0, atol=1e-15)
    left, right = fp.compose(fp.compose(f, g), h), fp.compose(f, fp.compose(g, h))
    for u, v in zip(left, right):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-14)


def test_scan_equals_the_token_loop():
    """out[t] = maps[t]∘…∘maps[0]: applied to x0 it gives the loop's state after token t."""
    gen = torch.Generator().manual_seed(1)
    maps = random_maps(37, 8, gen)
    x0 = torch.randn(8, generator=gen, dtype=torch.float64)
    scanned = fp.inclusive_scan(maps)
    x = x0
    for t in range(37):
        x = apply(tuple(m[t] for m in maps), x)
        torch.testing.assert_close(apply(tuple(m[t] for m in scanned), x0), x, rtol=0, atol=1e-14)


def test_fixed_point_matches_the_sequential_scan():
    for apf in (False, True):
        run = fp.study(T=200, K=16, eta=0.5, apf=apf, keys="repeated", seed=3)
        assert run["err"] < 1e-13 and 0 < max(run["sweeps"]) <= 65
    assert fp.study(T=200, K=16, eta=0.5, apf=True, keys="random", seed=4)["clipped"] > 0.5

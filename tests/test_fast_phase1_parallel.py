"""The chunk-parallel fixed-point forward of phase 1 (osdn_fast/ops/phase1_parallel.py) against the sequential
scan, clip included (tight bounds, so that it acts): d_t, the final d and k̃ agree to float32 rounding."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from osdn_fast.ops.phase1 import phase1_fwd_seq  # noqa: E402
from osdn_fast.ops.phase1_parallel import phase1_fwd_parallel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [  # (B, T, H, K, clip, apf, beta_aware, normalize, d0, chunk)
    (2, 100, 2, 32, True, False, True, True, False, 64),
    (2, 100, 2, 32, True, True, True, True, True, 16),
    (1, 64, 1, 16, False, False, True, True, False, 16),
    (1, 64, 1, 16, False, True, False, False, True, 32),
    (1, 77, 2, 20, True, True, False, True, True, 64),
    (3, 33, 1, 128, True, False, True, True, False, 32),
]


@pytest.mark.parametrize("B,T,H,K,clip,apf,beta_aware,normalize,d0,chunk", CASES)
def test_fixed_point_matches_the_sequential_scan(B, T, H, K, clip, apf, beta_aware, normalize, d0, chunk):
    gen = torch.Generator().manual_seed(B * 1000 + T + K)
    k = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1) if normalize else 0.5 * k
    beta = torch.rand(B, T, H, generator=gen)
    r = 0.8 + 0.2 * torch.rand(B, T, H, generator=gen) if apf else None
    dd0 = 0.8 + 0.4 * torch.rand(B, H, K, generator=gen) if d0 else None
    eta = torch.full((H,), 0.5)
    to = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    kw = dict(d_min=0.9 if clip else None, d_max=1.01 if clip else None, beta_aware=beta_aware,
              normalize=normalize, cu_seqlens=None, store_kt=True)
    seq = phase1_fwd_seq(to(k), to(beta), to(r), to(dd0), to(eta), **kw)
    par = phase1_fwd_parallel(to(k), to(beta), to(r), to(dd0), to(eta), chunk_size=chunk, **kw)
    for a, b in zip(seq, par):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    if clip:
        assert ((seq[0] <= 0.9 + 1e-7) | (seq[0] >= 1.01 - 1e-7)).any(), "the clip never acts: a weak test"


def test_packed_sequences_and_zero_retention():
    gen = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, 5, 70, 71, 130], dtype=torch.int32)
    k = torch.nn.functional.normalize(torch.randn(1, 130, 2, 32, generator=gen), dim=-1)
    beta = torch.rand(1, 130, 2, generator=gen)
    for r in (0.5 + 0.5 * torch.rand(1, 130, 2, generator=gen), torch.zeros(1, 130, 2)):
        kw = dict(d_min=2 / 3, d_max=1.5, beta_aware=True, normalize=True, cu_seqlens=cu.to(DEVICE))
        args = [x.to(DEVICE) for x in (k, beta, r)] + [None, torch.full((2,), 0.3, device=DEVICE)]
        seq = phase1_fwd_seq(*args, **kw)
        par = phase1_fwd_parallel(*args, chunk_size=32, **kw)
        torch.testing.assert_close(par[0], seq[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(par[1], seq[1], rtol=1e-5, atol=1e-5)


BWD_CASES = [  # (B, T, H, K, clip, apf, beta_aware, normalize, fused, chunk)
    (1, 40, 1, 16, True, True, True, True, False, 16),
    (2, 70, 2, 32, True, False, True, True, True, 32),
    (1, 64, 1, 16, False, True, False, False, True, 64),
    (1, 33, 2, 20, True, True, True, False, False, 16),
    (2, 50, 1, 128, False, False, True, True, False, 64),
]


@pytest.mark.parametrize("B,T,H,K,clip,apf,beta_aware,normalize,fused,chunk", BWD_CASES)
def test_parallel_reverse_scan_matches_the_sequential_one(B, T, H, K, clip, apf, beta_aware, normalize, fused, chunk):
    from osdn_fast.ops.phase1 import phase1_bwd_seq
    from osdn_fast.ops.phase1_parallel import phase1_bwd_parallel

    gen = torch.Generator().manual_seed(T * 7 + K)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    k = rnd(B, T, H, K)
    k = torch.nn.functional.normalize(k, dim=-1) if normalize else 0.5 * k
    beta = torch.rand(B, T, H, generator=gen).to(DEVICE)
    r = (0.8 + 0.2 * torch.rand(B, T, H, generator=gen)).to(DEVICE) if apf else None
    eta = torch.full((H,), 0.5, device=DEVICE)
    kw = dict(d_min=0.9 if clip else None, d_max=1.01 if clip else None, beta_aware=beta_aware,
              normalize=normalize, cu_seqlens=None)
    d_all, d_final, _ = phase1_fwd_seq(k, beta, r, None, eta, **kw)
    gd_all, gd_final = rnd(B, T, H, K), rnd(*d_final.shape)
    p2 = (rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H)) if fused else None
    seq = phase1_bwd_seq(k, beta, r, eta, d_all, None if fused else gd_all, gd_final, phase2_grads=p2, **kw)
    par = phase1_bwd_parallel(k, beta, r, eta, d_all, None if fused else gd_all, gd_final, phase2_grads=p2,
                              chunk_size=chunk, **kw)
    for name, a, b in zip(("dk", "dbeta", "dr", "dd0", "deta"), seq, par):
        if a is None:
            assert b is None, name
            continue
        scale = a.float().abs().max().clamp_min(1e-30)
        assert ((b.float() - a.float()).abs().max() / scale).item() < 1e-5, name


def test_parallel_reverse_scan_packed():
    from osdn_fast.ops.phase1 import phase1_bwd_seq
    from osdn_fast.ops.phase1_parallel import phase1_bwd_parallel

    gen = torch.Generator().manual_seed(11)
    cu = torch.tensor([0, 5, 70, 71, 130], dtype=torch.int32, device=DEVICE)
    k = torch.nn.functional.normalize(torch.randn(1, 130, 2, 32, generator=gen), dim=-1).to(DEVICE)
    beta = torch.rand(1, 130, 2, generator=gen).to(DEVICE)
    r = (0.5 + 0.5 * torch.rand(1, 130, 2, generator=gen)).to(DEVICE)
    eta = torch.full((2,), 0.3, device=DEVICE)
    kw = dict(d_min=2 / 3, d_max=1.5, beta_aware=True, normalize=True, cu_seqlens=cu)
    d_all, d_final, _ = phase1_fwd_seq(k, beta, r, None, eta, **kw)
    gd_all, gd_final = torch.randn_like(d_all), torch.randn_like(d_final)
    seq = phase1_bwd_seq(k, beta, r, eta, d_all, gd_all, gd_final, **kw)
    par = phase1_bwd_parallel(k, beta, r, eta, d_all, gd_all, gd_final, chunk_size=32, **kw)
    for a, b in zip(seq, par):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)

"""What phase 1's two kernel families share (sequential: phase1.py; chunk-parallel: phase1_parallel.py): the
token range of a sequence, the constexpr flags, and the allocation and launch of the forward and the backward.
Both families take the same arguments, one program per (sequence, head)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from osdn_ref import EPS


@triton.jit
def seq_bounds(cu_seqlens, n, T, IS_VARLEN: tl.constexpr):
    """Token range [bos, eos) of sequence n in the flattened [B*T] token axis."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    else:
        bos = n.to(tl.int64) * T
        eos = bos + T
    return bos, eos


def wide_index(k) -> bool:
    """Whether an offset into k [B, T, H, K] may exceed int32: the sequential scans then keep token indices in int64
    (their WIDE_INDEX); otherwise 32-bit indices take 7% of the instructions out of each token's dependent chain."""
    return k.numel() > 2**31 - 1


def block_k(K: int) -> int:
    return max(16, triton.next_power_of_2(K))


def _common(k, r, d_min, d_max, beta_aware, normalize, cu_seqlens):
    """(N, H, the runtime scalars after the pointers, the shared constexprs)."""
    B, T, H, K = k.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    scalars = (T, H, K, EPS, 0.0 if d_min is None else float(d_min), 0.0 if d_max is None else float(d_max))
    flags = dict(HAS_R=r is not None, BETA_AWARE=beta_aware, NORMALIZE=normalize, HAS_MIN=d_min is not None,
                 HAS_MAX=d_max is not None, IS_VARLEN=cu_seqlens is not None, BK=block_k(K))
    return N, H, scalars, flags


def launch_fwd(kernel, k, beta, r, d0, eta, *, d_min, d_max, beta_aware, normalize, cu_seqlens, store_kt, out=None,
               store_d=True, **launch):
    """(d_all [B, T, H, K] float32 or None without `store_d`, d_final [N, H, K] float32, k̃ = d ⊙ k in k's dtype
    or None without `store_kt`), new or `out`; `launch` holds the family's own arguments, constexprs and launch
    options (a kernel that can skip d_all takes STORE_D there)."""
    N, H, scalars, flags = _common(k, r, d_min, d_max, beta_aware, normalize, cu_seqlens)
    if out is not None:
        d_all, d_final, kt = out
    else:
        d_all = torch.empty(k.shape, dtype=torch.float32, device=k.device) if store_d else None
        d_final = torch.empty(N, H, k.shape[3], dtype=torch.float32, device=k.device)
        kt = torch.empty_like(k) if store_kt else None
    kernel[(N, H)](
        k, beta, r if r is not None else beta, d0 if d0 is not None else d_final, eta,
        d_all if d_all is not None else d_final, d_final,
        kt if store_kt else d_final, cu_seqlens if cu_seqlens is not None else d_final, *scalars,
        HAS_D0=d0 is not None, STORE_KT=store_kt, **flags, **launch,
    )
    return d_all, d_final, kt


def launch_bwd(kernel, k, beta, r, eta, d_all, gd_all, gd_final, *, d_min, d_max, beta_aware, normalize, cu_seqlens,
               phase2_grads, out=None, **launch):
    """(dk, dbeta, dr, dd0, deta [N, H]), float32 (dr None without r), new or `out`. With `phase2_grads` = (∂k̃, ∂k,
    ∂β) of phase 2 (k's and β's shapes, any float dtype, summed in float32), the fused form: ∂k and ∂β are the totals, in k's and β's dtypes."""
    N, H, scalars, flags = _common(k, r, d_min, d_max, beta_aware, normalize, cu_seqlens)
    f32 = dict(dtype=torch.float32, device=k.device)
    fused = phase2_grads is not None
    if out is not None:
        dk, dbeta, dr, dd0, deta = out
    else:
        dk = torch.empty_like(k) if fused else torch.empty(k.shape, **f32)
        if fused:
            dbeta = torch.empty_like(beta)
        else:
            dbeta = torch.empty(beta.shape, **f32) if beta_aware else torch.zeros(beta.shape, **f32)
        dr = torch.empty(beta.shape, **f32) if r is not None else None
        dd0 = torch.empty(N, H, k.shape[3], **f32)
        deta = torch.empty(N, H, **f32)
    kernel[(N, H)](
        k, beta, r if r is not None else beta, eta, d_all,
        gd_all if gd_all is not None else d_all, gd_final if gd_final is not None else dd0,
        *(phase2_grads if fused else (dd0, dd0, dd0)), cu_seqlens if cu_seqlens is not None else dd0,
        dk, dbeta, dr if dr is not None else dbeta, dd0, deta, *scalars,
        HAS_GD_ALL=gd_all is not None, HAS_GD_FINAL=gd_final is not None, FUSED=fused, **flags, **launch,
    )
    return dk, dbeta, dr, dd0, deta

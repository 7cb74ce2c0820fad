"""The helpers and fixed inputs that notebooks 06, 06b and 06c (the kernels, rung by rung) share.

Plumbing only: the notebooks derive and check; this module holds what more than one of them needs, so that each
notebook's setup cell imports it instead of repeating it. The inputs are drawn exactly as notebook 06 drew them
before it was split in three (the same generators and seeds, in the same order), so every check prints what it
printed then. Import it after choosing the device: without a GPU, Triton must see TRITON_INTERPRET=1 before
anything imports it (set below too if no one has).
"""
import contextlib
import inspect
import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton and osdn_fast are imported

import osdn_ref as ref  # noqa: E402
from osdn_fast.ops import chunk, phase1_chunk  # noqa: E402
from osdn_fast.ops.tuning import TUNING  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
f64, f32 = torch.float64, torch.float32
FWD_TOL, GRAD_TOL = 1e-5, 1e-4       # float32 kernels against the float64 oracle (notebook 06, rung 0, says why)
DATA = Path(__file__).resolve().parent / "data"


def data_file(name):
    """A committed GPU result in book/data/, wherever the notebook runs from."""
    return DATA / name


def make_inputs(B, T, H, K, V, seed):
    """float64 inputs on the CPU: queries, L2-normalised keys, values, gates beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=f64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=f64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=f64)
    beta = torch.rand(B, T, H, generator=gen, dtype=f64)
    return q, k, v, beta


def dev(x):
    """What a kernel is given: float32, contiguous, on the kernel's device."""
    return None if x is None else x.to(DEVICE, f32).contiguous()


def packed(x):
    """[B, T, H, ...] -> [1, B*T, H, ...] float32: the phase-2 kernels see a batch as B packed sequences."""
    return dev(x.reshape(1, -1, *x.shape[2:]))


def ref_chunks(x, B, C):
    """Packed [1, B*T, H, ...] of a fixed-length batch -> the reference's chunked [B, H, NC, C, ...]."""
    return ref.to_chunks(x.detach().double().cpu().reshape(B, -1, *x.shape[2:]), C)


def unchunk(x, T):
    """The reference's chunked [B, H, NC, C, ...] -> packed [1, B*T, H, ...] float32."""
    B, H = x.shape[:2]
    return packed(x.reshape(B, H, -1, *x.shape[4:])[:, :, :T].movedim(1, 2))


def show(fn, start, stop=None):
    """Print the lines of fn's source from the first line containing `start` to the one containing `stop`."""
    lines = inspect.getsource(getattr(fn, "fn", fn)).splitlines()   # a Triton kernel keeps its Python function in .fn
    i = next(n for n, line in enumerate(lines) if start in line)
    j = i if stop is None else next(n for n in range(i, len(lines)) if stop in lines[n])
    print("\n".join(lines[i : j + 1]))


def suite_ms(shape, impl, mode):
    """ms (median) of one row of version 4's benchmark suite, bench_suite_v4.json."""
    return next(r["ms"] for r in _SUITE_V4["rows"] if r["shape"] == shape and r["impl"] == impl and r["mode"] == mode)


_SUITE_V4 = json.loads(data_file("bench_suite_v4.json").read_text())

# Rung 0's problem, used throughout: 2 sequences of 45 tokens (not a multiple of the chunk length 16), 2 heads, key and
# value dimension 16, an initial state with d0 away from 1; with rung 1's APF retention r and a per-head eta.
B, T, H, K, V, C = 2, 45, 2, 16, 16, 16
q, k, v, beta = make_inputs(B, T, H, K, V, seed=0)
gen = torch.Generator().manual_seed(1)
S0 = torch.randn(B, H, K, V, generator=gen, dtype=f64)
d0 = 0.6 + 0.8 * torch.rand(B, H, K, generator=gen, dtype=f64)
r = 0.9 + 0.1 * torch.rand(B, T, H, generator=torch.Generator().manual_seed(2), dtype=f64)
eta_h = torch.tensor([0.5, 0.2], dtype=f64)                     # eta per head
del gen

# Phase 1's chunk form as versions 9 to 17 launched it (rung 1; the checks of versions 10 to 17 in rung 5 run it so).
TUNING_V17 = json.loads(data_file("gpu_validation_v17.json").read_text())["tuning"]   # versions 13 to 17's settings
P1_STAGES = ("prep", "out", "bwd_prep", "bwd_out")                                     # its four chunk-parallel kernels


@contextlib.contextmanager
def as_in_version17():
    """Phase 1's chunk form as versions 9 to 17 launched it: chunks of 64, TUNING's phase1_* entries at (64, 128)."""
    saved = chunk.PHASE1_CHUNKED["chunk_size"], phase1_chunk.TUNED_TILES, dict(TUNING)
    chunk.PHASE1_CHUNKED["chunk_size"], phase1_chunk.TUNED_TILES = 64, (64, 128)
    TUNING.clear()                 # version 17's entries only (no `_k64` ones: the rule at K = 64)
    TUNING.update(TUNING_V17)
    try:
        yield
    finally:
        chunk.PHASE1_CHUNKED["chunk_size"], phase1_chunk.TUNED_TILES = saved[:2]
        TUNING.clear()
        TUNING.update(saved[2])


def launch_str(cfg, ms=None):
    """A launch setting of phase 1's chunk kernels, KB / warps / stages, and its time."""
    return f"{cfg['KB']}/{cfg['num_warps']}/{cfg['num_stages']}" + ("" if ms is None else f"  {ms:.3f}")


# Rung 1's 150 tokens: one sequence, two chunks of 64 and a partial one, K = 128, one head, APF and d0, with a
# cotangent on every d_t and on d_T.
gen_l = torch.Generator().manual_seed(11)
Tl, Kl = 150, 128
k_l = torch.nn.functional.normalize(torch.randn(1, Tl, 1, Kl, generator=gen_l, dtype=f64), dim=-1)
beta_l = torch.rand(1, Tl, 1, generator=gen_l, dtype=f64)
r_l = 0.9 + 0.1 * torch.rand(1, Tl, 1, generator=gen_l, dtype=f64)
d0_l = 0.5 + torch.rand(1, 1, Kl, generator=gen_l, dtype=f64)
eta_l = torch.tensor([0.5], dtype=f64)
cot_l = (torch.randn(1, Tl, 1, Kl, generator=gen_l, dtype=f64), torch.randn(1, 1, Kl, generator=gen_l, dtype=f64))
del gen_l
inputs_l = (k_l, beta_l, r_l, d0_l, eta_l)
labels_l = ("d_t", "d_T", "dk", "dbeta", "dr", "dd0", "deta")


def scan_and_grads(fn, inputs):
    """d_t, d_T and the gradients (k, beta, r, d0, eta) of <d_t, w> + <d_T, w_T> (w, w_T: cot_l), for one phase-1
    function."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    d_all, d_fin = fn(*leaves)
    ((d_all.double().cpu() * cot_l[0]).sum() + (d_fin.double().cpu() * cot_l[1]).sum()).backward()
    return [d_all.detach(), d_fin.detach()] + [x.grad for x in leaves]


def reference_scan(k, beta, r, d0, eta):
    """osdn_ref's phase 1 (no clip): d_t and d_T."""
    out = ref.preconditioner_scan(k, beta, eta=eta, r=r, d0=d0)
    return out.d, out.d_final


# Rung 1's packed sequences: 90, 1 and 109 tokens (6, 1 and 7 chunks of 16, each last one partial), two heads,
# K = 24 (BK = 32: masked key lanes), APF, d0, float32, with phase 1's chunk form run on them forward and backward.
gen_w = torch.Generator().manual_seed(14)
Tw, Hw, Kw = 200, 2, 24
cu_w = torch.tensor([0, 90, 91, 200], dtype=torch.int32)
k_w = torch.nn.functional.normalize(torch.randn(1, Tw, Hw, Kw, generator=gen_w), dim=-1)
beta_w, r_w = torch.rand(1, Tw, Hw, generator=gen_w), 0.9 + 0.1 * torch.rand(1, Tw, Hw, generator=gen_w)
d0_w, eta_w = 0.5 + torch.rand(3, Hw, Kw, generator=gen_w), torch.tensor([0.5, 0.2])
gd_all_w, gd_fin_w = torch.randn(1, Tw, Hw, Kw, generator=gen_w), torch.randn(3, Hw, Kw, generator=gen_w)
del gen_w
opts_w = dict(beta_aware=True, normalize=True, cu_seqlens=cu_w.to(DEVICE), chunk_size=16, solver="blockwise")


def fwd_w(group):
    """phase1_fwd_chunk on the packed sequences, the chains walked (group None) or in groups of `group` chunks."""
    return phase1_chunk.phase1_fwd_chunk(*map(dev, (k_w, beta_w, r_w, d0_w, eta_w)), **opts_w, group=group)


def bwd_w(d_all, group):
    """phase1_bwd_chunk on the packed sequences, for the cotangents gd_all_w, gd_fin_w."""
    return phase1_chunk.phase1_bwd_chunk(*map(dev, (k_w, beta_w, r_w, eta_w)), d_all, dev(gd_all_w), dev(gd_fin_w),
                                         **opts_w, group=group)


# Rung 3: the state chain's launch on the H200, and its launch sweeps.
H200_SMS = 132                                                  # the H200's multiprocessors


def sweep_ms(sweep, stage, cfg):
    """ms of one setting (BV, warps, stages) in a launch sweep of phase 2's stages."""
    return next(x["ms"] for x in sweep["sweep"][stage]
                if (x["BV"], x["num_warps"], x["num_stages"]) == (cfg["BV"], cfg["num_warps"], cfg["num_stages"]))


def bws(cfg):
    """A launch setting of phase 2's stages: BV / warps / stages."""
    return f"{cfg['BV']}/{cfg['num_warps']}/{cfg['num_stages']}"

"""osdn_ref: the chunkwise WY form (SPEC §3) equals the token loop (SPEC §2), and both ops compose.

- recurrent vs chunk, every option, float64 to 1e-10 and float32 to F32_TOL (relative, `osdn_ref.rel_err`);
- state continuation: [0, T1) then [T1, T) from the returned state equals one run (both ops);
- varlen: packed sequences with `cu_seqlens` equal separate runs (both ops).
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from osdn_ref import chunk_osdn, recurrent_osdn, rel_err
from strategies import examples, problems

F64_TOL = 1e-10
# float32: states and accumulations in float32 over up to 300 tokens; the worst of 400 random problems was 1.7e-6.
F32_TOL = 2e-5
TOL = {torch.float64: F64_TOL, torch.float32: F32_TOL}
OPS = {"recurrent": recurrent_osdn, "chunk": chunk_osdn}


def run(op, p, **extra):
    kwargs = {**p.options, **extra}
    if op is chunk_osdn:
        kwargs.setdefault("chunk_size", p.chunk_size)
    return op(*p.args(), **kwargs)


@given(p=problems())
def test_chunk_equals_recurrent(p):
    o_ref, (S_ref, d_ref) = run(recurrent_osdn, p, output_final_state=True)
    o, (S, d) = run(chunk_osdn, p, output_final_state=True)
    tol = TOL[p.q.dtype]
    assert o.dtype == p.q.dtype and o.shape == p.v.shape
    assert rel_err(o, o_ref) <= tol
    assert rel_err(S, S_ref) <= tol
    assert rel_err(d, d_ref) <= tol


@given(p=problems(dtypes=(torch.float64,)), split=st.floats(0.0, 1.0), op=st.sampled_from(sorted(OPS)))
def test_state_continuation(p, split, op):
    B, T, H, K, V = p.dims
    T1 = min(max(1, round(split * T)), T - 1) if T > 1 else None
    if T1 is None:  # nothing to split; continue from the final state of the whole run instead
        T1 = T
    fn = OPS[op]
    o_all, (S_all, d_all) = run(fn, p, output_final_state=True)

    def part(x, lo, hi):
        return None if x is None else x[:, lo:hi]

    def sliced(lo, hi, initial_state):
        kw = {**p.options, "g": part(p.options.get("g"), lo, hi), "r": part(p.options.get("r"), lo, hi),
              "initial_state": initial_state, "output_final_state": True}
        if fn is chunk_osdn:
            kw["chunk_size"] = p.chunk_size
        return fn(*(x[:, lo:hi] for x in p.args()), **kw)

    o1, state1 = sliced(0, T1, p.options.get("initial_state"))
    assert rel_err(o1, o_all[:, :T1]) <= F64_TOL
    if T1 == T:
        assert rel_err(state1[0], S_all) <= F64_TOL and rel_err(state1[1], d_all) <= F64_TOL
        return
    o2, (S2, d2) = sliced(T1, T, state1)
    assert rel_err(torch.cat([o1, o2], dim=1), o_all) <= F64_TOL
    assert rel_err(S2, S_all) <= F64_TOL
    assert rel_err(d2, d_all) <= F64_TOL


@examples(60)
@given(p=problems(dtypes=(torch.float64,), B=st.just(1)), data=st.data(), op=st.sampled_from(sorted(OPS)))
def test_varlen_equals_separate_runs(p, data, op):
    """Pack N sequences in one row; sequence n starts from initial_state[.][n]."""
    B, T, H, K, V = p.dims
    cuts = data.draw(st.sets(st.integers(1, T - 1), max_size=4)) if T > 1 else set()
    bounds = [0, *sorted(cuts), T]
    N = len(bounds) - 1
    gen = torch.Generator().manual_seed(T)
    S0 = torch.randn(N, H, K, V, generator=gen, dtype=torch.float64)
    d0 = 0.5 + torch.rand(N, H, K, generator=gen, dtype=torch.float64)
    options = {**p.options, "initial_state": (S0, d0)}
    fn = OPS[op]
    extra = {"chunk_size": p.chunk_size} if fn is chunk_osdn else {}
    cu = torch.tensor(bounds, dtype=torch.int32)
    o, (S, d) = fn(*p.args(), cu_seqlens=cu, output_final_state=True, **options, **extra)
    assert S.shape == (N, H, K, V) and d.shape == (N, H, K)
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = {name: (x[:, a:b] if x is not None else None) for name, x in
                (("g", options.get("g")), ("r", options.get("r")))}
        state = (S0[n : n + 1], d0[n : n + 1])
        o_n, (S_n, d_n) = fn(*(x[:, a:b] for x in p.args()), **{**options, **part, "initial_state": state},
                             output_final_state=True, **extra)
        assert rel_err(o[:, a:b], o_n) <= F64_TOL
        assert rel_err(S[n : n + 1], S_n) <= F64_TOL
        assert rel_err(d[n : n + 1], d_n) <= F64_TOL


@pytest.mark.parametrize("op", sorted(OPS))
def test_low_precision_inputs_keep_float32_state(op):
    """bfloat16 in: o comes back in bfloat16, the final state in float32 (SPEC §4)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 9, 2, 4, generator=gen) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(1, 9, 2, generator=gen)
    lo = [x.to(torch.bfloat16) for x in (q, k, v, beta)]
    o, (S, d) = OPS[op](*lo, eta=0.1, output_final_state=True)
    o32, (S32, d32) = OPS[op](*[x.float() for x in lo], eta=0.1, output_final_state=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32 and d.dtype == torch.float32
    assert rel_err(S, S32) <= 1e-6 and rel_err(o, o32) <= 1e-2

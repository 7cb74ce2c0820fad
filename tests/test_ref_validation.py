"""Every malformed input of SPEC §4 raises ValueError naming the argument, before any computation.

Each case starts from one valid call and breaks exactly one thing; the message must name the argument.
"""
import re

import pytest
import torch

from osdn_ref import chunk_osdn, recurrent_osdn, validate_inputs

B, T, H, K, V = 2, 6, 3, 4, 5


def valid():
    gen = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(B, T, H, K, generator=gen),
        k=torch.randn(B, T, H, K, generator=gen),
        v=torch.randn(B, T, H, V, generator=gen),
        beta=torch.rand(B, T, H, generator=gen),
        eta=0.1,
    )


def packed():
    """One packed row of two sequences (lengths 2 and 4) for the cu_seqlens cases."""
    x = valid()
    for name in ("q", "k", "v", "beta"):
        x[name] = x[name][:1]
    x["cu_seqlens"] = torch.tensor([0, 2, T])
    return x


def S0(n=B):
    return torch.zeros(n, H, K, V)


def d0(n=B):
    return torch.ones(n, H, K)


# (case id, change to the valid call, substring the message must contain)
CASES = [
    ("q rank 3", lambda x: x.update(q=x["q"][..., 0]), "q"),
    ("q rank 5", lambda x: x.update(q=x["q"][..., None]), "q"),
    ("q integer", lambda x: x.update(q=x["q"].long()), "q"),
    ("q not a tensor", lambda x: x.update(q=x["q"].tolist()), "q"),
    ("k K differs", lambda x: x.update(k=x["k"][..., :-1]), "k"),
    ("k B differs", lambda x: x.update(k=x["k"][:1]), "k"),
    ("k T differs", lambda x: x.update(k=x["k"][:, :-1]), "k"),
    ("k H differs", lambda x: x.update(k=x["k"][:, :, :-1]), "k"),
    ("v rank 3", lambda x: x.update(v=x["v"][..., 0]), "v"),
    ("v B differs", lambda x: x.update(v=x["v"][:1]), "v"),
    ("v T differs", lambda x: x.update(v=x["v"][:, 1:]), "v"),
    ("v H differs", lambda x: x.update(v=x["v"][:, :, 1:]), "v"),
    ("empty T", lambda x: x.update(**{n: x[n][:, :0] for n in ("q", "k", "v", "beta")}), "non-empty"),
    ("beta rank 4", lambda x: x.update(beta=x["beta"][..., None]), "beta"),
    ("beta T differs", lambda x: x.update(beta=x["beta"][:, :-1]), "beta"),
    ("beta H differs", lambda x: x.update(beta=x["beta"][..., :-1]), "beta"),
    ("g rank 2", lambda x: x.update(g=torch.zeros(B, T)), "g"),
    ("g wrong K", lambda x: x.update(g=torch.zeros(B, T, H, K + 1)), "g"),
    ("g wrong T", lambda x: x.update(g=torch.zeros(B, T + 1, H)), "g"),
    ("g per value channel", lambda x: x.update(g=torch.zeros(B, T, H, V)), "g"),
    ("r per channel", lambda x: x.update(r=torch.ones(B, T, H, K)), "r"),
    ("r wrong H", lambda x: x.update(r=torch.ones(B, T, H + 1)), "r"),
    ("eta wrong H", lambda x: x.update(eta=torch.zeros(H + 1)), "eta"),
    ("eta per channel", lambda x: x.update(eta=torch.zeros(H, K)), "eta"),
    ("eta string", lambda x: x.update(eta="0.1"), "eta"),
    ("eta nan", lambda x: x.update(eta=float("nan")), "eta"),
    ("eta None", lambda x: x.update(eta=None), "eta"),
    ("scale inf", lambda x: x.update(scale=float("inf")), "scale"),
    ("d_min > d_max", lambda x: x.update(d_min=1.5, d_max=2 / 3), "d_min"),
    ("initial_state not a pair", lambda x: x.update(initial_state=S0()), "initial_state"),
    ("initial_state triple", lambda x: x.update(initial_state=(S0(), d0(), d0())), "initial_state"),
    ("S0 wrong V", lambda x: x.update(initial_state=(torch.zeros(B, H, K, V + 1), None)), "S0"),
    ("S0 wrong N", lambda x: x.update(initial_state=(S0(B + 1), None)), "S0"),
    ("S0 transposed", lambda x: x.update(initial_state=(torch.zeros(B, H, V, K), None)), "S0"),
    ("d0 wrong K", lambda x: x.update(initial_state=(None, torch.ones(B, H, K + 1))), "d0"),
    ("d0 per token", lambda x: x.update(initial_state=(None, torch.ones(B, T, H, K))), "d0"),
    ("mixed device k", lambda x: x.update(k=x["k"].to("meta")), "k"),
    ("mixed device v", lambda x: x.update(v=x["v"].to("meta")), "v"),
    ("mixed device beta", lambda x: x.update(beta=x["beta"].to("meta")), "beta"),
    ("mixed device g", lambda x: x.update(g=torch.zeros(B, T, H, device="meta")), "g"),
    ("mixed device r", lambda x: x.update(r=torch.ones(B, T, H, device="meta")), "r"),
    ("mixed device eta", lambda x: x.update(eta=torch.zeros(H, device="meta")), "eta"),
    ("mixed device S0", lambda x: x.update(initial_state=(S0().to("meta"), None)), "S0"),
    ("mixed device d0", lambda x: x.update(initial_state=(None, d0().to("meta"))), "d0"),
]

PACKED_CASES = [
    ("cu_seqlens with B = 2", lambda x: x.update(**valid(), cu_seqlens=torch.tensor([0, 2, T])), "cu_seqlens"),
    ("cu_seqlens not ending at T", lambda x: x.update(cu_seqlens=torch.tensor([0, 2, T - 1])), "cu_seqlens"),
    ("cu_seqlens past T", lambda x: x.update(cu_seqlens=torch.tensor([0, 2, T + 1])), "cu_seqlens"),
    ("cu_seqlens not starting at 0", lambda x: x.update(cu_seqlens=torch.tensor([1, 2, T])), "cu_seqlens"),
    ("cu_seqlens decreasing", lambda x: x.update(cu_seqlens=torch.tensor([0, 4, 2, T])), "cu_seqlens"),
    ("cu_seqlens repeated", lambda x: x.update(cu_seqlens=torch.tensor([0, 2, 2, T])), "cu_seqlens"),
    ("cu_seqlens float", lambda x: x.update(cu_seqlens=torch.tensor([0.0, 2.0, T])), "cu_seqlens"),
    ("cu_seqlens 2-D", lambda x: x.update(cu_seqlens=torch.tensor([[0, 2, T]])), "cu_seqlens"),
    ("cu_seqlens one entry", lambda x: x.update(cu_seqlens=torch.tensor([T])), "cu_seqlens"),
    ("cu_seqlens a list", lambda x: x.update(cu_seqlens=[0, 2, T]), "cu_seqlens"),
    ("cu_seqlens off the tensors' device",
     lambda x: x.update(**{n: x[n].to("meta") for n in ("q", "k", "v", "beta")}), "cu_seqlens"),
    ("cu_seqlens on another device", lambda x: x.update(cu_seqlens=torch.tensor([0, 2, T], device="meta")),
     "cu_seqlens"),
    ("S0 per batch row, not per sequence", lambda x: x.update(initial_state=(S0(1), None)), "S0"),
    ("d0 per batch row, not per sequence", lambda x: x.update(initial_state=(None, d0(1))), "d0"),
]

# cases about a shape, whose message must also spell the expected shape
SHAPE_CASES = {c[0] for c in CASES + PACKED_CASES
               if any(w in c[0] for w in ("rank", "differs", "wrong", "per ", "transposed", "not a pair", "triple"))}

OPS = {"recurrent": recurrent_osdn, "chunk": chunk_osdn}


def call(op, x):
    x = dict(x)
    return op(x.pop("q"), x.pop("k"), x.pop("v"), x.pop("beta"), **x)


@pytest.mark.parametrize("op", sorted(OPS))
def test_valid_calls_pass(op):
    """The starting points are valid (so each case below fails for the one thing it breaks)."""
    o, _ = call(OPS[op], valid())
    assert o.shape == (B, T, H, V)
    o, (S, d) = call(OPS[op], packed() | {"initial_state": (S0(2), d0(2)), "output_final_state": True})
    assert o.shape == (1, T, H, V) and S.shape == (2, H, K, V) and d.shape == (2, H, K)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("case, change, name", CASES + PACKED_CASES, ids=[c[0] for c in CASES + PACKED_CASES])
def test_malformed_input_raises_value_error(op, case, change, name):
    x = packed() if (case, change, name) in PACKED_CASES else valid()
    change(x)
    with pytest.raises(ValueError, match=rf"(^|\W){re.escape(name)}(\W|$)") as info:
        call(OPS[op], x)
    if case in SHAPE_CASES:
        assert "[" in str(info.value), "the message states the expected shape"


@pytest.mark.parametrize("chunk_size", [0, -1, 2.0, None, True])
def test_chunk_size_must_be_a_positive_int(chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_osdn(**valid(), chunk_size=chunk_size)


@pytest.mark.parametrize("limit, name", [("max_k", "K"), ("max_v", "V")])
def test_dims_beyond_kernel_limits(limit, name):
    """validate_inputs is shared with osdn_fast: K or V larger than a kernel supports is refused."""
    x = valid()
    size = K if limit == "max_k" else V
    assert validate_inputs(**x, **{limit: size}).K == K  # exactly at the limit is fine
    with pytest.raises(ValueError, match=name):
        validate_inputs(**x, **{limit: size - 1})


def test_validate_inputs_returns_the_sizes():
    dims = validate_inputs(**packed())
    assert (dims.B, dims.T, dims.H, dims.K, dims.V, dims.N) == (1, T, H, K, V, 2)

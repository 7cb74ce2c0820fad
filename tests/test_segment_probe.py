"""benchmarks/segment_probe.py's segmented forward is the whole op (CPU interpreter, float32, one stream): phase 1's d
and phase 2's S carried from segment to segment give chunk_osdn's output, in the sequential form of phase 1 (short
segments) and in its chunk form with d and k̃ formed by phase 2's Gram (segments of 256 tokens, few chains), its chains
walked chunk by chunk or in groups of chunks (segments of 1024 tokens)."""
import importlib.util
from pathlib import Path

import pytest
import torch

import osdn_fast.ops.chunk as chunk_ops

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("segment_probe", ROOT / "benchmarks" / "segment_probe.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


@pytest.mark.parametrize("shape,n,apf,form,groups", [("2x128x2x32", 2, False, "sequential", None),
                                                     ("1x512x2x32", 2, False, "chunked", None),
                                                     ("1x512x2x32", 2, True, "chunked", None),
                                                     ("1x2048x2x32", 2, False, "chunked", (8, 4))])
def test_segments_give_the_whole_op(shape, n, apf, form, groups):
    """`groups`: the chains walk groups of chunks (phase1_group), of this many chunks in the whole op and in a segment:
    the carry then enters the second segment's walk where the whole op's walk passes a group boundary (on the H100 the
    probe's bf16 outputs differed by 3e-3 there, its maps in TF32; in float32 here the cut must change nothing)."""
    x = probe.inputs(shape, apf, torch.device("cpu"), dtype=torch.float32, seed=1)
    B, T, H, _ = x["k"].shape
    assert chunk_ops.phase1_form(T / n, x.get("r"), None, None, chains=B * H) == form
    whole_group, segment_group = chunk_ops.phase1_group(x["k"], None), chunk_ops.phase1_group(x["k"][:, :T // n], None)
    assert (whole_group, segment_group) == (groups or (None, None))
    eta = torch.full((H,), 0.05)
    whole = probe.whole_forward(x, eta)
    segs = probe.cut(x, n)
    got = probe.joined(probe.segmented_forward(segs, eta), x["k"].shape)
    assert got.shape == whole.shape
    assert probe.rel_rmse(got, whole) < 1e-5
    # a wrong carry fails: phase 2's second segment from a zero state
    outs = probe.segmented_forward(segs[1:], eta)
    assert probe.rel_rmse(outs[0].reshape(whole[:, T // n:].shape), whole[:, T // n:]) > 1e-2


def test_cut_rejects_segments_off_the_chunks():
    x = probe.inputs("1x192x1x16", False, torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(ValueError, match="n=2"):
        probe.cut(x, 2)

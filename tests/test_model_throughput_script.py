"""benchmarks/model_throughput.py: its DeltaNet-on-our-kernels op is DeltaNet (against the float64 oracle, values and
gradients), it refuses what it cannot compute, and its smoke run on the CPU times every variant in both modes."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import osdn_ref

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mt():
    spec = importlib.util.spec_from_file_location("model_throughput", ROOT / "benchmarks" / "model_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1])
def test_deltanet_phase2_is_deltanet(mt, seed, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V = 2, 40 + 9 * seed, 2, 16, 8
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta)]
    o, _ = mt.deltanet_phase2(*leaves, eta=0.0, chunk_size=16)
    o.backward(do)
    ref = [x.double().requires_grad_() for x in (q, k, v, beta)]
    o_ref, _ = osdn_ref.chunk_osdn(*ref, eta=0.0, chunk_size=16)
    o_ref.backward(do.double())
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(o, o_ref) < 1e-5
    for name, got, want in zip("q k v beta".split(), leaves, ref):
        assert rel(got.grad, want.grad) < 1e-4, name


def test_identity_mixer_passes_v_and_zero_gradients(mt):
    x = [torch.randn(1, 5, 2, 3, requires_grad=True) for _ in range(3)]
    beta = torch.rand(1, 5, 2, requires_grad=True)
    o, _ = mt.identity_mixer(*x, beta, eta=0.0)
    assert torch.equal(o, x[2])
    do = torch.randn_like(o)
    o.backward(do)
    assert torch.equal(x[2].grad, do)
    assert all(t.grad is not None and not t.grad.any() for t in (x[0], x[1], beta))


def test_identity_mixer_output_is_contiguous_like_an_ops(mt):
    v = torch.randn(1, 4, 2, 5).transpose(1, 3).contiguous().transpose(1, 3)  # K at a stride of T, as before
    assert not v.is_contiguous()
    x = torch.zeros(1, 5, 2, 4)
    o, _ = mt.identity_mixer(x, x, v, x[..., 0], eta=0.0)
    assert o.is_contiguous() and torch.equal(o, v)


def test_the_convs_are_one_function_in_two_layouts(mt):
    conv = mt.layer_module.ShortConv(6, 4, kernel="fast")  # the Triton kernels (the interpreter without a GPU)
    x = torch.randn(2, 9, 6)
    new, old, torch_path = conv(x), mt.channel_major_conv(conv, x), mt.torch_conv(conv, x)
    assert new.is_contiguous() and torch_path.is_contiguous()
    assert not old.is_contiguous() and old.stride()[2] == 9
    torch.testing.assert_close(new, torch_path, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new, old, rtol=1e-6, atol=1e-7)  # SiLU's vectorised path rounds in its last bit


def test_deltanet_phase2_refuses_a_preconditioned_call(mt):
    x = torch.zeros(1, 4, 1, 4)
    with pytest.raises(ValueError, match="eta"):
        mt.deltanet_phase2(x, x, x, x[..., 0], eta=0.003)
    with pytest.raises(ValueError, match="r None"):
        mt.deltanet_phase2(x, x, x, x[..., 0], eta=0.0, r=x[..., 0])


def test_mixer_op_swaps_the_layers_op_and_restores_it(mt):
    before = mt.layer_module.chunk_op
    with mt.mixer_op("deltanet_phase2"):
        assert mt.layer_module.chunk_op(torch.device("cpu"), "fast") is mt.deltanet_phase2
    assert mt.layer_module.chunk_op is before
    with mt.mixer_op("osdn"):  # the OSDN variants keep the layer's own op
        assert mt.layer_module.chunk_op is before


def test_smoke_run_times_every_variant_in_both_modes(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_throughput.py"), "--smoke", "--out",
                          str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "model_throughput.json").read_text())
    assert result["meta"]["fla"] is None and "skipped" in res.stdout  # said so, not silently
    rows = {(r["variant"], r["mode"]): r for r in result["rows"]}
    variants = ("deltanet_phase2", "osdn", "osdn_apf", "identity_mixer")
    assert set(rows) == {(v, m) for v in variants for m in ("inference", "train")}
    for r in rows.values():
        assert len(r["rounds_ms"]) == result["meta"]["rounds"] and all(t > 0 for t in r["rounds_ms"])
        assert math.isclose(r["tokens_per_s"], r["B"] * r["T"] / r["ms"] * 1e3)
        rest = rows[("identity_mixer", r["mode"])]["ms"]
        assert r["op_ms"] is None if r["variant"] == "identity_mixer" else math.isclose(r["op_ms"], r["ms"] - rest)
    # the variants differ only by the preconditioner's parameters: d_0 [H, K] per layer, and APF's r projection
    p = {v: rows[(v, "train")]["params"] for v in variants}
    assert p["identity_mixer"] == p["deltanet_phase2"]
    d, layers, H = 32, 2, 2
    assert p["osdn"] - p["deltanet_phase2"] == layers * H * (d // H)
    assert p["osdn_apf"] - p["osdn"] == layers * (d * H + H)


def test_subsets_of_variants_and_modes(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    script = [sys.executable, str(ROOT / "benchmarks" / "model_throughput.py"), "--smoke", "--out", str(tmp_path)]
    res = subprocess.run(script + ["--variants", "deltanet_phase2,osdn", "--modes", "train", "--conv",
                                   "torch-channel-major"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "model_throughput.json").read_text())
    assert {(r["variant"], r["mode"]) for r in result["rows"]} == {("deltanet_phase2", "train"), ("osdn", "train")}
    assert all(r["op_ms"] is None for r in result["rows"])  # no identity_mixer: no op share, not a wrong one
    assert result["meta"]["conv"] == "torch-channel-major" and result["meta"]["modes"] == ["train"]
    bad = subprocess.run(script + ["--variants", "osdn,nope"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "--variants: unknown ['nope']" in bad.stderr


def test_op_share_and_summary_divide_by_the_same_scale_and_mode(mt):
    rows = [dict(scale=s, mode=m, variant=v, ms=ms) for s, m, v, ms in (
        ("a", "train", "fla_delta_rule", 10.0), ("a", "train", "osdn", 12.0), ("a", "train", "identity_mixer", 6.0),
        ("a", "inference", "fla_delta_rule", 4.0), ("a", "inference", "osdn", 4.5),
        ("a", "inference", "identity_mixer", 3.0))]
    mt.with_op_share(rows)
    assert [r["op_ms"] for r in rows] == [4.0, 6.0, None, 1.0, 1.5, None]
    summary = mt.summarise(rows)
    assert set(summary) == {"a/train/fla_delta_rule", "a/train/osdn", "a/inference/fla_delta_rule", "a/inference/osdn"}
    assert summary["a/train/osdn"] == dict(model=1.2, op=1.5)
    assert summary["a/inference/osdn"] == dict(model=1.125, op=1.5)


def test_model_profile_smoke_and_its_op_tag(tmp_path):
    spec = importlib.util.spec_from_file_location("model_profile", ROOT / "benchmarks" / "model_profile.py")
    mp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mp)
    names = {"phase1_chunk_prep_kernel", "chunk_fwd_kernel_o"}
    assert mp.op_kernel("phase1_chunk_prep_kernel", names) and mp.op_kernel("chunk_fwd_kernel_o", names)
    assert not mp.op_kernel("void at::native::vectorized_elementwise_kernel<4, FillFunctor>(int)", names)
    import osdn_fast.ops.chunk  # noqa: F401 -- its kernels' modules are loaded

    assert {"phase1_chunk_prep_kernel", "gram_kernel", "wy_bwd_kernel"} <= mp.triton_kernel_names()
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_profile.py"), "--smoke", "--out",
                          str(tmp_path), "--variants", "identity_mixer,deltanet_phase2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "model_profile.json").read_text())
    assert set(result["variants"]) == {"identity_mixer", "deltanet_phase2"}
    for r in result["variants"].values():
        assert r["device_ms"] > 0 and r["kernels"] and r["kernels"][0]["ms"] >= r["kernels"][-1]["ms"]

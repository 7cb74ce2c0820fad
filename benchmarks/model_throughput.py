"""The op inside a model: training-step and inference throughput of whole language models whose token mixers run
OSDN, against the same models with fla's DeltaNet, at the paper's two scales (it reports OSDN within ±2.2% of
DeltaNet's throughput at 340M and OSDN-APF 6.8% slower at 1.3B).

Every variant is `osdn_fast.nn.model.RecallLM` (embedding, pre-norm blocks of token mixer + GELU MLP of ratio 4, LM
head; 32000 tokens of vocabulary) in bfloat16, with the same shapes; only the mixer's op differs:

  fla_delta_rule   the layer with preconditioner 'off' and fla's `chunk_delta_rule` as its op (the baseline);
  deltanet_phase2  the same with osdn_fast's phase 2 alone, k̃ = k (DeltaNet on our kernels, `deltanet_phase2`);
  osdn             preconditioner 'osdn' on `osdn_fast.chunk_osdn` (η = 0.003, the clip [2/3, 1.5]);
  osdn_apf         preconditioner 'apf' (the retention gate r added);
  identity_mixer   the op replaced by o = v: everything but the op, so that (variant − identity_mixer) is the op's
                   time inside the model (`op_ms`), to be set beside the kernels' own ratios (bench_suite.py).

Scales ("shaped like" fla's DeltaNet configurations, not their exact models): 340M = d_model 1024, 24 blocks, 8 heads
of 128; 1.3B = d_model 2048, 24 blocks, 16 heads of 128. Each step runs B × T = 8 × 2048 tokens. Modes: `inference`
(a forward under torch.no_grad), `train` (forward, cross-entropy on shifted tokens, backward; no optimizer step) and
`inference_graph` (the inference forward captured once in a CUDA graph and replayed: no host work between kernels, so
that an op's launches no longer count; CUDA only, after the two eager modes; a variant that cannot be captured gets
NaN and the reason in `note`).
Each (scale, mode) warms every variant up, then times --rounds rounds; in each round every variant runs --steps steps
between two CUDA events (the variants' order rotates from round to round); the row keeps the median of the rounds.
Before timing, the two DeltaNet variants are compared on one input (`agreement`: relative RMSE of their outputs).
`peak_mib` is the peak of a warm-up step above what was allocated before it (all the variants' weights stay resident).
--variants and --modes take subsets (op_ms needs identity_mixer). Since 2026-12-05 the layer's short convolutions
return contiguous [B, T, C]; the models here are built with kernel='fast', so their convolutions run
osdn_fast.nn.short_conv's Triton kernels (what 'auto' runs on CUDA since 2026-12-06, calls 10 to 14); --conv torch
times torch's conv1d with its output copied to that layout (call 4), --conv torch-channel-major the layer before
(calls 1 to 3: K at a stride of T), so that one call can time the change itself.

    python benchmarks/model_throughput.py --out $OUT      # on the GPU (fla carried: .whl/), ~3 min warm
    TRITON_INTERPRET=1 python benchmarks/model_throughput.py --smoke --out /tmp/mt   # a tiny model on the CPU
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import sys

import torch
import torch.nn.functional as F

import osdn_fast.nn.layer as layer_module
from osdn_fast.nn.model import RecallLM
from osdn_fast.ops.chunk import ChunkOSDNPhase2, phase2_fwd
from osdn_fast.ops.index import uniform_chunk_layout, uniform_cu_seqlens

VOCAB = 32000
SCALES = {"340M": dict(d_model=1024, num_layers=24, num_heads=8),
          "1.3B": dict(d_model=2048, num_layers=24, num_heads=16)}
SMOKE_SCALE = {"tiny": dict(d_model=32, num_layers=2, num_heads=2)}
VARIANTS = ("fla_delta_rule", "deltanet_phase2", "osdn", "osdn_apf", "identity_mixer")
PRECONDITIONER = dict(fla_delta_rule="off", deltanet_phase2="off", osdn="osdn", osdn_apf="apf", identity_mixer="off")
MODES = ("inference", "train", "inference_graph")


class UniformPhase2(ChunkOSDNPhase2):
    """ChunkOSDNPhase2 on a fixed-length batch packed as B sequences of T: its chunk layout from B and T alone
    (uniform_chunk_layout), so that no call waits on the device (chunk_layout's repeat_interleave would, once per
    layer). Same inputs and saved tensors, so the parent's backward serves."""

    @staticmethod
    def forward(ctx, q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state, chunk_size):
        B = cu_seqlens.numel() - 1
        layout = uniform_chunk_layout(B, q.shape[1] // B, chunk_size, q.device)
        o, S_final, Ainv, _ = phase2_fwd(q, k, kt, v, beta, g, S0, cu_seqlens, scale, output_final_state, chunk_size,
                                         layout)
        ctx.save_for_backward(q, k, kt, v, beta, g, S0, cu_seqlens, Ainv, *layout)
        ctx.scale, ctx.chunk_size = scale, chunk_size
        ctx.set_materialize_grads(False)
        return o, S_final


def deltanet_phase2(q, k, v, beta, *, eta, g=None, r=None, initial_state=None, chunk_size=64, **_clip):
    """DeltaNet (GDN with g) on osdn_fast's kernels: phase 2 alone with k̃ = k, which is chunk_osdn when d_t = 1 for
    every t (η = 0, d_0 = 1, no r). The initial state is taken to be the layer's with preconditioner 'off', the zero
    state and d_0 = 1, and is not read: checking its values would cost a host synchronisation per layer."""
    if not (isinstance(eta, float) and eta == 0.0) or r is not None:
        raise ValueError("deltanet_phase2: eta must be 0.0 and r None (the layer's preconditioner 'off')")
    B, T, H, K = k.shape
    packed = lambda x: None if x is None else x.contiguous().reshape(1, B * T, *x.shape[2:])  # noqa: E731
    k1 = packed(k)
    o, _ = UniformPhase2.apply(packed(q), k1, k1, packed(v), packed(beta), packed(g), None,
                               uniform_cu_seqlens(B, T, q.device), K**-0.5, False, chunk_size)
    return o.reshape(v.shape), None


class Passthrough(torch.autograd.Function):
    """o = v, with zero gradients for q, k and β: their branches of the layer still run their backward, as they do
    under a real op, so that identity_mixer's training step differs from the others by the op alone. o is contiguous,
    as every op's output is: a strided v (--conv torch-channel-major) would otherwise reach the output norm, whose
    forward and backward then reduce over a stride of T."""

    @staticmethod
    def forward(ctx, q, k, v, beta):
        ctx.shapes = [(x.shape, x.dtype, x.device) for x in (q, k, beta)]
        return v.contiguous().view_as(v)

    @staticmethod
    def backward(ctx, do):
        zq, zk, zb = (torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.shapes)
        return zq, zk, do, zb


def identity_mixer(q, k, v, beta, **_):
    """o = v (Passthrough): the layer without its op, so that a variant's time less this one's is its op's share of
    the model."""
    return Passthrough.apply(q, k, v, beta), None


def fla_delta_rule(q, k, v, beta, *, eta, g=None, r=None, initial_state=None, **_):
    """fla's chunk_delta_rule behind the layer's op signature (preconditioner 'off': the zero state, d = 1)."""
    from fla.ops.delta_rule import chunk_delta_rule

    if g is not None or r is not None:
        raise ValueError("fla_delta_rule: DeltaNet only (g and r None)")
    return chunk_delta_rule(q, k, v, beta)[0], None


OPS = dict(fla_delta_rule=fla_delta_rule, deltanet_phase2=deltanet_phase2, identity_mixer=identity_mixer)


@contextlib.contextmanager
def mixer_op(variant):
    """Every OSDNLayer's op is the variant's while inside (the layers pick it per call: layer.chunk_op)."""
    chosen = layer_module.chunk_op
    if variant in OPS:
        layer_module.chunk_op = lambda device, kernel: OPS[variant]
    try:
        yield
    finally:
        layer_module.chunk_op = chosen


def channel_major_conv(self, x):
    """ShortConv.forward before 2026-12-05: conv1d's [B, C, T] output transposed back, not copied, so the heads split
    from it have K at a stride of T (what calls 1 to 3 timed)."""
    T = x.shape[1]
    return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2))


def torch_conv(self, x):
    """ShortConv's torch path on every device: conv1d on [B, C, T], its output copied back to [B, T, C] (call 4)."""
    T = x.shape[1]
    return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2).contiguous())


CONVS = {"layer": None, "torch": torch_conv, "torch-channel-major": channel_major_conv}  # --conv: ShortConv.forward


def use_conv(name):
    """Every ShortConv's forward becomes CONVS[name] (the layer's own for 'layer'), for the rest of the process."""
    if CONVS[name] is not None:
        layer_module.ShortConv.forward = CONVS[name]


def build(variant, scale, vocab, device, dtype, seed=0):
    """The variant's model, its weights drawn on `device` (a 1.3B model's initialisation takes seconds on the host)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = RecallLM(vocab, scale["d_model"], scale["num_layers"], num_heads=scale["num_heads"],
                         preconditioner=PRECONDITIONER[variant], kernel="fast")
    return model.to(dtype=dtype)


def step(model, tokens, mode):
    if mode in ("inference", "inference_graph"):
        with torch.no_grad():
            model(tokens)
        return
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)).backward()
    model.zero_grad(set_to_none=True)


def agreement(scale, device, dtype, B, T):
    """Relative RMSE between fla's chunk_delta_rule and deltanet_phase2 on one layer input of this scale."""
    H = scale["num_heads"]
    K = scale["d_model"] // H
    gen = torch.Generator(device=device).manual_seed(1)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    q, k = (F.normalize(rnd(B, T, H, K), dim=-1).to(dtype) for _ in range(2))
    v, beta = rnd(B, T, H, K).to(dtype), torch.rand(B, T, H, generator=gen, device=device).to(dtype)
    a = fla_delta_rule(q, k, v, beta, eta=0.0)[0].float()
    b = deltanet_phase2(q, k, v, beta, eta=0.0)[0].float()
    return ((a - b).pow(2).mean() / a.pow(2).mean()).sqrt().item()


def captured(model, tokens, variant):
    """(a CUDA graph of the variant's inference forward, None), or (None, why) when it cannot be captured. Warmed up
    on a side stream first, as torch.cuda.graph asks, so that nothing compiles or autotunes during the capture."""
    try:
        with mixer_op(variant), torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(tokens)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(tokens)
        torch.cuda.synchronize()
        return graph, None
    except Exception as err:  # noqa: BLE001 -- recorded in the row; the other variants go on
        torch.cuda.synchronize()
        return None, f"not captured: {type(err).__name__}: {str(err)[:200]}"


def time_scale(name, scale, vocab, variants, modes, device, dtype, B, T, rounds, steps, warmup, log):
    """Rows of one scale: per mode and variant, the median over rounds of ms per step, tokens/s and peak MiB."""
    models = {v: build(v, scale, vocab, device, dtype) for v in variants}
    params = {v: sum(p.numel() for p in m.parameters()) for v, m in models.items()}
    tokens = torch.randint(0, vocab, (B, T + 1), device=device)
    cuda = device == "cuda"
    rows = []
    for mode in [m for m in modes if cuda or m != "inference_graph"]:
        batch = tokens[:, :T] if mode != "train" else tokens
        peak = {}
        for v in variants:
            with mixer_op(v):
                if cuda:  # the peak above what is resident before the step: every variant's weights are
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    resident = torch.cuda.memory_allocated()
                for _ in range(warmup):
                    step(models[v], batch, mode)
                if cuda:
                    torch.cuda.synchronize()
                    peak[v] = (torch.cuda.max_memory_allocated() - resident) / 2**20
            log(f"{name} {mode} {v}: warm")
        graphs, notes = {}, {}
        if mode == "inference_graph":
            for v in variants:
                graphs[v], notes[v] = captured(models[v], batch, v)
                log(f"{name} {mode} {v}: " + (notes[v] or "captured"))
        times = {v: [] for v in variants}
        for rnd in range(rounds):
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for v in order:
                with mixer_op(v):
                    if cuda:
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(steps):
                            if mode != "inference_graph":
                                step(models[v], batch, mode)
                            elif graphs[v] is not None:
                                graphs[v].replay()
                        end.record()
                        end.synchronize()
                        times[v].append(float("nan") if graphs.get(v, 1) is None else start.elapsed_time(end) / steps)
                    else:
                        t0 = dt.datetime.now()
                        for _ in range(steps):
                            step(models[v], batch, mode)
                        times[v].append((dt.datetime.now() - t0).total_seconds() * 1e3 / steps)
            log(f"{name} {mode} round {rnd + 1}/{rounds}: " + ", ".join(f"{v} {times[v][-1]:.1f} ms" for v in variants))
        for v in variants:
            ms = statistics.median(times[v])
            rows.append(dict(scale=name, variant=v, mode=mode, ms=ms, rounds_ms=times[v], tokens_per_s=B * T / ms * 1e3,
                             peak_mib=peak.get(v, float("nan")), params=params[v], B=B, T=T, note=notes.get(v), **scale))
        del graphs
    del models
    if cuda:
        torch.cuda.empty_cache()
    return rows


def with_op_share(rows):
    """Each row gains op_ms: its median less identity_mixer's at the same scale and mode (None for that one, and for
    every row when identity_mixer was not run)."""
    rest = {(r["scale"], r["mode"]): r["ms"] for r in rows if r["variant"] == "identity_mixer"}
    for r in rows:
        base = rest.get((r["scale"], r["mode"]))
        r["op_ms"] = None if r["variant"] == "identity_mixer" or base is None else r["ms"] - base
    return rows


def summarise(rows):
    """Per scale and mode: each variant's model time, and its op's share (op_ms), over fla_delta_rule's."""
    base = {(r["scale"], r["mode"]): r for r in rows if r["variant"] == "fla_delta_rule"}
    out = {}
    for r in rows:
        b = base.get((r["scale"], r["mode"]))
        if b is not None and r["variant"] != "identity_mixer":
            op = None if r["op_ms"] is None else r["op_ms"] / b["op_ms"]
            out[f"{r['scale']}/{r['mode']}/{r['variant']}"] = dict(model=r["ms"] / b["ms"], op=op)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, one step per round (a CPU check)")
    ap.add_argument("--scales", default=",".join(SCALES), help=f"comma-separated, of {list(SCALES)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)} (graphs: CUDA only)")
    ap.add_argument("--conv", default="layer", choices=list(CONVS),
                    help="the layer's short convolutions: its own (Triton on CUDA), torch's conv1d with the output "
                         "copied to [B, T, C], or as before 2026-12-05 (q, k, v with K at a stride of T)")
    args = ap.parse_args(argv)
    for flag, given, known in (("--variants", args.variants, VARIANTS), ("--modes", args.modes, MODES)):
        unknown = set(given.split(",")) - set(known)
        if unknown:
            ap.error(f"{flag}: unknown {sorted(unknown)}")
    use_conv(args.conv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        scales, vocab, dtype, B, T, rounds, steps, warmup = SMOKE_SCALE, 64, torch.float32, 1, 48, 2, 1, 1
    else:
        unknown = set(args.scales.split(",")) - set(SCALES)
        if unknown:
            ap.error(f"--scales: unknown {sorted(unknown)}")
        scales = {s: SCALES[s] for s in args.scales.split(",")}
        vocab, dtype, B, T = VOCAB, torch.bfloat16, args.batch, args.seq_len
        rounds, steps, warmup = args.rounds, args.steps, args.warmup
    try:
        import fla

        fla_version = fla.__version__ if device == "cuda" else None
    except ImportError:
        fla_version = None
    variants = [v for v in VARIANTS if v in args.variants.split(",") and (fla_version or v != "fla_delta_rule")]
    modes = [m for m in MODES if m in args.modes.split(",")]
    log = lambda msg: print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {msg}", flush=True)  # noqa: E731
    if not fla_version:
        log("fla is not importable here (or no GPU): the fla_delta_rule baseline is skipped")
    import triton

    meta = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                gpu=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                torch=torch.__version__, triton=triton.__version__, fla=fla_version, dtype=str(dtype),
                vocab=vocab, variants=variants, modes=modes, rounds=rounds, steps=steps, warmup=warmup,
                conv=args.conv,
                timing="CUDA events around --steps steps per variant and round; median over rounds")
    os.makedirs(args.out, exist_ok=True)
    rows, agree = [], {}
    for name, scale in scales.items():
        if fla_version:
            agree[name] = agreement(scale, device, dtype, B, T)
            log(f"{name}: fla_delta_rule vs deltanet_phase2, relative RMSE {agree[name]:.2e}")
        rows += with_op_share(time_scale(name, scale, vocab, variants, modes, device, dtype, B, T, rounds, steps,
                                         warmup, log))
        with open(os.path.join(args.out, "model_throughput.json"), "w") as f:
            json.dump(dict(meta=meta, agreement=agree, rows=rows, summary=summarise(rows)), f, indent=1)
    for key, ratio in summarise(rows).items():
        op = "not taken (no identity_mixer)" if ratio["op"] is None else f"{ratio['op']:.3f}x"
        log(f"{key}: model {ratio['model']:.3f}x, op {op} fla_delta_rule's")


if __name__ == "__main__":
    main()

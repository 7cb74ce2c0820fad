"""One recall training run: data, model, AdamW with warmup + cosine, periodic evaluation, layer diagnostics.

Loss: cross-entropy at the answer positions only (labels −100 elsewhere). Accuracy: the fraction of answer
positions whose arg-max prediction is the right value, on a held-out set drawn with another seed.
Under torch.distributed (torchrun) the model is wrapped in DDP: each rank draws its own share of every
batch, gradients are averaged, and evaluation counts are summed over ranks.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from ..nn import RecallLM
from .tasks import IGNORE, RecallTask, generate

TEST_SEED_OFFSET = 1_000_003  # the test set never shares a generator seed with a training set


@dataclass
class ModelSpec:
    """The mixer variant: backbone, preconditioner, gradient form (beta-aware or beta-free), η and clip bounds."""

    backbone: str = "deltanet"
    preconditioner: str = "off"
    beta_aware: bool = True
    eta: float = 0.003
    learn_eta: bool = False
    d_min: float = 2 / 3
    d_max: float = 1.5


@dataclass
class RunConfig:
    """Everything one run depends on (its results are a function of this and the device)."""

    task: RecallTask = field(default_factory=RecallTask)
    model: ModelSpec = field(default_factory=ModelSpec)
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    mlp: bool = True
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_frac: float = 0.1
    num_train: int = 20_000
    num_test: int = 512
    eval_every: int = 100
    seed: int = 0
    device: str = "cpu"
    kernel: str = "auto"
    mode: str = "chunk"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        data = dict(data)
        return cls(task=RecallTask(**data.pop("task")), model=ModelSpec(**data.pop("model")), **data)


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warmup to cfg.lr over warmup_frac·steps, then cosine decay to 0."""
    warmup = max(1, int(cfg.warmup_frac * cfg.steps))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


def build_model(cfg: RunConfig) -> RecallLM:
    """The RecallLM of a run, initialised from cfg.seed."""
    torch.manual_seed(cfg.seed)
    m = cfg.model
    return RecallLM(cfg.task.vocab_size, cfg.d_model, cfg.num_layers, mlp=cfg.mlp, num_heads=cfg.num_heads,
                    backbone=m.backbone, preconditioner=m.preconditioner, beta_aware=m.beta_aware, eta=m.eta,
                    learn_eta=m.learn_eta, d_min=m.d_min, d_max=m.d_max, kernel=cfg.kernel, mode=cfg.mode)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _ranks_in_sync(model: torch.nn.Module, device) -> bool | None:
    """Under DDP: do all ranks hold the same parameters (a checksum compared by max and min over ranks)?"""
    if _world()[1] == 1:
        return None
    total = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().to(device)
    lo, hi = total.clone(), total.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool((hi - lo).abs() <= 1e-9 * total.abs().clamp_min(1))


def _sum_over_ranks(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if _world()[1] > 1:
        dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(model: RecallLM, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, device) -> dict:
    """Accuracy and loss at the answer positions of this rank's share of the test set, summed over ranks."""
    rank, world = _world()
    model.eval()
    correct = total = loss_sum = 0.0
    for i in range(rank * batch_size, len(inputs), world * batch_size):
        x, y = inputs[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
        logits = model(x)
        mask = y != IGNORE
        correct += (logits.argmax(-1)[mask] == y[mask]).sum().item()
        total += mask.sum().item()
        loss_sum += F.cross_entropy(logits[mask], y[mask], reduction="sum").item()
    model.train()
    correct, total, loss_sum = _sum_over_ranks([correct, total, loss_sum], device)
    return dict(accuracy=correct / total, loss=loss_sum / total)


@torch.no_grad()
def layer_diagnostics(model: RecallLM, inputs: torch.Tensor, device) -> dict:
    """q_geo and the clip fraction of every mixer, measured on one batch of test inputs."""
    model.eval()
    for layer in model.mixers():
        layer.record = True
    model(inputs.to(device))
    per_layer = []
    for layer in model.mixers():
        diag = layer.diagnostics()
        per_layer.append({k: diag[k] for k in ("q_geo", "clip_fraction", "d_mean", "beta_mean")})
        layer.record, layer.last = False, None
    model.train()
    mean = lambda key: sum(p[key] for p in per_layer) / len(per_layer)  # noqa: E731
    return dict(q_geo=mean("q_geo"), clip_fraction=mean("clip_fraction"), layers=per_layer)


def train_run(cfg: RunConfig, *, progress: bool = True, deadline: float | None = None) -> dict:
    """Train one model and return its record: final and best accuracy, q_geo, clip fraction, history, time.

    `deadline` (time.time() seconds): stop training there and mark the run truncated.
    """
    rank, world = _world()
    device = torch.device(cfg.device)
    if cfg.num_test < 1 or cfg.num_train < 1 or cfg.steps < 1:
        raise ValueError(f"num_train, num_test and steps must be >= 1, got {cfg.num_train}, {cfg.num_test}, {cfg.steps}")
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the number of ranks {world}")
    start = time.time()
    train_x, train_y = generate(cfg.task, cfg.num_train, cfg.seed)
    test_x, test_y = generate(cfg.task, cfg.num_test, cfg.seed + TEST_SEED_OFFSET)
    model = build_model(cfg).to(device)
    trained = model
    if world > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=cfg.weight_decay), dict(params=no_decay, weight_decay=0.0)],
                            lr=cfg.lr, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    per_rank = cfg.batch_size // world
    history, truncated = [], False
    bar = tqdm(range(cfg.steps), disable=not progress or rank != 0, leave=False, desc=_label(cfg), mininterval=1.0)
    for step in bar:
        if deadline is not None and time.time() > deadline:
            truncated = True
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        idx = torch.randint(len(train_x), (per_rank,), generator=gen)
        x, y = train_x[idx].to(device), train_y[idx].to(device)
        logits = trained(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            ev = evaluate(model, test_x, test_y, max(per_rank, 256), device)
            history.append(dict(step=step + 1, train_loss=loss.item(), **ev))
            bar.set_postfix(acc=f"{ev['accuracy']:.3f}", loss=f"{loss.item():.3f}")
    bar.close()
    final = evaluate(model, test_x, test_y, max(per_rank, 256), device)
    diag = layer_diagnostics(model, test_x[: min(256, cfg.num_test)], device)
    return dict(config=cfg.to_dict(), accuracy=final["accuracy"], test_loss=final["loss"],
                best_accuracy=max([h["accuracy"] for h in history] + [final["accuracy"]]),
                q_geo=diag["q_geo"], clip_fraction=diag["clip_fraction"], layers=diag["layers"],
                history=history, steps_done=step + 1 if not truncated else step, truncated=truncated,
                seconds=time.time() - start, world_size=world, ranks_in_sync=_ranks_in_sync(model, device))


def _label(cfg: RunConfig) -> str:
    m = cfg.model
    return f"{m.backbone}/{m.preconditioner}{'' if m.preconditioner == 'off' else '-ba' if m.beta_aware else '-bf'} s{cfg.seed}"

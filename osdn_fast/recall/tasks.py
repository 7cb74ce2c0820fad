"""Synthetic in-context recall tasks, generated (nothing downloaded), seeded and reproducible.

MQAR (multi-query associative recall, Zoology's `multiquery_ar` format):

    [k1 v1 k2 v2 ... kP vP] × num_passes   then a query region of length seq_len − 2P,

keys drawn from the lower vocabulary half {1, …, V/2 − 1}, values from the upper half {V/2, …, V − 1},
no key repeated inside one example. Each key is asked once in the query region, at an even offset
2·gap with gap drawn without replacement from p(gap) ∝ (gap + 1)^(a − 1) (a power law: most queries
close to the context). Labels are the next-token targets: the value at the position of its query key,
−100 (ignored) everywhere else. Unused query-region positions hold random tokens. `num_passes = 2` is
the JRT-style "read twice" prompt: the whole key-value block is repeated before the queries, so the
sequence grows by 2P·(num_passes − 1) tokens.

Key-frequency variant (`num_updates > 0`): the context holds P + U writes; U of them re-write keys
already written, with fresh values, at random places in the write stream. A query asks for the value
written LAST (the stale-memory overwrite case). Repeating passes keeps the answer the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE = -100


@dataclass(frozen=True)
class RecallTask:
    """One task distribution: vocab V, single-pass length, P distinct keys, passes, power law, U re-writes."""

    vocab_size: int = 128
    seq_len: int = 64
    num_kv_pairs: int = 8
    num_passes: int = 1
    power_a: float = 0.01
    num_updates: int = 0

    def __post_init__(self):
        P, U = self.num_kv_pairs, self.num_updates
        if self.seq_len % 2 or self.vocab_size % 2:
            raise ValueError(f"seq_len and vocab_size must be even, got {self.seq_len}, {self.vocab_size}")
        if not 0 <= U <= P:
            raise ValueError(f"num_updates must lie in [0, num_kv_pairs = {P}], got {U}")
        if 4 * (P + U) > self.seq_len:
            raise ValueError(f"need 4·(num_kv_pairs + num_updates) <= seq_len, got {P}, {U}, {self.seq_len}")
        if P >= self.vocab_size // 2 or self.num_passes < 1:
            raise ValueError(f"need num_kv_pairs < vocab_size/2 and num_passes >= 1, got {P}, {self.num_passes}")

    @property
    def context_len(self) -> int:
        """Tokens of one pass of the key-value block."""
        return 2 * (self.num_kv_pairs + self.num_updates)

    @property
    def total_len(self) -> int:
        """Length of a generated example: the single-pass length plus the repeated blocks."""
        return self.seq_len + self.context_len * (self.num_passes - 1)


def _choose_without_replacement(rng: np.random.Generator, n: int, low: int, high: int, size: int) -> np.ndarray:
    """n rows of `size` distinct integers from [low, high), every subset and order equally likely.

    Draw with replacement, redraw the repeated entries until none is left, then shuffle each row. The draw
    commutes with any relabelling of [low, high), so every subset is equally likely; memory is O(n·size).
    """
    out = rng.integers(low, high, size=(n, size))
    while True:
        order = np.argsort(out, axis=1, kind="stable")
        ordered = np.take_along_axis(out, order, 1)
        repeat = np.zeros_like(out, dtype=bool)
        np.put_along_axis(repeat, order[:, 1:], ordered[:, 1:] == ordered[:, :-1], axis=1)
        if not repeat.any():
            return rng.permuted(out, axis=1)
        out[repeat] = rng.integers(low, high, size=int(repeat.sum()))


def _power_law_gaps(rng: np.random.Generator, n: int, space: int, size: int, a: float) -> np.ndarray:
    """n rows of `size` distinct gaps in [0, space) with p(gap) ∝ (gap + 1)^(a − 1), without replacement.

    Gumbel top-k: the `size` largest of log p + Gumbel noise are a draw without replacement from p.
    """
    log_p = (a - 1) * np.log(np.arange(1, space + 1))
    noisy = log_p + rng.gumbel(size=(n, space))
    return np.argsort(-noisy, axis=1)[:, :size]


def _write_stream(rng: np.random.Generator, task: RecallTask, keys: np.ndarray, values: np.ndarray):
    """Interleave P first writes with U re-writes of earlier keys; return (stream keys, stream values, latest values)."""
    n, P, U = keys.shape[0], task.num_kv_pairs, task.num_updates
    if U == 0:
        return keys, values, values
    half = task.vocab_size // 2
    which = _choose_without_replacement(rng, n, 0, P, U)  # keys that get a second write
    old = np.take_along_axis(values, which, 1)
    new_values = half + (old - half + rng.integers(1, half, size=(n, U))) % half  # always a different value
    # A second write comes after the first: place each write at a random slot, then fix the order.
    stream_k = np.concatenate([keys, np.take_along_axis(keys, which, 1)], axis=1)
    stream_v = np.concatenate([values, new_values], axis=1)
    order = np.argsort(rng.random((n, P + U)), axis=1)
    stream_k, stream_v = np.take_along_axis(stream_k, order, 1), np.take_along_axis(stream_v, order, 1)
    latest = values.copy()
    for j in range(P + U):  # a later write wins: scan the stream in order
        hit = keys == stream_k[:, j : j + 1]
        latest[hit] = np.broadcast_to(stream_v[:, j : j + 1], latest.shape)[hit]
    return stream_k, stream_v, latest


BLOCK = 8192  # examples drawn per generator: bounds the memory of large sets


def generate(task: RecallTask, num_examples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels), both int64 [num_examples, task.total_len]; labels −100 off the answers.

    Examples are drawn in blocks of BLOCK, block b from numpy's generator seeded with (seed, b).
    """
    parts = [_generate_block(task, min(BLOCK, num_examples - start), np.random.default_rng([seed, b]))
             for b, start in enumerate(range(0, num_examples, BLOCK))]
    return torch.from_numpy(np.concatenate([p[0] for p in parts])), torch.from_numpy(np.concatenate([p[1] for p in parts]))


def _generate_block(task: RecallTask, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    P, half = task.num_kv_pairs, task.vocab_size // 2
    keys = _choose_without_replacement(rng, n, 1, half, P)
    values = _choose_without_replacement(rng, n, half, task.vocab_size, P)
    stream_k, stream_v, latest = _write_stream(rng, task, keys, values)

    block = np.empty((n, task.context_len), dtype=np.int64)
    block[:, 0::2], block[:, 1::2] = stream_k, stream_v
    context = np.tile(block, (1, task.num_passes))

    space = (task.seq_len - task.context_len) // 2
    gaps = _power_law_gaps(rng, n, space, P, task.power_a)
    queries = rng.integers(0, task.vocab_size, size=(n, task.seq_len - task.context_len))
    np.put_along_axis(queries, 2 * gaps, keys, axis=1)

    inputs = np.concatenate([context, queries], axis=1)
    labels = np.full_like(inputs, IGNORE)
    np.put_along_axis(labels, context.shape[1] + 2 * gaps, latest, axis=1)
    return inputs, labels

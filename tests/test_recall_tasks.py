"""The recall task generators: shapes, label placement, disjoint vocab halves, passes, re-writes, seeding."""
import numpy as np
import pytest
import torch

from osdn_fast.recall.tasks import IGNORE, RecallTask, generate


def _pairs(task, x):
    """(keys, values) of the first pass's write stream of every example."""
    block = x[:, : task.context_len]
    return block[:, 0::2], block[:, 1::2]


@pytest.mark.parametrize("passes", [1, 2, 3])
@pytest.mark.parametrize("updates", [0, 3])
def test_shapes_and_label_placement(passes, updates):
    task = RecallTask(vocab_size=64, seq_len=64, num_kv_pairs=8, num_passes=passes, num_updates=updates)
    x, y = generate(task, 50, seed=1)
    assert x.shape == y.shape == (50, task.total_len) == (50, 64 + 2 * (8 + updates) * (passes - 1))
    assert x.dtype == y.dtype == torch.int64
    answers = y != IGNORE
    assert (answers.sum(1) == 8).all()  # each distinct key asked exactly once
    start = task.context_len * passes
    assert not answers[:, :start].any()  # no label inside the context
    pos = answers.nonzero()
    assert ((pos[:, 1] - start) % 2 == 0).all()  # queries at even offsets of the query region
    keys, _ = _pairs(task, x)
    for b, t in pos.tolist()[:100]:
        assert x[b, t] in keys[b]  # the input at an answer position is a key of that example


def test_disjoint_vocab_and_distinct_keys():
    task = RecallTask(vocab_size=128, seq_len=64, num_kv_pairs=12)
    x, y = generate(task, 200, seed=2)
    keys, values = _pairs(task, x)
    half = task.vocab_size // 2
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < task.vocab_size)).all()
    assert all(len(set(row.tolist())) == 12 for row in keys)
    labels = y[y != IGNORE]
    assert ((labels >= half) & (labels < task.vocab_size)).all()


def test_answer_is_the_value_written_with_the_key():
    task = RecallTask(vocab_size=64, seq_len=48, num_kv_pairs=6)
    x, y = generate(task, 100, seed=3)
    keys, values = _pairs(task, x)
    for b, t in (y != IGNORE).nonzero().tolist():
        (j,) = (keys[b] == x[b, t]).nonzero()[0].tolist()
        assert y[b, t] == values[b, j]


def test_passes_repeat_the_block():
    task = RecallTask(vocab_size=64, seq_len=48, num_kv_pairs=6, num_passes=2, num_updates=2)
    x, _ = generate(task, 20, seed=4)
    C = task.context_len
    assert torch.equal(x[:, :C], x[:, C : 2 * C])
    once, _ = generate(RecallTask(vocab_size=64, seq_len=48, num_kv_pairs=6, num_updates=2), 20, seed=4)
    assert torch.equal(once[:, :C], x[:, :C])  # the passes add a copy, they do not change the draw


def test_recurring_keys_answer_with_latest_value():
    task = RecallTask(vocab_size=64, seq_len=64, num_kv_pairs=8, num_updates=4)
    x, y = generate(task, 100, seed=5)
    keys, values = _pairs(task, x)
    rewritten = 0
    for b in range(len(x)):
        counts = {}
        for key in keys[b].tolist():
            counts[key] = counts.get(key, 0) + 1
        assert len(counts) == 8 and sum(c - 1 for c in counts.values()) == 4
        for t in (y[b] != IGNORE).nonzero()[:, 0].tolist():
            where = (keys[b] == x[b, t]).nonzero()[:, 0].tolist()
            assert y[b, t] == values[b, where[-1]]  # the last write wins
            if len(where) > 1:
                rewritten += 1
                assert values[b, where[-1]] != values[b, where[0]]  # a re-write changes the value
    assert rewritten == 4 * len(x)


def test_seeded_and_reproducible():
    task = RecallTask()
    a, b, c = generate(task, 30, 7), generate(task, 30, 7), generate(task, 30, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_power_law_placement_prefers_early_queries():
    task = RecallTask(vocab_size=256, seq_len=256, num_kv_pairs=8, power_a=0.01)
    _, y = generate(task, 400, seed=9)
    offsets = ((y != IGNORE).nonzero()[:, 1] - task.context_len) // 2
    space = (task.seq_len - task.context_len) // 2
    first, last = (offsets < space // 4).float().mean(), (offsets >= 3 * space // 4).float().mean()
    assert first > 2 * last
    hist = np.bincount(offsets.numpy(), minlength=space)
    assert hist[0] > hist[space // 2]


@pytest.mark.parametrize("bad", [dict(seq_len=63), dict(num_kv_pairs=20, seq_len=64), dict(num_updates=9),
                                 dict(num_passes=0), dict(vocab_size=16, num_kv_pairs=8, seq_len=64)])
def test_bad_task_raises(bad):
    with pytest.raises(ValueError):
        RecallTask(**bad)


def test_distinct_draw_is_uniform_and_blocks_are_seeded():
    from osdn_fast.recall import tasks

    rng = np.random.default_rng(0)
    draw = tasks._choose_without_replacement(rng, 20000, 1, 5, 2)  # 2 of {1, 2, 3, 4}: 6 subsets, 12 orders
    assert (draw[:, 0] != draw[:, 1]).all() and draw.min() == 1 and draw.max() == 4
    counts = np.unique(draw[:, 0] * 10 + draw[:, 1], return_counts=True)[1]
    assert len(counts) == 12 and counts.min() > 0.85 * 20000 / 12 and counts.max() < 1.15 * 20000 / 12
    task = RecallTask(vocab_size=64, seq_len=32, num_kv_pairs=4)
    big, _ = generate(task, tasks.BLOCK + 5, seed=3)
    assert big.shape[0] == tasks.BLOCK + 5 and torch.equal(big, generate(task, tasks.BLOCK + 5, seed=3)[0])
    assert not torch.equal(big[:5], big[tasks.BLOCK:])  # each block has its own generator

"""benchmarks/memory_peak.py replays an allocator trace to its peak and names who allocated what was alive there:
the replay and the grouping, on a hand-made trace (the trace itself needs a GPU)."""
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("memory_peak", ROOT / "benchmarks" / "memory_peak.py")
memory_peak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory_peak)


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


TORCH = frame("/usr/lib/python3/site-packages/torch/autograd/graph.py", 10, "backward")
WY = frame("/root/repo/osdn_fast/ops/wy.py", 162, "wy_bwd")
OUT = frame("/root/repo/osdn_fast/ops/output.py", 144, "output_bwd")


def ev(action, addr, size, *frames):
    return {"action": action, "addr": addr, "size": size, "frames": list(frames)}


def test_the_peak_is_the_most_bytes_alive_and_its_blocks():
    events = [ev("alloc", 1, 100, TORCH, OUT), ev("alloc", 2, 300, WY), ev("free_requested", 1, 100),
              ev("free_completed", 1, 100), ev("alloc", 3, 250, WY),       # 550 alive
              ev("free_completed", 9, 999),                                  # allocated before the trace: ignored
              ev("alloc", 4, 50, TORCH), ev("free_completed", 2, 300), ev("alloc", 5, 10, OUT)]  # peak 600
    peak, blocks = memory_peak.live_at_peak(events)
    assert peak == 600 and sorted(b["addr"] for b in blocks) == [2, 3, 4]
    groups = memory_peak.by_site(blocks, unit=100)
    assert [(g["site"], g["blocks"]) for g in groups] == [("osdn_fast/ops/wy.py:162 wy_bwd", 2),
                                                          ("(torch internals)", 1)]
    assert groups[0]["units"] == pytest.approx(5.5) and groups[0]["mib"] == pytest.approx(550 / 2**20)


def test_the_site_is_the_innermost_frame_of_ours_or_fla():
    fla = frame("/tmp/site/fla/ops/delta_rule/chunk.py", 77, "chunk_delta_rule_bwd")
    assert memory_peak.site([TORCH, fla, WY]) == "fla/ops/delta_rule/chunk.py:77 chunk_delta_rule_bwd"
    assert memory_peak.site([OUT, WY]) == "osdn_fast/ops/output.py:144 output_bwd"
    assert memory_peak.site([TORCH]) == "(torch internals)"


def test_live_storages_count_each_storage_once_until_its_last_tensor_dies():
    """The CPU count (memory_peak.py --cpu): a view adds no bytes, a storage is released with its last tensor, and
    the peak keeps the blocks alive then, named by the line that made them."""
    with memory_peak.LiveStorages() as live:
        a = torch.empty(100, dtype=torch.uint8)
        b = torch.empty(300, dtype=torch.uint8)
        view = b[10:]                      # b's storage: no new bytes
        del b
        c = torch.empty(250, dtype=torch.uint8)  # 650 alive: b's storage lives on in its view
        del view, a
        d = torch.empty(200, dtype=torch.uint8)  # 450 alive
        assert live.now == 450
    assert live.peak == 650 and sorted(blk["size"] for blk in live.at_peak) == [100, 250, 300]
    groups = memory_peak.by_site(live.at_peak, unit=50)
    assert [(g["site"], g["blocks"]) for g in groups] == [("(torch internals)", 3)]  # a test's lines are not OWN
    assert groups[0]["units"] == pytest.approx(13.0)
    del c, d

"""osdn_fast.interpreter: under TRITON_INTERPRET=1 a launch swaps triton.language once, however many helper calls
its programs make, computes what it computed before, and leaves the language as it found it."""
import os

import pytest
import torch
import triton
import triton.language as tl

import osdn_fast  # noqa: F401  (installs the interpreter's change under TRITON_INTERPRET=1)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU interpreter only")


@triton.jit
def _axpy(acc, x, a):
    return acc + a * x


@triton.jit
def _helper_loop_kernel(x, y, n_steps, N: tl.constexpr):
    offs = tl.arange(0, N)
    xv = tl.load(x + tl.program_id(0) * N + offs)
    acc = tl.zeros([N], dtype=tl.float32)
    for i in range(n_steps):
        acc = _axpy(acc, xv, i + 1.0)
    tl.store(y + tl.program_id(0) * N + offs, acc)


def _run(n_steps):
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(n_steps))
    y = torch.empty_like(x)
    _helper_loop_kernel[(3,)](x, y, n_steps, N=16)
    return x, y


def test_installed_on_import():
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "swaps_once", False)
    assert osdn_fast.interpreter.install()  # idempotent


def test_one_swap_per_launch(monkeypatch):
    """The walks over triton.language's members (`_patch_builtin`) do not grow with the helper calls (without
    install(): 34 walks at 1 step, 106 at 7, with Triton 3.9). A first launch is made before counting: in it,
    Triton's own helpers swap triton.language.core's builtins and leave them swapped, as they do without install()."""
    from triton.runtime import interpreter

    _run(1)
    walks, walk = [], interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a, **k: (walks.append(1), walk(*a, **k))[1])
    counts = []
    for n_steps in (1, 7):
        walks.clear()
        x, y = _run(n_steps)
        torch.testing.assert_close(y, x * (n_steps * (n_steps + 1) / 2), rtol=1e-6, atol=1e-6)
        counts.append(len(walks))
    assert counts[0] == counts[1] > 0, counts


def test_language_restored_after_a_launch():
    _run(3)
    assert all(tl.core.is_builtin(f) for f in (tl.program_id, tl.load, tl.store, tl.arange, tl.dot))

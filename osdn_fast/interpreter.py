"""Triton's CPU interpreter (TRITON_INTERPRET=1: how CI and the book run the kernels), without its redundant patching.

At a launch the interpreter swaps triton.language's builtins (and those of its tensor and math modules) for
NumPy-backed ones, runs every program of the grid, and swaps the originals back. It also redoes the swap at every
call of a @triton.jit helper inside a program, while the launch's swap is still in force: an `inspect.getmembers`
walk over those modules per helper call, whose result changes nothing. The kernels here call helpers inside their
token and chunk loops, so the walks took about half of the interpreter's time (the quasi-Newton tests: 109 s → 57 s).

`install()` lets a helper call skip the swap when the launch's is in force. A launch still swaps and restores as
before, and a helper whose module sees a language module that the launch did not swap still swaps it, so every
value the kernels compute is the same. Nothing changes on a GPU, where the interpreter does not run.
"""
from __future__ import annotations

import inspect


class _InForce:
    """The scope of a skipped swap: the launch that made the swap restores it."""

    def restore(self) -> None:
        pass


def install() -> bool:
    """Replace `triton.runtime.interpreter._patch_lang` by one that swaps only where triton.language's builtins
    are still the originals. Idempotent; False (and nothing replaced) where this Triton has no such function."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    if patch_lang is None or not hasattr(tl.core, "is_builtin"):
        return False
    if getattr(patch_lang, "swaps_once", False):
        return True

    seen = {}  # id of a module's globals -> (those globals, the language modules they hold)

    def patch_lang_once(fn):
        g = fn.__globals__
        held = seen.get(id(g))
        if held is None or held[0] is not g:
            held = seen[id(g)] = (g, [v for v in g.values() if inspect.ismodule(v) and v in (tl, tl.core)])
        ids = [getattr(lang, "program_id", None) for lang in held[1]]
        if ids and all(i is not None and not tl.core.is_builtin(i) for i in ids):  # swapped by the launch
            return _InForce()
        return patch_lang(fn)

    patch_lang_once.swaps_once = True
    interpreter._patch_lang = patch_lang_once
    return True

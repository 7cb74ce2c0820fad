"""osdn_fast: Triton chunkwise OSDN kernels (forward and backward), the layer and recall training."""
import os

if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU interpreter, without its redundant patching (interpreter.py)
    from .interpreter import install

    install()

from .ops import chunk_osdn  # noqa: E402

__all__ = ["chunk_osdn"]

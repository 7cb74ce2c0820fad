"""osdn_fast: Triton chunkwise OSDN kernels (forward and backward), the layer and recall training."""
from .ops import chunk_osdn

__all__ = ["chunk_osdn"]

"""Triton kernels of OSDN, one stage per module (forward and backward side by side), and the op `chunk_osdn`."""
from .chunk import chunk_osdn

__all__ = ["chunk_osdn"]

"""The OSDN token-mixing layer (fla style) and a small LM for synthetic recall."""
from .layer import OSDNLayer, ShortConv
from .model import RecallLM

__all__ = ["OSDNLayer", "ShortConv", "RecallLM"]

"""Synthetic recall (MQAR, JRT-style passes, key-frequency re-writes) and the `osdn-recall` training CLI."""
from .tasks import IGNORE, RecallTask, generate
from .train import ModelSpec, RunConfig, train_run

__all__ = ["IGNORE", "RecallTask", "generate", "ModelSpec", "RunConfig", "train_run"]

"""Shared test setup: the Triton CPU interpreter when there is no GPU, and the Hypothesis profiles.

Profiles (pick one with the environment variable HYPOTHESIS_PROFILE):
- "ci" (default): bounded example counts, no deadline, derandomized so every run draws the same examples.
- "deep": many random examples, for a local run before a release (`HYPOTHESIS_PROFILE=deep pytest tests`).
"""
import os

import torch

# Must happen before anything imports triton: osdn_fast's kernels then run on CPU tensors (SPEC §4).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

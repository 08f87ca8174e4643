"""A python source beside the spec: the client calls it when a run compiles (the deployment matrix)."""

import numpy as np


def load(n: int = 64, seed: int = 0):
    """A deterministic block of values, so every deployment reads the same."""
    return np.random.default_rng(seed).standard_normal((n, 16)).astype("float32")

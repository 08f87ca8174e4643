"""Functions that specs in tests/faults/test_memory.py name (imported by the workers of a subprocess run)."""

from __future__ import annotations

import time

import numpy as np


def hog(block):
    """Holds far more memory than a small worker's limit (1 GiB, every page touched), long enough for
    distributed's memory monitor (every 100 ms) to kill the worker."""
    if block.size:
        held = np.ones(1 << 27)  # 1 GiB of float64
        time.sleep(20)
        return block + held[0]
    return block

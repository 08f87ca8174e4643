"""Functions that specs in tests/faults/test_memory.py name (imported by the workers of a subprocess run)."""

from __future__ import annotations

import os
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


def fill_spill_disk(block):
    """Fills the filesystem of ``$FLOWGPU_TEST_SPILL_FILL`` (once), so the worker's later spills fail."""
    path = os.path.join(os.environ["FLOWGPU_TEST_SPILL_FILL"], "filler")
    if block.size and not os.path.exists(path):
        with open(path, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
    return block

"""User functions for the browser test's run: each block takes a fixed time, so steps are seen
running and then done on the dashboard page however fast the machine is."""

from __future__ import annotations

import time


def slow_scale(block, seconds: float = 0.5, factor: float = 2.0):
    time.sleep(seconds)
    return block * factor

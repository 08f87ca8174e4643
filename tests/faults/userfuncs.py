"""Functions that specs in the fault tests name (importable by the workers of a subprocess run)."""

from __future__ import annotations


def explode(block):
    """Fails on every non-empty block: a user function that raises while the run computes."""
    if block.size:
        raise RuntimeError("user function failed")
    return block

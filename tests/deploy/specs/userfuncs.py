"""A map_blocks function beside the spec: its workers need not have this file (it travels by value)."""

from flowgpu.backend import array_module


def soft_threshold(block, t=0.25):
    xp = array_module(block)
    return xp.sign(block) * xp.maximum(xp.abs(block) - t, 0)

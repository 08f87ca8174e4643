"""A pipeline whose last step is a function of this module (``Pipeline.blocks``, Hamilton's style):
importable, so the spec names it ``tests.pipeline.builder_steps:centred`` and `flowgpu run` can run
the YAML written from it."""

from __future__ import annotations

import flowgpu as fg

p = fg.Pipeline("blocks", description="columns less their means, by a function of this module")
seed = p.param("seed", 0)
out = p.param("out", "flowgpu-output/blocks")
x = p.input("x", source="normal", shape=[48, 5], dtype="float32", seed=seed, chunks=[12, -1])
mu = p.step("mu", "mean", x, axis=0, keepdims=True)


@p.blocks(dtype="float32")
def centred(x, mu, scale=1.0):
    """Each value less its column's mean (the blocks of x and mu, chunk by chunk)."""
    return (x - mu) * scale


p.output("centred", centred, sink="npy", path=f"{out}/centred.npy")
p.output("spread", p.step("spread", "sum", p.step("sq", "square", centred)))

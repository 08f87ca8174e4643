"""flowgpu.optimize: chains of ufuncs in a dask graph become one fused kernel, same results.

The reductions they feed: tests/fusion/test_graph_reduce.py."""

from __future__ import annotations

import dask.array as da
import numpy as np

import flowgpu as fg
from flowgpu.fusion import fusing
from flowgpu.fusion.chunk import FusedChunk


def _fused_texts(arr):
    return [layer.task.func.text for layer in arr.__dask_graph__().layers.values()
            if isinstance(getattr(getattr(layer, "task", None), "func", None), FusedChunk)]


def test_chain_becomes_one_kernel(rng):
    xn, yn = rng.random((60, 50)), rng.random((60, 50))
    x, y = da.from_array(xn, chunks=20), da.from_array(yn, chunks=20)
    e = ((x * 2 + 1) ** 2 - np.sqrt(x)) * da.where(y > 0.5, y, 0.25) + abs(-x)
    o = fg.optimize(e)
    (text,) = _fused_texts(o)
    assert text.count("sqrt") == 1 and "where" in text
    assert len(o.__dask_graph__().layers) == 3  # x, y and the fused layer
    want = ((xn * 2 + 1) ** 2 - np.sqrt(xn)) * np.where(yn > 0.5, yn, 0.25) + abs(-xn)
    np.testing.assert_allclose(o.compute(), want, rtol=1e-12)


def test_shared_intermediate_is_kept(rng):
    xn = rng.random(100)
    x = da.from_array(xn, chunks=30)
    t = x * 3 + 1  # used twice: stays its own layer, each user fuses around it
    a, b = fg.optimize(t ** 2 - 1, np.exp(t) * 2)
    np.testing.assert_allclose(a.compute(), (xn * 3 + 1) ** 2 - 1)
    np.testing.assert_allclose(b.compute(), np.exp(xn * 3 + 1) * 2)


def test_config_hook_fuses_everything_computed(rng, monkeypatch):
    """Under fusing() the chain and the sum after it are one kernel per chunk (the reduction's
    chunk stage, fusion/graph_reduce.py); fusing(False) leaves them to dask."""
    calls = []
    original = FusedChunk.__call__
    monkeypatch.setattr(FusedChunk, "__call__",
                        lambda self, *b: calls.append((self.text, self.reduction)) or original(self, *b))
    xn = rng.random((40, 40), dtype=np.float32)
    x = da.from_array(xn, chunks=10)
    s = ((x * 2 + 1) ** 2 - x).sum()
    with fusing():
        got = s.compute(scheduler="sync")
    assert len(calls) == 16 and set(calls) == {("((((v0 * 2) + 1) ** 2) - v0)", "sum")}
    assert abs(float(got) - ((xn.astype(np.float64) * 2 + 1) ** 2 - xn).sum()) < 1e-3
    with fusing(False):
        s.compute(scheduler="sync")
    assert len(calls) == 16


def test_non_elementwise_graph_is_untouched(rng):
    x = da.from_array(rng.random((30, 30)), chunks=10)
    e = (x @ x).T
    assert fg.optimize(e).__dask_graph__() is e.__dask_graph__()

"""flowgpu.optimize: chains of ufuncs in a dask graph become one fused kernel, same results.

The reductions they feed: tests/fusion/test_graph_reduce.py."""

from __future__ import annotations

import dask.array as da
import numpy as np

import flowgpu as fg
from flowgpu.fusion import fused_elementwise, fusing
from flowgpu.fusion.chunk import FusedChunk
from flowgpu.fusion.graph import fusions


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


def test_fused_elementwise_layers_join_the_chains_around_them(rng):
    """An ``expr`` step or ``fused_elementwise`` result is a chain like any other: the ufuncs after
    it and the reduction reading them become one kernel with it, with NumPy's values."""
    xn, yn = rng.standard_normal((40, 30)), rng.random((40, 30)) + 0.5
    x, y = da.from_array(xn, chunks=(10, 15)), da.from_array(yn, chunks=(10, 15))
    first = fused_elementwise("(a * 2 + 1e-3) ** 2 - a / b", {"a": x, "b": y})
    total = (first * -3.0 + y).sum(axis=0)
    found = fusions(total.__dask_graph__(), keep={total.name})
    assert [(len(f.members), f.reduction) for f in found] == [(4, "sum")]  # fused, *, +, sum's chunk stage
    assert found[0].text.count("**") == 1 and "1e-3" in found[0].text
    with fusing():
        got = total.compute()
    np.testing.assert_allclose(got, ((-3.0 * ((xn * 2 + 1e-3) ** 2 - xn / yn)) + yn).sum(0), rtol=1e-12)


def test_a_fused_layer_with_a_cast_or_a_nan_constant_stays_its_own_kernel(rng):
    xn = rng.standard_normal((30, 20)).astype(np.float32)
    x = da.from_array(xn, chunks=10)
    cast = fused_elementwise("x * 3.5", {"x": x}, dtype="float64")  # the cast is the kernel's: not a template
    nan = fused_elementwise("where(x > 0, x, c)", {"x": x, "c": float("nan")})
    for arr, want in ((cast + 1, (xn * np.float32(3.5)).astype(np.float64) + 1), (nan + 1, np.where(xn > 0, xn, np.nan) + 1)):
        assert fusions(arr.__dask_graph__(), keep={arr.name}) == []
        with fusing():
            np.testing.assert_allclose(arr.compute(), want, rtol=1e-6)


def test_a_long_chain_of_fused_layers_is_cut_into_kernels_of_bounded_depth(rng):
    xn = rng.random((20, 20))
    z = x = da.from_array(xn, chunks=10)
    want = xn
    for _ in range(40):
        z = fused_elementwise("v * 1.01 + 0.5 - v / 3", {"v": z})
        want = want * 1.01 + 0.5 - want / 3
    found = fusions(z.__dask_graph__(), keep={z.name})
    assert len(found) > 1 and all(len(f.members) < 40 for f in found)
    with fusing():
        np.testing.assert_allclose(z.compute(), want, rtol=1e-12)

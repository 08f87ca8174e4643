"""Bugs of the fusion compiler found by a differential test against NumPy (issue 16), one section each.

Every case runs the same code unfused with NumPy and fused (``fusing()`` on a plain dask graph,
``fg.fuse`` and, where the language is concerned, ``fused_elementwise``) on fresh random data:
values and dtypes must be NumPy's.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.fusion import fusing
from flowgpu.fusion.chunk import FusedChunk

pytestmark = pytest.mark.timeout(120)


def _fused_texts(arr) -> list[str]:
    return [layer.task.func.text for layer in arr.__dask_graph__().layers.values()
            if isinstance(getattr(getattr(layer, "task", None), "func", None), FusedChunk)]


def _same(got, want) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)


def _under_fusing(lazy):
    with fusing():
        return lazy.compute(scheduler="sync")


# ------------------------------------------------- bug 1: a negative scalar as the base of **


def test_negative_scalar_base_of_power(rng):
    """Bug 1: `(-2.0) ** (x + 1)` gave -(2.0 ** (x + 1)): the text `(-2.0 ** v0)` re-parsed."""
    xn = rng.integers(0, 6, (30, 20)).astype(np.float64)  # whole exponents: the signs alternate
    x = da.from_array(xn, chunks=(11, 7))
    with np.errstate(invalid="ignore"):
        want = (-2.0) ** (xn + 1) * (-3) ** (xn - 1)
    e = (-2.0) ** (x + 1) * (-3) ** (x - 1)
    (text,) = _fused_texts(fg.optimize(e))
    assert "(-2.0) **" in text and "(-3) **" in text
    _same(_under_fusing(e), want)
    _same(fg.fuse(lambda a: (-2.0) ** (a + 1) * (-3) ** (a - 1))(x).compute(), want)
    total = fg.fuse(lambda a: ((-2.0) ** (a + 1)).sum())(x).compute()
    assert float(total) == pytest.approx(((-2.0) ** (xn + 1)).sum(), rel=1e-12)

"""The tiled map + reduce for chunks with transposed inputs: same values as NumPy, any shape."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from flowgpu.fusion import fused_elementwise, tiled


def test_applies_only_to_2d_blocks_with_a_transposed_input():
    a = np.zeros((600, 400), dtype=np.float32)
    b = np.zeros((400, 600), dtype=np.float32)
    assert tiled.applies((a, b.T), a.shape)
    assert not tiled.applies((a, a), a.shape)  # all C-ordered: the flat kernel is better
    assert not tiled.applies((a, b.T[:, ::2]), a.shape)  # strided views: not tile-readable
    assert not tiled.applies((a[:10, :10], b.T[:10, :10]), (10, 10))  # too small to matter
    assert not tiled.applies((a.astype(np.complex64), b.T), a.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["sum", "mean", "min", "max", "prod"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("shape", [(700, 513), (1024, 1024)], ids=["ragged", "square"])
def test_gpu_transposed_inputs_match_numpy(rng, reduction, dtype, shape):
    import cupy as cp

    rows, cols = shape
    if reduction == "prod":
        xn = (1 + (rng.random((rows, cols)) - 0.5) * 1e-3).astype(dtype) if dtype != "int32" else \
            np.where(rng.random((rows, cols)) < 0.999, 1, -1).astype(dtype)
        yn = np.ones((cols, rows), dtype=dtype)
    else:
        # x * 2 - y averages 20, so its sum stays 30 standard deviations from zero, where a
        # relative tolerance on the result would mean nothing
        xn = (rng.standard_normal((rows, cols)) * 100 + 10).astype(dtype)
        yn = (rng.standard_normal((cols, rows)) * 100).astype(dtype)
    x = da.from_array(cp.asarray(xn), chunks=shape)
    y = da.from_array(cp.asarray(yn), chunks=shape[::-1])
    text = "x * y" if reduction == "prod" else "x * 2 - y"
    got = fused_elementwise(text, {"x": x, "y": y.T}, reduction=reduction).compute()
    ref = (xn.astype(np.float64) * yn.T if reduction == "prod" else xn.astype(np.float64) * 2 - yn.T)
    if dtype != "float64":
        ref = ref.astype(dtype)  # the values the kernel reduces are of the expression's dtype
    want = getattr(np, reduction)(ref.astype(np.float64) if ref.dtype.kind == "f" else ref)
    assert tiled._kernels, "the tiled kernel was not used"
    if reduction == "prod" and dtype == "float32":
        # a float32 product of 10^5-10^6 factors multiplies in float32, as CuPy's own does: on the H200
        # cupy.prod is 9e-4 / 2.6e-3 from float64 here (NumPy's 6e-7 / 1.3e-5); no worse than that
        own = abs(float(cp.prod(cp.asarray(ref))) - float(want))
        assert abs(float(got) - float(want)) <= max(2 * own, 1e-5 * abs(float(want)))
        return
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6 if dtype != "float32" else 1e-5)


@pytest.mark.gpu
def test_gpu_x_plus_x_transpose_over_chunks(rng):
    import cupy as cp

    xn = rng.random((2000, 2000), dtype=np.float32)
    x = da.from_array(cp.asarray(xn), chunks=1000)
    got = fused_elementwise("a + b", {"a": x, "b": x.T}, reduction="sum").compute()
    want = 2 * xn.astype(np.float64).sum()
    assert abs(float(got) - want) / want < 1e-6
    again = fused_elementwise("a + b", {"a": x, "b": x.T}, reduction="sum").compute()
    assert float(again) == float(got)  # partials combine in a fixed order

"""matmul and tensordot equal NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get
from tests.ops.conftest import chunked, computed, max_rel_err


def test_matmul_float32_against_float64(rng, backend):
    a = rng.random((20, 15)).astype(np.float32)
    b = rng.random((15, 9)).astype(np.float32)
    out = get("matmul")(chunked(a, (8, 5), backend), chunked(b, (5, 4), backend))
    result = computed(out, backend)
    assert result.dtype == np.float32
    assert max_rel_err(result, a.astype(np.float64) @ b.astype(np.float64)) < 1e-6


def test_matmul_stacked_and_vector(rng, backend):
    a = rng.random((3, 6, 5))
    b = rng.random((5, 4))
    v = rng.random(5)
    np.testing.assert_allclose(computed(get("matmul")(chunked(a, (2, 3, 5), backend), chunked(b, (5, 2), backend)),
                                        backend), a @ b, rtol=1e-12)
    np.testing.assert_allclose(computed(get("matmul")(chunked(a[0], 3, backend), chunked(v, 5, backend)), backend),
                               a[0] @ v, rtol=1e-12)


def test_matmul_shape_mismatch_says_which_axes(rng):
    import dask.array as da

    with pytest.raises(OpError, match=r"a's last axis \(5\) must equal b's second-to-last axis \(4\)"):
        get("matmul")(da.from_array(rng.random((3, 5))), da.from_array(rng.random((4, 2))))


def test_tensordot(rng, backend):
    a = rng.random((4, 5, 6))
    b = rng.random((6, 5, 3))
    out = get("tensordot")(chunked(a, (2, 5, 3), backend), chunked(b, (3, 5, 3), backend), axes=[[1, 2], [1, 0]])
    np.testing.assert_allclose(computed(out, backend), np.tensordot(a, b, axes=([1, 2], [1, 0])), rtol=1e-12)

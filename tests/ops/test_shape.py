"""transpose, slice, reshape, rechunk, concatenate, stack, squeeze equal NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.errors import ChunkError, OpError
from flowgpu.ops import get
from flowgpu.ops.shape import parse_index
from tests.ops.conftest import chunked, computed


@pytest.mark.parametrize("axes", [None, [1, 0, 2], [2, 0, 1], (-1, 0, 1)])
def test_transpose(axes, rng, backend):
    a = rng.random((6, 5, 4))
    result = computed(get("transpose")(chunked(a, (4, 2, 3), backend), axes=axes), backend)
    np.testing.assert_array_equal(result, np.transpose(a, axes))


def test_transpose_rejects_a_non_permutation(rng):
    import dask.array as da

    with pytest.raises(OpError, match="not a permutation"):
        get("transpose")(da.from_array(rng.random((2, 3))), axes=[0, 0])


@pytest.mark.parametrize("index, expected", [
    ("0:10, ::2", np.s_[0:10, ::2]),
    ("3", np.s_[3]),
    ("..., -1", np.s_[..., -1]),
    ("-5:, 1:9:3", np.s_[-5:, 1:9:3]),
    ([[0, 10], None], np.s_[0:10, :]),
    ([None, [1, None, 2]], np.s_[:, 1::2]),
    ([2, "::-1"], np.s_[2, ::-1]),
    ("1:4,", np.s_[1:4]),
])
def test_slice(index, expected, rng, backend):
    a = rng.random((17, 12))
    result = computed(get("slice")(chunked(a, (5, 5), backend), index=index), backend)
    np.testing.assert_array_equal(result, a[expected])


@pytest.mark.parametrize("index, message", [
    ("0:x", "'x' in '0:x' is not a whole number"),
    ("1:2:3:4", "more than two ':'"),
    ([[1, 2, 3, 4]], "should be \\[start, stop\\]"),
    ("0, 0, 0", "does not fit an array of shape"),
    ("99", "does not fit an array of shape"),
])
def test_bad_slices_say_what_is_wrong(index, message, rng):
    import dask.array as da

    with pytest.raises(OpError, match=message):
        get("slice")(da.from_array(rng.random((5, 5))), index=index)


def test_parse_index_is_plain_python():
    assert parse_index("0:100, ::2") == (slice(0, 100), slice(None, None, 2))
    assert parse_index([[0, 100], None, 3]) == (slice(0, 100), slice(None), 3)


def test_reshape(rng, backend):
    a = rng.random((6, 8))
    result = computed(get("reshape")(chunked(a, (3, 4), backend), shape=[4, -1]), backend)
    np.testing.assert_array_equal(result, a.reshape(4, -1))
    with pytest.raises(OpError, match="cannot reshape"):
        get("reshape")(chunked(a, (3, 4), backend), shape=[5, 5])


@pytest.mark.parametrize("chunks, expected", [(5, ((5, 5, 2), (5, 5))), ([-1, 3], ((12,), (3, 3, 3, 1))),
                                              ({0: 6}, ((6, 6), (4, 4, 2)))])
def test_rechunk(chunks, expected, rng, backend):
    a = rng.random((12, 10))
    out = get("rechunk")(chunked(a, 4, backend), chunks=chunks)
    assert out.chunks == expected
    np.testing.assert_array_equal(computed(out, backend), a)


def test_rechunk_by_bytes_and_bad_value(rng):
    import dask.array as da

    x = da.from_array(rng.random((64, 64)), chunks=8)
    out = get("rechunk")(x, chunks="8KiB")
    assert max(out.chunks[0]) * max(out.chunks[1]) * 8 <= 8192
    with pytest.raises(OpError, match="neither 'auto' nor a byte size"):
        get("rechunk")(x, chunks="lots")
    with pytest.raises(ChunkError):
        get("rechunk")(x, chunks=[1, 2, 3])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_and_stack(axis, rng, backend):
    arrays = [rng.random((4, 6)) for _ in range(3)]
    xs = [chunked(a, 3, backend) for a in arrays]
    np.testing.assert_array_equal(computed(get("concatenate")(*xs, axis=axis), backend),
                                  np.concatenate(arrays, axis=axis))
    np.testing.assert_array_equal(computed(get("stack")(*xs, axis=axis), backend), np.stack(arrays, axis=axis))


def test_concatenate_mismatch_names_the_shapes(rng):
    import dask.array as da

    a, b = da.from_array(rng.random((3, 4))), da.from_array(rng.random((3, 5)))
    with pytest.raises(OpError, match=r"shapes \(3, 4\), \(3, 5\) along axis 0"):
        get("concatenate")(a, b, axis=0)


def test_squeeze(rng, backend):
    a = rng.random((1, 5, 1))
    np.testing.assert_array_equal(computed(get("squeeze")(chunked(a, 2, backend)), backend), a.squeeze())
    np.testing.assert_array_equal(computed(get("squeeze")(chunked(a, 2, backend), axis=0), backend),
                                  a.squeeze(axis=0))

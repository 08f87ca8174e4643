"""chunks="auto": blocks bounded by the target, spread evenly so no task is a small leftover."""

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.arrays.chunks import resolve_chunks


@pytest.mark.parametrize("shape, target", [((40000, 40000), "4GiB"), ((1001, 999), "1MiB"), ((10**7,), "3MiB")])
def test_auto_chunks_are_even_and_within_the_target(shape, target):
    with dask.config.set({"flowgpu.chunks.cpu-target": target}):
        chunks = resolve_chunks("auto", shape, "float32")
    limit = dask.utils.parse_bytes(target)
    assert tuple(sum(c) for c in chunks) == shape
    assert int(np.prod([max(c) for c in chunks])) * 4 <= limit
    for c in chunks:
        assert max(c) - min(c) <= 1  # even: no ragged last block
    if shape == (40000, 40000):
        assert chunks == ((20000, 20000), (20000, 20000))  # not 32768 + 7232


def test_explicit_chunks_are_kept_as_given_and_auto_axes_evened(rng):
    with dask.config.set({"flowgpu.chunks.cpu-target": "64KiB"}):
        chunks = resolve_chunks(("auto", 300), (5000, 1000), "float64")
        assert chunks[1] == (300, 300, 300, 100)
        assert max(chunks[0]) - min(chunks[0]) <= 1
        data = rng.random((5000, 1000))
        x = fg.from_array(data, chunks=("auto", 300))
    np.testing.assert_array_equal(x.compute(scheduler="sync"), data)

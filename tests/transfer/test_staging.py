"""The staging pipeline's logic without a GPU: a stand-in CuPy runs each device copy as late as
CUDA may, so a staging buffer refilled before its copy has run shows up as wrong bytes."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.transfer import staging
from flowgpu.transfer.pinned import PinnedPool
from tests.transfer.fakes import fake_pinned, fake_staging


@pytest.fixture
def fake_cp(monkeypatch):
    return fake_staging(monkeypatch)


@pytest.mark.parametrize("depth", [1, 2, 4, 9])
def test_file_rows_arrive_intact_through_many_slices(tmp_path, rng, fake_cp, depth):
    data = rng.standard_normal((203, 37))
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    offset = np.load(path, mmap_mode="r").offset
    pool = PinnedPool(allocator=fake_pinned)
    out = staging.file_rows_to_device(path, offset + 11 * 37 * 8, (180, 37), np.float64,
                                      budget=37 * 8 * 7, pool=pool)  # 26 slices of 7 rows
    staging_depth = staging.DEPTH
    try:
        staging.DEPTH = depth
        again = staging.file_rows_to_device(path, offset, (203, 37), np.float64, budget=37 * 8 * 5, pool=pool)
    finally:
        staging.DEPTH = staging_depth
    np.testing.assert_array_equal(out.a, data[11:191])
    np.testing.assert_array_equal(again.a, data)
    assert pool.stats()["in_use"] == 0  # every staging buffer given back
    # one buffer per slice in flight plus one, reused by the second read (same size class)
    assert pool.stats()["allocations"] == max(staging_depth, depth) + 1


def test_host_blocks_arrive_intact_also_through_pageable_fallback(rng, fake_cp):
    data = rng.integers(-1000, 1000, (50, 3, 4), dtype=np.int32)
    pinned = staging.to_device_staged(data, budget=3 * 4 * 4 * 6, pool=PinnedPool(allocator=fake_pinned))
    with pytest.warns(RuntimeWarning, match="using pageable host memory instead"):
        pageable = staging.to_device_staged(data[::2], budget=3 * 4 * 4 * 4, pool=PinnedPool(capacity=0))
    np.testing.assert_array_equal(pinned.a, data)
    np.testing.assert_array_equal(pageable.a, data[::2])


def test_a_failing_fill_returns_every_buffer(rng, fake_cp):
    class Flaky(np.ndarray):
        def __getitem__(self, key):
            if isinstance(key, slice) and key.start and key.start >= 30:
                raise OSError("read error (fake)")
            return super().__getitem__(key)

    data = rng.standard_normal((60, 8)).view(Flaky)
    pool = PinnedPool(allocator=fake_pinned)
    with pytest.raises(OSError, match="read error"):
        staging._staged((60, 8), np.dtype(np.float64), (60, 8),
                        lambda staged, a, b: np.copyto(staged, np.asarray(data[a:b])), 8 * 8 * 5, pool)
    assert pool.stats()["in_use"] == 0


def test_large_blocks_are_staged_and_small_ones_copied_plainly(tmp_path, rng, fake_cp):
    """What flowgpu.to_device (arrays) and from_npy (io) call for each block."""
    big = rng.standard_normal(staging.STAGE_MIN // 8 + 3)
    small = rng.integers(0, 100, (7, 5))
    got_big, got_small = staging.host_to_device(big), staging.host_to_device(small)
    np.testing.assert_array_equal(got_big.a, big)
    np.testing.assert_array_equal(got_small.a, small)
    pool = staging.staging_pool().stats()
    assert pool["allocations"] >= 1 and pool["in_use"] == 0  # the large block went through staging
    assert fake_cp.plain_copies == 1  # the small one straight through asarray
    data = rng.integers(-50, 50, (40, 3, 2), dtype=np.int16)
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    offset = np.load(path, mmap_mode="r").offset
    takes = pool["allocations"] + pool["reuses"]
    rows = staging.file_rows_to_device(path, offset + 5 * 6 * 2, (30, 3, 2), data.dtype)
    np.testing.assert_array_equal(rows.a, data[5:35])
    pool = staging.staging_pool().stats()
    assert fake_cp.plain_copies == 1 and pool["allocations"] + pool["reuses"] > takes  # read into staging
    assert staging.file_rows_to_device(path, offset, (0, 3, 2), np.int16).a.shape == (0, 3, 2)

"""``from_npy`` on GPU sessions reads straight into pinned staging buffers; the values never change."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.io.npy import NpyReader
from flowgpu.transfer.staging import file_rows_to_device, staging_pool
from tests.transfer.fakes import fake_staging


def test_row_blocks_are_recognised_as_one_byte_range(tmp_path, rng):
    path = str(tmp_path / "a.npy")
    np.save(path, rng.random((10, 4, 3)).astype(np.float32))
    r = NpyReader(path)
    assert r._rows((slice(2, 7), slice(0, 4), slice(0, 3))) == (2, 7)
    assert r._rows((slice(2, 7),)) == (2, 7)
    assert r._rows((slice(2, 7), slice(0, 2), slice(0, 3))) is None  # part of each row
    assert r._rows((slice(0, 10, 2),)) is None
    assert r._rows((3,)) is None
    fpath = str(tmp_path / "f.npy")
    np.save(fpath, np.asfortranarray(rng.random((6, 5))))
    assert NpyReader(fpath)._rows((slice(0, 3),)) is None  # Fortran order: not contiguous rows
    assert NpyReader(fpath).offset == np.load(fpath, mmap_mode="r").offset


@pytest.mark.parametrize("order", ["C", "F"])
def test_device_reads_go_through_staging(tmp_path, rng, monkeypatch, order):
    """Row blocks of a C-ordered file are one byte range read into staging buffers; other blocks
    (and Fortran files) come from the memory map through host_to_device."""
    cp = fake_staging(monkeypatch)
    data = rng.standard_normal((40, 30)).astype(np.float32)
    data = np.asfortranarray(data) if order == "F" else data
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    r = NpyReader(path, device=True)
    rows, part = r[(slice(5, 25), slice(0, 30))], r[(slice(5, 25), slice(3, 9))]
    np.testing.assert_array_equal(rows.a, data[5:25])
    np.testing.assert_array_equal(part.a, data[5:25, 3:9])
    # small blocks: cupy.asarray, except the row block of a C file, which is read into staging buffers
    assert cp.plain_copies == (1 if order == "C" else 2)


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [(7, 64), (7, 20), (50, 64)], ids=["row-blocks", "column-blocks", "one-block"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_gpu_from_npy_matches_the_file(tmp_path, rng, chunks, order):
    import cupy as cp

    data = rng.standard_normal((50, 64)).astype(np.float32)
    data = np.asfortranarray(data) if order == "F" else data
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        x = fg.from_npy(path, chunks=chunks)
        assert isinstance(x._meta, cp.ndarray)
        got = x.compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), data)


@pytest.mark.gpu
def test_gpu_file_rows_to_device_spans_many_staging_slices(tmp_path, rng):
    import cupy as cp

    data = rng.integers(0, 1 << 30, (301, 77), dtype=np.int64)
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    offset = np.load(path, mmap_mode="r").offset
    got = file_rows_to_device(path, offset + 13 * 77 * 8, (200, 77), np.int64, budget=77 * 8 * 9)  # 9 rows a slice
    np.testing.assert_array_equal(cp.asnumpy(got), data[13:213])


@pytest.mark.gpu
def test_gpu_to_device_stages_large_numpy_blocks(rng):
    import cupy as cp

    data = rng.random((1 << 20) + 5)  # 8 MiB: above the staging threshold
    with dask.config.set({"array.backend": "cupy"}):
        x = fg.to_device(da.from_array(data, chunks=(1 << 19) + 3))
        got = x.compute(scheduler="threads")
    np.testing.assert_array_equal(cp.asnumpy(got), data)


@pytest.mark.gpu
def test_gpu_file_rows_read_past_the_end_fails_cleanly(tmp_path, rng):
    data = rng.random((100, 50))
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    offset = np.load(path, mmap_mode="r").offset
    before = staging_pool().stats()["in_use"]
    with pytest.raises(OSError, match="file ended"):
        file_rows_to_device(path, offset, (130, 50), np.float64, budget=50 * 8 * 7)  # 30 rows too many
    assert staging_pool().stats()["in_use"] == before  # every staging buffer came back


def test_a_read_past_the_end_of_the_file_is_refused_before_any_copy(tmp_path, rng):
    data = rng.random((100, 50))
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    offset = np.load(path, mmap_mode="r").offset
    with pytest.raises(OSError, match=r"file ended 12000 bytes early: 52000 bytes wanted at offset"):
        file_rows_to_device(path, offset, (130, 50), np.float64)  # 30 rows of 400 bytes too many

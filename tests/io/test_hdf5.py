"""``source: hdf5`` / ``fg.from_hdf5``: an HDF5 file made here with h5py reads chunk by chunk equal to
NumPy's, on the CPU and through the device path (pinned staging, with the stand-in CuPy here)."""

from __future__ import annotations

import sys

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import ConfigError, SourceError
from flowgpu.io import hdf5, sources
from flowgpu.transfer import staging
from tests.transfer.fakes import fake_staging

h5py = pytest.importorskip("h5py")


@pytest.fixture
def h5file(tmp_path, rng):
    """A file with a gzip-chunked, a contiguous, a big-endian integer and a scalar dataset, in groups."""
    data = {
        "/fields/temp": rng.standard_normal((120, 33, 17)).astype("float32"),
        "/plain": rng.random((70, 41)),
        "/counts/be": rng.integers(-1000, 1000, (55, 9)).astype(">i4"),
        "/scalar": np.float64(rng.random()),
    }
    path = tmp_path / "run.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/fields/temp", data=data["/fields/temp"], chunks=(8, 11, 17), compression="gzip")
        f.create_dataset("/plain", data=data["/plain"])  # contiguous
        f.create_dataset("/counts/be", data=data["/counts/be"], chunks=(10, 9))
        f.create_dataset("/scalar", data=data["/scalar"])
        f.create_dataset("/names", data=np.array([b"a", b"b"]))
    return str(path), data


@pytest.mark.parametrize("name, chunks", [("/fields/temp", (13, 11, 5)), ("fields/temp", "auto"),
                                          ("/plain", (16, 20)), ("/counts/be", (7, 4)), ("/scalar", "auto")])
def test_reads_chunk_by_chunk_equal_to_numpy(h5file, name, chunks):
    path, data = h5file
    want = data["/" + name.lstrip("/")]
    x = fg.from_hdf5(path, name, chunks=chunks)
    assert x.dtype == want.dtype.newbyteorder("=") and x.dtype.isnative
    if chunks != "auto":
        assert x.chunks == dask.array.core.normalize_chunks(chunks, want.shape)
        # every block on its own, as a worker reads it
        for index in np.ndindex(*x.numblocks):
            sl = tuple(slice(sum(c[:i]), sum(c[:i + 1])) for c, i in zip(x.chunks, index))
            np.testing.assert_array_equal(x.blocks[index].compute(), want[sl])
    np.testing.assert_array_equal(x.compute(), want)


def test_the_registry_source_and_the_python_api_agree(h5file):
    path, data = h5file
    x = sources.open_source("hdf5", path=path, dataset="/fields/temp", chunks=[40, -1, -1])
    assert x.numblocks == (3, 1, 1)
    np.testing.assert_array_equal(x.compute(), data["/fields/temp"])
    assert sources.reads_files("hdf5")


def test_auto_chunks_are_whole_multiples_of_the_stored_chunks(tmp_path, rng):
    want = rng.random((1000, 700)).astype("float32")  # 2.8 MB, chunks of 64 x 100
    path = str(tmp_path / "big.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=want, chunks=(64, 100))
    with dask.config.set({"flowgpu.chunks.cpu-target": "1MiB"}):
        x = fg.from_hdf5(path, "x")
    assert x.npartitions > 1
    for axis, stored in enumerate((64, 100)):
        assert all(c % stored == 0 for c in x.chunks[axis][:-1]), x.chunks
    np.testing.assert_array_equal(x.compute(), want)


def test_one_dataset_needs_no_name(tmp_path, rng):
    want = rng.random((9, 4))
    path = str(tmp_path / "one.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("/deep/only", data=want)
    np.testing.assert_array_equal(fg.from_hdf5(path).compute(), want)


def test_bad_input_is_one_clear_error(h5file, tmp_path):
    path, _ = h5file
    with pytest.raises(SourceError, match=r"has no dataset '/fields/tmp'; it holds /counts/be, /fields/temp, /names, "
                                          r"/plain, /scalar; did you mean '/fields/temp'\?") as e:
        fg.from_hdf5(path, "/fields/tmp")
    assert e.value.option == "dataset"
    with pytest.raises(SourceError, match="'fields' .* is a group, not a dataset; .*: /fields/temp"):
        fg.from_hdf5(path, "fields")
    with pytest.raises(SourceError, match="holds 5 datasets, so name one as its dataset \\(its path in the file, e.g. '/"):
        fg.from_hdf5(path)
    with pytest.raises(SourceError, match=r"holds \|S1 values, not numbers"):
        fg.from_hdf5(path, "/names")
    (tmp_path / "fake.h5").write_bytes(b"not hdf5 at all" * 10)
    with pytest.raises(SourceError, match="is not an HDF5 file") as e:
        fg.from_hdf5(str(tmp_path / "fake.h5"), "x")
    assert e.value.option == "path"
    with pytest.raises(SourceError, match="does not exist"):
        fg.from_hdf5(str(tmp_path / "missing.h5"), "x")


@pytest.mark.parametrize("index", [(3, slice(2, 9)), -1, (-2, -7), (3, 4), (slice(None, None, -2), 4),
                                   (Ellipsis, -3), (slice(1, 6, 2), slice(9, 0, -3)), [4, 0, 5], slice(5, 2)],
                         ids=["int-and-slice", "negative", "two-negatives", "one-value", "reversed-step", "ellipsis",
                              "steps", "list", "empty"])
def test_any_numpy_index_reads_what_h5py_holds(tmp_path, rng, index):
    """Integer indexes (``op: slice``, ``op: squeeze``) reach the reader fused into its block's slices."""
    path = str(tmp_path / "i.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("/g/x", data=rng.standard_normal((6, 10)), chunks=(2, 5))
        f.create_dataset("a", data=rng.random((1, 9)))
    with h5py.File(path, "r") as f:
        want, row = f["/g/x"][()], f["a"][()]
    got = fg.from_hdf5(path, "/g/x", chunks=(4, 3))[index].compute()
    assert got.shape == want[index].shape
    np.testing.assert_array_equal(got, want[index])
    np.testing.assert_array_equal(fg.from_hdf5(path, "a").squeeze().compute(), row[0])


def test_missing_h5py_says_how_to_install(monkeypatch, h5file):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    with pytest.raises(ConfigError, match=r"needs h5py.*pip install 'flowgpu\[formats\]'"):
        fg.from_hdf5(h5file[0], "/plain")


def test_a_file_changed_after_planning_is_an_error_not_other_values(h5file, rng):
    path, _ = h5file
    x = fg.from_hdf5(path, "/plain", chunks=(35, 41))
    with h5py.File(path, "a") as f:
        del f["/plain"]
        f.create_dataset("/plain", data=rng.random((10, 41)))
    with pytest.raises(OSError, match="is now .* the file changed after the run was planned"):
        x.compute()


# -- the device path: blocks reach the device through pinned staging buffers -----------------------

@pytest.mark.parametrize("userblock", [0, 512])
def test_device_reads_stage_contiguous_rows_as_one_byte_range(tmp_path, rng, monkeypatch, userblock):
    """A contiguous dataset's row block is read from the file into the staging buffers (as .npy's), its
    offset found by HDF5 (also past a user block); other blocks are decoded by HDF5 into them."""
    cp = fake_staging(monkeypatch)
    ranges = []
    monkeypatch.setattr(hdf5, "file_rows_to_device", lambda *a, **k: ranges.append(a) or staging.file_rows_to_device(
        *a, **k))
    want = rng.standard_normal((300, 2500))  # 6 MB: above STAGE_MIN
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset("x", data=want)
    r = hdf5.Hdf5Reader(path, "/x", want.shape, want.dtype, device=True)
    rows = r[(slice(20, 290), slice(0, 2500))]
    np.testing.assert_array_equal(rows.a, want[20:290])
    assert len(ranges) == 1
    part = r[(slice(20, 290), slice(100, 2400))]  # not whole rows: decoded by HDF5 into the buffers
    np.testing.assert_array_equal(part.a, want[20:290, 100:2400])
    assert len(ranges) == 1 and getattr(cp, "plain_copies", 0) == 0


def test_device_reads_of_compressed_chunks_decode_into_staging(tmp_path, rng, monkeypatch):
    cp = fake_staging(monkeypatch)
    monkeypatch.setattr(staging, "STAGING_BYTES", 1 << 20)  # several slices per block
    want = rng.integers(0, 1 << 20, (640, 3000)).astype(">i4")  # big-endian on disk
    path = str(tmp_path / "z.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=want, chunks=(64, 500), compression="gzip")
    r = hdf5.Hdf5Reader(path, "/x", want.shape, np.dtype("int32"), device=True)
    got = r[(slice(64, 640), slice(0, 3000))]
    np.testing.assert_array_equal(got.a, want[64:640])
    small = r[(slice(0, 3), slice(0, 10))]  # below STAGE_MIN: one cupy.asarray copy
    np.testing.assert_array_equal(small.a, want[:3, :10])
    assert cp.plain_copies == 1


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "gzip-chunks"])
@pytest.mark.parametrize("chunks", [(400, -1), (800, 2000), (50, 300)], ids=["row-blocks", "column-blocks", "small"])
def test_gpu_from_hdf5_matches_the_file(tmp_path, rng, monkeypatch, layout, chunks):
    """Blocks of 4.8 and 6.4 MB go through the staging buffers (1 MiB slices: several per block), the small
    ones through cupy.asarray; row blocks of the contiguous dataset are read from the file directly."""
    import cupy as cp

    monkeypatch.setattr(staging, "STAGING_BYTES", 1 << 20)
    want = rng.standard_normal((1600, 3000)).astype("float32")
    path = str(tmp_path / "g.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("/g/x", data=want, **({"chunks": (100, 1000), "compression": "gzip"}
                                                if layout == "gzip-chunks" else {}))
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        x = fg.from_hdf5(path, "/g/x", chunks=chunks)
        assert isinstance(x._meta, cp.ndarray)
        got = x.compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), want)

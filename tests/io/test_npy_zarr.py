"""The array API's files: .npy read in chunks through a memory map, Zarr and .npy written atomically."""

from __future__ import annotations

import os
import pickle
import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import ConfigError, OutputError, OutputExistsError, PathNotVisibleError
from flowgpu.io.zarr import store_zarr
from tests.tolerance import assert_within_terms


def test_npy_roundtrip_reads_chunks_not_the_file(tmp_path, rng):
    data = rng.standard_normal((1500, 1100)).astype(np.float32)  # 6.6 MB
    path = str(tmp_path / "x.npy")
    np.save(path, data)
    x = fg.from_npy(path, chunks=(500, 400))
    assert x.chunks == ((500, 500, 500), (400, 400, 300))
    # only the path travels in the graph, never the data
    assert len(pickle.dumps(dict(x.__dask_graph__()))) < 100_000
    np.testing.assert_array_equal(fg.to_numpy(x), data)
    part = data[100:700, 50:].astype(np.float64)  # float32 sums round by epsilons of the terms, not the result
    assert_within_terms(float(x[100:700, 50:].sum().compute()), part.sum(), np.abs(part).sum(), 64, np.float32)


def test_a_npy_reader_unpickles_without_the_file_and_its_read_says_where_it_is_missing(tmp_path, rng):
    """A worker unpickles the reader before the task runs: a file it cannot see must fail the task (a
    FileNotFoundError while unpickling stopped the worker and the compute hung)."""
    path = str(tmp_path / "x.npy")
    np.save(path, rng.random((30, 7)))
    x = fg.from_npy(path, chunks=(10, 7))
    graph = pickle.dumps(dict(x.__dask_graph__()))
    os.rename(path, path + ".away")
    assert len(pickle.loads(graph)) == len(x.__dask_graph__())
    with pytest.raises(PathNotVisibleError, match=rf"\.npy file '{path}' is not there for process \d+ on host .* \(working "
                                                  rf"directory {os.getcwd()}\); the workers do not see this path"):
        x.compute(scheduler="sync")


def test_to_npy_writes_in_parallel_and_atomically(tmp_path, rng):
    data = rng.standard_normal((300, 70))
    out = str(tmp_path / "y.npy")
    fg.to_npy(da.from_array(data, chunks=(64, 30)) * 2, out)
    np.testing.assert_array_equal(np.load(out), data * 2)
    with pytest.raises(OutputExistsError):
        np.save(str(tmp_path / "foreign.npy"), data)
        fg.to_npy(da.from_array(data, chunks=50), str(tmp_path / "foreign.npy"))
    np.testing.assert_array_equal(np.load(str(tmp_path / "foreign.npy")), data)  # untouched


def test_zarr_roundtrip(tmp_path, rng):
    data = rng.standard_normal((250, 120)).astype(np.float32)
    path = str(tmp_path / "z.zarr")
    fg.to_zarr(fg.from_array(data, chunks=(100, 50)), path)
    back = fg.from_zarr(path)
    assert back.chunks[0][0] == 100
    np.testing.assert_array_equal(fg.to_numpy(back), data)
    np.testing.assert_array_equal(fg.to_numpy(fg.from_zarr(path, chunks=(125, 120))), data)


def _explode(block):
    if block[0, 0] > -np.inf:
        raise RuntimeError("boom")
    return block


@pytest.mark.parametrize("shards", [None, [20, 30]])
def test_a_lz4_store_flowgpu_wrote_reads_without_warnings_also_where_a_worker_unpickles_it(tmp_path, rng, shards):
    """zarr says numcodecs codecs (lz4) are not in the Zarr 3 spec whenever it parses one: each worker
    unpickling a sharded array's read printed it on stderr."""
    data = rng.standard_normal((40, 30))
    path = str(tmp_path / "l.zarr")
    fg.to_zarr(fg.from_array(data, chunks=(20, 30)), path, codec="lz4", chunks=[10, 15], shards=shards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = fg.from_zarr(path)
        graph = pickle.loads(pickle.dumps(dict(x.__dask_graph__())))  # as a worker gets its tasks
        got = da.Array(graph, x.name, x.chunks, meta=x._meta).compute(scheduler="sync")
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("shards", [None, [20, 30]])
def test_a_lz4_write_gives_no_warning_where_a_worker_unpickles_its_tasks(tmp_path, rng, shards):
    """A sharded array parses its codecs again when unpickled: each worker writing a sharded lz4
    store printed zarr's numcodecs notice on stderr."""
    data = rng.standard_normal((40, 30))
    path = str(tmp_path / "w.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write = store_zarr(fg.from_array(data, chunks=(20, 30)), path, codec="lz4", chunks=[10, 15], shards=shards)
        graph = pickle.loads(pickle.dumps(dict(write.__dask_graph__())))  # as a worker gets its tasks
        da.Array(graph, write.name, write.chunks, meta=write._meta).compute(scheduler="sync")
    np.testing.assert_array_equal(fg.from_zarr(path).compute(), data)


def test_failed_write_leaves_nothing(tmp_path, rng):
    data = rng.standard_normal((100, 100))
    x = da.from_array(data, chunks=50).map_blocks(_explode, dtype=data.dtype)
    for writer, name in ((fg.to_zarr, "a.zarr"), (fg.to_npy, "a.npy")):
        with pytest.raises(RuntimeError, match="boom"):
            writer(x, str(tmp_path / name))
        assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        fg.from_npy(str(tmp_path / "nope.npy"))
    with pytest.raises(ConfigError, match="does not exist"):
        fg.from_zarr(str(tmp_path / "nope.zarr"))
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(ConfigError, match="not a readable .npy file: the magic string is not correct"):
        fg.from_npy(str(tmp_path / "bad.npy"))
    np.savez(tmp_path / "arrays.npz", a=np.arange(3))  # a .npz (a zip of .npy files) named .npy
    os.replace(tmp_path / "arrays.npz", tmp_path / "zipped.npy")
    with pytest.raises(ConfigError, match="zipped.npy' is not a readable .npy file: the magic string is not correct"):
        fg.from_npy(str(tmp_path / "zipped.npy"))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ConfigError, match="objects.npy' is not a readable .npy file: .*Python objects"):
        fg.from_npy(str(tmp_path / "objects.npy"))


def test_a_file_given_as_a_store_and_a_folder_given_as_a_file_say_what_they_are(tmp_path, rng):
    np.save(tmp_path / "x.npy", rng.normal(size=(4, 3)))
    with pytest.raises(ConfigError, match=r"x\.npy' is a file, not a Zarr store \(a folder\); named as a \.npy file"):
        fg.from_zarr(str(tmp_path / "x.npy"))
    (tmp_path / "notes").write_text("not an array")
    with pytest.raises(ConfigError, match=r"notes' is a file, not a Zarr store \(a folder\)$"):
        fg.from_zarr(str(tmp_path / "notes"))
    fg.to_zarr(fg.random((6, 5), seed=int(rng.integers(1 << 30)), chunks=3), str(tmp_path / "s.zarr"))
    with pytest.raises(ConfigError, match=r"s\.zarr' is a folder, not a \.npy file \(for a Zarr store use source: zarr\)"):
        fg.from_npy(str(tmp_path / "s.zarr"))


@pytest.mark.parametrize("write, path, better", [(fg.to_zarr, "out.npy", "out.zarr"), (fg.to_zarr, "t.tif", "t.zarr"),
                                                  (fg.to_npy, "out.zarr", "out.npy")])
def test_python_writers_refuse_a_path_named_as_another_kind_of_file(tmp_path, rng, monkeypatch, write, path, better):
    """As a spec's output is refused: a Zarr store named ``out.npy`` is a folder that np.load cannot open."""
    monkeypatch.chdir(tmp_path)
    x = da.from_array(rng.random((40, 30)), chunks=(20, 15))
    with pytest.raises(OutputError, match=f"{path!r} ends in .*name it e.g. {better!r}"):
        write(x, path)
    assert os.listdir(tmp_path) == []
    assert write(x, better) == better  # the name it suggests is written
    got = fg.to_numpy(fg.from_zarr(better) if better.endswith(".zarr") else fg.from_npy(better))
    np.testing.assert_array_equal(got, x.compute())

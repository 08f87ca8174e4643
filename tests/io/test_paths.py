"""Paths resolved on the client, and what a worker is asked before a run: flowgpu.io.paths."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import zarr

from flowgpu.errors import PathNotVisibleError
from flowgpu.io import paths
from flowgpu.io.zarr import from_zarr


def test_resolve_makes_local_paths_absolute_here_and_leaves_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.resolve("data/x.zarr") == str(tmp_path / "data" / "x.zarr")
    assert paths.resolve("~/x.npy") == str(tmp_path / "home" / "x.npy")
    assert paths.resolve("./a/../b.npy") == str(tmp_path / "b.npy")
    assert paths.resolve("s3://bucket/x.zarr") == "s3://bucket/x.zarr"


def test_metadata_files_name_what_shows_a_store_is_there(tmp_path, rng):
    v3 = zarr.create_array(str(tmp_path / "v3.zarr"), shape=(4, 3), chunks=(2, 3), dtype="f4")
    v3[:] = rng.random((4, 3))
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("t2m", shape=(4,), dtype="f8")[:] = rng.random(4)
    np.save(tmp_path / "a.npy", rng.random(3))
    assert paths.metadata_files(str(tmp_path / "v3.zarr")) == [str(tmp_path / "v3.zarr" / "zarr.json")]
    assert paths.metadata_files(str(tmp_path / "g.zarr"), "t2m") == [
        str(tmp_path / "g.zarr" / "zarr.json"), str(tmp_path / "g.zarr" / "t2m" / "zarr.json")]
    assert paths.metadata_files(str(tmp_path / "a.npy")) == [str(tmp_path / "a.npy")]
    assert paths.metadata_files(str(tmp_path / "nothing.zarr")) == []
    assert paths.metadata_files("s3://bucket/x.zarr") == []


def test_a_glob_names_each_file_it_matches(tmp_path, rng):
    """A TIFF source's glob of pages: each page is what a worker must read, and an input of the cache."""
    (tmp_path / "pages" / "deeper").mkdir(parents=True)
    for name in ("p10.tif", "p2.tif", "deeper/p3.tif", "notes.txt"):
        (tmp_path / "pages" / name).write_bytes(rng.bytes(8))
    pattern = str(tmp_path / "pages" / "p*.tif")
    assert paths.is_glob(pattern) and not paths.is_glob(str(tmp_path / "pages" / "p2.tif"))
    assert paths.metadata_files(pattern) == [str(tmp_path / "pages" / n) for n in ("p10.tif", "p2.tif")]
    assert paths.expand(str(tmp_path / "pages" / "**" / "*.tif")) == [
        str(tmp_path / "pages" / n) for n in ("deeper/p3.tif", "p10.tif", "p2.tif")]
    assert paths.metadata_files(str(tmp_path / "none" / "*.tif")) == []
    assert not paths.is_glob("s3://bucket/*.tif")


def test_probe_names_each_path_a_process_cannot_reach(tmp_path):
    (tmp_path / "meta.json").write_text("{}")
    staging = tmp_path / "stage"
    staging.mkdir()
    (staging / "owner.json").write_text("{}")
    other = tmp_path / "other"
    other.mkdir()
    entries = [{"read": [str(tmp_path / "meta.json")]},           # fine
               {"read": [str(tmp_path / "gone" / "zarr.json")]},  # not there
               {"write": str(staging), "marker": "owner.json"},   # fine (a file made and removed)
               {"write": str(other), "marker": "owner.json"},     # a folder of that name, not the client's
               {"write": str(tmp_path / "missing"), "marker": "owner.json"},
               {"write": str(other), "inode": os.stat(other).st_ino},       # the same folder, nothing written
               {"write": str(other), "inode": os.stat(staging).st_ino}]     # another folder
    answer = paths.probe(entries)
    assert answer["host"] == socket.gethostname() and answer["cwd"] == os.getcwd()
    assert [(i, why.split(" (")[0]) for i, _, why in answer["problems"]] == [
        (1, "is not there"), (3, "is another folder than the client's"), (4, "is not there"),
        (6, "is another folder than the client's")]
    assert os.listdir(staging) == ["owner.json"] and os.listdir(other) == []  # the probe left nothing


def test_reading_a_store_that_is_not_there_is_an_error_never_fill_values(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = rng.random((6, 4)).astype("f4")
    z = zarr.create_array("x.zarr", shape=data.shape, chunks=(2, 4), dtype="f4")
    z[:] = data
    x = from_zarr("x.zarr")  # relative, as a spec writes it
    np.testing.assert_array_equal(x.compute(), data)
    os.rename(tmp_path / "x.zarr", tmp_path / "moved.zarr")  # what a worker on a host without it sees
    with pytest.raises(PathNotVisibleError, match=r"x\.zarr' is not there for (worker|process) .* on host .*the "
                                                  r"workers do not see this path"):
        x.compute()


def test_a_chunk_missing_from_a_store_that_is_there_is_still_the_fill_value(tmp_path, rng):
    data = rng.random((4, 4)).astype("f4") + 1
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=(8, 4), chunks=(4, 4), dtype="f4", fill_value=-1)
    z[:4] = data  # the second chunk is never written: Zarr's fill value, as zarr-python reads it
    got = from_zarr(str(tmp_path / "x.zarr")).compute()
    np.testing.assert_array_equal(got[:4], data)
    assert (got[4:] == -1).all()

"""``source: xarray`` and ``sink: xarray`` (flowgpu.io.labelled), and flowgpu's marker kept out of stores."""

from __future__ import annotations

import json
import os
import warnings

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr

from flowgpu.errors import ConfigError
from flowgpu.io import sinks, sources
from flowgpu.io.atomic import written_by_flowgpu
from flowgpu.io.journal import MARKER
from flowgpu.io.labelled import StoredChunksWarning

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")


@pytest.fixture
def ds(rng):
    time = pd.date_range("2010-01-01", periods=30, freq="D")
    v = xr.DataArray(rng.random((30, 4, 5)), dims=("time", "y", "x"), attrs={"units": "mm"},
                     coords={"time": time, "y": np.arange(4.0), "x": np.arange(5.0) / 2})
    return xr.Dataset({"rain": v, "snow": v * 0.5}, attrs={"title": "test"})


@pytest.mark.parametrize("name", ["d.zarr", "d.nc", "d.h5"])
def test_the_source_opens_a_variable_with_its_labels(tmp_path, ds, name):
    path = str(tmp_path / name)
    ds.to_zarr(path) if name.endswith(".zarr") else ds.to_netcdf(path, engine="h5netcdf")
    x = sources.open_source("xarray", path=path, variable="rain", chunks=[10, 4, 5])
    assert isinstance(x.data, da.Array) and x.data.chunks[0] == (10, 10, 10)
    xr.testing.assert_identical(x.compute(), ds.rain)


def test_chunks_that_split_the_stored_ones_are_noted_once_as_one_line_naming_the_input(tmp_path, ds):
    """xarray warned once per split dim, from flowgpu's line that opened the store, each time a run
    opened it (plan, then run)."""
    path = str(tmp_path / "d.zarr")
    ds.to_zarr(path, encoding={"rain": {"chunks": (5, 4, 5)}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = sources.open_source("xarray", path=path, variable="rain", chunks=[7, -1, 2])
        whole = sources.open_source("xarray", path=path, variable="rain", chunks=[10, -1, -1])  # whole stored chunks
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(StoredChunksWarning, path, 0)]
    assert str(caught[0].message) == (
        "variable 'rain': chunks [7, -1, 2] split its stored chunks along 'time' (at index 7) and 'x' (at index 2), "
        "so each of those is read and decoded once for every chunk it falls in; give chunks that are whole "
        "multiples of the stored ones (time: 5, y: 4, x: 5), or leave chunks out")
    assert x.data.chunks == ((7, 7, 7, 7, 2), (4,), (2, 2, 1))
    xr.testing.assert_identical(x.compute(), ds.rain)
    xr.testing.assert_identical(whole.compute(), ds.rain)


def test_a_missing_variable_or_an_unknown_format_is_refused(tmp_path, ds):
    ds.to_zarr(tmp_path / "d.zarr")
    with pytest.raises(ConfigError, match="has no variable 'hail'; its variables: rain, snow"):
        sources.open_source("xarray", path=str(tmp_path / "d.zarr"), variable="hail")
    (tmp_path / "d.txt").write_text("no")
    with pytest.raises(ConfigError, match="cannot tell the format"):
        sources.open_source("xarray", path=str(tmp_path / "d.txt"), variable="rain")


@pytest.mark.parametrize("fmt, name", [("zarr", "o.zarr"), ("netcdf", "o.nc"), (None, "o.nc"), (None, "o.zarr")])
def test_the_sink_writes_a_dataset_xarray_reads_back(tmp_path, ds, fmt, name):
    path = str(tmp_path / name)
    x = ds.rain.chunk({"time": 7}) * 2
    pending = sinks.prepare_write("xarray", x, path, format=fmt)
    dask.compute(pending.target, scheduler="sync")
    pending.commit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = (xr.open_zarr(path) if name.endswith(".zarr") else xr.open_dataset(path, engine="h5netcdf")).load()
    xr.testing.assert_identical(got.rain, (ds.rain * 2).compute())
    assert written_by_flowgpu(path) and not os.path.exists(os.path.join(path, MARKER))


def test_an_unlabelled_output_gets_numbered_dims(tmp_path, rng):
    host = rng.random((6, 4))
    pending = sinks.prepare_write("xarray", da.from_array(host, chunks=3), str(tmp_path / "plain.zarr"))
    dask.compute(pending.target, scheduler="sync")
    pending.commit()
    got = xr.open_zarr(tmp_path / "plain.zarr").plain
    assert got.dims == ("dim_0", "dim_1")
    np.testing.assert_array_equal(got.values, host)


def test_other_sinks_get_the_dask_array_under_the_labels(tmp_path, ds):
    pending = sinks.prepare_write("npy", ds.rain.chunk({"time": 10}), str(tmp_path / "r.npy"))
    dask.compute(pending.target, scheduler="sync")
    pending.commit()
    np.testing.assert_array_equal(np.load(tmp_path / "r.npy"), ds.rain.values)


def test_a_zarr_group_output_opens_without_a_warning(tmp_path, rng):
    # the marker used to live inside the store, where zarr warned about an object it does not know
    host = rng.random((8, 8))
    pending = sinks.prepare_write("zarr", da.from_array(host, chunks=4), str(tmp_path / "g.zarr"), component="a")
    dask.compute(pending.target, scheduler="sync")
    pending.commit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group = zarr.open_group(str(tmp_path / "g.zarr"), mode="r")
        assert [name for name, _ in group.members()] == ["a"]
    np.testing.assert_array_equal(group["a"][:], host)
    marker = json.loads((tmp_path / ".g.zarr.flowgpu-output.json").read_text())
    assert marker["writer"] == "flowgpu"


def test_an_output_with_the_marker_inside_from_an_earlier_version_is_still_flowgpus(tmp_path, rng):
    old = tmp_path / "old.zarr"
    zarr.create_array(str(old), data=rng.random(4))
    assert not written_by_flowgpu(str(old))
    (old / MARKER).write_text(json.dumps({"writer": "flowgpu", "run": "r0123456789abcdef"}))
    assert written_by_flowgpu(str(old))
    pending = sinks.prepare_write("zarr", da.from_array(rng.random(4)), str(old))  # replaced, not refused
    dask.compute(pending.target, scheduler="sync")
    pending.commit()
    assert written_by_flowgpu(str(old)) and not (old / MARKER).exists()


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_convert_keeps_an_xarray_variables_dims_and_attrs(tmp_path, ds, zarr_format):
    from flowgpu.io.convert import convert

    ds.to_zarr(tmp_path / "d.zarr", zarr_format=zarr_format, consolidated=False)
    out = convert(str(tmp_path / "d.zarr"), str(tmp_path / "rain.zarr"), component="rain")
    a = zarr.open_array(out["path"], mode="r")
    assert a.metadata.dimension_names == ("time", "y", "x")
    assert a.attrs["units"] == "mm" and "_ARRAY_DIMENSIONS" not in a.attrs
    np.testing.assert_array_equal(a[:], ds.rain.values)

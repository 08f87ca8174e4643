"""Ops on labelled inputs keep their labels as xarray does (flowgpu.ops.labels, flowgpu.ops.grouping)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest

from flowgpu.errors import ArgumentError, OpError
from flowgpu.ops import get
from flowgpu.ops.labels import call

xr = pytest.importorskip("xarray")


@pytest.fixture
def t2m(rng):
    time = pd.date_range("2000-01-01", periods=40, freq="W")
    data = rng.random((40, 3, 4)).astype("float32")
    return xr.DataArray(data, dims=("time", "lat", "lon"), name="t2m", attrs={"units": "K", "long_name": "2 m T"},
                        coords={"time": time, "lat": [-10.0, 0.0, 10.0], "lon": np.arange(4) * 90.0,
                                "station": ("lon", list("abcd"))}).chunk({"time": 9})


def _run(op, *args, **kwargs):
    return call(get(op), list(args), kwargs)


def test_elementwise_steps_keep_dims_coords_and_attrs(t2m):
    got = _run("scale", t2m, factor=2.0, offset=-1.0)
    xr.testing.assert_identical(got.compute(), (t2m * 2.0 - 1.0).compute())
    got = _run("sqrt", t2m)
    xr.testing.assert_identical(got.compute(), np.sqrt(t2m).compute())


def test_binary_steps_broadcast_by_dimension_name(t2m):
    clim = t2m.mean("time")  # (lat, lon): aligned by name, not position
    got = _run("subtract", t2m, clim.transpose("lon", "lat"))
    xr.testing.assert_allclose(got.compute(), (t2m - clim).compute())
    assert got.dims == ("time", "lat", "lon")


@pytest.mark.parametrize("axis", ["time", ["lat", "lon"], 0, [1, "lon"], None])
def test_reductions_by_dimension_name_drop_the_reduced_coords(t2m, axis):
    got = _run("mean", t2m, axis=axis)
    dims = [t2m.dims[a] if isinstance(a, int) else a for a in ([axis] if not isinstance(axis, list) else axis)] \
        if axis is not None else None
    want = t2m.mean(dims)
    xr.testing.assert_allclose(got.compute(), want.compute(), rtol=1e-6)
    assert got.dims == want.dims and set(got.coords) == set(want.coords) and got.attrs == want.attrs
    assert got.name == "t2m"


def test_scans_nan_and_arg_reductions_by_dimension_name(t2m, rng):
    t2m = t2m.where(rng.random(t2m.shape) > 0.1)  # NaNs, where nan* leave them out
    got = _run("cumsum", t2m, axis="time")
    xr.testing.assert_allclose(got.compute(), t2m.cumsum("time", skipna=False).compute(), rtol=1e-6)
    assert got.dims == t2m.dims and set(got.coords) == set(t2m.coords)
    clim = _run("nanmean", t2m, axis="time")
    xr.testing.assert_allclose(clim.compute(), t2m.mean("time", skipna=True).compute(), rtol=1e-6)
    warmest = _run("argmax", clim, axis="lon")
    assert warmest.dims == ("lat",)
    np.testing.assert_array_equal(warmest.values, clim.argmax("lon").values)


def test_keepdims_keeps_the_dims_without_their_coords(t2m):
    got = _run("std", t2m, axis="time", keepdims=True, ddof=1)
    want = t2m.std("time", keepdims=True, ddof=1)
    np.testing.assert_allclose(got.values, want.values, rtol=1e-5)
    assert got.dims == want.dims and set(got.coords) == set(want.coords)


def test_the_op_runs_on_the_same_dask_graph_as_a_bare_array(t2m):
    # no speed lost: the labels sit around the graph the bare op builds
    bare = get("mean")(t2m.data, axis=(1, 2))
    assert _run("mean", t2m, axis=["lat", "lon"]).data.name == bare.name
    assert _run("sqrt", t2m).data.name == get("sqrt")(t2m.data).name


def test_transpose_slice_and_squeeze_are_xarrays(t2m):
    xr.testing.assert_identical(_run("transpose", t2m, axes=["lon", "time", "lat"]).compute(),
                                t2m.transpose("lon", "time", "lat").compute())
    xr.testing.assert_identical(_run("slice", t2m, index="2:30:3, 1").compute(),
                                t2m.isel(time=slice(2, 30, 3), lat=1).compute())
    one = t2m.isel(lat=[1])
    xr.testing.assert_identical(_run("squeeze", one, axis="lat").compute(), one.squeeze("lat").compute())


def test_a_shape_keeping_op_keeps_the_labels_and_a_shape_changing_one_drops_them(t2m):
    smooth = _run("uniform_filter", t2m, size=3, axes=["lat", "lon"])
    assert smooth.dims == t2m.dims and smooth.attrs == t2m.attrs
    flat = _run("reshape", t2m, shape=[40, 12])
    assert isinstance(flat, da.Array) and flat.shape == (40, 12)
    np.testing.assert_array_equal(flat.compute(), t2m.values.reshape(40, 12))


def test_an_unknown_dimension_lists_the_dims(t2m):
    with pytest.raises(ArgumentError, match="'height' is not a dimension of its input; its dims: time, lat, lon"):
        _run("sum", t2m, axis="height")


def test_a_dimension_name_on_a_bare_array_says_it_has_none(t2m):
    with pytest.raises(OpError, match="has no dimension names"):
        _run("sum", t2m.data, axis="time")
    with pytest.raises(OpError, match="has no dimension names"):
        get("sum")(t2m.data, axis="time")


@pytest.mark.parametrize("by", ["month", "season", "year", "dayofyear"])
@pytest.mark.parametrize("how", ["mean", "max", "std"])
def test_groupby_reduce_is_xarrays_groupby(t2m, by, how):
    got = _run("groupby_reduce", t2m, dim="time", by=by, how=how)
    want = getattr(t2m.groupby(f"time.{by}"), how)()
    xr.testing.assert_allclose(got.compute(), want.compute(), rtol=1e-6)
    assert got.attrs == want.attrs and got.name == want.name


def test_groupby_reduce_by_a_coordinate(t2m):
    got = _run("groupby_reduce", t2m, dim="lon", by="station", how="sum")
    want = t2m.assign_coords(station=t2m.station.compute()).groupby("station").sum()
    xr.testing.assert_allclose(got.compute(), want.compute(), rtol=1e-6)


@pytest.mark.parametrize("freq", ["1MS", "QS-DEC", "14D"])
def test_resample_reduce_is_xarrays_resample(t2m, freq):
    got = _run("resample_reduce", t2m, freq=freq, how="mean")
    want = t2m.resample(time=freq).mean()
    xr.testing.assert_allclose(got.compute(), want.compute(), rtol=1e-6)
    assert got.dims == want.dims


def test_grouping_refuses_what_it_cannot_group(t2m):
    with pytest.raises(OpError, match="needs a labelled input"):
        _run("groupby_reduce", t2m.data, dim="time", by="month")
    with pytest.raises(ArgumentError, match="dim 'month' is not a dimension of its input; its dims: time, lat, lon"):
        _run("groupby_reduce", t2m, dim="month", by="month")
    with pytest.raises(ArgumentError, match="neither a datetime component"):
        _run("groupby_reduce", t2m, dim="time", by="fortnight")
    with pytest.raises(ArgumentError, match="not datetimes"):
        _run("groupby_reduce", t2m, dim="lat", by="month")
    with pytest.raises(ArgumentError, match="freq 'monthly' is not a frequency"):
        _run("resample_reduce", t2m, freq="monthly")


@pytest.mark.parametrize("how", ["mean", "median"])
def test_groupby_anomaly_is_xarrays_group_arithmetic(t2m, how):
    got = _run("groupby_anomaly", t2m, dim="time", by="month", how=how)
    grouped = t2m.groupby("time.month")
    want = grouped - getattr(grouped, how)()
    xr.testing.assert_allclose(got.compute(), want.compute(), rtol=1e-6)
    assert got.dims == t2m.dims and got.attrs == want.attrs


def test_ops_taking_arrays_by_name_or_any_number_keep_labels(t2m):
    got = call(get("expr"), [], {"expression": "(x - m) * 2", "x": t2m, "m": t2m.mean("time")})
    xr.testing.assert_allclose(got.compute(), ((t2m - t2m.mean("time")) * 2).compute(), rtol=1e-6)
    assert got.dims == t2m.dims
    both = _run("concatenate", t2m, t2m, axis="lat")  # a shape-changing op: bare, values right
    np.testing.assert_array_equal(both.compute(), np.concatenate([t2m.values, t2m.values], axis=1))

"""xarray in and out of a pipeline: a dataset written by xarray (dims, coords, attrs, a time
coordinate) goes through named-axis reductions and a monthly groupby to ``sink: xarray``, and
xarray reads back what it computes itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pandas as pd
import pytest
import zarr

from flowgpu import pipeline
from flowgpu.errors import SpecError
from flowgpu.io.atomic import written_by_flowgpu

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

SPEC = """\
name: climate
inputs:
  t2m: {{source: xarray, path: {data}, variable: t2m}}
steps:
  celsius: {{op: scale, inputs: [t2m], args: {{offset: -273.15}}}}
  climatology: {{op: groupby_reduce, inputs: [celsius], args: {{dim: time, by: month, how: mean}}}}
  zonal: {{op: mean, inputs: [celsius], args: {{axis: lon}}}}
  spread: {{op: std, inputs: [celsius], args: {{axis: [lat, lon], ddof: 1}}}}
  monthly_max: {{op: resample_reduce, inputs: [t2m], args: {{freq: 1MS, how: max}}}}
outputs:
  climatology: {{from: climatology, sink: xarray, path: out/climatology.zarr}}
  zonal: {{from: zonal, sink: xarray, path: out/zonal.zarr, variable: zonal_mean}}
  spread: {{from: spread, sink: xarray, path: out/spread.nc}}
  monthly_max: {{from: monthly_max, sink: xarray, path: out/monthly_max.zarr, format: zarr}}
"""


def _dataset(rng):
    time = pd.date_range("2001-01-01", periods=2 * 365, freq="D")
    data = 250.0 + 40.0 * rng.random((time.size, 6, 8))
    t2m = xr.DataArray(data.astype("float32"), dims=("time", "lat", "lon"),
                       coords={"time": time, "lat": np.linspace(-75.0, 75.0, 6), "lon": np.arange(8) * 45.0},
                       attrs={"units": "K", "long_name": "2 metre temperature"})
    ds = xr.Dataset({"t2m": t2m, "sp": t2m * 2}, attrs={"source": "test"})
    ds.lat.attrs["units"] = "degrees_north"
    return ds


def _expected(t2m):
    """What xarray computes itself for SPEC."""
    celsius = t2m - 273.15
    return {"climatology": celsius.groupby("time.month").mean(),
            "zonal": celsius.mean("lon").rename("zonal_mean"),
            "spread": celsius.std(["lat", "lon"], ddof=1),
            "monthly_max": t2m.resample(time="1MS").max()}


def _open(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flowgpu's marker, or anything else, must not make xarray warn
        if path.endswith(".nc"):
            return xr.open_dataset(path, engine="h5netcdf").load()
        return xr.open_zarr(path).load()


def _check_outputs(folder, ds):
    for name, want in _expected(ds.t2m.load()).items():
        path = str(folder / "out" / (name + (".nc" if name == "spread" else ".zarr")))
        got = _open(path)[want.name]
        xr.testing.assert_allclose(got, want, rtol=1e-5)  # values, dims and coordinates
        assert got.dims == want.dims and set(got.coords) == set(want.coords)
        assert got.attrs == want.attrs == ds.t2m.attrs  # units kept
        assert got.coords["lat"].attrs == ds.lat.attrs if "lat" in got.dims else True
        assert written_by_flowgpu(path) and not os.path.exists(os.path.join(path, ".flowgpu-output.json"))


@pytest.fixture
def climate(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ds = _dataset(rng)
    ds.chunk({"time": 100}).to_zarr(tmp_path / "era.zarr", consolidated=False)
    return ds


def _spec(tmp_path, data="era.zarr", text=SPEC, raw=False):
    (tmp_path / "climate.yaml").write_text(text if raw else text.format(data=data))
    return str(tmp_path / "climate.yaml")


def test_a_climate_pipeline_gives_what_xarray_computes(tmp_path, climate, rng):
    result = pipeline.run(_spec(tmp_path), session="local", progress=False)
    assert result.summary["status"] == "ok"
    _check_outputs(tmp_path, climate)
    zonal = zarr.open_group(str(tmp_path / "out" / "zonal.zarr"), mode="r")["zonal_mean"]
    assert zonal.metadata.dimension_names == ("time", "lat")
    again = pipeline.run(_spec(tmp_path), session="local", progress=False)  # incremental: nothing to do
    assert {o["status"] for o in again.summary["outputs"].values()} == {"up-to-date"}
    changed = _dataset(rng)  # new data in the store: computed again, and replaced in place
    changed.chunk({"time": 100}).to_zarr(tmp_path / "era.zarr", mode="w", consolidated=False)
    third = pipeline.run(_spec(tmp_path), session="local", progress=False)
    assert {o["status"] for o in third.summary["outputs"].values()} == {"computed"}
    _check_outputs(tmp_path, changed)


def test_netcdf_in_and_out(tmp_path, climate):
    climate.to_netcdf(tmp_path / "era.nc", engine="h5netcdf")
    pipeline.run(_spec(tmp_path, "era.nc"), session="local", progress=False)
    _check_outputs(tmp_path, climate)


def test_labelled_steps_fuse_as_bare_ones_do(tmp_path, climate):
    zarr.create_array(str(tmp_path / "bare.zarr"), data=climate.t2m.values, chunks=(100, 6, 8))
    text = ("inputs:\n  t2m: {source: SOURCE}\nsteps:\n  c: {op: scale, inputs: [t2m], args: {offset: -273.15}}\n"
            "  s: {op: square, inputs: [c]}\n  z: {op: sum, inputs: [s], args: {axis: AXIS}}\n"
            "outputs:\n  z: {from: z}\n")
    labelled = pipeline.compile(_spec(tmp_path, text=text.replace("SOURCE", "xarray, path: era.zarr, variable: t2m")
                                      .replace("AXIS", "lon"), raw=True))
    bare = pipeline.compile(_spec(tmp_path, text=text.replace("SOURCE", "zarr, path: bare.zarr").replace("AXIS", "2"), raw=True))
    assert labelled.labelled["z"].dims == ("time", "lat") and not bare.labelled
    assert labelled.fusion and labelled.fusion == bare.fusion
    np.testing.assert_allclose(labelled.outputs["z"].compute(), bare.outputs["z"].compute(), rtol=1e-6)


MIXED = """\
name: mixed
inputs:
  t2m: {{source: xarray, path: {data}, variable: t2m}}
steps:
  hottest: {{op: max, inputs: [t2m]}}
  zonal: {{op: mean, inputs: [t2m], args: {{axis: lon}}}}
  coldest: {{op: min, inputs: [t2m]}}
outputs:
  hottest: {{from: hottest}}
  zonal: {{from: zonal, sink: xarray, path: out/zonal.nc}}
  coldest: {{from: coldest}}
"""


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_each_output_gets_its_own_value_when_values_and_xarray_files_mix(tmp_path, climate, cpu_session, where):
    # dask.compute(array, delayed, array) answers in the order (array, array, delayed): the NetCDF
    # write is a Delayed, and 'coldest' once came back as None, the write's answer
    result = pipeline.run(_spec(tmp_path, text=MIXED), session="local" if where == "local" else cpu_session,
                          progress=False, force=True)
    t2m = climate.t2m.values
    assert result.outputs["hottest"] == float(t2m.max()) and result.outputs["coldest"] == float(t2m.min())
    got = _open(str(tmp_path / "out" / "zonal.nc"))["t2m"]
    np.testing.assert_allclose(got.values, t2m.astype(np.float64).mean(axis=2), rtol=1e-5)


def _error(tmp_path, text, raw=False):
    with pytest.raises(SpecError) as e:
        pipeline.compile(_spec(tmp_path, text=text, raw=raw))
    return e.value


def test_chunks_that_split_the_stored_ones_are_said_once_at_the_inputs_line(tmp_path, climate):
    """The note comes at the spec's input, once, though plan and run open the input again."""
    climate.to_zarr(tmp_path / "split.zarr", encoding={"t2m": {"chunks": (50, 6, 8)}})
    (tmp_path / "s.yaml").write_text(
        "inputs:\n  x: {source: xarray, path: split.zarr, variable: t2m, chunks: [70, -1, -1]}\n"
        "steps:\n  m: {op: mean, inputs: [x], args: {axis: time}}\noutputs:\n  m: {from: m, sink: npy, path: m.npy}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeline.status(tmp_path / "s.yaml")
        pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    said = [(os.path.basename(w.filename), w.lineno, str(w.message)) for w in caught
            if "split its stored chunks" in str(w.message)]
    assert said == [("s.yaml", 2, "input 'x': variable 't2m': chunks [70, -1, -1] split its stored chunks along "
                     "'time' (at index 70), so each of those is read and decoded once for every chunk it falls in; "
                     "give chunks that are whole multiples of the stored ones (time: 50, lat: 6, lon: 8), or leave "
                     "chunks out")], said
    np.testing.assert_allclose(np.load(tmp_path / "m.npy"), climate.t2m.astype("float64").mean("time").values, rtol=1e-6)


def test_a_missing_variable_lists_the_ones_there(tmp_path, climate):
    e = _error(tmp_path, SPEC.replace("variable: t2m", "variable: t2"))
    assert e.path == "inputs.t2m.variable" and e.line == 3
    assert "has no variable 't2'; its variables: sp, t2m (coordinates: lat, lon, time)" in str(e)


def test_an_unknown_dimension_lists_the_dims(tmp_path, climate):
    e = _error(tmp_path, SPEC.replace("axis: lon", "axis: longitude"))
    assert e.path == "steps.zonal.args.axis" and e.line == 7
    assert "'longitude' is not a dimension of its input; its dims: time, lat, lon" in str(e)


def test_grouping_a_bare_array_says_it_needs_labels(tmp_path, climate, rng):
    np.save(tmp_path / "x.npy", rng.random((10, 3)))
    text = "inputs:\n  x: {source: npy, path: x.npy}\nsteps:\n  m: {op: groupby_reduce, inputs: [x]}\n" \
           "outputs:\n  m: {from: m}\n"
    e = _error(tmp_path, text, raw=True)
    assert e.path.startswith("steps.m") and "needs a labelled input" in str(e)


@pytest.mark.slow
def test_python_m_flowgpu_run_writes_the_same(tmp_path, climate):
    spec = _spec(tmp_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) \
        + os.pathsep + os.environ.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", spec, "--workers", "2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _check_outputs(tmp_path, climate)

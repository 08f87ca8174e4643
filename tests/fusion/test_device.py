"""Host NumPy operands of device chunks go to the device (flowgpu.fusion.device): plain xarray code
(``weighted``, ``rolling``, ``groupby``, ``resample``, ``coarsen``) runs unmodified on a GPU Session.

On the CPU the device is :class:`tests.fusion.fakedevice.Dev`, which refuses NumPy operands as
CuPy does; the GPU tests run the same code on a GPU Session's CuPy chunks."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest

from flowgpu.fusion import device
from flowgpu.fusion.device import OnDevice, move_host_operands
from flowgpu.fusion.graph import Fusing
from tests.fusion.fakedevice import Dev, is_dev, to_dev

xr = pytest.importorskip("xarray")

CASES = {
    "weighted": lambda a: a.weighted(np.cos(np.deg2rad(a.lat))).mean(("lat", "lon")),
    "rolling": lambda a: a.rolling(time=3).mean(),
    "rolling_centered": lambda a: a.rolling(time=4, center=True).sum(),
    "groupby": lambda a: a.groupby("time.month").mean(),
    "resample": lambda a: a.resample(time="QS").mean(),
    "coarsen": lambda a: a.coarsen(time=3).mean(),
    "anomaly_std": lambda a: (a.groupby("time.month") - a.groupby("time.month").mean()).std("time"),
}


def _labelled(data, chunks):
    t = pd.date_range("2001-01-01", periods=data.shape[0], freq="MS")
    coords = {"time": t, "lat": np.linspace(-60, 60, data.shape[1]), "lon": np.arange(data.shape[2]) * 10.0}
    return xr.DataArray(data, dims=("time", "lat", "lon"), coords=coords, attrs={"units": "K"}, name="t2m")


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr(device, "_is_device", is_dev)
    monkeypatch.setattr(device, "_to_device", lambda x: x.view(Dev))


def _on_fake_device(host, chunks):
    meta = np.empty((0,) * host.ndim).view(Dev)
    return _labelled(da.from_array(host, chunks=chunks).map_blocks(to_dev, meta=meta), chunks)


@pytest.mark.parametrize("case", ["weighted", "rolling"])
def test_without_the_move_numpy_operands_fail_on_device_chunks(case, rng):
    # what the issue saw on the H200, reproduced by the stand-in: the test below can fail
    x = _on_fake_device(rng.random((24, 5, 6)), (6, 5, 6))
    with dask.config.set(scheduler="sync", array_optimize=Fusing(enabled=True)):
        with pytest.raises(TypeError, match="Unsupported type"):
            CASES[case](x).compute()


@pytest.mark.parametrize("case", sorted(CASES))
def test_xarray_code_runs_unmodified_on_device_chunks(case, rng, fake_device):
    host = rng.random((36, 5, 6))
    x = _on_fake_device(host, (7, 5, 3))
    with dask.config.set(scheduler="sync", array_optimize=Fusing(enabled=True, device=True)):
        got = CASES[case](x).compute()
    want = CASES[case](_labelled(host, None))
    assert isinstance(got.data, Dev)  # computed on the "device"
    np.testing.assert_allclose(got.data.view(np.ndarray), want.values, rtol=1e-12, equal_nan=True)
    assert got.dims == want.dims


def test_a_host_only_graph_is_left_as_it_is(rng):
    host = rng.random((12, 4))
    w = rng.random(4)
    x = da.from_array(host, chunks=(4, 4)) * da.from_array(w)
    dsk = dict(x.__dask_graph__())
    from dask._task_spec import convert_legacy_graph

    dsk = convert_legacy_graph(dsk)
    out = move_host_operands(dsk)
    assert all(out[k] is dsk[k] for k in dsk)
    np.testing.assert_allclose(x.compute(scheduler="sync"), host * w)


def test_integer_arrays_are_never_moved(rng, fake_device):
    # an index array (xarray's groupby codes, a random state) stays NumPy; only the float weights move
    base = da.from_array(rng.random((8, 6)), chunks=(4, 6)).map_blocks(to_dev, meta=np.empty((0, 0)).view(Dev))
    idx = np.array([5, 0, 2], dtype=np.int64)
    taken = da.take(base, idx, axis=1) * np.array([1.0, 2.0, 3.0])
    with dask.config.set(scheduler="sync", array_optimize=Fusing(enabled=False, device=True)):
        got = taken.compute()
    host = base.compute(scheduler="sync").view(np.ndarray)
    np.testing.assert_allclose(got.view(np.ndarray), host[:, idx] * [1.0, 2.0, 3.0])


def test_on_device_passes_numpy_through_when_nothing_is_on_the_device(rng, fake_device):
    a, b = rng.random(3), rng.random(3)
    out = OnDevice(np.add)(a, b)
    assert type(out) is np.ndarray and np.array_equal(out, a + b)
    moved = OnDevice(lambda *xs: [type(v) for v in xs])(a.view(Dev), b, [b, 1.0])
    assert moved == [Dev, Dev, list]


# -- on a GPU Session's CuPy chunks (run on the H200) -------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_xarray_code_on_a_gpu_session_matches_numpy(case, rng, gpu_session):
    from flowgpu.arrays import to_device

    host = rng.random((36, 5, 6))
    x = _labelled(to_device(da.from_array(host, chunks=(7, 5, 3))), None)
    got = CASES[case](x).compute()
    want = CASES[case](_labelled(host, None))
    assert type(got.data).__module__.startswith("cupy")
    np.testing.assert_allclose(got.data.get(), want.values, rtol=1e-10, equal_nan=True)
    assert got.dims == want.dims and got.attrs == want.attrs

"""The shipped pipelines on a GPU session give the CPU's results (run by the lead on an H200)."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import zarr

from flowgpu import pipeline
from flowgpu.backend import is_cupy
from tests.pipeline.test_pipelines import DATA, ROOT, SPECS, small

pytestmark = pytest.mark.gpu


@pytest.fixture
def stack(tmp_path, rng):
    x = rng.random((3, 64, 48)).astype("float32")
    z = zarr.create_array(str(tmp_path / "stack.zarr"), shape=x.shape, chunks=(1, 64, 48), dtype=x.dtype)
    z[:] = x
    return str(tmp_path / "stack.zarr")


def _files(result):
    out = {}
    for name, o in result.summary["outputs"].items():
        if "location" in o:
            loc = o["location"]
            if o["sink"] == "xarray":  # a labelled dataset: its one data variable
                import xarray as xr

                ds = xr.open_dataset(loc, engine="h5netcdf" if loc.endswith(".nc") else "zarr")
                out[name] = next(iter(ds.data_vars.values())).values
            else:
                out[name] = np.load(loc) if loc.endswith(".npy") else zarr.open_array(loc)[:]
    return out


def test_compile_in_a_gpu_session_gives_cupy_chunks(gpu_session):
    plan = pipeline.compile(ROOT / "transpose_sum.yaml", params={"n": 1000, "chunk": 500})
    assert is_cupy(plan.outputs["total"]._meta)
    assert plan.fused  # add + sum run as one fused CuPy ReductionKernel


# float32 anomalies of ~288 K: a float32 mean's last bit there is 3e-5, and the CPU and the GPU sum
# in other orders (each as NumPy and CuPy do), so near-zero anomalies differ by a few of those
ATOL = {"hdf5_anomaly.yaml": 3e-4}


@pytest.mark.parametrize("name", SPECS)
def test_shipped_spec_on_gpu_matches_cpu(name, tmp_path, stack, gpu_session, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    if name in DATA:  # a spec whose data a script makes (tile_stats.yaml: pipelines/make_tiles.py)
        DATA[name](rng)
    os.makedirs("cpu"), os.makedirs("gpu")
    with dask.config.set({"array.backend": "numpy"}):
        cpu = pipeline.run(ROOT / name, overrides=small(name, tmp_path / "cpu", stack), session="local",
                           progress=False)
    gpu = pipeline.run(ROOT / name, overrides=small(name, tmp_path / "gpu", stack), session=gpu_session,
                       progress=False)
    assert gpu.summary["session"]["backend"] == "gpu"
    pairs = list(zip(cpu.items, gpu.items)) if isinstance(cpu, pipeline.BatchResult) else [(cpu, gpu)]
    assert pairs and all(c.params == g.params for c, g in pairs)  # a batch: item by item
    for c, g in pairs:
        for key, value in c.outputs.items():
            if c.summary["outputs"][key]["sink"] in ("summary", "table"):  # a table's values: each item's row
                np.testing.assert_allclose(g.outputs[key], value, rtol=2e-4, atol=1e-5)
        gpu_files, cpu_files = _files(g), _files(c)
        assert gpu_files.keys() == cpu_files.keys()
        for key in cpu_files:
            np.testing.assert_allclose(gpu_files[key], cpu_files[key], rtol=2e-4, atol=ATOL.get(name, 1e-5))


def test_quickstart_default_size_on_gpu(tmp_path, gpu_session, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = pipeline.run(ROOT / "quickstart.yaml", overrides={"params.n": 8000, "params.rows_per_chunk": 2000},
                          session=gpu_session, progress=False)
    assert abs(result.outputs["energy"] / 8000**2 - 1) < 1e-3
    assert abs(result.outputs["mean"] - 3.0) < 1e-2

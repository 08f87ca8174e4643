"""Every shipped spec under pipelines/ is validated and run with small params."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import pathlib
import runpy

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from flowgpu import arrays, pipeline
from flowgpu.cli import cli
from flowgpu.pipeline.spec import json_schema

ROOT = pathlib.Path(__file__).resolve().parents[2] / "pipelines"
SPECS = sorted(p.name for p in ROOT.glob("*.yaml"))


def test_every_spec_has_the_schema_modeline_and_the_schema_is_current():
    shipped = json.loads((ROOT / "flowgpu-pipeline.schema.json").read_text())
    assert shipped == json_schema(), "run: flowgpu schema -o pipelines/flowgpu-pipeline.schema.json"
    for name in SPECS:
        first = (ROOT / name).read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=./flowgpu-pipeline.schema.json", name


@pytest.fixture
def stack(tmp_path, rng):
    x = rng.random((3, 40, 36)).astype("float32")
    z = zarr.create_array(str(tmp_path / "stack.zarr"), shape=x.shape, chunks=(1, 40, 36), dtype=x.dtype)
    z[:] = x
    return x, str(tmp_path / "stack.zarr")


def _files(tmp_path):
    """The file examples' inputs, made by their script (pipelines/make_files.py) in ``tmp_path/data``."""
    pytest.importorskip("h5py"), pytest.importorskip("tifffile")
    made = runpy.run_path(str(ROOT / "make_files.py"))["make"](str(tmp_path / "data"), seed=7, frames=6, size=40)
    return str(tmp_path / "data"), made


def climate_data(stack_path):
    """pipelines/climate.yaml's dataset, made by its script beside ``stack_path`` (once: a CPU and a
    GPU run of one test read the same data)."""
    path = os.path.join(os.path.dirname(stack_path), "era.zarr")
    if not os.path.exists(path):
        runpy.run_path(str(ROOT / "climate_data.py"))["make"](path, years=1, nlat=7, nlon=12)
    return path


def small(name, tmp_path, stack_path):
    out = str(tmp_path / "out")
    if name in ("hdf5_anomaly.yaml", "tiff_projection.yaml"):
        data, _ = _files(tmp_path)
        return {"params.input": f"{data}/climate.h5" if name.startswith("hdf5") else f"{data}/frames/frame_*.tif",
                "params.out": out}
    return {
        "climate.yaml": {"params.input": climate_data(stack_path), "params.out": out},
        "quickstart.yaml": {"params.n": 64, "params.rows_per_chunk": 16, "params.out": out},
        "quickstart_batch.yaml": {"params.n": 48, "params.rows_per_chunk": 16, "params.out": out},
        "standardize.yaml": {"params.rows": 300, "params.cols": 8, "params.out": out},
        "transpose_sum.yaml": {"params.n": 60, "params.chunk": 25},
        "denoise.yaml": {"params.input": stack_path, "params.out": out + "/d.zarr", "params.sigma": 1.5},
        "denoise_synthetic.yaml": {"params.frames": 2, "params.size": 48, "params.out": out + "/d.zarr"},
        "tile_stats.yaml": {"params.sigma": 1.5, "params.out": out},
    }[name]


def _make_tiles(rng):
    """pipelines/make_tiles.py, as a user runs it before tile_stats.yaml (in the working directory)."""
    spec = importlib.util.spec_from_file_location("make_tiles", ROOT / "make_tiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_tiles("data/tiles", count=3, size=40, seed=int(rng.integers(2**31)))


DATA = {"tile_stats.yaml": _make_tiles}  # specs whose data a script makes


@pytest.mark.parametrize("name", SPECS)
def test_shipped_spec_validates_and_runs(name, tmp_path, stack, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    if name in DATA:
        DATA[name](rng)
    overrides = small(name, tmp_path, stack[1])
    pipeline.validate(ROOT / name, overrides)
    result = pipeline.run(ROOT / name, overrides=overrides, session="local", progress=False)
    assert result.summary["status"] == "ok"
    for summary in [i["outputs"] for i in result.summary["items"]] if "items" in result.summary else [
            result.summary["outputs"]]:
        for out in summary.values():
            if "location" in out:
                assert os.path.exists(out["location"])
    check = CHECKS.get(name)
    if check:
        check(result, stack[0])


def _quickstart(result, _):
    assert abs(result.outputs["energy"] - 64 * 64) < 1e-2 * 64 * 64
    assert abs(result.outputs["mean"] - 3.0) < 0.2
    z = zarr.open_array(result.summary["outputs"]["standardized"]["location"])[:]
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(z.std(0), 1, rtol=1e-4)


def _quickstart_batch(result, _):
    assert [r.params["seed"] for r in result.items] == list(range(8))  # the spec's own foreach block
    for r in result.items:
        x = arrays.normal((48, 48), dtype="float32", seed=r.params["seed"], loc=3.0, scale=2.0,
                          chunks=(16, -1)).compute().astype("float64")
        z = (x - x.mean(0)) / x.std(0)
        np.testing.assert_allclose(zarr.open_array(r.outputs["standardized"])[:], z, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r.outputs["sum_sq"], (z ** 2).sum(), rtol=1e-4)
        np.testing.assert_allclose(r.outputs["mean"], x.mean(), rtol=1e-5)


def _standardize(result, _):
    corr = np.load(result.summary["outputs"]["correlation"]["location"])
    np.testing.assert_allclose(np.diag(corr), 1, rtol=1e-4)
    np.testing.assert_allclose(result.outputs["frobenius_squared"], (corr.astype("float64") ** 2).sum(), rtol=1e-4)


def _transpose_sum(result, _):
    x = arrays.random((60, 60), seed=42, chunks=25).compute()
    np.testing.assert_allclose(result.outputs["total"], (x + x.T).sum(), rtol=1e-12)


def _denoise(result, x):
    from scipy import ndimage

    got = zarr.open_array(result.summary["outputs"]["denoised"]["location"])[:]
    np.testing.assert_allclose(got, ndimage.gaussian_filter(x, sigma=[0, 1.5, 1.5]), rtol=1e-5, atol=1e-6)


def _tile_stats(result, _):
    from scipy import ndimage

    with open(result.items[0].outputs["smoothed"].rsplit("/", 1)[0] + "/stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["tile"] for r in rows] == [f"data/tiles/tile_{i:02d}.npy" for i in range(3)]
    for row, item in zip(rows, result.items, strict=True):
        x = np.load(item.params["tile"]).astype("float64")
        want = ndimage.gaussian_filter(x, sigma=1.5)
        assert item.outputs["smoothed"].endswith(f"/{os.path.basename(item.params['tile'])[:-4]}.smooth.npy")
        np.testing.assert_allclose(np.load(item.outputs["smoothed"]), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose([float(row[c]) for c in ("mean", "std", "peak")], [want.mean(), want.std(), want.max()],
                                   rtol=1e-4)
        assert abs(int(row["bright"]) - int((want > 0.5).sum())) <= 2  # float32 against float64 at the threshold


def _denoise_synthetic(result, _):
    assert result.outputs["mse_denoised"] < 0.5 * result.outputs["mse_noisy"]


def _climate(result, _):
    import xarray as xr

    t2m = xr.open_zarr(result.plan.spec.inputs["t2m"].path).t2m.load() - 273.15
    outs = result.summary["outputs"]
    climatology = xr.open_zarr(outs["climatology"]["location"]).t2m.load()
    xr.testing.assert_allclose(climatology, t2m.groupby("time.month").mean(), rtol=1e-5)
    assert climatology.attrs["units"] == "K"  # attrs kept, as xarray keeps them
    zonal = xr.open_dataset(outs["zonal_mean"]["location"], engine="h5netcdf").zonal_mean.load()
    xr.testing.assert_allclose(zonal.rename("t2m"), t2m.mean("lon"), rtol=1e-5)
    anomaly = t2m.groupby("time.month") - t2m.groupby("time.month").mean()
    np.testing.assert_allclose(result.outputs["anomaly_spread"], anomaly.std(["time", "lon"]).values, rtol=1e-4)



def _made(result, output, *parts):
    """A file the example's script made: ``data/`` beside the run's ``out/`` folder."""
    out = os.path.dirname(result.summary["outputs"][output]["location"])
    return os.path.join(os.path.dirname(out), "data", *parts)


def _hdf5_anomaly(result, _):
    import h5py

    with h5py.File(_made(result, "anomaly", "climate.h5")) as f:
        t2m = f["/fields/t2m"][:].astype("float64")
    anomaly = t2m - t2m.mean(0, keepdims=True)
    got = zarr.open_array(result.summary["outputs"]["anomaly"]["location"])[:]
    np.testing.assert_allclose(got, anomaly, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.load(result.summary["outputs"]["spread"]["location"]), anomaly.std(0), rtol=1e-4)
    np.testing.assert_allclose(result.outputs["warmest"], anomaly.max(), rtol=1e-4)


def _tiff_projection(result, _):
    import tifffile
    from scipy import ndimage

    frames = tifffile.imread(_made(result, "projection", "frames", "frame_*.tif")).astype("float32")
    assert frames.shape == (6, 40, 40)
    smooth = ndimage.gaussian_filter(frames, sigma=[0, 1.5, 1.5])
    got = zarr.open_array(result.summary["outputs"]["projection"]["location"])[:]
    np.testing.assert_allclose(got, smooth.max(0), rtol=1e-5)
    np.testing.assert_allclose(result.outputs["frame_means"], frames.mean((1, 2)), rtol=1e-5)


CHECKS = {"climate.yaml": _climate, "hdf5_anomaly.yaml": _hdf5_anomaly, "tiff_projection.yaml": _tiff_projection,
          "quickstart.yaml": _quickstart, "quickstart_batch.yaml": _quickstart_batch, "standardize.yaml": _standardize, "transpose_sum.yaml": _transpose_sum,
          "denoise.yaml": _denoise, "denoise_synthetic.yaml": _denoise_synthetic, "tile_stats.yaml": _tile_stats}


def test_quickstart_through_the_cli_on_a_cluster(tmp_path, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["run", str(ROOT / "quickstart.yaml"), "--set", "params.n=64",
                                      "--set", "params.rows_per_chunk=16", "--summary", "run.json"])
    assert result.exit_code == 0, result.output
    assert "dashboard:" in result.output
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["session"]["n_workers"] == 2
    assert os.path.isdir(tmp_path / "flowgpu-output" / "quickstart" / "standardized.zarr")


def test_the_docs_example_runs(tmp_path, monkeypatch):
    text = (ROOT.parent / "docs" / "pipelines.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.yaml").write_text(example)
    monkeypatch.chdir(tmp_path)
    result = pipeline.run(tmp_path / "example.yaml", overrides={"params.n": 50}, session="local", progress=False)
    assert abs(result.outputs["total"] - 50 * 256) < 1
    assert os.path.isdir(tmp_path / "output" / "column-stats" / "z.zarr")


def test_editors_accept_the_shipped_specs_and_flag_typos():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    validator = jsonschema.Draft202012Validator(json_schema())
    for name in SPECS:
        assert not list(validator.iter_errors(yaml.safe_load((ROOT / name).read_text()))), name
    assert list(validator.iter_errors({"steps": {"a": {"op": "sum", "arg": {}}}}))

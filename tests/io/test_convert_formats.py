"""``flowgpu convert`` of an HDF5 dataset and of TIFF stacks (a multi-page file, a glob of pages) into
Zarr equal to NumPy's read of the source; what it refuses, before any cluster starts."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from flowgpu.cli import cli
from flowgpu.errors import ConfigError
from flowgpu.io import convert

h5py = pytest.importorskip("h5py")
tifffile = pytest.importorskip("tifffile")


@pytest.fixture
def files(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    field = rng.standard_normal((300, 40, 12)).astype("float32")
    with h5py.File(tmp_path / "run.h5", "w") as f:
        f.create_dataset("/fields/temp", data=field, chunks=(16, 40, 12), compression="gzip")
        f.create_dataset("/fields/wind", data=field[:, :3])
    stack = rng.integers(0, 60000, (14, 33, 21)).astype("uint16")
    tifffile.imwrite(tmp_path / "stack.tif", stack, compression="zlib")
    (tmp_path / "pages").mkdir()
    for i, page in enumerate(stack):
        tifffile.imwrite(tmp_path / "pages" / f"p{i}.tif", page)
    return {"field": field, "stack": stack}


@pytest.mark.parametrize("src, component, want", [
    ("run.h5", "/fields/temp", "field"),
    ("stack.tif", None, "stack"),
    ("pages/p*.tif", None, "stack"),  # natural order: p2 before p10
])
def test_convert_writes_zarr_equal_to_numpys_read(files, src, component, want):
    out = convert.convert(src, "out.zarr", chunk_bytes=8 << 10, shard_bytes=64 << 10, component=component)
    a = zarr.open_array("out.zarr")
    assert out["shape"] == list(files[want].shape) and a.dtype == files[want].dtype
    assert a.shards is not None  # the GPU-friendly layout: small chunks inside shards
    np.testing.assert_array_equal(a[:], files[want])


@pytest.mark.slow  # starts a cluster
def test_the_command_takes_a_quoted_glob(files):
    r = CliRunner().invoke(cli, ["convert", "pages/p*.tif", "w.zarr", "--backend", "cpu", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("wrote w.zarr: (14, 33, 21) uint16")
    np.testing.assert_array_equal(zarr.open_array("w.zarr")[:], files["stack"])


def test_a_dataset_is_named_as_a_component(files):
    convert.convert("run.h5", "w.zarr", component="fields/wind")
    np.testing.assert_array_equal(zarr.open_array("w.zarr")[:], files["field"][:, :3])


def test_bad_sources_are_refused_before_anything_starts(files, tmp_path):
    (tmp_path / "notes.txt").write_text("plain text, no array")
    for src, said in [("notes.txt", "is none of a .npy file, a Zarr store, an HDF5 file"),
                      ("nothing/*.tif", "matches no files"),
                      ("gone.h5", "does not exist")]:
        with pytest.raises(ConfigError, match=said):
            convert.check(src, "o.zarr")
    with pytest.raises(ConfigError, match="is the source itself"):
        convert.check("pages/p*.tif", "pages/p3.tif")
    with pytest.raises(ConfigError, match="has no dataset '/fields/t'; it holds /fields/temp, /fields/wind"):
        convert.convert("run.h5", "o.zarr", component="/fields/t")
    with pytest.raises(ConfigError, match="holds 2 datasets, so name one"):
        convert.convert("run.h5", "o.zarr")
    with pytest.raises(ConfigError, match="is a TIFF stack: it has no component"):
        convert.convert("stack.tif", "o.zarr", component="x")
    assert not (tmp_path / "o.zarr").exists()


def test_convert_keeps_a_netcdf_variables_dims_and_attributes(tmp_path, rng, monkeypatch):
    """``convert era.nc out.zarr --component t2m`` dropped the variable's dimension names and attributes
    (the docs say they are kept, as they were from an xarray Zarr store); xarray's ``_FillValue``
    encoding is no attribute."""
    xr = pytest.importorskip("xarray")
    monkeypatch.chdir(tmp_path)
    t2m = rng.standard_normal((10, 6, 8)).astype("float32")
    scale = float(rng.uniform(1, 2))
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m, {"units": "K", "scale": np.float32(scale)}),
                     "bare": (("a", "b"), rng.standard_normal((4, 5)))},
                    coords={"time": np.arange(10), "lat": np.linspace(-5, 5, 6), "lon": np.linspace(0, 7, 8)})
    ds.to_netcdf("era.nc", engine="h5netcdf")
    ds.to_zarr("era.zarr", mode="w")
    for src in ("era.nc", "era.zarr"):
        convert.convert(src, f"{src}.t2m.zarr", component="t2m")
        a = zarr.open_array(f"{src}.t2m.zarr")
        assert a.metadata.dimension_names == ("time", "lat", "lon"), src
        assert dict(a.attrs) == {"units": "K", "scale": pytest.approx(scale, rel=1e-6)}, src
        np.testing.assert_array_equal(a[:], t2m)
    convert.convert("era.nc", "bare.zarr", component="bare")
    assert zarr.open_array("bare.zarr").metadata.dimension_names == ("a", "b")

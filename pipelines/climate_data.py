"""Make the dataset pipelines/climate.yaml reads: daily 2 m temperature written by xarray to Zarr,
with dims (time, lat, lon), coordinates and units, as a reanalysis download would be.

    python pipelines/climate_data.py data/era.zarr [--years 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pandas as pd
import xarray as xr


def make(path: str, years: int = 3, nlat: int = 37, nlon: int = 72, seed: int | None = None) -> xr.Dataset:
    """Write the dataset to ``path`` (Zarr) and return it: a seasonal cycle, a pole-to-equator
    gradient and noise, in kelvin."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2001-01-01", periods=365 * years, freq="D")
    lat = np.linspace(-90.0, 90.0, nlat)
    lon = np.arange(nlon) * (360.0 / nlon)
    season = 10.0 * np.cos(2 * np.pi * (time.day_of_year.values - 200) / 365.25)[:, None, None]
    gradient = 30.0 * np.cos(np.deg2rad(lat))[None, :, None]
    noise = rng.normal(0.0, 2.0, (time.size, nlat, nlon))
    t2m = (255.0 + gradient + season * np.sign(lat)[None, :, None] + noise).astype("float32")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 metre temperature"})},
        coords={"time": time, "lat": ("lat", lat, {"units": "degrees_north"}),
                "lon": ("lon", lon, {"units": "degrees_east"})},
        attrs={"title": "synthetic daily 2 m temperature (flowgpu example)"})
    with warnings.catch_warnings():  # zarr: consolidated metadata is not yet part of the Zarr 3 spec
        warnings.simplefilter("ignore", UserWarning)
        ds.chunk({"time": 365}).to_zarr(path, mode="w", consolidated=True)  # xr.open_zarr reads it without a warning
    return ds


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="data/era.zarr")
    parser.add_argument("--years", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    make(args.path, years=args.years, seed=args.seed)
    print(f"wrote {args.path}")

"""Make the example inputs of pipelines/hdf5_anomaly.yaml and pipelines/tiff_projection.yaml.

    python pipelines/make_files.py            # writes data/climate.h5, data/frames/frame_*.tif, data/stack.tif
    python pipelines/make_files.py DIR --seed 3 --frames 40 --size 512

Needs h5py and tifffile (pip install 'flowgpu[formats]'). The data is made here, never committed:
a temperature field (time, lat, lon) with a seasonal cycle, in an HDF5 file as a gzip-chunked
dataset /fields/t2m; and a microscopy-like stack of noisy frames with bright spots, as one TIFF
file per frame (frame_0.tif ... frame_N.tif: a glob stacks them in natural order) and as one
multi-page file.
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def make_climate(path: str, rng: np.random.Generator, years: int = 4, lat: int = 36, lon: int = 72) -> np.ndarray:
    """Monthly temperatures (years*12, lat, lon) in kelvin, written to ``path`` as /fields/t2m."""
    import h5py

    months = np.arange(years * 12)
    lats = np.linspace(-87.5, 87.5, lat)
    base = 288 - 30 * np.abs(np.sin(np.deg2rad(lats)))[None, :, None]
    season = 10 * np.sin(2 * np.pi * months / 12)[:, None, None] * np.sign(lats)[None, :, None]
    t2m = (base + season + rng.normal(0, 1.5, (len(months), lat, lon))).astype("float32")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("/fields/t2m", data=t2m, chunks=(12, lat, lon), compression="gzip")
        d.attrs["units"] = "K"
        f.create_dataset("/coords/lat", data=lats)
        f.create_dataset("/coords/month", data=months)
    return t2m


def make_frames(folder: str, stack_path: str, rng: np.random.Generator, frames: int = 20,
                size: int = 256) -> np.ndarray:
    """``frames`` uint16 frames (size x size): noise plus a few bright spots that drift, written as
    ``folder/frame_<i>.tif`` (one page each) and as the multi-page ``stack_path``."""
    import tifffile

    yy, xx = np.mgrid[:size, :size]
    spots = rng.uniform(0.1 * size, 0.9 * size, (8, 2))
    stack = np.empty((frames, size, size), dtype="uint16")
    for i in range(frames):
        img = rng.normal(100, 10, (size, size))
        for y, x in spots + i * 0.5:
            img += 2000 * np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * 3.0 ** 2))
        stack[i] = np.clip(img, 0, 65535).astype("uint16")
    os.makedirs(folder, exist_ok=True)
    for i, frame in enumerate(stack):
        tifffile.imwrite(os.path.join(folder, f"frame_{i}.tif"), frame, photometric="minisblack")
    tifffile.imwrite(stack_path, stack, photometric="minisblack", compression="zlib")
    return stack


def make(folder: str = "data", seed: int = 0, frames: int = 20, size: int = 256) -> dict[str, np.ndarray]:
    """Write every example input under ``folder``; returns what was written, by file."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    return {"climate.h5": make_climate(os.path.join(folder, "climate.h5"), rng),
            "frames": make_frames(os.path.join(folder, "frames"), os.path.join(folder, "stack.tif"), rng, frames, size)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", default="data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--size", type=int, default=256)
    a = p.parse_args()
    make(a.folder, a.seed, a.frames, a.size)
    print(f"wrote {a.folder}/climate.h5, {a.folder}/frames/frame_*.tif and {a.folder}/stack.tif")

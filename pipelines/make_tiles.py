"""Make example tiles for pipelines/tile_stats.yaml: random float32 images, one .npy file each.

    python pipelines/make_tiles.py                 # 8 tiles of 256 x 256 in data/tiles/
    python pipelines/make_tiles.py data/tiles --count 32 --size 1024 --seed 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def make_tiles(folder: str | Path = "data/tiles", count: int = 8, size: int = 256, seed: int | None = None) -> list[Path]:
    """Write ``count`` tiles ``tile_00.npy ...`` of ``size`` x ``size`` noisy blobs into ``folder``; returns their paths."""
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size] / size
    paths = []
    for i in range(count):
        cy, cx, width = rng.random(3) * [1, 1, 0.2] + [0, 0, 0.05]
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width ** 2))
        tile = (blob + 0.2 * rng.standard_normal((size, size))).astype("float32")
        paths.append(folder / f"tile_{i:02d}.npy")
        np.save(paths[-1], tile)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="data/tiles")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    for path in make_tiles(args.folder, args.count, args.size, args.seed):
        print(path)

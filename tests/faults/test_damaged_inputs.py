"""Damaged inputs on the CPU path: a Zarr chunk that does not decode names its file and grid position
(as the GPU path does), and a .npy whose size disagrees with its header is refused, never read as a prefix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

from flowgpu.errors import ConfigError
from flowgpu.io.npy import from_npy
from flowgpu.io.zarr import from_zarr, to_zarr

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.mark.parametrize("shards", [None, (8, 6)])
def test_a_zarr_chunk_that_does_not_decode_is_named(tmp_path, rng, shards):
    data = rng.random((16, 12)).astype("f4")
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=data.shape, chunks=(4, 6), shards=shards, dtype="f4")
    z[:] = data
    np.testing.assert_array_equal(from_zarr(str(tmp_path / "x.zarr")).compute(), data)
    unit = "c/1/1"  # the chunk (or shard) at grid position (1, 1)
    damaged = tmp_path / "x.zarr" / unit
    raw = bytearray(damaged.read_bytes())
    raw[: min(len(raw), 64)] = rng.integers(0, 256, min(len(raw), 64), dtype=np.uint8).tobytes()
    damaged.write_bytes(bytes(raw))
    with pytest.raises(OSError) as e:
        from_zarr(str(tmp_path / "x.zarr")).sum().compute()
    said = str(e.value)
    assert said.startswith(f"{damaged}: the {'shard' if shards else 'chunk'} at grid position (1, 1)")
    assert "the store is damaged: restore it, or rewrite it from its source" in said
    np.testing.assert_array_equal(from_zarr(str(tmp_path / "x.zarr"))[:4, :6].compute(), data[:4, :6])  # the rest reads


@pytest.mark.parametrize("options", [{}, {"codec": "lz4", "chunks": (4, 6), "shards": (8, 6)}])
def test_a_bit_flipped_in_a_store_flowgpu_wrote_is_caught_by_its_crc32c(tmp_path, rng, options):
    """With ``flowgpu.zarr.checksum`` flowgpu ends every chunk it writes in zarr's crc32c: one bit
    flipped in a chunk's bytes (which a decompressor may turn into other values without a word) is an
    error naming that file, on read."""
    data = rng.random((16, 12)).astype("f4")
    out = str(tmp_path / "w.zarr")
    with dask.config.set({"flowgpu.zarr.checksum": True}):
        to_zarr(da.from_array(data, chunks=(4, 6)), out, **options)
    a = zarr.open_array(out)
    assert [c.to_dict()["name"] for c in (a.metadata.codecs[0].codecs if a.shards else a.metadata.codecs)][-1] == "crc32c"
    unit = "c/1/1"
    damaged = tmp_path / "w.zarr" / unit
    raw = bytearray(damaged.read_bytes())
    at = int(rng.integers(0, len(raw) - (16 * 2 + 4 if a.shards else 0)))  # a chunk's bytes, not a shard's index
    raw[at] ^= 1 << int(rng.integers(0, 8))
    damaged.write_bytes(bytes(raw))
    with pytest.raises(OSError) as e:
        from_zarr(out).sum().compute()
    said = str(e.value)
    assert said.startswith(f"{damaged}: the {'shard' if a.shards else 'chunk'} at grid position (1, 1)"), said
    assert "checksum" in said and "the store is damaged" in said
    np.testing.assert_array_equal(from_zarr(out)[:4, :6].compute(), data[:4, :6])  # the rest reads


def test_a_npy_that_holds_more_than_its_header_says_is_refused(tmp_path, rng):
    data = rng.random((20, 5))
    path = tmp_path / "x.npy"
    np.save(path, data)
    np.testing.assert_array_equal(from_npy(str(path)).compute(), data)
    with open(path, "ab") as f:
        f.write(rng.random(5).tobytes())  # a row more than the header declares
    with pytest.raises(ConfigError, match=r"header declares \(20, 5\) float64 \(800 bytes after a \d+-byte header\), "
                                          r"but the file holds \d+ bytes: it is damaged"):
        from_npy(str(path))
    (tmp_path / "s.yaml").write_text("inputs: {x: {source: npy, path: x.npy}}\nsteps: {s: {op: sum, inputs: [x]}}\n"
                                     "outputs: {s: {from: s}}\n")
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", "s.yaml", "--quiet"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "but the file holds" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_npy_shorter_than_its_header_is_refused(tmp_path, rng):
    path = tmp_path / "x.npy"
    np.save(path, rng.random((20, 5)))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 40)
    with pytest.raises(ConfigError, match="is not a readable .npy file"):
        from_npy(str(path))

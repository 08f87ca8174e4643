"""Stores for the Zarr device-path tests: fresh data that compresses, written by zarr-python itself."""

from __future__ import annotations

import warnings

import numcodecs
import numpy as np
import zarr

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # numcodecs codecs in Zarr 3 warn that they are not in the spec
    from zarr.codecs import numcodecs as zarr_numcodecs

# name -> create_array keyword arguments, and the nvCOMP algorithm / framing each must plan to
STORES = {
    "zstd": ({}, ("Zstd", 0, 0)),
    "gzip": ({"compressors": zarr.codecs.GzipCodec()}, ("Gzip", 0, 0)),
    "zlib": ({"compressors": "numcodecs.zlib"}, ("Deflate", 2, 4)),
    "lz4": ({"compressors": "numcodecs.lz4"}, ("LZ4", 4, 0)),
    "none": ({"compressors": None}, (None, 0, 0)),
    "v2-lz4": ({"zarr_format": 2, "compressors": numcodecs.LZ4()}, ("LZ4", 4, 0)),
    "v2-zlib": ({"zarr_format": 2, "compressors": numcodecs.Zlib()}, ("Deflate", 2, 4)),
    "sharded-zstd": ({"shards": (20, 12)}, ("Zstd", 0, 0)),
    "sharded-lz4": ({"shards": (20, 12), "compressors": "numcodecs.lz4"}, ("LZ4", 4, 0)),
    # zarr's crc32c after the compressor (what flowgpu writes): 4 more bytes, checked before decoding
    "zstd-crc32c": ({"compressors": [zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]}, ("Zstd", 0, 4)),
    "lz4-crc32c": ({"compressors": ["numcodecs.lz4", zarr.codecs.Crc32cCodec()]}, ("LZ4", 4, 4)),
    "zlib-crc32c": ({"compressors": ["numcodecs.zlib", zarr.codecs.Crc32cCodec()]}, ("Deflate", 2, 8)),
    "none-crc32c": ({"compressors": [zarr.codecs.Crc32cCodec()]}, (None, 0, 4)),
    "sharded-lz4-crc32c": ({"shards": (20, 12), "compressors": ["numcodecs.lz4", zarr.codecs.Crc32cCodec()]},
                           ("LZ4", 4, 4)),
}


def field(rng: np.random.Generator, shape: tuple, dtype: str = "float32") -> np.ndarray:
    """A smooth field plus noise, rounded so that it compresses (never zeros, new every run)."""
    axes = np.meshgrid(*(np.linspace(0, rng.uniform(3, 9), n) for n in shape), indexing="ij")
    smooth = sum(np.sin(a + rng.uniform(0, 6)) for a in axes) * 100
    return np.round(smooth + rng.normal(0, 1, shape), 1).astype(dtype)


def _compressors(kw: dict) -> dict:
    kw = dict(kw)
    named = {"numcodecs.zlib": zarr_numcodecs.Zlib, "numcodecs.lz4": zarr_numcodecs.LZ4}
    c = kw.get("compressors")
    if isinstance(c, list):
        kw["compressors"] = [named[x]() if isinstance(x, str) else x for x in c]
    elif isinstance(c, str) and c in named:
        kw["compressors"] = named[c]()
    return kw


def make_store(path: str, data: np.ndarray, name: str, chunks: tuple = (10, 6), **extra) -> zarr.Array:
    """``data`` as the Zarr store ``name`` of :data:`STORES` at ``path``, chunks ``chunks``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = {**_compressors(STORES[name][0]), **extra}  # extra wins (e.g. other shards)
        a = zarr.create_array(path, shape=data.shape, chunks=chunks, dtype=data.dtype, fill_value=0, **kw)
        a[:] = data
    return a


def first_mismatch(got: np.ndarray, want: np.ndarray) -> str:
    """Where two arrays first differ, for a failure message."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    if not len(bad):
        return "equal"
    i = tuple(int(v) for v in bad[0])
    return f"{len(bad)} values differ; first at {i}: got {got[i]!r}, zarr read {want[i]!r}"

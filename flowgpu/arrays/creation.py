"""Creating chunked arrays: plain ``dask.array.Array`` objects whose chunks are CuPy on GPU sessions
and NumPy otherwise. Nothing here starts a cluster or computes anything."""

from __future__ import annotations

import secrets
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays import random as _random
from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.movement import to_device
from flowgpu.backend import current_backend, import_cupy, is_cupy
from flowgpu.errors import ChunkError, ConfigError

__all__ = ["random", "normal", "zeros", "ones", "full", "arange", "from_array", "meta_for"]


def meta_for(dtype: Any, ndim: int = 0, backend: str | None = None):
    """An empty array of the current backend, for dask's ``meta=``."""
    backend = backend or current_backend()
    xp = import_cupy() if backend == "cupy" else np
    return xp.empty((0,) * ndim, dtype=dtype)


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ConfigError(f"shape={shape!r} is not a tuple of whole numbers, e.g. (1000, 1000)") from None
    if any(s < 0 for s in out):
        raise ConfigError(f"shape={shape!r} has a negative length")
    return out


def _seed(seed: Any) -> int:
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r}: give a non-negative whole number, or None for a fresh one")
    return int(seed)


def _generated(block_fn, shape, dtype, chunks, **kwargs) -> da.Array:
    backend = current_backend()
    normalized = resolve_chunks(chunks, shape, dtype)

    def block(block_info=None, _fn=block_fn, _shape=shape, _backend=backend, _kw=kwargs):
        loc = block_info[None]["array-location"]
        return _fn(loc, _shape, dtype=np.dtype(dtype), backend=_backend, **_kw)

    return da.map_blocks(block, chunks=normalized, dtype=dtype, meta=meta_for(dtype, len(shape), backend))


def random(shape: Any, dtype: Any = "float64", seed: int | None = None, chunks: Any = "auto") -> da.Array:
    """Uniform random numbers in [0, 1), reproducible per seed.

    The same seed gives the same numbers for any ``chunks`` and on NumPy and CuPy alike: each value
    is a hash of the seed and the element's position.

    Examples
    --------
    >>> import flowgpu as fg
    >>> x = fg.random((4, 4), dtype="float32", seed=0, chunks=2)
    >>> bool(((x >= 0) & (x < 1)).all().compute())
    True
    """
    shape = _shape(shape)
    dtype = np.dtype(dtype)
    if dtype not in _random.UNIFORM_DTYPES:
        raise ConfigError(f"random() makes float32 or float64, not {dtype}; cast afterwards with .astype()")
    key = _random.seed_key(_seed(seed))
    return _generated(_random.uniform_block, shape, dtype, chunks, key=key)


def normal(shape: Any, dtype: Any = "float64", seed: int | None = None, chunks: Any = "auto",
           loc: float = 0.0, scale: float = 1.0) -> da.Array:
    """Normal random numbers with mean ``loc`` and standard deviation ``scale``, reproducible per seed."""
    shape = _shape(shape)
    dtype = np.dtype(dtype)
    if dtype not in _random.UNIFORM_DTYPES:
        raise ConfigError(f"normal() makes float32 or float64, not {dtype}")
    key = _random.seed_key(_seed(seed))
    x = _generated(_random.normal_block, shape, dtype, chunks, key=key)
    if scale != 1.0 or loc != 0.0:
        x = (x * dtype.type(scale) + dtype.type(loc)).astype(dtype)
    return x



def zeros(shape: Any, dtype: Any = "float64", chunks: Any = "auto") -> da.Array:
    """An array of zeros in the session's backend."""
    return _filled(shape, dtype, chunks, 0)


def ones(shape: Any, dtype: Any = "float64", chunks: Any = "auto") -> da.Array:
    """An array of ones in the session's backend."""
    return _filled(shape, dtype, chunks, 1)


def full(shape: Any, fill_value: Any, dtype: Any = None, chunks: Any = "auto") -> da.Array:
    """An array filled with ``fill_value`` in the session's backend."""
    dtype = np.dtype(dtype) if dtype is not None else np.asarray(fill_value).dtype
    return _filled(shape, dtype, chunks, fill_value)


def _fill_block(location, full_shape, *, dtype, backend, value):
    xp = import_cupy() if backend == "cupy" else np
    return xp.full(tuple(b - a for a, b in location), value, dtype=dtype)


def _filled(shape, dtype, chunks, value) -> da.Array:
    shape = _shape(shape)
    return _generated(_fill_block, shape, np.dtype(dtype), chunks, value=value)


def _arange_block(location, full_shape, *, dtype, backend, start, step):
    xp = import_cupy() if backend == "cupy" else np
    (a, b), = location
    return (xp.arange(a, b, dtype=np.float64 if dtype.kind == "f" else np.int64) * step + start).astype(dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, chunks: Any = "auto") -> da.Array:
    """Evenly spaced values in ``[start, stop)``, like ``numpy.arange``."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ConfigError("arange step must not be 0")
    n = max(int(np.ceil((stop - start) / step)), 0)
    dtype = np.dtype(dtype) if dtype is not None else np.arange(start, start + step, step).dtype
    return _generated(_arange_block, (n,), dtype, chunks, start=start, step=step)


def from_array(x: Any, chunks: Any = "auto") -> da.Array:
    """A host (NumPy) or device (CuPy) array as a chunked array on the session's device."""
    if isinstance(x, da.Array):
        return to_device(x)
    if not is_cupy(x):
        x = np.asarray(x)
    if chunks == "auto" or chunks is None:
        chunks = resolve_chunks("auto", x.shape, x.dtype)
    else:
        try:
            chunks = resolve_chunks(chunks, x.shape, x.dtype)
        except ChunkError:
            raise
    return to_device(da.from_array(x, chunks=chunks, asarray=False))

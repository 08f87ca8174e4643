"""Creating chunked arrays: plain ``dask.array.Array`` objects whose chunks are CuPy on GPU sessions
and NumPy otherwise. Nothing here starts a cluster or computes anything."""

from __future__ import annotations

import math
import secrets
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import format_bytes, parse_bytes

from flowgpu import config
from flowgpu.arrays import random as _random
from flowgpu.arrays.chunks import resolve_chunks, target_chunk_bytes
from flowgpu.arrays.movement import to_device
from flowgpu.backend import current_backend, empty_meta, import_cupy, is_cupy
from flowgpu.errors import ChunkError, ConfigError

__all__ = ["random", "normal", "zeros", "ones", "full", "arange", "from_array", "from_reader", "meta_for",
           "check_size", "check_fill_value", "arange_length"]

_INDEX_MAX = 2**63 - 1  # the most elements a 64-bit index (NumPy's, dask's) can count


def meta_for(dtype: Any, ndim: int = 0, backend: str | None = None):
    """An empty array of the current backend, for dask's ``meta=``."""
    return empty_meta((backend or current_backend()) == "cupy", dtype, ndim)


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


def check_size(shape: tuple[int, ...], dtype: Any = None) -> None:
    """Refuse a shape whose element count overflows a 64-bit index, or whose bytes (for ``dtype``)
    pass ``flowgpu.spec.max-array-bytes``: such an array is a typo, and only fails later, slowly."""
    count = math.prod(shape)
    if max(shape, default=0) > _INDEX_MAX or count > _INDEX_MAX:
        raise ConfigError(f"shape {list(shape)} holds {count:.3g} elements, more than a 64-bit index can count; "
                          "give smaller lengths")
    if dtype is None:
        return
    nbytes = count * np.dtype(dtype).itemsize
    most = config.get("spec.max-array-bytes")
    most = int(config.parse_size(most) if isinstance(most, str) else most)
    if nbytes > most:
        raise ConfigError(f"shape {list(shape)} of {np.dtype(dtype)} is {format_bytes(nbytes)}, more than "
                          f"flowgpu.spec.max-array-bytes ({format_bytes(most)}); give smaller lengths (or raise "
                          "the limit if this array is meant)")


def check_fill_value(value: Any, dtype: Any) -> None:
    """Refuse a fill value that ``dtype`` cannot hold (``inf`` or ``1e10`` as int32 would be garbage)."""
    dtype = np.dtype(dtype)
    if isinstance(value, (bool, np.bool_)) or dtype.kind in "cmMOSUV":
        return
    if dtype.kind == "b":
        if value not in (0, 1):
            raise ConfigError(f"fill_value={value!r} is not a bool; give true or false for dtype bool")
        return
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not (isinstance(value, (int, np.integer)) or (math.isfinite(value) and float(value).is_integer())):
            raise ConfigError(f"fill_value={value!r} is not a whole number, so {dtype} cannot hold it; give a whole "
                              "number or a float dtype")
        if not info.min <= int(value) <= info.max:
            raise ConfigError(f"fill_value={value!r} is outside {dtype}'s range [{info.min}, {info.max}]; give a "
                              "value in range or a wider dtype")
    elif dtype.kind == "f" and math.isfinite(value) and abs(value) > np.finfo(dtype).max:
        raise ConfigError(f"fill_value={value!r} is beyond {dtype}'s largest value {np.finfo(dtype).max:g}; give "
                          "a smaller value or float64")


def _seed(seed: Any) -> int:
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r}: give a non-negative whole number, or None for a fresh one")
    return int(seed)


def _fewest_blocks(chunks: Any, shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The fewest blocks ``chunks`` can cut ``shape`` into, counted before dask lists them all (a list
    of 10**12 block lengths does not fit in memory)."""
    if chunks is None or isinstance(chunks, str):
        try:
            per = max((target_chunk_bytes() if chunks in (None, "auto") else parse_bytes(chunks)) // dtype.itemsize, 1)
        except (ValueError, TypeError, OverflowError):
            return 1
        return -(-math.prod(shape) // per)
    if isinstance(chunks, (int, np.integer)) and not isinstance(chunks, bool):
        chunks = (chunks,) * len(shape)
    if not isinstance(chunks, (tuple, list)) or len(chunks) != len(shape):
        return 1
    lengths = [c if isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c > 0 else None for c in chunks]
    return math.prod(-(-s // c) for s, c in zip(shape, lengths) if c)


def _check_blocks(blocks: int, shape: tuple[int, ...], chunks: Any) -> None:
    most = int(config.get("spec.max-chunks"))
    if blocks > most:
        raise ChunkError(f"shape {list(shape)} in chunks of {chunks} makes {blocks:,} chunks, more than "
                         f"flowgpu.spec.max-chunks ({most:,}); give larger chunks (a byte size such as '1GiB') or "
                         "a smaller shape")


def _generated(block_fn, shape, dtype, chunks, **kwargs) -> da.Array:
    backend = current_backend()
    check_size(shape, dtype)
    _check_blocks(_fewest_blocks(chunks, shape, np.dtype(dtype)), shape, chunks)
    normalized = resolve_chunks(chunks, shape, dtype)
    _check_blocks(math.prod(len(c) for c in normalized), shape, [max(c, default=0) for c in normalized])

    def block(block_info=None, _fn=block_fn, _shape=shape, _backend=backend, _kw=kwargs):
        loc = block_info[None]["array-location"]
        return _fn(loc, _shape, dtype=np.dtype(dtype), backend=_backend, **_kw)

    return da.map_blocks(block, chunks=normalized, dtype=dtype, meta=meta_for(dtype, len(shape), backend))


def _generated_random(block_fn, what: str, shape: Any, dtype: Any, seed: Any, chunks: Any) -> da.Array:
    shape, dtype = _shape(shape), np.dtype(dtype)
    if dtype not in _random.UNIFORM_DTYPES:
        raise ConfigError(f"{what}() makes float32 or float64, not {dtype}; cast it afterwards (x.astype(...), or "
                          "a step with op: astype)")
    return _generated(block_fn, shape, dtype, chunks, key=_random.seed_key(_seed(seed)))


def random(shape: Any, dtype: Any = "float64", seed: int | None = None, chunks: Any = "auto") -> da.Array:
    """Uniform random numbers in [0, 1), reproducible per seed.

    The same seed gives the same numbers for any ``chunks`` and on NumPy and CuPy alike: each value
    is a hash of the seed and the element's position.
    """
    return _generated_random(_random.uniform_block, "random", shape, dtype, seed, chunks)


def normal(shape: Any, dtype: Any = "float64", seed: int | None = None, chunks: Any = "auto",
           loc: float = 0.0, scale: float = 1.0) -> da.Array:
    """Normal random numbers with mean ``loc`` and standard deviation ``scale``, reproducible per seed."""
    x = _generated_random(_random.normal_block, "normal", shape, dtype, seed, chunks)
    if scale != 1.0 or loc != 0.0:
        x = (x * x.dtype.type(scale) + x.dtype.type(loc)).astype(x.dtype)
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
    check_fill_value(fill_value, dtype)
    return _filled(shape, dtype, chunks, fill_value)


def _fill_block(location, full_shape, *, dtype, backend, value):
    xp = import_cupy() if backend == "cupy" else np
    return xp.full(tuple(b - a for a, b in location), value, dtype=dtype)


def _filled(shape, dtype, chunks, value) -> da.Array:
    return _generated(_fill_block, _shape(shape), np.dtype(dtype), chunks, value=value)


def _arange_block(location, full_shape, *, dtype, backend, start, step):
    xp = import_cupy() if backend == "cupy" else np
    (a, b), = location
    return (xp.arange(a, b, dtype=np.float64 if dtype.kind == "f" else np.int64) * step + start).astype(dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, chunks: Any = "auto") -> da.Array:
    """Evenly spaced values in ``[start, stop)``, like ``numpy.arange``."""
    if stop is None:
        start, stop = 0, start
    n = arange_length(start, stop, step)
    dtype = np.dtype(dtype) if dtype is not None else np.arange(start, start + step, step).dtype
    return _generated(_arange_block, (n,), dtype, chunks, start=start, step=step)


def arange_length(start: Any, stop: Any, step: Any) -> int:
    """How many values ``arange(start, stop, step)`` holds; non-finite or absurd bounds are refused."""
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise ConfigError(f"arange {name}={v!r} is not a finite number; give a number such as 1000")
        if isinstance(v, (int, np.integer)) and abs(v) > _INDEX_MAX:
            raise ConfigError(f"arange {name}={v!r} is beyond 64-bit numbers; give a smaller one")
    if step == 0:
        raise ConfigError("arange step must not be 0")
    span = (stop - start) / step
    if not math.isfinite(span):
        raise ConfigError(f"arange from {start!r} to {stop!r} by {step!r} holds too many values; give a larger step")
    n = max(math.ceil(span), 0)
    check_size((n,))
    return n


def from_array(x: Any, chunks: Any = "auto") -> da.Array:
    """A host (NumPy) or device (CuPy) array as a chunked array on the session's device."""
    if isinstance(x, da.Array):
        return to_device(x)
    if not is_cupy(x):
        x = np.asarray(x)
    chunks = resolve_chunks("auto" if chunks is None else chunks, x.shape, x.dtype)
    return to_device(da.from_array(x, chunks=chunks, asarray=False))


def from_reader(reader: Any, chunks: Any, kind: str, token: str) -> da.Array:
    """The blocks of ``reader`` (sliced in the task that needs them) as a chunked array named
    ``from-<kind>[-gpu]-<token>``; on a GPU session the reader reads straight to the device."""
    gpu = current_backend() == "cupy"
    if gpu:
        reader.device = True
    # not inline_array=True: the reads would run inside the next step's tasks, and the flowgpu page
    # would show the input step with no tasks (and failed when the next step failed)
    meta = empty_meta(gpu, reader.dtype, reader.ndim)
    return da.from_array(reader, chunks=chunks, asarray=False, meta=meta,
                         name=f"from-{kind}-gpu-{token}" if gpu else f"from-{kind}-{token}")

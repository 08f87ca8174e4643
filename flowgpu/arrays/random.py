"""Counter-based random numbers: element ``i`` of an array depends only on the seed and ``i``.

Each value is a splitmix64 hash of (seed, global flat index), so the numbers are the same for any
chunking, on any worker, and bit for bit the same on NumPy and CuPy (integer arithmetic, then an
exact conversion of the top 24 or 53 bits to a float in [0, 1)).
"""

from __future__ import annotations

import functools

import numpy as np

from flowgpu.backend import import_cupy

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1

UNIFORM_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def seed_key(seed: int) -> int:
    """Mix a user seed into a 64-bit key (plain Python integers)."""
    z = (int(seed) * _GOLDEN + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=None)
def _uniform_kernel(dtype_name: str):
    """One CUDA kernel: global index from the thread's position, hash, exact float conversion.

    No index array is materialised, so generating a chunk needs no memory beyond the chunk itself.
    """
    cp = import_cupy()
    shift, scale = (40, "5.9604644775390625e-08") if dtype_name == "float32" else (11, "1.1102230246251565e-16")
    return cp.ElementwiseKernel(
        "raw int64 lshape, raw int64 offset, raw int64 gstride, int32 ndim, uint64 key, uint64 mul, uint64 add",
        "T out",
        f"""
        long long rem = i;
        unsigned long long g = 0;
        for (int d = ndim - 1; d >= 0; --d) {{
            long long c = rem % lshape[d];
            rem /= lshape[d];
            g += (unsigned long long)(c + offset[d]) * (unsigned long long)gstride[d];
        }}
        g = g * mul + add;
        unsigned long long z = g * 0x9E3779B97F4A7C15ULL + key;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z = z ^ (z >> 31);
        out = (T)(z >> {shift}) * (T){scale};
        """,
        f"flowgpu_uniform_{dtype_name}",
    )


def uniform_block(location, full_shape, key: int, dtype, backend: str, stream: int = -1):
    """Uniform [0, 1) numbers for the block at ``location`` of an array of ``full_shape``."""
    dtype = np.dtype(dtype)
    xp = import_cupy() if backend == "cupy" else np
    lshape = [b - a for a, b in location]
    out = xp.empty(tuple(lshape), dtype=dtype)
    if out.size == 0:
        return out
    ndim = len(full_shape)
    gstride = [int(np.prod(full_shape[i + 1 :], dtype=np.int64)) for i in range(ndim)]
    mul, add = (2, stream) if stream >= 0 else (1, 0)
    arr = lambda v: xp.asarray(np.asarray(v or [0], dtype=np.int64))  # noqa: E731
    offset = arr([a for a, _ in location])
    if backend == "cupy":
        _uniform_kernel(dtype.name)(arr(lshape), offset, arr(gstride), np.int32(ndim), np.uint64(key),
                                    np.uint64(mul), np.uint64(add), out)
        return out
    shift, scale = (40, 2.0**-24) if dtype == np.float32 else (11, 2.0**-53)
    _cpu_kernel()(out.reshape(-1), arr(lshape) if ndim else np.ones(1, np.int64), offset, arr(gstride),
                  np.uint64(key), np.uint64(mul), np.uint64(add), np.uint64(shift), scale)
    return out


@functools.lru_cache(maxsize=1)
def _cpu_kernel():
    """The same hash as the CUDA kernel, compiled by numba: one parallel pass, no index array."""
    import numba

    u64 = np.uint64

    @numba.njit(parallel=True, cache=True, nogil=True)
    def fill(out, lshape, offset, gstride, key, mul, add, shift, scale):
        ndim = lshape.size
        cols = lshape[ndim - 1]
        rows = out.size // cols
        for r in numba.prange(rows):
            rem = np.int64(r)  # coordinates of this row in the block (all axes but the last)
            base = u64(offset[ndim - 1]) * u64(gstride[ndim - 1])
            for d in range(ndim - 2, -1, -1):
                c = rem % lshape[d]
                rem = rem // lshape[d]
                base += u64(c + offset[d]) * u64(gstride[d])
            for j in range(cols):
                g = (base + u64(j) * u64(gstride[ndim - 1])) * mul + add
                z = g * u64(0x9E3779B97F4A7C15) + key
                z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
                z = z ^ (z >> u64(31))
                out[r * cols + j] = (z >> shift) * scale  # exact: < 53 bits times a power of two

    return fill


def normal_block(location, full_shape, key: int, dtype, backend: str):
    """Standard normal numbers by the Box-Muller transform of two uniform streams (float64 inside)."""
    xp = import_cupy() if backend == "cupy" else np
    u1 = uniform_block(location, full_shape, key, np.float64, backend, stream=0)
    u2 = uniform_block(location, full_shape, key, np.float64, backend, stream=1)
    r = xp.sqrt(-2.0 * xp.log1p(-u1))  # 1 - u1 is in (0, 1]: no log(0)
    return (r * xp.cos(2.0 * np.pi * u2)).astype(dtype, copy=False)

"""Chunk sizes: ``chunks="auto"`` sized from the workers' memory budget (:class:`flowgpu.backend.Facts`),
and the check that chunks fit.

dask's ``"auto"`` aims at 128 MiB, a CPU default; a GPU task costs about a millisecond of scheduling
and an H200 streams ~4 TB/s, so GPU chunks must be about 1 GiB (the targets in ``flowgpu.yaml`` come
from ``python -m benchmarks.suite.chunk_size``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dask.array.core import normalize_chunks
from dask.utils import parse_bytes

from flowgpu import config
from flowgpu.backend import Facts
from flowgpu.errors import ChunkError

__all__ = ["target_chunk_bytes", "resolve_chunks", "check_fits"]

_MIN_CHUNK = 1 << 20


def target_chunk_bytes() -> int:
    """Bytes ``chunks="auto"`` aims at for one chunk: the backend's target, or less when the open
    session's workers cannot hold ``flowgpu.chunks.headroom`` chunks per thread."""
    facts = Facts.here()
    cap = parse_bytes(config.get("chunks.gpu-target" if facts.backend == "cupy" else "chunks.cpu-target"))
    if facts.budget is not None:
        threads = facts.threads or 1
        cap = min(cap, int(facts.budget) // max(int(config.get("chunks.headroom")) * int(threads), 1))
    return max(int(cap), _MIN_CHUNK)


def resolve_chunks(chunks: Any, shape: tuple[int, ...], dtype: Any, previous: tuple[int, ...] | None = None) -> tuple:
    """Normalise ``chunks`` for an array of ``shape``/``dtype``; ``"auto"`` uses the worker budget.

    ``previous``: the stored data's own chunks (an HDF5 dataset's); ``"auto"`` blocks are then whole
    multiples of them, so no stored chunk is read by two tasks.
    """
    dtype = np.dtype(dtype)
    given = [c for c in (chunks if isinstance(chunks, (tuple, list)) else (chunks,)) if isinstance(c, (int, np.integer))]
    if any(c < -1 for c in given):  # dask's own words for these speak of empty tuples
        raise ChunkError(f"chunks={chunks!r} hold a block length of {min(given)}; give lengths of at least 1, -1 "
                         "for a whole axis, or 'auto'")
    try:
        if chunks is None or chunks == "auto" or (isinstance(chunks, (tuple, list)) and "auto" in chunks):
            limit = target_chunk_bytes()
            stored = _stored_multiples(chunks, shape, previous, limit // dtype.itemsize) if previous else None
            out = _balanced(stored or normalize_chunks("auto" if chunks is None else chunks, shape, limit=limit,
                                                       dtype=dtype), chunks, previous if stored else None)
        else:
            out = normalize_chunks(chunks, shape, dtype=dtype)
    except ZeroDivisionError:  # dask divides by each given block length
        raise ChunkError(f"chunks={chunks!r} hold a block length of 0; give lengths of at least 1, -1 for a whole "
                         "axis, or 'auto'") from None
    except (ValueError, TypeError, NotImplementedError, OverflowError) as e:
        raise ChunkError(
            f"chunks={chunks!r} do not fit shape {tuple(shape)}: {e}; give 'auto', one size per axis such as "
            "(1000, 1000), or a byte size such as '256MiB'"
        ) from None
    check_fits(out, dtype)
    return out


def _stored_multiples(asked: Any, shape: tuple, previous: tuple, items: int) -> tuple | None:
    """Blocks of whole stored chunks (``previous``) within ``items`` elements where one stored chunk
    fits, cut from the leading automatic axes first (a C-ordered block keeps whole rows); never
    less than one stored chunk an axis. None when ``asked`` lists blocks by hand (then dask's rule)."""
    if len(previous) != len(shape) or not all(previous):
        return None
    entries = list(asked) if isinstance(asked, (tuple, list)) else ["auto"] * len(shape)
    if len(entries) != len(shape) or any(isinstance(e, (tuple, list)) for e in entries):
        return None
    shrink = [e is None or e == "auto" for e in entries]
    sizes = [n if s else max(normalize_chunks((e,), (n,))[0], default=0) for e, s, n in zip(entries, shrink, shape)]
    for i in (i for i in range(len(shape)) if shrink[i]):
        total = int(np.prod(sizes, dtype=np.int64))
        if total <= items or sizes[i] == 0:
            break
        unit = max(1, min(int(previous[i]), shape[i]))
        others = max(1, total // sizes[i])
        sizes[i] = max(unit, min(sizes[i], (items // others) // unit * unit))
    return normalize_chunks(tuple(max(1, n) for n in sizes), shape)


def _balanced(chunks: tuple, asked: Any, previous: tuple[int, ...] | None = None) -> tuple:
    """Spread each automatically sized axis evenly over the same number of blocks (no block grows).

    dask's ``"auto"`` leaves a ragged last block (40000 rows: 32768 + 7232), a task that costs as much
    as a full one; 20000 + 20000 is even. With ``previous``, blocks stay multiples of the stored chunks.
    """
    out = []
    auto = [a == "auto" or a == -1 or a is None for a in asked] if isinstance(asked, (tuple, list)) else \
        [True] * len(chunks)
    for i, (c, a) in enumerate(zip(chunks, auto)):
        n, total = len(c), sum(c)
        if a and n > 1 and max(c) != min(c):
            unit = max(1, int(previous[i])) if previous else 1
            base, extra = divmod(-(-total // unit), n)  # stored chunks per block
            sizes = [(base + (1 if j < extra else 0)) * unit for j in range(n)]
            sizes[-1] -= sum(sizes) - total  # the last block ends at the array's end
            c = tuple(sizes)
        out.append(tuple(c))
    return tuple(out)


def check_fits(chunks: tuple, dtype: Any) -> None:
    """Refuse chunks whose largest block cannot fit one worker's memory budget (``flowgpu.worker.budget``)."""
    budget = Facts.here().budget
    if budget is None:
        return
    largest = int(np.prod([max(c) if c else 0 for c in chunks], dtype=np.int64)) * np.dtype(dtype).itemsize
    if largest > budget:
        raise ChunkError(
            f"the largest chunk holds {largest:,} bytes but a worker can hold {budget:,} bytes (its memory "
            "limit, less what the worker process itself uses); use smaller chunks (chunks='auto' sizes them "
            "for the workers) or more worker memory (cluster.memory_limit)"
        )

"""Importable helpers for pipeline tests (python-callable sources and test ops)."""

from __future__ import annotations

import dask.array as da
import numpy as np

import flowgpu

CALLS = {"count": 0}


def make_matrix(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A python-callable source."""
    return np.random.default_rng(seed).standard_normal((rows, cols))


def counted_matrix(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A python-callable source that counts its calls (``CALLS["source"]``); ``CALLS["shift"]`` is
    added to its values (data that changes between two runs of the same spec)."""
    CALLS["source"] = CALLS.get("source", 0) + 1
    return make_matrix(rows, cols, seed) + CALLS.get("shift", 0.0)


def _counted(block):
    CALLS["count"] += 1
    return block * 1.0


@flowgpu.op("test_counted", kind="array")
def counted(x):
    """Identity that counts how many chunks it computes (shared intermediates: once)."""
    return x.map_blocks(_counted, dtype=x.dtype, meta=x._meta)


def _explode(block):
    raise RuntimeError("boom while running")


@flowgpu.op("test_explode", kind="array")
def explode(x):
    """Fails while running, never while compiling."""
    return x.map_blocks(_explode, dtype=x.dtype, meta=x._meta)


@flowgpu.op("test_split", kind="array")
def split(x, *, at: int = 1):
    """Two results: the rows before ``at`` and the rest."""
    return x[:at], x[at:]


def finite(block):
    """A check step: the block doubled, or an error if it holds NaN or inf."""
    if not np.isfinite(block).all():
        raise ValueError("the block holds NaN or inf")
    return block * 2.0

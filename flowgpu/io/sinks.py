"""The sink registry: lazy, atomic writes that join one task graph.

A sink's ``prepare`` returns a :class:`PendingWrite`: a lazy dask object that writes the array to a
temporary path when computed, and ``commit``/``abort`` to move it into place or remove it. The
pipeline runner computes the targets of all outputs together (one graph, shared intermediates
computed once) and commits only when all of them are complete.

Built in: ``zarr``, ``npy`` and ``summary`` (the value itself, reported in the run summary).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.movement import to_host
from flowgpu.errors import ConfigError
from flowgpu.io.atomic import AtomicPath, check_writable
from flowgpu.io.npy import _write_block
from flowgpu.io.zarr import _regular

__all__ = ["PendingWrite", "register_sink", "get_sink", "sink_names", "prepare_write", "check_destination",
           "SUMMARY_MAX_ELEMENTS", "to_summary_value"]

SUMMARY_MAX_ELEMENTS = 10_000


@dataclass
class PendingWrite:
    """One output on its way: compute ``target``, then ``commit()`` (or ``abort()`` on failure)."""

    sink: str
    target: Any  # a dask collection (array or delayed)
    location: str | None = None
    atomic: AtomicPath | None = None

    def commit(self) -> str | None:
        return self.atomic.commit() if self.atomic is not None else self.location

    def abort(self) -> None:
        if self.atomic is not None:
            self.atomic.abort()


_sinks: dict[str, Callable[..., PendingWrite]] = {}


def register_sink(name: str, prepare: Callable[..., PendingWrite]) -> None:
    """Register ``prepare(x, path=None, overwrite=False, **options) -> PendingWrite`` as sink ``name``."""
    _sinks[name] = prepare


def get_sink(name: str) -> Callable[..., PendingWrite]:
    try:
        return _sinks[name]
    except KeyError:
        raise ConfigError(f"unknown sink {name!r}; choose one of {', '.join(sorted(_sinks))}") from None


def sink_names() -> list[str]:
    return sorted(_sinks)


def prepare_write(sink: str, x: da.Array, path: str | None = None, overwrite: bool = False, **options) -> PendingWrite:
    """Set up the lazy write of ``x`` to ``sink``; creates only the temporary store, computes nothing."""
    return get_sink(sink)(x, path=path, overwrite=overwrite, **options)


def check_destination(path: str, overwrite: bool = False) -> None:
    """Refuse an existing path flowgpu did not write (unless ``overwrite``); touches nothing."""
    check_writable(os.path.abspath(path), overwrite)


def _npy(x: da.Array, path: str | None = None, overwrite: bool = False) -> PendingWrite:
    x = to_host(x)
    atomic = AtomicPath(path, overwrite, meta={"format": "npy"})
    tmp = atomic.begin()
    np.lib.format.open_memmap(tmp, mode="w+", dtype=x.dtype, shape=x.shape).flush()
    done = x.map_blocks(_write_block, path=tmp, dtype=np.int8, chunks=tuple((1,) * len(c) for c in x.chunks))
    return PendingWrite("npy", done, atomic.path, atomic)


def _zarr(x: da.Array, path: str | None = None, overwrite: bool = False, component: str | None = None) -> PendingWrite:
    x = _regular(to_host(x))
    atomic = AtomicPath(path, overwrite, meta={"format": "zarr"})
    tmp = atomic.begin()
    try:
        target = da.to_zarr(x, tmp, component=component, compute=False)
    except BaseException:
        atomic.abort()
        raise
    return PendingWrite("zarr", target, atomic.path, atomic)


def _summary(x: da.Array, path: str | None = None, overwrite: bool = False) -> PendingWrite:
    if x.size > SUMMARY_MAX_ELEMENTS:
        raise ConfigError(f"a summary output holds at most {SUMMARY_MAX_ELEMENTS} values, not {x.size}; "
                          "write it with sink: zarr or npy")
    return PendingWrite("summary", to_host(x))


def to_summary_value(value: Any) -> Any:
    """A computed summary output as plain JSON-able Python (a number, or nested lists)."""
    if hasattr(value, "get") and not isinstance(value, (np.ndarray, dict)):
        value = value.get()  # CuPy
    arr = np.asarray(value)
    if arr.dtype.kind == "c":
        return {"real": arr.real.tolist(), "imag": arr.imag.tolist()}
    return arr.tolist()


register_sink("npy", _npy)
register_sink("zarr", _zarr)
register_sink("summary", _summary)

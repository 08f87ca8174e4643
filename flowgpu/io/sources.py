"""The source registry: a name maps to a function that returns a lazy chunked array.

Built in: ``random``, ``normal``, ``zeros``, ``ones``, ``full``, ``arange`` (synthetic, through
:mod:`flowgpu.arrays`), ``zarr``, ``npy`` and ``python`` (a callable given by import path).
Register more with :func:`register_source`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from flowgpu import arrays
from flowgpu.errors import ConfigError
from flowgpu.io.npy import from_npy
from flowgpu.io.zarr import from_zarr

__all__ = ["register_source", "get_source", "source_names", "open_source", "import_callable", "reads_files"]

_sources: dict[str, Callable[..., da.Array]] = {}
_FILE_SOURCES = {"zarr", "npy"}


def register_source(name: str, func: Callable[..., da.Array], *, reads_files: bool = False) -> None:
    """Register ``func(**options) -> dask.array.Array`` as source ``name``."""
    _sources[name] = func
    if reads_files:
        _FILE_SOURCES.add(name)


def get_source(name: str) -> Callable[..., da.Array]:
    try:
        return _sources[name]
    except KeyError:
        raise ConfigError(f"unknown source {name!r}; choose one of {', '.join(sorted(_sources))}") from None


def source_names() -> list[str]:
    return sorted(_sources)


def reads_files(name: str) -> bool:
    """Whether source ``name`` reads stored data (counted as bytes read in run summaries)."""
    return name in _FILE_SOURCES


def open_source(name: str, **options: Any) -> da.Array:
    """The lazy array of source ``name`` configured by ``options``; nothing is read yet."""
    return get_source(name)(**options)


def import_callable(path: str) -> Callable:
    """``"package.module:function"`` (or ``"package.module.function"``) -> the function."""
    module, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module!r} of {path!r}: {e}; check it is installed "
                          "and on PYTHONPATH") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module!r} has no attribute {attr!r} (from {path!r})") from None
    if not callable(obj):
        raise ConfigError(f"{path!r} is not callable")
    return obj


def _python(callable: str, args: dict | None = None, chunks: Any = "auto") -> da.Array:  # noqa: A002
    func = import_callable(callable)
    try:
        inspect.signature(func).bind(**(args or {}))
    except TypeError as e:
        raise ConfigError(f"{callable} does not take arguments {sorted(args or {})}: {e}") from None
    except ValueError:  # builtins without a signature
        pass
    out = func(**(args or {}))
    if isinstance(out, da.Array):
        return arrays.to_device(out if chunks in (None, "auto") else out.rechunk(chunks))
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        out = np.asarray(out)
    return arrays.from_array(out, chunks=chunks)


register_source("random", lambda shape, dtype="float64", seed=None, chunks="auto":
                arrays.random(tuple(shape), dtype=dtype, seed=seed, chunks=chunks))
register_source("normal", lambda shape, dtype="float64", seed=None, chunks="auto", loc=0.0, scale=1.0:
                arrays.normal(tuple(shape), dtype=dtype, seed=seed, chunks=chunks, loc=loc, scale=scale))
register_source("zeros", lambda shape, dtype="float64", chunks="auto": arrays.zeros(tuple(shape), dtype, chunks))
register_source("ones", lambda shape, dtype="float64", chunks="auto": arrays.ones(tuple(shape), dtype, chunks))
register_source("full", lambda shape, fill_value, dtype="float64", chunks="auto":
                arrays.full(tuple(shape), fill_value, dtype, chunks))
register_source("arange", lambda stop, start=0, step=1, dtype=None, chunks="auto":
                arrays.arange(start, stop, step, dtype=dtype, chunks=chunks))
register_source("zarr", lambda path, component=None, chunks=None: from_zarr(path, component=component, chunks=chunks),
                reads_files=True)
register_source("npy", lambda path, chunks="auto": from_npy(path, chunks=chunks), reads_files=True)
register_source("python", _python)

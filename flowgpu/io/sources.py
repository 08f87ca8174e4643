"""The source registry: a name maps to a function that returns a lazy chunked array.

Each source has a pydantic model of its options (below), from which the spec model and ``flowgpu
schema`` are generated. Add more with :func:`register_source` or the ``flowgpu.sources`` entry-point
group: a function ``f(**options) -> dask.array.Array`` whose signature becomes its options model.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import stat
import warnings
from collections.abc import Callable
from typing import Any, Literal, Union

import dask.array as da
import numpy as np
from dask.base import tokenize
from pydantic import Field, ValidationInfo, field_validator, model_validator

from flowgpu import arrays
from flowgpu.arrays.creation import arange_length, check_fill_value, check_size, meta_for
from flowgpu.errors import ConfigError, RunError
from flowgpu.io.hdf5 import from_hdf5
from flowgpu.io.labelled import check_variable, open_xarray
from flowgpu.io.npy import from_npy
from flowgpu.io.paths import resolve
from flowgpu.io.tiff import from_tiff
from flowgpu.io.zarr import from_zarr
from flowgpu.registry import Entry, Options, Registry, checking_only, import_object, options_model

__all__ = ["register_source", "source_entry", "source_names", "open_source", "reads_files",
           "calls_user_code", "SOURCES", "Chunks"]

Chunks = Union[Literal["auto"], int, str, list[Union[int, Literal["auto"], list[int]]]]
READS_FILES = "reads_files"
# A source that calls user code takes ``call=``: True only when a run compiles (validate and plan never call it).
CALLS_USER_CODE = "calls_user_code"


def dtype_name(v: str) -> str:
    """``v`` if NumPy knows it as a dtype (a spec's ``dtype:`` fields), else a ValueError saying so."""
    try:
        np.dtype(v)
    except TypeError:
        raise ValueError(f"{v!r} is not a dtype; give e.g. 'float64' or 'int32'") from None
    return v


def _from_plugin(name: str, obj: Any) -> Entry | None:
    return None if inspect.ismodule(obj) else _entry(name, obj, reads_files=bool(getattr(obj, READS_FILES, False)))


SOURCES: Registry[Entry] = Registry("flowgpu.sources", "source", error=ConfigError, from_plugin=_from_plugin)


def _entry(name: str, func: Callable, *, reads_files: bool = False, options: type | None = None,
           calls_user_code: bool = False) -> Entry:
    if not callable(func):
        raise ConfigError(f"source {name!r}: {func!r} is not callable")
    model = options or options_model(name, func, skip=("call",) if calls_user_code else ())
    caps = frozenset(c for c, on in ((READS_FILES, reads_files), (CALLS_USER_CODE, calls_user_code)) if on)
    return Entry(name, func, inspect.getdoc(model) or inspect.getdoc(func) or "", model, caps)


def register_source(name: str, func: Callable[..., da.Array], *, reads_files: bool = False,
                    options: type | None = None, replace: bool = False, calls_user_code: bool = False) -> Entry:
    """Register ``func(**options) -> dask.array.Array`` as source ``name``.

    A name already registered (a built-in's too) is refused unless ``replace``; the same function
    registered again replaces it. ``reads_files``: its bytes count as read in run summaries. ``options``: a pydantic model
    (default: from ``func``'s signature). ``calls_user_code``: it takes ``call=``, True only when a
    run compiles (``validate`` and ``plan`` pass False and must get a lazy stand-in).
    """
    return SOURCES.add(_entry(name, func, reads_files=reads_files, options=options,
                              calls_user_code=calls_user_code), replace=replace)


source_entry, source_names = SOURCES.get, SOURCES.names  # an entry by name (unknown names suggest close ones); all


def reads_files(name: str) -> bool:
    """Whether source ``name`` reads stored data (counted as bytes read in run summaries)."""
    return SOURCES.get(name).has(READS_FILES)


def calls_user_code(name: str) -> bool:
    """Whether source ``name`` runs code the spec names (it is called with ``call=``)."""
    return SOURCES.get(name).has(CALLS_USER_CODE)


def open_source(name: str, *, call: bool = False, **options: Any) -> da.Array:
    """The lazy array of source ``name``; ``call``: a run is compiling, so user code may be called."""
    entry = SOURCES.get(name)
    return entry(**options, call=call) if entry.has(CALLS_USER_CODE) else entry(**options)


# -- the built-in sources' options ------------------------------------------------------------------
class _Source(Options):
    chunks: Chunks = Field("auto", description="Chunk shape, a byte size such as '256MiB', or 'auto'.")


def _dtype(info: ValidationInfo) -> np.dtype | None:
    """The ``dtype`` already validated beside the field being checked (None when it is bad: its own error)."""
    try:
        return np.dtype(info.data.get("dtype") or "float64")
    except TypeError:
        return None


class _Generated(_Source):
    dtype: str = "float64"  # before shape: the shape's size check reads it
    shape: list[int] = Field(..., description="Array shape, e.g. [10000, 10000].")

    @field_validator("shape")
    @classmethod
    def _non_negative(cls, v: list[int], info: ValidationInfo) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError("shape lengths must be >= 0")
        check_size(tuple(v), _dtype(info))
        return v


class RandomOptions(_Generated):
    """Uniform random numbers in [0, 1), reproducible per seed."""

    seed: int | None = None


class NormalOptions(_Generated):
    """Normal random numbers, reproducible per seed."""

    seed: int | None = None
    loc: float = 0.0
    scale: float = 1.0


class ZerosOptions(_Generated):
    """An array of zeros."""


class OnesOptions(_Generated):
    """An array of ones."""


class FullOptions(_Generated):
    """An array filled with one value."""

    fill_value: float | int | bool

    @field_validator("fill_value")
    @classmethod
    def _fits_dtype(cls, v: float | int | bool, info: ValidationInfo) -> float | int | bool:
        dtype = _dtype(info)
        if dtype is not None:
            check_fill_value(v, dtype)
        return v


class ArangeOptions(_Source):
    """Evenly spaced values in [start, stop)."""

    start: float | int = 0
    stop: float | int
    step: float | int = 1
    dtype: str | None = None

    @model_validator(mode="after")
    def _finite(self) -> "ArangeOptions":
        arange_length(self.start, self.stop, self.step)
        return self


class _Stored(_Source):
    path: str = Field(..., description="A file or store (relative to the working directory, made absolute there), "
                                       "or a URL.")

    @field_validator("path")
    @classmethod
    def _file(cls, v: str) -> str:
        """Absolute before any graph is built; a FIFO, device or socket is refused (reads never end)."""
        path = resolve(v)
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            return path  # missing, or a URL: the source says so when it opens it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ValueError(f"{path!r} is {'a FIFO' if stat.S_ISFIFO(mode) else 'a device or socket'}, not a file; "
                             "give the path of stored data")
        return path


class ZarrOptions(_Stored):
    """A Zarr array (path relative to the working directory)."""

    component: str | None = None
    chunks: Chunks | None = None


class NpyOptions(_Stored):
    """A ``.npy`` file, read chunk by chunk (path relative to the working directory)."""


class Hdf5Options(_Stored):
    """A dataset of an HDF5 (or NetCDF-4) file, read chunk by chunk (path relative to the working directory)."""

    dataset: str | None = Field(None, description="The dataset's path in the file, e.g. '/group/temp' (may be left "
                                                   "out when the file holds one dataset).")


class TiffOptions(_Stored):
    """A TIFF stack as one (pages, y, x) array, read page by page: a multi-page file, or a glob of one-page files."""

    path: str = Field(..., description="A multi-page TIFF file, or a glob of one-page TIFF files ('pages/*.tif', "
                                       "stacked in natural order), relative to the working directory.")


class XarrayOptions(_Stored):
    """A variable of an xarray dataset (a Zarr store, or a NetCDF/HDF5 file read through h5netcdf),
    with its dims, coordinates and attributes (path relative to the working directory)."""

    engine: Literal["zarr", "h5netcdf"] | None = Field(
        None, description="How to open it; default from the path: a folder or '.zarr' is Zarr, "
                          "'.nc'/'.h5'/'.hdf5' NetCDF/HDF5 (h5netcdf).")
    # after engine: its check opens the dataset with it
    variable: str = Field(..., description="The variable to read, e.g. 't2m'.")

    @field_validator("variable")
    @classmethod
    def _present(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("path") is not None:
            try:
                check_variable(info.data["path"], v, info.data.get("engine"))
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return v


class PythonOptions(_Source):
    """An array returned by a Python callable given by import path, ``package.module:function``.

    ``validate`` and ``plan`` never call it: they use the declared ``shape`` and ``dtype``, and only
    ``run`` calls it (and checks its result against them). ``plan_call: true`` instead calls it at
    plan time too, with a warning, and takes shape and dtype from what it returns.
    """

    callable: str = Field(..., description="Import path of a function returning an array, e.g. 'mypkg.data:load'; "
                                           "modules beside the spec file are importable.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the callable.")
    shape: list[int] | None = Field(None, description="Shape of the array the callable returns (validate and "
                                                      "plan use it instead of calling it).")
    dtype: str | None = Field(None, description="Dtype of the array the callable returns.")
    plan_call: bool = Field(False, description="Call it at validate/plan time too (with a warning), instead of "
                                               "declaring shape and dtype.")

    @field_validator("callable")
    @classmethod
    def _import_path(cls, v: str) -> str:
        _callable(v)
        return v

    @field_validator("shape")
    @classmethod
    def _lengths(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(s < 0 for s in v):
            raise ValueError("shape lengths must be >= 0")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str | None) -> str | None:
        return v if v is None else dtype_name(v)

    @model_validator(mode="after")
    def _declared(self) -> "PythonOptions":
        if not self.plan_call and (self.shape is None or self.dtype is None):
            raise ValueError("declare the array the callable returns with 'shape' and 'dtype' (validate and plan "
                             "never call it), or set 'plan_call: true' to call it at plan time too")
        return self


def _callable(path: str) -> Callable:
    func = import_object(path, what="callable")
    if not callable(func):
        raise ConfigError(f"callable {path!r}: is a {type(func).__name__}, not a function; name a function")
    return func


def _not_called(path: str) -> None:
    raise ConfigError(f"python source {path!r} is called only by a run (flowgpu run, pipeline.run); "
                      "this array only stands for its declared shape and dtype")


def _placeholder(path: str, shape: list[int], dtype: str, chunks: Any) -> da.Array:
    """A lazy array of the declared shape and dtype that refuses to be computed (validate, plan)."""
    dt = np.dtype(dtype)
    normalized = arrays.resolve_chunks(chunks, tuple(shape), dt)
    return da.map_blocks(functools.partial(_not_called, path), chunks=normalized, dtype=dt,
                         meta=meta_for(dt, len(shape)), name=f"python-placeholder-{tokenize(path, shape, dt)}")


def _check_declared(path: str, out: Any, shape: list[int] | None, dtype: str | None) -> None:
    got_shape, got_dtype = [int(n) for n in out.shape], np.dtype(out.dtype)
    if shape is not None and got_shape != list(shape):
        raise ConfigError(f"callable {path!r} returned shape {got_shape}, but the spec declares {list(shape)}; "
                          "fix 'shape' (or the callable's args)")
    if dtype is not None and got_dtype != np.dtype(dtype):
        raise ConfigError(f"callable {path!r} returned dtype {got_dtype}, but the spec declares "
                          f"{np.dtype(dtype)}; fix 'dtype'")


def _python(callable: str, args: dict | None = None, chunks: Any = "auto", shape: list[int] | None = None,  # noqa: A002
            dtype: str | None = None, plan_call: bool = False, call: bool = False) -> da.Array:
    """``call``: a run is compiling (call the function); else only ``plan_call`` calls it."""
    with checking_only(False) if call or plan_call else contextlib.nullcontext():  # it is called: import it
        func = _callable(callable)
    try:
        inspect.signature(func).bind(**(args or {}))
    except TypeError as e:
        raise ConfigError(f"{callable} does not take arguments {sorted(args or {})}: {e}") from None
    except ValueError:  # builtins without a signature
        pass
    if not call and not plan_call:
        return _placeholder(callable, shape, dtype, chunks)
    if not call:
        warnings.warn(f"python source {callable!r} is called at plan time (plan_call: true): validate and plan "
                      "run its code", stacklevel=2)
    try:
        out = func(**(args or {}))
    except Exception as e:  # noqa: BLE001 - the user's code failed: a failure while running, not a bad spec
        raise RunError(f"python source {callable!r} raised {type(e).__name__}: {e}") from e
    if isinstance(out, da.Array):
        _check_declared(callable, out, shape, dtype)
        return arrays.to_device(out if chunks in (None, "auto") else out.rechunk(chunks))
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        out = np.asarray(out)
    _check_declared(callable, out, shape, dtype)
    return arrays.from_array(out, chunks=chunks)


register_source("random", arrays.random, options=RandomOptions)  # each takes its options as keywords
register_source("normal", arrays.normal, options=NormalOptions)
register_source("zeros", arrays.zeros, options=ZerosOptions)
register_source("ones", arrays.ones, options=OnesOptions)
register_source("full", arrays.full, options=FullOptions)
register_source("arange", arrays.arange, options=ArangeOptions)
register_source("zarr", from_zarr, reads_files=True, options=ZarrOptions)
register_source("npy", from_npy, reads_files=True, options=NpyOptions)
register_source("hdf5", from_hdf5, reads_files=True, options=Hdf5Options)
register_source("tiff", from_tiff, reads_files=True, options=TiffOptions)
register_source("xarray", open_xarray, reads_files=True, options=XarrayOptions)
register_source("python", _python, options=PythonOptions, calls_user_code=True)

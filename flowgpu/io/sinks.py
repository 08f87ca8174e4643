"""The sink registry: lazy, atomic writes that join one task graph.

A sink's ``prepare`` returns a :class:`PendingWrite`: a lazy dask object that writes to a staging
path when computed, then ``commit``/``abort``; the runner computes all outputs in one graph and
commits only when all are complete. A sink that is not ``atomic`` writes where it is told, and is
told a path in a staging folder that flowgpu commits as its own (:func:`prepare_write`): its output
gets the marker that lets the next run replace it, or find it up to date. Add sinks with
:func:`register_sink` or the ``flowgpu.sinks`` entry-point group (capabilities, when not the
defaults, as attributes of the ``prepare`` function); a ``prepare`` that cannot take flowgpu's call
is refused there, not mid-run.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

import dask.array as da
import numpy as np

from flowgpu.arrays.movement import to_host
from flowgpu.errors import ConfigError, OutputError
from flowgpu.io.atomic import AtomicPath, check_writable, commit_together, hold
from flowgpu.io.paths import files_read, is_url
from flowgpu.io.labelled import as_dataset, bare, write_dataset
from flowgpu.io.npy import npy_writes
from flowgpu.io.zarr import store_zarr
from flowgpu.io.zarrwrite import check_layout, compressors
from flowgpu.registry import Entry, Registry, options_model

__all__ = ["PendingWrite", "commit_all", "hold_outputs", "register_sink", "sink_entry", "sink_names", "prepare_write",
           "check_destination", "check_write", "SUMMARY_MAX_ELEMENTS", "COLLECTS", "to_summary_value", "SINKS", "DEFAULT_SINK", "sinks_for"]

SUMMARY_MAX_ELEMENTS = 10_000


@dataclass
class PendingWrite:
    """One output on its way: compute ``target``, then ``commit()`` (or ``abort()`` on failure)."""

    sink: str
    target: Any  # a dask collection (array or delayed)
    location: str | None = None
    atomic: AtomicPath | None = None

    def commit(self) -> str | None:
        return commit_all([self])[0]

    def abort(self) -> None:
        if self.atomic is not None:
            self.atomic.abort()


WRITES_PATH, ATOMIC, IN_SUMMARY, COLLECTS = "writes_path", "atomic", "in_summary", "collects"
CAPABILITIES = (WRITES_PATH, ATOMIC, IN_SUMMARY, COLLECTS)
LABELLED = "labelled"  # takes an xarray.DataArray where the output is labelled (others get its dask array)


def _entry(name: str, prepare: Callable[..., PendingWrite], capabilities: set[str],
           options: type | None = None, suffixes: tuple[str, ...] = (), check: Callable | None = None) -> Entry:
    if not callable(prepare):
        raise ConfigError(f"sink {name!r}: {prepare!r} is not callable")
    try:
        sig = inspect.signature(prepare)
    except (TypeError, ValueError):  # a builtin that has none: its call will tell
        sig = None
    first = next((p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)),
                 "x") if sig else "x"  # the array, whatever its name: not an option
    model = options or options_model(name, prepare, skip=(first, "path", "overwrite"))
    if sig is not None:
        try:  # flowgpu's call, as prepare_write makes it: refused now, not as a TypeError mid-run
            sig.bind(None, path=None, overwrite=False, **dict.fromkeys(model.model_fields))
        except TypeError as e:
            what = getattr(prepare, "__qualname__", type(prepare).__name__)
            raise ConfigError(f"sink {name!r}: {what}{sig} cannot take flowgpu's call ({e}); a sink's prepare must "
                              "accept the array first and the keywords path, overwrite and its options, as in "
                              "prepare(x, path=None, overwrite=False, **options) -> flowgpu.io.PendingWrite") from None
    return Entry(name, prepare, inspect.getdoc(prepare) or "", model, frozenset(capabilities), suffixes, check)


def _from_plugin(name: str, obj: Any) -> Entry | None:
    if inspect.ismodule(obj):
        return None
    caps = {c for c in CAPABILITIES if getattr(obj, c, c == WRITES_PATH)}
    return _entry(name, obj, caps, suffixes=tuple(s.lower() for s in getattr(obj, "suffixes", ())))


SINKS: Registry[Entry] = Registry("flowgpu.sinks", "sink", error=ConfigError, from_plugin=_from_plugin)


def register_sink(name: str, prepare: Callable[..., PendingWrite], *, writes_path: bool = True,
                  atomic: bool = False, in_summary: bool = False, collects: bool = False,
                  options: type | None = None, replace: bool = False, labelled: bool = False,
                  suffixes: tuple[str, ...] = (), check: Callable[..., None] | None = None) -> Entry:
    """Register ``prepare(x, path=None, overwrite=False, **options) -> PendingWrite`` as sink ``name``
    (a ``prepare`` that cannot be called so is refused, a ConfigError).

    Capabilities: ``writes_path`` (needs ``path``, checked first), ``atomic`` (``prepare`` stages the
    output itself, its PendingWrite carrying the :class:`AtomicPath`, as the built-ins do; otherwise
    flowgpu stages it: ``path`` is then a path of the same name in a staging folder, whose content is
    moved into place when every output is complete), ``in_summary`` (the value goes into the run
    summary), ``collects``
    (each batch item's value is a row of the file at ``path``: ``table``), ``labelled`` (it gets an
    ``xarray.DataArray``). ``options``: a pydantic model (default: from the signature).
    ``suffixes``: how its files are named; a path named as another kind of file is refused.
    ``check(x, **options)``: raises what ``prepare`` would refuse, so a spec's is refused before it runs.
    A name already registered (a built-in's too) is refused unless ``replace``.
    """
    caps = {c for c, on in zip(CAPABILITIES + (LABELLED,), (writes_path, atomic, in_summary, collects, labelled)) if on}
    return SINKS.add(_entry(name, prepare, caps, options, tuple(s.lower() for s in suffixes), check), replace=replace)


def check_write(sink: str, x: da.Array, **options: Any) -> None:
    """Raise (a ConfigError) what writing ``x`` to ``sink`` with ``options`` would refuse; computes nothing."""
    entry = SINKS.get(sink)
    if entry.check is not None:
        entry.check(x, **options)


sink_entry, sink_names = SINKS.get, SINKS.names  # an entry by name (unknown names suggest close ones); all names


def sinks_for(path: Any) -> list[str]:
    """The sinks whose files are named as ``path`` is (by its suffix: ``out.npy`` -> ``["npy"]``)."""
    if not isinstance(path, str):
        return []
    suffix = os.path.splitext(path.rstrip("/" + os.sep))[1].lower()
    return [e.name for e in SINKS.entries() if suffix and suffix in e.suffixes]


def prepare_write(sink: str, x: da.Array, path: str | None = None, overwrite: bool = False, **options) -> PendingWrite:
    """Set up the lazy write of ``x`` to ``sink`` (labels only to a labelled sink); computes nothing.

    A sink that writes a path but does not stage it (not ``atomic``) is given a path in a staging
    folder: committed as the built-ins' outputs are, with the marker that says flowgpu wrote it."""
    entry = SINKS.get(sink)
    x = x if entry.has(LABELLED) else bare(x)
    local = entry.has(WRITES_PATH) and path is not None and not is_url(path)  # a URL is the sink's to handle
    if not local or entry.has(ATOMIC):
        return _pending(sink, entry(x, path=path, overwrite=overwrite, **options), local)
    atomic = AtomicPath(path, overwrite, meta={"format": sink}, reads=files_read(x), named=True)
    given = atomic.begin()
    with atomic.preparing():
        pending = _pending(sink, entry(x, path=given, overwrite=overwrite, **options), False)
    return PendingWrite(sink, pending.target, atomic.path, atomic)


def _pending(sink: str, got: Any, staged: bool) -> PendingWrite:
    """``got``, what sink ``prepare`` returned, once checked to be a PendingWrite (``staged``: with its AtomicPath)."""
    if not isinstance(got, PendingWrite):
        raise ConfigError(f"sink {sink!r}: prepare returned {type(got).__name__}, not a flowgpu.io.PendingWrite; "
                          "return PendingWrite(name, target, path), target a dask object writing path when computed")
    if staged and got.atomic is None:  # its output would carry no marker: the next run could not replace it
        raise ConfigError(f"sink {sink!r} is registered atomic=True but its PendingWrite carries no AtomicPath; "
                          "register it with atomic=False, and flowgpu stages what it writes")
    return got


def commit_all(pending: list[PendingWrite]) -> list[str | None]:
    """Commit every write together (the atomic ones in one transaction); each one's location. An
    output whose write made nothing at the path it was given fails them all, nothing replaced."""
    for p in pending:
        if p.atomic is not None and not p.atomic.settle():
            raise OutputError(f"sink {p.sink!r} wrote nothing for output {p.atomic.path!r}: its target, computed, "
                              "made no file or folder at the path prepare was given (a staging path beside the "
                              "output); write there, not elsewhere. Nothing was replaced")
    commit_together([p.atomic for p in pending if p.atomic is not None])
    return [p.location for p in pending]


hold_outputs = hold  # the write lock of every output path, held while the block runs
check_destination = check_writable  # refuse an existing path flowgpu did not write (unless overwrite)


def _staged(sink: str, x: Any, path: str | None, overwrite: bool, fmt: str, write: Callable[[str], Any]) -> PendingWrite:
    """A staged output of ``x`` at ``path``: ``write(tmp)`` sets up its lazy write (an error aborts it)."""
    atomic = AtomicPath(path, overwrite, meta={"format": fmt}, reads=files_read(x))
    tmp = atomic.begin()
    with atomic.preparing():
        target = write(tmp)
    return PendingWrite(sink, target, atomic.path, atomic)


def _npy(x: da.Array, path: str | None = None, overwrite: bool = False) -> PendingWrite:
    """A ``.npy`` file, written chunk by chunk into a memory map and moved into place when complete."""
    host = to_host(x)
    return _staged("npy", x, path, overwrite, "npy", lambda tmp: npy_writes(host, tmp))


def _zarr(x: da.Array, path: str | None = None, overwrite: bool = False, component: str | None = None,
          codec: Literal["zstd", "lz4", "none"] | None = None,
          level: Annotated[int, Field(ge=-131072, le=22)] | None = None,
          chunks: list[int] | None = None, shards: list[int] | None = None,
          checksum: bool | None = None) -> PendingWrite:
    """A Zarr store (``component``: an array inside a group), moved into place when complete.

    ``codec`` (zstd, lz4 or none), ``level`` (zstd's, for zarr's CPU encoder), ``chunks`` and
    ``shards`` (shapes) choose a Zarr 3 layout; on a GPU session the chunks are encoded there.
    ``checksum``: each chunk ends in zarr's crc32c, checked on every read (default
    ``flowgpu.zarr.checksum``, off)."""
    return _staged("zarr", x, path, overwrite, "zarr", lambda tmp: store_zarr(
        x, tmp, component=component, codec=codec, level=level, chunks=chunks, shards=shards, checksum=checksum))


_NETCDF = (".nc", ".nc4", ".h5", ".hdf5", ".cdf")  # the xarray sink writes NetCDF to these, Zarr to others


def _xarray(x: da.Array, path: str | None = None, overwrite: bool = False, variable: str | None = None,
            format: Literal["zarr", "netcdf"] | None = None) -> PendingWrite:  # noqa: A002
    """An xarray Dataset: Zarr 3 (dims as ``dimension_names``, coordinates, attributes) or NetCDF4.

    ``variable``: the name of the data variable (default: the input's variable, else the path's
    stem). ``format``: ``zarr`` or ``netcdf``; default from the path (``.nc``/``.h5`` NetCDF, else
    Zarr). ``xr.open_zarr`` / ``xr.open_dataset`` read it back as xarray computed it; an unlabelled
    output gets dims ``dim_0, dim_1, ...``."""
    if format is None:
        format = "netcdf" if str(path).lower().endswith(_NETCDF) else "zarr"
    ds = as_dataset(x, variable, path)
    return _staged("xarray", x, path, overwrite, f"xarray-{format}", lambda tmp: write_dataset(ds, tmp, format))


def _summary(x: da.Array, path: str | None = None, overwrite: bool = False) -> PendingWrite:
    """The value itself, in the run summary (scalars and small arrays)."""
    if x.size > SUMMARY_MAX_ELEMENTS:
        raise ConfigError(f"a summary output holds at most {SUMMARY_MAX_ELEMENTS} values, not {x.size}; "
                          "write it with sink: zarr or npy")
    if not x.size:  # no values: its shape, as NumPy gives it (dask's reductions over an empty axis may not)
        return PendingWrite("summary", da.from_array(np.empty(x.shape, x.dtype)))
    return PendingWrite("summary", to_host(x))


def _table(x: da.Array, path: str | None = None, overwrite: bool = False) -> PendingWrite:
    """Columns of a CSV or Parquet table, one row per batch item (scalars, 1-D up to 64 values).

    A scalar is one column named after the output, a 1-D array one column per value; the row
    starts with the item's params (:mod:`flowgpu.io.table`). The value is in the run summary too."""
    return PendingWrite("table", to_host(x))


def to_summary_value(value: Any) -> Any:
    """A computed summary output as plain JSON-able Python (a number, or nested lists)."""
    if hasattr(value, "get") and not isinstance(value, (np.ndarray, dict)):
        value = value.get()  # CuPy
    arr = np.asarray(value)
    if arr.dtype.kind == "c":
        return {"real": arr.real.tolist(), "imag": arr.imag.tolist()}
    return arr.tolist()


register_sink("npy", _npy, atomic=True, suffixes=(".npy",))
def _zarr_check(x: da.Array, codec: str | None = None, level: int | None = None, chunks: Any = None,
                shards: Any = None, **_: Any) -> None:
    """The layout and level a Zarr write of ``x`` would refuse (chunks default to ``x``'s own)."""
    own = tuple(max(c) if c else 1 for c in x.chunks)
    check_layout(x.shape, chunks if chunks is not None else own if shards else None, shards)
    compressors(codec or "zstd", level, False)


register_sink("zarr", _zarr, atomic=True, suffixes=(".zarr",), check=_zarr_check)
register_sink("xarray", _xarray, atomic=True, labelled=True, suffixes=(".zarr", *_NETCDF))
register_sink("summary", _summary, writes_path=False, in_summary=True)
register_sink("table", _table, writes_path=False, in_summary=True, collects=True)
DEFAULT_SINK = "summary"  # an output that names no sink

"""Paths that mean the same on every host: resolved once on the client, checked from the workers.

A worker's working directory and HOME may not be the client's, and Zarr reads a store it cannot
see as fill values. So :func:`resolve` makes every local path absolute on the client,
:func:`require_store` checks in each Zarr read task that the metadata is there, and :func:`probe`
asks every worker before a run whether it can read each input and write each output's folder.
"""

from __future__ import annotations

import glob
import os
import socket
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

from distributed import get_worker

from flowgpu.errors import OutputError, PathNotVisibleError

__all__ = ["FIX", "METADATA", "is_url", "is_glob", "glob_files", "expand", "resolve", "shown", "named_kind", "misnamed",
           "refuse_misnamed", "metadata_files", "require_store", "not_visible", "where", "probe", "files_read"]

FIX = ("the workers do not see this path: put it on storage every host mounts (at the same path), "
       "or use a URL")
METADATA = ("zarr.json", ".zarray", ".zgroup")  # what says a Zarr store (or group) is there: v3's, v2's


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``s3://``, ``gs://``, ``file://``...), read the same from every host."""
    return "://" in path


def is_glob(path: str) -> bool:
    """Whether ``path`` is a pattern (``*``, ``?``, ``[...]``: a TIFF source's pages) rather than a file that is there."""
    return not is_url(path) and glob.has_magic(path) and not os.path.exists(path)


def expand(path: str) -> list[str]:
    """The files ``path`` names: a pattern's matches (:func:`glob_files`), else ``path`` itself."""
    return glob_files(path) if is_glob(path) else [path]


def _file_key(path: str) -> Any:
    """Which file ``path`` names: its device and inode (the path itself when it names nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    return st.st_dev, st.st_ino


def _folders_once(top: str) -> Iterator[str]:
    """``top`` and every non-hidden folder under it, each real folder once: linked folders are walked
    last, only into folders not seen yet (a link to a folder above ends at once)."""
    seen: set[Any] = set()
    pending = [top]
    while pending:
        linked = []
        for root in pending:
            for here, dirs, _ in os.walk(root):  # lists linked folders, never enters them
                key = _file_key(here)
                if key in seen:
                    dirs[:] = []
                    continue
                seen.add(key)
                yield here
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                linked += [os.path.join(here, d) for d in dirs if os.path.islink(os.path.join(here, d))]
        pending = linked


def _matches(pattern: str) -> Iterator[str]:
    """The paths ``pattern`` matches, as ``glob`` does, ``**`` walked by :func:`_folders_once`."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        yield from glob.iglob(pattern)
        return
    at = parts.index("**")
    head, tail = os.sep.join(parts[:at]), os.sep.join(parts[at + 1:])
    bases = [b for b in glob.iglob(head) if os.path.isdir(b)] if glob.has_magic(head) else [head]
    for base in bases:
        for folder in _folders_once(base or os.curdir):
            if not base:  # a pattern relative to the working directory gives relative paths
                folder = "" if folder == os.curdir else folder.removeprefix(os.curdir + os.sep)
            inside = os.path.join(glob.escape(folder), tail or "*") if folder else (tail or "*")
            if not tail and folder:
                yield folder
            yield from _matches(inside)


def glob_files(pattern: str, most: int | None = None) -> list[str]:
    """The paths ``pattern`` matches, sorted, each real file once (by its name through no link);
    stops once more than ``most`` are found."""
    found: dict[Any, str] = {}
    for path in _matches(pattern):
        key = _file_key(path)
        kept = found.get(key)
        if kept is None or (_through_links(path), len(path), path) < (_through_links(kept), len(kept), kept):
            found[key] = path
        if most is not None and len(found) > most:
            break
    return sorted(found.values())


def _through_links(path: str) -> bool:
    absolute = os.path.abspath(path)
    return os.path.realpath(absolute) != absolute


def resolve(path: str) -> str:
    """``path`` as every process reads it: absolute, with ``~`` expanded here; a URL unchanged."""
    if is_url(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def shown(path: str) -> str:
    """``path`` as a message shows it: relative to the working directory when it lies under it."""
    if is_url(path):
        return path
    rel = os.path.relpath(path)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


# what a suffix says a file holds: a Zarr store named x.npy is a folder np.load cannot open
_NAMES = {".npy": "a .npy file", ".npz": "a .npz archive", ".h5": "an HDF5 file", ".hdf5": "an HDF5 file",
          ".nc": "a NetCDF file", ".nc4": "a NetCDF file", ".cdf": "a NetCDF file", ".tif": "a TIFF file",
          ".tiff": "a TIFF file", ".csv": "a CSV table", ".parquet": "a Parquet table", ".zarr": "a Zarr store"}


def named_kind(path: str) -> str | None:
    """What ``path``'s suffix says it holds (``'an HDF5 file'``), or None."""
    return _NAMES.get(os.path.splitext(path.rstrip("/" + os.sep))[1].lower())


def misnamed(path: str, own: tuple[str, ...] = (".zarr",), writer: str = "it") -> tuple[str, str] | None:
    """``(why, better name)`` when ``path``'s suffix names another kind of file than ``writer``
    writes (files named with one of ``own``); else None."""
    stem, suffix = os.path.splitext(path.rstrip("/" + os.sep))
    if not own or suffix.lower() in own or suffix.lower() not in _NAMES:
        return None
    kinds = " or ".join(dict.fromkeys(_NAMES.get(o, f"a {o} file") for o in own))
    return (f"{shown(path)!r} ends in {suffix}, the name of {_NAMES[suffix.lower()]}, but {writer} writes {kinds}",
            shown(stem + own[0]))


def refuse_misnamed(path: str, own: tuple[str, ...] = (".zarr",), writer: str = "it", error: type = OutputError,
                    prefix: str = "") -> None:
    """Raise ``error`` (after ``prefix``) when :func:`misnamed` finds ``path`` named as another kind of file."""
    if wrong := misnamed(os.fspath(path), own, writer):  # as a spec's zarr output named "out.npy" is
        raise error(f"{prefix}{wrong[0]}: name it e.g. {wrong[1]!r}")


def metadata_files(path: str, component: str | None = None) -> list[str]:
    """What shows the input at ``path`` is here: a file itself, a store's metadata files (and
    ``component``'s), else the folder; nothing for a URL or a missing path."""
    if is_url(path):
        return []
    if is_glob(path):  # a stack of pages: each is read
        return [f for f in expand(path) if os.path.isfile(f)]
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return []
    if not stat.S_ISDIR(mode):
        return [path]
    folders = [path, os.path.join(path, *component.split("/"))] if component else [path]
    return [os.path.join(f, m) for f in folders for m in METADATA if os.path.isfile(os.path.join(f, m))] or [path]


def files_read(x: Any) -> dict[str, str]:
    """``{path: "an input of the array written (path)"}`` for each file or store that the graph of ``x``
    reads through an object ``da.from_array`` slices (its ``original-`` key, or a constant of a
    ``from-`` layer when inlined): flowgpu's readers (``.path``), a Zarr array (its local store's
    folder) and an h5py dataset (its file). Looks at no task of a blockwise layer."""
    graph = x.__dask_graph__() if hasattr(x, "__dask_graph__") else None
    found = {}
    for name, layer in (getattr(graph, "layers", None) or {}).items():
        if str(name).startswith("original-"):
            sources = list(layer.values())
        elif str(name).startswith("from-"):
            sources = [value for value, index in getattr(layer, "indices", ()) if index is None]
        else:
            continue
        for source in sources:
            for path in _source_paths(source):
                if isinstance(path, (str, os.PathLike)) and not is_url(os.fspath(path)):
                    path = os.path.abspath(os.fspath(path))
                    found[path] = f"an input of the array written ({path!r})"
    return found


def _source_paths(source: Any) -> list[Any]:
    store = getattr(source, "store", None)  # a Zarr array: its store's folder, not its component
    if store is not None:
        local = "file" in getattr(getattr(store, "fs", None), "protocol", ("file",))  # fsspec's, or none
        return [getattr(store, "root", None) or (getattr(store, "path", None) if local else None)]
    files = getattr(source, "files", None)  # flowgpu's TIFF pages
    return [getattr(source, "path", None) or getattr(getattr(source, "file", None), "filename", None),
            *(files if isinstance(files, (tuple, list)) else ())]


def where() -> str:
    """This process, as a message names it: the worker's address (in a worker), host and folder."""
    try:
        name = f"worker {get_worker().address}"
    except ValueError:  # not in a worker
        name = f"process {os.getpid()}"
    return f"{name} on host {socket.gethostname()} (working directory {os.getcwd()})"


def not_visible(what: str, path: str) -> PathNotVisibleError:
    """The error for the ``what`` at ``path`` that this process (a worker) does not see."""
    return PathNotVisibleError(f"{what} {path!r} is not there for {where()}; {FIX}")


def require_store(folder: str) -> None:
    """Refuse to read a Zarr array whose metadata is not at ``folder`` (Zarr would read fill values)."""
    if is_url(folder):
        return
    if not any(os.path.isfile(os.path.join(folder, m)) for m in METADATA[:2]):
        raise not_visible("zarr store", folder)


def _readable(path: str) -> str | None:
    """Why ``path`` cannot be read here, or None. Opened without blocking (a FIFO waits for a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        return "is not there" if isinstance(e, (FileNotFoundError, NotADirectoryError)) else \
            f"cannot be read ({e.strerror})"
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.read(fd, 1)
        return None
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    finally:
        os.close(fd)


def _writable(folder: str, marker: str | None, inode: int | None = None) -> str | None:
    """Why a task cannot write into ``folder`` here, or None. It must be the client's folder: hold
    ``marker`` (written there by the client), or have the client's ``inode``."""
    if not os.path.isdir(folder):
        return "is not there"
    if marker is not None and not os.path.exists(os.path.join(folder, marker)):
        return f"is another folder than the client's (it lacks {marker!r}, written there by the client)"
    if inode is not None:
        if os.stat(folder).st_ino != inode:
            return "is another folder than the client's (its inode differs)"
        return None if os.access(folder, os.W_OK | os.X_OK) else "cannot be written (permission denied)"
    try:
        fd, name = tempfile.mkstemp(prefix=".flowgpu-probe-", dir=folder)
    except OSError as e:
        return f"cannot be written ({e.strerror})"
    os.close(fd)
    os.unlink(name)
    return None


def probe(entries: list[dict[str, Any]], dask_worker: Any = None) -> dict[str, Any]:
    """Run on each worker: which of ``entries`` (``{"read": [files]}``, ``{"write": folder, "marker":
    name}`` or ``{"write": folder, "inode": n}``) it cannot reach, as ``(index, path, why)``."""
    problems = []
    for i, entry in enumerate(entries):
        for path in entry.get("read", ()):
            why = _readable(path)
            if why is not None:
                problems.append((i, path, why))
                break
        if entry.get("write"):
            why = _writable(entry["write"], entry.get("marker"), entry.get("inode"))
            if why is not None:
                problems.append((i, entry["write"], why))
    return {"host": socket.gethostname(), "cwd": os.getcwd(), "problems": problems}

"""TIFF stacks (tifffile, optional, imported when used): a multi-page file, or a glob of one-page
files in natural order, as one (pages, y, x) array, chunked by pages; each task decodes only its own
pages (on a GPU session, into pinned staging buffers). Every page must match the first one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import parse_bytes

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.creation import from_reader
from flowgpu.errors import SourceError
from flowgpu.io.hdf5 import block_slices, import_format, open_format, take
from flowgpu.io.paths import expand, is_glob, resolve
from flowgpu.transfer.staging import rows_to_device

__all__ = ["from_tiff", "TiffReader", "import_tifffile", "is_tiff", "tiff_files"]

# the first bytes of a TIFF file: classic and BigTIFF, little- and big-endian
_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def import_tifffile() -> Any:
    return import_format("tifffile", "TIFF")


def is_tiff(path: str) -> bool:
    """Whether the file at ``path`` starts as a TIFF (or BigTIFF) file does."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in _MAGIC
    except OSError:
        return False


def tiff_files(path: str) -> list[str]:
    """The files ``path`` names: itself, or a glob's matches in natural order (``**`` recurses)."""
    if not is_glob(path):
        return [path]
    files = import_tifffile().natural_sorted(f for f in expand(path) if os.path.isfile(f))
    if not files:
        raise SourceError(f"{path!r} matches no files; give a multi-page TIFF file or a glob of TIFF pages such "
                          "as 'pages/*.tif'", "path")
    return files


def _open(path: str) -> Any:
    return open_format(path, "TIFF", import_tifffile().TiffFile,
                       f"; give a TIFF file, or a glob of its pages such as '{os.path.join(path, '*.tif')}'",
                       (is_tiff, "a TIFF file (it does not start as one)"))


def _page_kind(page: Any) -> tuple[tuple[int, ...], np.dtype | None]:
    dtype = page.dtype
    return tuple(int(n) for n in page.shape), (None if dtype is None else np.dtype(dtype).newbyteorder("="))


def _scan(path: str) -> tuple[list[str], bool, tuple[int, ...], np.dtype]:
    """``(files, multipage, shape, dtype)``: what ``path`` stacks, every page checked; ``shape`` is
    the stack's, (pages, *page shape)."""
    files = tiff_files(path)
    multipage, first = len(files) == 1 and not is_glob(path), None
    for f in files:
        with _open(f) as tif:
            pages = list(tif.pages) if multipage else [tif.pages[0]] if len(tif.pages) == 1 else None
            if pages is None:
                raise SourceError(f"{f!r} holds {len(tif.pages)} pages, but a glob stacks files of one page each; "
                                  "give a multi-page file as 'path' alone, or a glob of one-page files", "path")
            for i, page in enumerate(pages):
                kind = _page_kind(page)
                if first is None:
                    first = kind
                elif kind != first:
                    where, first_where = (f"page {i} of {path!r}", "page 0") if multipage else (repr(f), repr(files[0]))
                    raise SourceError(f"{where} holds a {kind[0]} {kind[1]} page, but {first_where} holds {first[0]} "
                                      f"{first[1]}; the pages of a stack must all have one shape and dtype: give only "
                                      "pages that match", "path")
    if first is None:
        raise SourceError(f"TIFF file {path!r} holds no pages", "path")
    page, dtype = first
    count = len(pages) if multipage else len(files)
    if dtype is None:
        raise SourceError(f"{files[0]!r}: tifffile cannot decode its pages (unsupported sample format)", "path")
    return files, multipage, (count,) + page, dtype


class TiffReader:
    """Reads pages of a stack (one ``multipage`` file, or a file per page) in the task that needs them."""

    def __init__(self, files: tuple[str, ...], multipage: bool, shape: tuple[int, ...], dtype: Any,
                 device: bool = False):
        self.files, self.multipage, self.device = tuple(files), multipage, device
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)

    def _check(self, page: Any, where: str) -> Any:
        kind = _page_kind(page)
        if kind != (self.shape[1:], self.dtype):
            raise OSError(f"{where} is now a {kind[0]} {kind[1]} page, but the run was planned for "
                          f"{self.shape[1:]} {self.dtype}; the stack changed after the run was planned: run again")
        return page

    def __getitem__(self, key: Any) -> Any:
        key, rest = block_slices(key, self.shape)
        return take(self._read(key), rest)

    def _read(self, key: tuple[slice, ...]) -> Any:
        tifffile = import_tifffile()
        shape = tuple(k.stop - k.start for k in key)
        first, rest = key[0].start, key[1:]
        whole = all(k.start == 0 and k.stop == n for k, n in zip(rest, self.shape[1:]))
        # fills may run on several threads: one file handle (not thread-safe) is read by one at a time;
        # a glob's pages, each its own file, are decoded in parallel
        with tifffile.TiffFile(self.files[0]) if self.multipage else contextlib.nullcontext() as tif:
            lock = threading.Lock() if tif is not None else contextlib.nullcontext()

            def fill(out: np.ndarray, a: int, b: int) -> None:
                with lock:
                    for j in range(a, b):
                        i = first + j
                        if tif is not None:
                            try:
                                page = tif.pages[i]
                            except IndexError:
                                raise OSError(f"{self.files[0]} holds fewer pages than the {self.shape[0]} the run "
                                              "was planned for; the file changed after the run was planned: run "
                                              "again") from None
                            _read(self._check(page, f"page {i} of {self.files[0]}"), out[j - a], whole, rest)
                        else:
                            with tifffile.TiffFile(self.files[i]) as one:
                                _read(self._check(one.pages[0], self.files[i]), out[j - a], whole, rest)

            if self.device:
                return rows_to_device(shape, self.dtype, fill)
            out = np.empty(shape, self.dtype)
            if out.size:
                fill(out, 0, shape[0])
            return out


def _read(page: Any, out: np.ndarray, whole: bool, rest: tuple[slice, ...]) -> None:
    """Decode ``page`` into ``out`` (its part ``rest`` when the block is not whole pages)."""
    if whole:
        page.asarray(out=out)
    else:
        out[...] = page.asarray()[rest]


def _page_chunks(chunks: Any, shape: tuple[int, ...], dtype: np.dtype) -> tuple:
    """Whole pages per chunk for ``"auto"`` and byte sizes; any other ``chunks`` as given."""
    if chunks is None or chunks == "auto":
        return resolve_chunks(("auto",) + (-1,) * (len(shape) - 1), shape, dtype)
    if isinstance(chunks, str):
        try:
            size = parse_bytes(chunks)
        except ValueError:
            size = None
        if size is not None:
            page = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            return resolve_chunks((max(1, size // max(page, 1)),) + (-1,) * (len(shape) - 1), shape, dtype)
    return resolve_chunks(chunks, shape, dtype)


def from_tiff(path: str, chunks: Any = "auto") -> da.Array:
    """A TIFF stack as a chunked ``(pages, *page shape)`` array on the session's device (RGB pages
    keep their samples' axis; unlike ``tifffile.imread``, one page keeps its pages' axis).

    ``path``: a multi-page file, or a glob of one-page files (``"pages/*.tif"``; ``**`` recurses).
    ``chunks``: ``"auto"`` (whole pages), a byte size such as ``"256MiB"`` (whole pages within it),
    or one length per axis such as ``[16, -1, -1]``.
    """
    path = resolve(path)
    files, multipage, shape, dtype = _scan(path)
    chunks = _page_chunks(chunks, shape, dtype)
    token = da.core.tokenize(files, [os.path.getmtime(f) for f in files], chunks, str(dtype))
    return from_reader(TiffReader(tuple(files), multipage, shape, dtype), chunks, "tiff", token)

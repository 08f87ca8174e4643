"""Fused kernels compiled once per machine: numba's machine code kept on disk, shared by processes.

A fused kernel on NumPy chunks is Python source that :mod:`flowgpu.fusion.compiled` generates and
numba compiles (about a second each, in every new process). :func:`python_function` writes that
source to a file in ``flowgpu.cache.kernels`` (``DASK_FLOWGPU__CACHE__KERNELS``; default
``$XDG_CACHE_HOME/flowgpu/kernels``, i.e. ``~/.cache/flowgpu/kernels``), named by a hash of the text
and of what else decides the machine code (flowgpu's fusion sources, Python, NumPy, numba and
llvmlite versions); :func:`cached` and :func:`vectorize` compile it with numba's own disk cache
(``cache=True``), which keeps the machine code beside it in ``__pycache__/`` (or under
``NUMBA_CACHE_DIR`` where the user set it) keyed by signature and CPU. The next process that builds
the same kernel loads it instead of compiling.

* Concurrent workers: every file is written under a temporary name and renamed into place
  (``os.replace``; numba writes its files the same way), so no process reads a half-written one;
  two processes compiling the same kernel at once both compile, and the renames leave one copy.
* A cache file that cannot be read (truncated, damaged) is removed and the kernel compiled again;
  a folder that cannot be used (not writable, or writable by other users: its files are executed)
  leaves kernels compiled in memory only, as without the cache, and says so once in the log.
* :func:`stats` counts, per process, the kernels compiled and those loaded from disk; the logger
  ``flowgpu.fusion`` says which at DEBUG level, with the compile time.

CUDA kernels are not cached here: CuPy keeps every kernel it compiles in its own disk cache
(``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``), keyed by the source, and flowgpu's kernel
sources are the same in every process (their names are hashes of the expression), so a second
process loads them from there. flowgpu leaves ``CUPY_CACHE_DIR`` as the user set it.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import logging
import os
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowgpu import config

__all__ = ["directory", "python_namespace", "python_function", "cached", "vectorize", "guvectorize", "stats"]

_log = logging.getLogger("flowgpu.fusion")
_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_counts = {"compiled": 0, "loaded": 0}
_refused: set[str] = set()  # folders already logged as unusable


def directory() -> str:
    """The folder of the kernel cache: ``flowgpu.cache.kernels``, else ``~/.cache/flowgpu/kernels``."""
    configured = config.get("cache.kernels", default=None)
    if configured:
        return os.path.abspath(os.path.expanduser(str(configured)))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "flowgpu", "kernels")


def stats() -> dict[str, int]:
    """Fused numba kernels this process ``compiled`` and ``loaded`` from the disk cache.

    Examples
    --------
    >>> sorted(stats())
    ['compiled', 'loaded']
    """
    with _lock:
        return dict(_counts)


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


@functools.lru_cache(maxsize=1)
def _salt() -> bytes:
    """What a kernel's machine code depends on besides its own text: the versions of Python, NumPy,
    numba and llvmlite, and flowgpu's fusion sources (numba does not see a change in the functions a
    cached kernel calls: the NumPy-semantics helpers, a row kernel's flat kernel)."""
    import llvmlite
    import numba
    import numpy as np

    h = hashlib.sha256(repr((sys.version, sys.platform, np.__version__, numba.__version__,
                             llvmlite.__version__)).encode())
    for path in sorted(glob.glob(os.path.join(_HERE, "*.py"))):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.digest()


def _usable(folder: str) -> bool:
    """Create ``folder`` (0700) and say whether it may hold code this process runs: owned by this user
    and writable by no one else; otherwise log why once and return False."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise PermissionError("it is owned by another user" if st.st_uid != os.getuid()
                                  else f"other users may write there (mode {st.st_mode & 0o777:o})")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError("it is not writable")
    except OSError as e:
        if folder not in _refused:
            _refused.add(folder)
            _log.warning("flowgpu compiles fused kernels in memory only: the kernel cache %s cannot be used (%s); "
                         "set flowgpu.cache.kernels (DASK_FLOWGPU__CACHE__KERNELS) to a folder of your own", folder,
                         e.strerror or e)
        return False
    return True


def _source_file(src: str) -> str | None:
    """The file in the cache that holds exactly ``src`` (written atomically when missing or different)."""
    root = directory()
    folder = os.path.join(root, "numba")
    if not (_usable(root) and _usable(folder)):
        return None
    digest = hashlib.sha256(_salt() + src.encode()).hexdigest()[:32]
    path = os.path.join(folder, f"k{digest}.py")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == src:
                return path
    except (OSError, UnicodeDecodeError):
        pass  # missing, or damaged: write it (numba then compiles again: its index records the source's hash)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".k{digest}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(src)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        _log.warning("flowgpu compiles a fused kernel in memory only: cannot write %s (%s)", path, e.strerror or e)
        return None
    return path


def python_namespace(src: str, fname: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The globals in which ``src`` (generated code, never user text) defined its functions, with
    ``namespace`` in them: a module of its own, from its file in the kernel cache where there is one
    (numba caches only functions of a module it can find again, with a source file)."""
    path = _source_file(src)
    if path is None:
        glb = dict(namespace)
        exec(compile(src, f"<flowgpu {fname}>", "exec"), glb)  # noqa: S102 - code generated by codegen
        return glb
    name = "_flowgpu_kernel_" + os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__dict__.update(namespace)
        module.__file__ = path
        exec(compile(src, path, "exec"), module.__dict__)  # noqa: S102 - code generated by codegen
        module = sys.modules.setdefault(name, module)
    return module.__dict__


def python_function(src: str, fname: str, namespace: Mapping[str, Any]) -> Callable:
    """The function ``fname`` that ``src`` defines (:func:`python_namespace`)."""
    return python_namespace(src, fname, namespace)[fname]


def _file_backed(func: Callable) -> bool:
    return os.path.isfile(func.__code__.co_filename)


def _guarded(func: Callable, inner: Any) -> Any:
    """numba's cache of ``func`` (``inner``), counting compiles and loads; a file it cannot read is a
    miss (removed, so the compile writes it again), never an error."""
    from numba.core.caching import NullCache

    name = func.__name__

    class Guarded(NullCache):
        cache_path = getattr(inner, "cache_path", None)
        started = 0.0

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            try:
                cres = inner.load_overload(sig, target_context)
            except Exception as e:  # noqa: BLE001 - any damage to numba's pickles: compile again
                _log.warning("flowgpu's kernel cache: %s for %s could not be read (%s: %s); compiling it again",
                             inner.cache_path, name, type(e).__name__, e)
                self._remove()
                cres = None
            if cres is not None:
                _count("loaded")
                _log.debug("fused kernel %s%s loaded from %s", name, sig, inner.cache_path)
            else:
                _count("compiled")
                self.started = time.perf_counter()
            return cres

        def save_overload(self, sig: Any, data: Any) -> None:
            took = time.perf_counter() - self.started
            try:
                inner.save_overload(sig, data)
                where = f"cached in {inner.cache_path}" if inner.cache_path else "not cached"
            except Exception as e:  # noqa: BLE001 - a full disk or a read-only folder: this process keeps it
                where = f"not cached ({type(e).__name__}: {e})"
            _log.debug("fused kernel %s%s compiled in %.2f s, %s", name, sig, took, where)

        def flush(self) -> None:
            inner.flush()

        def _remove(self) -> None:
            stem = os.path.splitext(os.path.basename(func.__code__.co_filename))[0]
            for path in glob.glob(os.path.join(glob.escape(inner.cache_path), f"{stem}.*")):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    return Guarded()


def cached(dispatcher: Any) -> Any:
    """``dispatcher`` (a ``numba.njit`` function) with numba's disk cache where its function has a file in
    the cache (:func:`python_function`), and its compiles counted in :func:`stats` either way."""
    func = dispatcher.py_func
    if _file_backed(func):
        try:
            dispatcher.enable_caching()  # what numba.njit(cache=True) calls
        except RuntimeError as e:  # numba found no folder it may write: compiled in memory, as before
            _log.warning("flowgpu compiles a fused kernel in memory only: %s", e)
    # numba's enable_caching sets this attribute (a NullCache without it); the guard wraps it
    dispatcher._cache = _guarded(func, dispatcher._cache)
    return dispatcher


def vectorize(func: Callable, signatures: Sequence[Any]) -> Any:
    """``numba.vectorize(signatures, nopython=True)(func)``, disk-cached and counted as :func:`cached` is."""
    import numba

    try:
        ufunc = numba.vectorize(nopython=True, cache=_file_backed(func))(func)  # a DUFunc: nothing compiled yet
    except RuntimeError as e:  # numba found no folder it may write: compiled in memory, as before
        _log.warning("flowgpu compiles a fused kernel in memory only: %s", e)
        ufunc = numba.vectorize(nopython=True)(func)
    ufunc._dispatcher.cache = _guarded(func, ufunc._dispatcher.cache)  # as enable_caching sets it
    for sig in signatures:
        ufunc.add(sig)
    ufunc.disable_compile()  # as numba.vectorize(signatures) leaves it
    return ufunc


def guvectorize(func: Callable, signatures: Sequence[Any], layout: str) -> Any:
    """``numba.guvectorize(signatures, layout, nopython=True)(func)``: the gufunc's thin loop wrapper
    around a fused reduction, built in each process (about 0.1-0.4 s). ``func`` calls the kernel, whose
    machine code is in the disk cache (:func:`cached`); numba's own gufunc cache is not used: a cached
    wrapper that calls a cached kernel crashed the next process (SIGSEGV, numba 0.68)."""
    from numba.np.ufunc import GUVectorize

    gufunc = GUVectorize(func, layout, nopython=True)  # what numba.guvectorize builds
    started = time.perf_counter()
    for sig in signatures:
        gufunc.add(sig)
    gufunc.disable_compile()
    _log.debug("loop wrapper %s built in %.2f s (not cached)", func.__name__, time.perf_counter() - started)
    return gufunc.build_ufunc()

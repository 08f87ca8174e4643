"""Fused numba kernels compiled once per machine: their source and numba's machine code kept on disk.

numba caches only functions defined in a file, so generated source is written to
``flowgpu.cache.kernels`` (default ``~/.cache/flowgpu/kernels``), named by a hash of the text, the
fusion sources and the library versions, and compiled with numba's ``cache=True``. Files are
written atomically; a damaged one is removed and compiled again; a folder others may write is
refused (its files run here), leaving kernels in memory. :func:`stats` counts compiles and loads.
CUDA kernels stay in CuPy's own cache.
"""

from __future__ import annotations

import contextlib
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

__all__ = ["directory", "python_namespace", "cached", "vectorize", "guvectorize", "stats"]

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
    """Fused numba kernels this process ``compiled`` and ``loaded`` from the disk cache."""
    with _lock:
        return dict(_counts)


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


@functools.lru_cache(maxsize=1)
def _salt() -> bytes:
    """What machine code depends on besides its text: library versions and the fusion sources (numba
    does not see a change in the helpers a cached kernel calls)."""
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
    """Create ``folder`` (0700); whether it is ours and writable by no one else (else log why, once)."""
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
    """The globals in which ``src`` (generated, never user text) defined its functions, ``namespace``
    among them: a module whose file is in the kernel cache where there is one."""
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


def _file_backed(func: Callable) -> bool:
    return os.path.isfile(func.__code__.co_filename)


def _guarded(func: Callable, inner: Any) -> Any:
    """numba's cache of ``func`` (``inner``), counting compiles and loads; a file it cannot read is a
    miss (removed), never an error."""
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
                with contextlib.suppress(OSError):
                    os.unlink(path)

    return Guarded()


def cached(dispatcher: Any) -> Any:
    """``dispatcher`` (``numba.njit``) with numba's disk cache where its function has a file, counted."""
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
    """``numba.guvectorize(signatures, layout, nopython=True)(func)``, a thin wrapper around a cached
    kernel, built in each process: a cached wrapper calling a cached kernel crashed the next one."""
    from numba.np.ufunc import GUVectorize

    gufunc = GUVectorize(func, layout, nopython=True)  # what numba.guvectorize builds
    started = time.perf_counter()
    for sig in signatures:
        gufunc.add(sig)
    gufunc.disable_compile()
    _log.debug("loop wrapper %s built in %.2f s (not cached)", func.__name__, time.perf_counter() - started)
    return gufunc.build_ufunc()

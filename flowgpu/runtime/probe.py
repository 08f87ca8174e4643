"""What a worker has: run on workers through ``client.run`` to learn a joined cluster's backend."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sys
import warnings
from typing import Any

import dask.config
import psutil

from flowgpu import __version__, backend
from flowgpu.errors import SessionError

__all__ = ["worker_info", "ask_workers", "where", "spill_space", "set_array_backend"]


def worker_info(dask_worker=None) -> dict:
    """GPUs, CuPy, memory and whereabouts (host, directory, pid, version) of this worker process."""
    gpus = backend.gpu_count()
    limit = getattr(getattr(dask_worker, "data", None), "device_memory_limit", None)
    info = {
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "flowgpu": __version__,
        "gpus": gpus,
        "cupy": backend.import_cupy(strict=False) is not None if gpus else False,
        "array_backend": dask.config.get("array.backend", "numpy"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_memory": backend.device_total_memory(0) if gpus else None,
        "device_memory_limit": int(limit) if isinstance(limit, (int, float)) and limit else None,
        "memory_limit": getattr(getattr(dask_worker, "memory_manager", None), "memory_limit", None),
        "nthreads": getattr(dask_worker, "state", None) and dask_worker.state.nthreads,
    }
    info.update(spill_space(getattr(dask_worker, "local_directory", None)))
    return info


def ask_workers(client: Any) -> dict[str, dict]:
    """:func:`worker_info` of every worker; :class:`SessionError` when they cannot run flowgpu's code."""
    try:
        info = client.run(worker_info)
    except Exception as e:
        # a worker that cannot unpickle flowgpu's function: its ImportError, or an Exception quoting it
        if not (isinstance(e, ImportError) or "No module named 'flowgpu" in str(e)):
            raise
        raise SessionError(
            f"the workers at {client.scheduler.address} cannot run flowgpu's code ({type(e).__name__}: {e}): install "
            f"flowgpu {__version__} in the workers' environment too (its data store, its dashboard page and its "
            "tasks run there)") from None
    others = sorted({f"{w.get('flowgpu')}" for w in info.values()} - {__version__})
    if others:
        warnings.warn(f"the workers at {client.scheduler.address} run flowgpu {', '.join(others)}, this client "
                      f"{__version__}: install the same version everywhere, or tasks may fail to load", stacklevel=3)
    return info


def where(workers: dict[str, dict]) -> list[dict]:
    """Where each worker runs, for summaries and ``flowgpu cluster status``: address, host, working directory, pid."""
    return [{"address": a, "host": w.get("host"), "cwd": w.get("cwd"), "pid": w.get("pid")}
            for a, w in sorted(workers.items())]


# What a CPU worker grows by when its first task loads numba's kernels (measured: 87 -> 201 MiB).
CPU_KERNELS = 120 << 20


def spill_space(directory: str | None) -> dict:
    """The process's ``rss``, the ``kernels`` numba will add, and the spill directory's free bytes
    and disk (``host:device``: workers sharing it share the space)."""
    kernels = 0
    if dask.config.get("array.backend", "numpy") == "numpy" and "numba" not in sys.modules \
            and importlib.util.find_spec("numba") is not None:
        kernels = CPU_KERNELS  # loaded by the first task that uses them (not here: it could kill the worker)
    out = {"rss": psutil.Process().memory_info().rss, "kernels": kernels, "local_directory": directory,
           "spill_free": None, "spill_disk": None}
    if directory:
        with contextlib.suppress(OSError):
            out["spill_free"] = shutil.disk_usage(directory).free
            out["spill_disk"] = f"{socket.gethostname()}:{os.stat(directory).st_dev}"
    return out


def set_array_backend(name: str, dask_worker=None) -> str:
    """Set ``array.backend`` on a worker (used when joining GPU workers started elsewhere)."""
    dask.config.set({"array.backend": name})
    return name

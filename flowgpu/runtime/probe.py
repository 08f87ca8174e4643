"""What a worker has: run on workers through ``client.run`` to learn a joined cluster's backend."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys

import dask.config
import psutil

from flowgpu import backend

def worker_info(dask_worker=None) -> dict:
    """GPUs, CuPy and memory of the worker process this runs in."""
    gpus = backend.gpu_count()
    has_cupy = backend.import_cupy(strict=False) is not None if gpus else False
    info = {
        "gpus": gpus,
        "cupy": has_cupy,
        "array_backend": dask.config.get("array.backend", "numpy"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_memory": backend.device_total_memory(0) if gpus else None,
        "device_memory_limit": None,
        "memory_limit": getattr(getattr(dask_worker, "memory_manager", None), "memory_limit", None),
        "nthreads": getattr(dask_worker, "state", None) and dask_worker.state.nthreads,
    }
    data = getattr(dask_worker, "data", None)
    limit = getattr(data, "device_memory_limit", None)
    if isinstance(limit, (int, float)) and limit:
        info["device_memory_limit"] = int(limit)
    info.update(spill_space(getattr(dask_worker, "local_directory", None)))
    return info


# What a CPU worker's process grows by when its first task loads flowgpu's compiled CPU kernels
# (numba and its threading layer; measured: 87 -> 201 MiB resident).
CPU_KERNELS = 120 << 20


def spill_space(directory: str | None) -> dict:
    """The process's memory in use (``rss``: what a worker holds before any chunk; ``kernels``: what
    loading flowgpu's compiled CPU kernels will add) and its spill directory's free bytes, with the
    host and device it lies on (workers sharing a disk share it)."""
    kernels = 0
    if dask.config.get("array.backend", "numpy") == "numpy" and "numba" not in sys.modules \
            and importlib.util.find_spec("numba") is not None:
        kernels = CPU_KERNELS  # loaded by the first task that uses them (not here: it could kill the worker)
    out = {"rss": psutil.Process().memory_info().rss, "kernels": kernels, "local_directory": directory,
           "spill_free": None, "spill_disk": None}
    if directory:
        try:
            out["spill_free"] = shutil.disk_usage(directory).free
            out["spill_disk"] = f"{socket.gethostname()}:{os.stat(directory).st_dev}"
        except OSError:
            pass
    return out


def set_array_backend(name: str, dask_worker=None) -> str:
    """Set ``array.backend`` on a worker (used when joining GPU workers started elsewhere)."""
    dask.config.set({"array.backend": name})
    return name

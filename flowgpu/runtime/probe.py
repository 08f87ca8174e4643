"""What a worker has: run on workers through ``client.run`` to learn a joined cluster's backend."""

from __future__ import annotations

import os

import dask.config

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
    return info


def set_array_backend(name: str, dask_worker=None) -> str:
    """Set ``array.backend`` on a worker (used when joining GPU workers started elsewhere)."""
    dask.config.set({"array.backend": name})
    return name

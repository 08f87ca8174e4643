"""How a session turns the memory layer on: cluster kwargs, worker environment, the plugin.

The session calls, in order, before and after starting its local cluster::

    kwargs = worker_data_kwargs(options)          # {"data": (FlowgpuStore, {...})} or {}
    env = worker_environ(options)                 # variables the worker processes need
    cluster = LocalCUDACluster(..., **kwargs)     # inside dask.config.set(pre-spawn-environ)
    install(client, options)                      # the MemoryPlugin on every worker

``flowgpu.spill.store: dask-cuda`` (or ``dask``) keeps the cluster's own store instead, for
comparison; then these return ``{}`` and install nothing.
"""

from __future__ import annotations

from typing import Any

import psutil
from dask.utils import parse_bytes

from flowgpu import backend as _backend
from flowgpu import config
from flowgpu.errors import ConfigError, MemoryLimitError
from flowgpu.memory.plugin import MemoryPlugin
from flowgpu.memory.store import FlowgpuStore

__all__ = ["STORES", "store_choice", "resolved_limits", "worker_data_kwargs", "worker_environ", "install"]

STORES = ("flowgpu", "dask-cuda", "dask")
DASK_CUDA_DEFAULT_FRACTION = 0.8  # what dask-cuda's device_memory_limit="default" means


def store_choice() -> str:
    """``flowgpu.spill.store``, checked."""
    store = config.get("spill.store")
    if store not in STORES:
        raise ConfigError(f"flowgpu.spill.store={store!r} is not a store; choose one of {', '.join(STORES)}")
    return store


def _bytes(value: Any, name: str) -> int | None:
    if value in (None, 0, "0"):
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size; give bytes such as '16GiB'")
    if isinstance(value, str):
        try:
            return int(parse_bytes(value))
        except (ValueError, TypeError):
            raise ConfigError(f"{name}={value!r} is not a size; give bytes such as '16GiB'") from None
    return int(value)


def _host_fraction() -> float:
    f = config.get("spill.host-fraction")
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1:
        raise ConfigError(f"flowgpu.spill.host-fraction={f!r}: give a fraction in (0, 1], e.g. 0.6")
    return float(f)


def resolved_limits(options) -> dict:
    """Per-worker ``{"device": bytes|None, "host": bytes|"auto"|None}`` the store would use.

    ``host="auto"`` means: a fraction (``flowgpu.spill.host-fraction``) of the worker's own
    memory limit, adopted when the worker starts. A device limit in bytes was checked against the
    GPUs' memory when the options were resolved (:func:`flowgpu.runtime.options.resolve`).
    """
    frac, mem, host = _host_fraction(), options.memory_limit, None
    if mem == "auto":
        host = "auto"
    elif mem:
        host = int((psutil.virtual_memory().total * mem if isinstance(mem, float) and mem <= 1 else int(mem)) * frac)
    dev, device = options.device_memory_limit, None
    if options.backend == "gpu" and dev not in (None, 0, "auto"):
        dev = DASK_CUDA_DEFAULT_FRACTION if dev == "default" else dev
        if isinstance(dev, float) and 0 < dev <= 1:
            dev = min(_backend.device_total_memory(g) for g in (options.gpus or (0,))) * dev
        device = int(dev)
    return {"device": device, "host": host}


def worker_data_kwargs(options) -> dict:
    """Extra cluster keyword arguments that give each worker a :class:`FlowgpuStore`.

    Parameters
    ----------
    options : a resolved :class:`flowgpu.runtime.SessionOptions` (backend, memory limits, gpus).

    Returns
    -------
    ``{"data": (FlowgpuStore, {...})}``, or ``{}`` when ``flowgpu.spill.store`` asks for the
    cluster's own store.
    """
    if store_choice() != "flowgpu":
        return {}
    limits = resolved_limits(options)
    pool = config.get("spill.pinned-pool-size")
    if pool in ("auto", None):
        pinned = None  # as much as the host tier
    else:
        pinned = _bytes(pool, "flowgpu.spill.pinned-pool-size") or 0
        ram = psutil.virtual_memory().total
        if pinned > ram:
            raise MemoryLimitError(f"flowgpu.spill.pinned-pool-size={pool!r} ({pinned} bytes) is larger than this "
                                   f"machine's {ram} bytes of memory; give less, e.g. '32GiB', or 'auto'")
    return {"data": (FlowgpuStore, {"device_memory_limit": limits["device"], "memory_limit": limits["host"],
                                    "host_fraction": _host_fraction(), "pinned_pool_size": pinned})}


def worker_environ(options) -> dict[str, str]:
    """Environment the worker processes need before they import CuPy.

    GPU workers with flowgpu's store get ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``
    (``flowgpu.spill.per-thread-streams``), so each worker thread computes and copies on its own
    stream and transfers overlap compute: the store orders a task's results before another
    thread reads them. Every other GPU worker gets ``0``, said explicitly: the nanny leaves the
    variable in this process's environment after an earlier Session, and a later one with
    dask's or dask-cuda's store (which order nothing across streams) would inherit it and read
    partial results (wrong sums, seen on an H200). Set it in
    ``distributed.nanny.pre-spawn-environ`` around the cluster's start.
    """
    if options.backend != "gpu":
        return {}
    on = store_choice() == "flowgpu" and bool(config.get("spill.per-thread-streams"))
    return {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1" if on else "0"}


def install(client, options=None) -> None:
    """Register the :class:`~flowgpu.memory.plugin.MemoryPlugin` on every worker of ``client``."""
    if store_choice() != "flowgpu":
        return
    client.register_plugin(MemoryPlugin(prefetch=bool(config.get("spill.prefetch"))), name=MemoryPlugin.name)

"""How a session turns the store on: :func:`worker_data_kwargs` and :func:`worker_environ` for the
local cluster, then :func:`install` for the plugin. ``flowgpu.spill.store: dask-cuda`` (or ``dask``)
keeps the cluster's own store, for comparison. The options were held to the schema by
:func:`flowgpu.runtime.options.resolve` before.
"""

from __future__ import annotations

import psutil

from flowgpu import backend as _backend
from flowgpu import config
from flowgpu.errors import MemoryLimitError
from flowgpu.memory.plugin import MemoryPlugin
from flowgpu.memory.store import FlowgpuStore

__all__ = ["resolved_limits", "worker_data_kwargs", "worker_environ", "install"]

DASK_CUDA_DEFAULT_FRACTION = 0.8  # what dask-cuda's device_memory_limit="default" means


def _flowgpu_store() -> bool:
    return config.get("spill.store") == "flowgpu"


def _host_fraction() -> float:
    return float(config.get("spill.host-fraction"))


def resolved_limits(options) -> dict:
    """Per-worker ``{"device": bytes|None, "host": bytes|"auto"|None}`` the store would use
    (``"auto"``: ``flowgpu.spill.host-fraction`` of the worker's own limit, adopted when it starts)."""
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
    """``{"data": (FlowgpuStore, {...})}`` for the cluster of resolved ``options``, or ``{}`` when
    ``flowgpu.spill.store`` keeps the cluster's own."""
    if not _flowgpu_store():
        return {}
    limits = resolved_limits(options)
    pool = config.get("spill.pinned-pool-size")
    if pool in ("auto", None):
        pinned = None  # as much as the host tier
    else:
        pinned = int(config.parse_size(pool) if isinstance(pool, str) else pool)
        ram = psutil.virtual_memory().total
        if pinned > ram:
            raise MemoryLimitError(f"flowgpu.spill.pinned-pool-size={pool!r} ({pinned} bytes) is larger than this "
                                   f"machine's {ram} bytes of memory; give less, e.g. '32GiB', or 'auto'")
    return {"data": (FlowgpuStore, {"device_memory_limit": limits["device"], "memory_limit": limits["host"],
                                    "host_fraction": _host_fraction(), "pinned_pool_size": pinned})}


def worker_environ(options) -> dict[str, str]:
    """Environment GPU workers need before they import CuPy: per-thread default streams
    (``flowgpu.spill.per-thread-streams``: copies overlap compute) only with flowgpu's store, which
    orders results across streams. Otherwise ``0``, said explicitly: a ``1`` an earlier Session left
    in the environment gave dask's stores partial results (wrong sums, seen on an H200)."""
    if options.backend != "gpu":
        return {}
    on = _flowgpu_store() and bool(config.get("spill.per-thread-streams"))
    return {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1" if on else "0"}


def install(client, options=None) -> None:
    """Register the :class:`~flowgpu.memory.plugin.MemoryPlugin` on every worker of ``client``."""
    if not _flowgpu_store():
        return
    client.register_plugin(MemoryPlugin(prefetch=bool(config.get("spill.prefetch"))), name=MemoryPlugin.name)

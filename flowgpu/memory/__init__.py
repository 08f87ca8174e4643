"""Spilling between device, pinned host memory and disk: the worker store.

* :class:`FlowgpuStore` - a worker's ``data`` mapping that stacks tiers device -> pinned host ->
  disk (host -> disk on CPU workers; :mod:`flowgpu.memory.tiers`), asynchronous copies, no pickle,
  per-tier accounting, and events a profiler subscribes to (:mod:`flowgpu.memory.events`);
* :func:`stats` - run on workers (``client.run(flowgpu.memory.stats)``) for that accounting;
  :func:`summary` sums it over workers, :func:`delta` says what moved between two sums;
* :func:`worker_data_kwargs`, :func:`worker_environ`, :func:`install` - how a session turns it on.

Pinned buffers, staging and the copies themselves are :mod:`flowgpu.transfer`, the layer below
(:class:`PinnedPool` and :func:`to_device_staged` are named here too).

Importing this package never imports CuPy.
"""

from __future__ import annotations

from flowgpu.memory.events import Events
from flowgpu.memory.integration import install, resolved_limits, worker_data_kwargs, worker_environ
from flowgpu.memory.plugin import MemoryPlugin, delta, stats, summary
from flowgpu.memory.store import FlowgpuStore
from flowgpu.transfer.pinned import PinnedPool
from flowgpu.transfer.staging import to_device_staged

__all__ = ["Events", "FlowgpuStore", "MemoryPlugin", "PinnedPool", "delta", "install", "resolved_limits", "stats",
           "summary", "to_device_staged", "worker_data_kwargs", "worker_environ"]

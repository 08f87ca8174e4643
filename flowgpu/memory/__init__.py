"""Spilling and staging between device, pinned host memory and disk.

* :class:`FlowgpuStore` - a worker's ``data`` mapping with tiers device -> pinned host -> disk
  (host -> disk on CPU workers), asynchronous copies, no pickle, per-tier accounting;
* :func:`stats` - run on workers (``client.run(flowgpu.memory.stats)``) for that accounting;
* :func:`worker_data_kwargs`, :func:`worker_environ`, :func:`install` - how a session turns it on;
* :func:`to_device_staged` - host chunks to the device through pinned staging buffers.

Importing this package never imports CuPy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FlowgpuStore": "flowgpu.memory.store",
    "PinnedPool": "flowgpu.memory.pinned",
    "MemoryPlugin": "flowgpu.memory.plugin",
    "stats": "flowgpu.memory.plugin",
    "summary": "flowgpu.memory.plugin",
    "worker_data_kwargs": "flowgpu.memory.integration",
    "worker_environ": "flowgpu.memory.integration",
    "install": "flowgpu.memory.integration",
    "resolved_limits": "flowgpu.memory.integration",
    "check_chunk_fits": "flowgpu.memory.integration",
    "to_device_staged": "flowgpu.memory.staging",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flowgpu.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

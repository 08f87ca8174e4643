"""The worker store: :class:`FlowgpuStore` spills device -> pinned host -> disk (host -> disk on CPU
workers) without pickle, with per-tier accounting (:func:`stats` on workers, :func:`summary` over
them, :func:`delta` between two) and events. Importing it never imports CuPy.
"""

from __future__ import annotations

from flowgpu.memory.events import Events
from flowgpu.memory.integration import install, resolved_limits, worker_data_kwargs, worker_environ
from flowgpu.memory.plugin import MemoryPlugin, delta, stats, summary
from flowgpu.memory.store import FlowgpuStore

__all__ = ["Events", "FlowgpuStore", "MemoryPlugin", "delta", "install", "resolved_limits", "stats", "summary",
           "worker_data_kwargs", "worker_environ"]

"""How bytes move between host and device: pinned host buffers placed on the GPU's NUMA node
(:mod:`~flowgpu.transfer.pinned`), host blocks and file rows staged through them
(:mod:`~flowgpu.transfer.staging`), copies on their own CUDA streams (:mod:`~flowgpu.transfer.streams`).
Never imports the worker store, the runtime, or CuPy at import time.
"""

from __future__ import annotations

from flowgpu.transfer.pinned import HostBuffer, PinnedPool
from flowgpu.transfer.staging import (file_rows_to_device, host_to_device, rows_to_device, staging_pool,
                                      to_device_staged)
from flowgpu.transfer.streams import CupyTransfer

__all__ = ["CupyTransfer", "HostBuffer", "PinnedPool", "file_rows_to_device", "host_to_device", "rows_to_device",
           "staging_pool", "to_device_staged"]

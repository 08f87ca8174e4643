"""How bytes move between host and device: pinned host buffers, staging, copies on their own streams.

* :mod:`~flowgpu.transfer.pinned` - :class:`PinnedPool`, page-locked host buffers reused by size
  class (placed on the GPU's NUMA node: :mod:`~flowgpu.transfer.numa`), pageable when pinning fails;
* :mod:`~flowgpu.transfer.staging` - :func:`host_to_device` and :func:`file_rows_to_device`: a host
  block or a byte range of a file on the device through pinned staging buffers, slice by slice;
  what ``flowgpu.to_device``, ``flowgpu.from_npy`` and the Zarr device reader call;
* :mod:`~flowgpu.transfer.streams` - :class:`CupyTransfer`, asynchronous copies between device
  chunks and pinned buffers on their own CUDA streams (what a worker's store spills with).

Below :mod:`flowgpu.arrays` and :mod:`flowgpu.io`, above :mod:`flowgpu.backend`; it never imports
the worker store (:mod:`flowgpu.memory`) or the runtime, and never imports CuPy at import time.
"""

from __future__ import annotations

from flowgpu.transfer.pinned import HostBuffer, PinnedPool
from flowgpu.transfer.staging import (file_rows_to_device, host_to_device, rows_to_device, staging_pool,
                                      to_device_staged)
from flowgpu.transfer.streams import CupyTransfer

__all__ = ["CupyTransfer", "HostBuffer", "PinnedPool", "file_rows_to_device", "host_to_device", "rows_to_device",
           "staging_pool", "to_device_staged"]

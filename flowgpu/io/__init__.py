"""Sources and sinks: .npy and Zarr, with atomic writes."""

from flowgpu.io.atomic import atomic_output, check_writable, written_by_flowgpu
from flowgpu.io.npy import from_npy, to_npy
from flowgpu.io.zarr import from_zarr, to_zarr

__all__ = ["atomic_output", "check_writable", "from_npy", "from_zarr", "to_npy", "to_zarr", "written_by_flowgpu"]

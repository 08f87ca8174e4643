"""Sources and sinks: .npy and Zarr, HDF5 and TIFF (read), synthetic data, Python callables, with atomic writes."""

from flowgpu.io.atomic import AtomicPath, atomic_output, check_writable, written_by_flowgpu
from flowgpu.io.hdf5 import from_hdf5
from flowgpu.io.npy import from_npy, to_npy
from flowgpu.io.sinks import SINKS, PendingWrite, prepare_write, register_sink, sink_entry, sink_names
from flowgpu.io.sources import SOURCES, open_source, register_source, source_entry, source_names
from flowgpu.io.tiff import from_tiff
from flowgpu.io.zarr import from_zarr, to_zarr

__all__ = [
    "SINKS", "SOURCES", "sink_entry", "source_entry", "AtomicPath", "PendingWrite", "atomic_output",
    "check_writable", "from_npy", "from_zarr", "open_source", "prepare_write", "register_sink", "register_source",
    "sink_names", "source_names", "to_npy", "to_zarr", "written_by_flowgpu", "from_hdf5", "from_tiff",
]

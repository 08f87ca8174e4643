"""Chunked arrays: creation, chunk sizing, and moving chunks between host and device."""

from flowgpu.arrays.chunks import check_fits, resolve_chunks, target_chunk_bytes
from flowgpu.arrays.creation import arange, from_array, full, normal, ones, random, zeros
from flowgpu.arrays.movement import to_device, to_host, to_numpy

__all__ = [
    "arange", "check_fits", "from_array", "full", "normal", "ones", "random",
    "resolve_chunks", "target_chunk_bytes", "to_device", "to_host", "to_numpy", "zeros",
]

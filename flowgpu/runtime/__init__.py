"""Start or join a cluster: GPU workers through dask-cuda, CPU workers through distributed."""

from flowgpu.runtime.options import SessionOptions, resolve
from flowgpu.runtime.session import Session, current_session

__all__ = ["Session", "SessionOptions", "current_session", "resolve"]

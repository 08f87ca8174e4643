"""Start or join a cluster: GPU workers through dask-cuda, CPU workers through distributed."""

from flowgpu.runtime.options import SessionOptions, resolve
from flowgpu.runtime.runsession import RunSession, ThreadedSession
from flowgpu.runtime.session import Session, current_session

__all__ = ["RunSession", "Session", "SessionOptions", "ThreadedSession", "current_session", "resolve"]

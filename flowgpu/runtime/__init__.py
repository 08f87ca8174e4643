"""Start or join a cluster: GPU workers through dask-cuda, CPU workers through distributed."""

from flowgpu.runtime.options import SessionOptions, resolve
from flowgpu.runtime.runsession import RunSession, ThreadedSession, cluster_gone
from flowgpu.runtime.session import Session, current_session

__all__ = ["RunSession", "Session", "SessionOptions", "ThreadedSession", "cluster_gone", "current_session", "resolve"]

"""What a run needs of its session: :class:`RunSession`, which :class:`~flowgpu.Session` and
:class:`ThreadedSession` (dask's threaded scheduler, no cluster) both are."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from flowgpu.backend import Facts, current_backend
from flowgpu.io.paths import shown

__all__ = ["RunSession", "ThreadedSession", "cluster_gone"]


@runtime_checkable
class RunSession(Protocol):
    """The session a pipeline run computes on (:func:`flowgpu.pipeline.run`'s ``session``)."""

    client: Any  # a distributed Client, or None: dask's threaded scheduler in this process
    backend: str  # "gpu", "cpu" or "local"
    n_workers: int
    dashboard_link: str | None
    may_serve_dashboard: bool
    workers: dict[str, dict]  # each worker's probe results (empty: none to ask)
    threads_per_worker: int
    worker_budget: int | None
    facts: Facts  # what its graphs are built with (a pipeline is compiled with them)

    def memory_summary(self) -> dict | None: ...

    def memory_summary_soon(self) -> Callable[[], dict | None]: ...  # asked now, answered when called

    def info(self) -> dict: ...


class ThreadedSession:
    """dask's threaded scheduler in this process: no cluster, no store (``run(..., session="local")``)."""

    client = None
    backend = "local"
    n_workers = 1
    dashboard_link = None
    may_serve_dashboard = False
    workers: dict[str, dict] = {}
    threads_per_worker = os.cpu_count() or 1
    worker_budget = None

    @property
    def facts(self) -> Facts:
        return Facts.here()

    def memory_summary(self) -> None:
        return None

    def memory_summary_soon(self) -> Callable[[], None]:
        return self.memory_summary

    def info(self) -> dict:
        return {"backend": f"local ({current_backend()})", "n_workers": 1, "threads_per_worker": os.cpu_count(),
                "address": None, "dashboard": None}


def cluster_gone(session: RunSession | None, unwritten: list[str]) -> str | None:
    """What a run whose client lost its scheduler says (``unwritten``: its outputs not written), in one
    line with how to go on; None while the client is connected (or there is none)."""
    client = getattr(session, "client", None)
    if client is None or client.status not in ("connecting", "closing", "closed"):  # connecting: trying again
        return None
    where = getattr(client.scheduler, "address", None) or "?"
    said = f" (not written: {', '.join(map(shown, unwritten))}, as they were before the run)" if unwritten else ""
    return (f"the cluster (scheduler at {where}) went away during the run (stopped, or its machine or network "
            f"failed); no output was written or replaced{said}. Start it again ('flowgpu cluster start', or "
            "your scheduler) and run again, or run with --standalone for a cluster of the run's own")

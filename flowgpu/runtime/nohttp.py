"""The dashboard off means no HTTP server. distributed's scheduler and workers always open one: the
scheduler on 8787 even with ``dashboard_address=None`` (its /info pages, /json/identity.json,
/metrics; and "Port 8787 is already in use" when another cluster holds it). A Session that starts
its cluster with the dashboard off starts those servers with no routes on a free loopback port
(:data:`ROUTES`, :data:`SCHEDULER`) and closes them as the scheduler and each worker start (:func:`install`).
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = ["ROUTES", "SCHEDULER", "install"]

ROUTES = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}  # nothing to serve
SCHEDULER = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}  # no page, no port taken from anyone


def close(server: Any) -> None:
    """Stop ``server``'s (a scheduler's or worker's) HTTP server listening."""
    http = getattr(server, "http_server", None)
    if http is not None:
        http.stop()
    server.services.pop("dashboard", None)


class NoHTTP(SchedulerPlugin):
    name = "flowgpu-no-http"

    async def start(self, scheduler: Any) -> None:
        close(scheduler)


class WorkerNoHTTP(WorkerPlugin):
    """Also on a worker its nanny restarts."""

    name = "flowgpu-worker-no-http"

    def setup(self, worker: Any) -> None:
        close(worker)


def install(client: Any) -> None:
    """Close the HTTP servers of ``client``'s scheduler and workers (those that join later too)."""
    client.register_plugin(NoHTTP(), name=NoHTTP.name)
    client.register_plugin(WorkerNoHTTP(), name=WorkerNoHTTP.name)

"""The client side of the flowgpu dashboard page: install it, and tell it what a run is doing.

A run's :class:`Follower` publishes each item's step graph, and which Dask layer belongs to which
step, to the scheduler's :class:`~flowgpu.diagnostics.dashboard.DashboardPlugin`; without a
distributed client (``session="local"``) it does nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from flowgpu.diagnostics import stepgraph
from flowgpu.diagnostics.dashboard import PAGE, PLUGIN_NAME, DashboardPlugin
from flowgpu.diagnostics.events import Event, ItemFinished, ItemStarted, SessionReady
from flowgpu.diagnostics.livestate import layer_of

__all__ = ["install", "page_link", "step_layers", "Follower", "Tracked"]

logger = logging.getLogger("flowgpu.dashboard")
_TIMEOUT = 10.0  # seconds for one call to the scheduler's board


def install(client: Any) -> bool:
    """Register the dashboard plugin on ``client``'s scheduler (once; again is a no-op). False when
    the scheduler refuses it (e.g. it cannot import flowgpu): runs go on without the page."""
    if client is None:
        return False
    if getattr(client, "_flowgpu_dashboard", None) is None:
        try:
            client.register_plugin(DashboardPlugin(), name=PLUGIN_NAME)
            client._flowgpu_dashboard = True
        except Exception as e:  # noqa: BLE001 - the page is a view; the run must not depend on it
            logger.warning("flowgpu: the dashboard page could not be installed on the scheduler: %s", e)
            client._flowgpu_dashboard = False
    return client._flowgpu_dashboard


def page_link(link: str | None) -> str | None:
    """The flowgpu page's URL from the dashboard's (``http://host:8787/status`` -> ``.../flowgpu``)."""
    if not link:
        return link
    parts = urlsplit(link)
    base = parts.path.rsplit("/", 1)[0] if parts.path.endswith("/status") else parts.path.rstrip("/")
    return parts._replace(path=f"{base}/{PAGE}").geturl()


def _claim(out: dict[str, str], x: Any, owner: str) -> None:
    if hasattr(x, "__dask_graph__"):  # each layer of a dask collection not given yet goes to owner
        graph = x.__dask_graph__()  # a HighLevelGraph's layers, else the names in a plain graph's keys
        for layer in getattr(graph, "layers", None) or dict.fromkeys(layer_of(k) for k in graph):
            out.setdefault(layer, owner)


def step_layers(plan: Any, targets: dict[str, Any] | None = None, prefix: str = "",
                out: dict[str, str] | None = None) -> dict[str, str]:
    """``{layer name: node id}``: each layer of the plan's graph goes to the first node (in plan order)
    whose array holds it, so a step gets the layers it adds; ``targets`` (output -> what computes
    it, e.g. a sink's write) gives the layers left to the output nodes (``out:NAME``)."""
    out = {} if out is None else out
    for name in plan.order:
        node = plan.nodes[name]
        if node.kind == "uses":
            step_layers(plan.children[name], None, f"{prefix}{name}/", out)
        elif node.fused_into in (None, name):
            _claim(out, node.array, prefix + name)
    for name, target in (targets or {}).items():
        _claim(out, target, f"out:{name}")
    return out


class Tracked:
    """A run (or batch item) the dashboard follows. With ``report`` it keeps, for the run report, the
    board's view at its end (``final``) and dask's performance report of its compute (``dask_html``)."""

    def __init__(self, client: Any, run_id: str, description: dict, report: bool = False):
        self.client, self.run_id, self.report = client, run_id, report
        self.description = description
        self.final: dict | None = None
        self.dask_html: str | None = None
        self._since: tuple[float, int] | None = None

    def _call(self, **kwargs: Any) -> Any:
        # bounded: a scheduler that went away must not hold up the run's own error
        return self.client.sync(self.client.scheduler.flowgpu_board, run_id=self.run_id, callback_timeout=_TIMEOUT,
                                **kwargs)

    def finish(self, status: str, error: str | None = None, written: list[str] | None = None) -> None:
        """The run ended: ``status`` ``"ok"`` or ``"failed"`` (with its ``error``); ``written``: the outputs
        moved into place."""
        try:
            self._call(action="finish", status=status, error=error, written=written)
        except Exception:  # noqa: BLE001 - the page is a view
            logger.debug("flowgpu: could not tell the board the run ended", exc_info=True)
        if self.report:  # the board's view at the end, and dask's report of the task stream since the start
            try:
                self.final = self._call(action="view")
            except Exception:  # noqa: BLE001 - a report without live figures is still a report
                logger.debug("flowgpu: no board view", exc_info=True)
            code = f"flowgpu run {self.description.get('file') or self.description.get('name')} ({status})"
            try:
                self.dask_html = self.client.sync(self.client.scheduler.performance_report, start=self._since[0],
                                                  last_count=self._since[1], code=code, mode="inline",
                                                  callback_timeout=6 * _TIMEOUT)
            except Exception:  # noqa: BLE001 - our part of the report stands without dask's
                logger.warning("flowgpu: dask's performance report could not be made", exc_info=True)


class Follower:
    """A run's subscriber that shows each item on the flowgpu page (one row per item of a batch), where
    a dashboard can show it or ``report`` needs what the page records (:meth:`report_data`)."""

    def __init__(self, report: bool = False):
        self.report, self.batch, self.session = report, uuid.uuid4().hex, None
        self.tracked: dict[int, Tracked] = {}  # item index -> its run on the page

    def __call__(self, event: Event) -> None:
        if isinstance(event, SessionReady):
            self.session = event.session
        elif isinstance(event, ItemStarted) and (self.report or self.session.may_serve_dashboard):
            if (tracked := self._follow(event)) is not None:
                self.tracked[event.index] = tracked
        elif isinstance(event, ItemFinished) and event.index in self.tracked:
            o = event.outcome
            self.tracked[event.index].finish("ok" if o.status == "ok" else "failed",
                                             str(o.error) if o.error else o.status, list(o.values))

    def _follow(self, event: ItemStarted) -> Tracked | None:
        client = self.session.client
        if client is None or not install(client):
            return None
        tracked = Tracked(client, uuid.uuid4().hex, event.describe(), self.report)
        graph = stepgraph.to_dict(stepgraph.from_description(tracked.description))
        try:
            count = tracked._call(action="publish", graph=graph, layers=step_layers(event.plan, event.targets),
                                  item=event.label, batch=self.batch,
                                  states={f"out:{n}": "up-to-date" for n in event.cached})
            if self.report:  # the scheduler records the task stream from now on
                client.get_task_stream(start=0, stop=0)
                tracked._since = (time.time(), count)
        except Exception as e:  # noqa: BLE001 - the page is a view; the run must not depend on it
            logger.warning("flowgpu: the dashboard page does not follow this run: %s", e)
            return None
        return tracked

    def report_data(self, index: int) -> dict | None:
        """What the run report shows of item ``index``: ``{"description", "view", "dask_html"}`` (None: not
        followed: up to date, or no distributed client)."""
        t = self.tracked.get(index)
        return {"description": t.description, "view": t.final, "dask_html": t.dask_html} if t is not None else None

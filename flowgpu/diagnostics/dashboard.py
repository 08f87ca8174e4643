"""The flowgpu page of the Dask dashboard: a scheduler plugin and the Bokeh document it serves.

:class:`DashboardPlugin` is registered from a client, so it works on any cluster. On the scheduler it
feeds a :class:`~flowgpu.diagnostics.livestate.Board` from the scheduler's events and, once a second,
each worker's ``flowgpu-memory`` heartbeat metric; answers the client's ``flowgpu_board`` calls; and
adds ``/flowgpu`` (a Bokeh application, as distributed's own pages are) with a tab in the navigation bar.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import IOLoop, PeriodicCallback

from flowgpu.diagnostics import stepgraph, templating
from flowgpu.diagnostics.livestate import MOVES, TIERS, Board

__all__ = ["DashboardPlugin", "PLUGIN_NAME", "PAGE", "install_page", "render_tables"]

PLUGIN_NAME = "flowgpu-dashboard"
PAGE = "flowgpu"


class DashboardPlugin(SchedulerPlugin):
    """Runs, steps and memory on the scheduler, and the dashboard page that shows them."""

    name = PLUGIN_NAME
    idempotent = True  # registering it again (every run does) keeps the board of the earlier runs

    def __init__(self, interval: float = 1.0):
        self.interval = interval

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.board = Board()
        scheduler.handlers["flowgpu_board"] = self.handle
        self._sampler = PeriodicCallback(self.sample, self.interval * 1000)
        self._sampler.start()
        self.sample()
        install_page(scheduler)

    async def close(self) -> None:
        self._sampler.stop()

    def handle(self, action: str, run_id: str | None = None, **kwargs: Any) -> Any:
        """The client's calls: ``publish`` (a run starts), ``finish`` (it ended), ``view``."""
        if action == "publish":
            self.board.publish(run_id, **kwargs)
            return self.scheduler.monitor.count  # where dask's performance report of the run starts
        elif action == "finish":
            self.sample()  # the last figures of the run
            self.board.finish(run_id, **kwargs)
        elif action == "view":
            return self.board.view(run_id)
        else:
            raise ValueError(f"unknown flowgpu_board action {action!r}")
        return None

    def update_graph(self, scheduler: Any, *, tasks: list | None = None, **kwargs: Any) -> None:
        ts = scheduler.tasks
        self.board.add_tasks((k, [d.key for d in ts[k].dependencies]) for k in tasks or () if k in ts)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        nbytes, seconds = None, 0.0
        if finish == "memory":
            ts = self.scheduler.tasks.get(key)
            nbytes = ts.nbytes if ts is not None and ts.nbytes >= 0 else None
            seconds = sum(s["stop"] - s["start"] for s in kwargs.get("startstops") or () if s.get("action") == "compute")
        self.board.transition(key, start, finish, nbytes, seconds, kwargs.get("exception_text"))

    def sample(self) -> None:
        workers = {}
        for addr, ws in self.scheduler.workers.items():
            m = dict(ws.metrics.get("flowgpu-memory") or {})
            m["gpu_memory_used"] = ws.metrics.get("gpu_memory_used")
            m["process"] = ws.memory.process
            workers[addr] = m
        self.board.sample(workers)


def install_page(scheduler: Any) -> bool:
    """Add ``/flowgpu`` and its tab to the scheduler's running dashboard; False where it has none."""
    http = getattr(scheduler, "http_application", None)
    try:
        from bokeh.server.server import BokehTornado  # noqa: PLC0415 - the dashboard's optional stack
        from distributed.dashboard.core import BokehApplication  # noqa: PLC0415
        from distributed.dashboard.scheduler import template_variables  # noqa: PLC0415
    except ImportError:
        return False
    apps = getattr(http, "applications", [])
    dashboards = [a for a in apps if isinstance(a, BokehTornado)]
    if not dashboards:
        return False  # the dashboard is off
    if any(getattr(a, "_flowgpu_page", False) for a in apps):
        return True
    variables = template_variables(scheduler)  # the dict every page's navigation bar reads
    if PAGE not in variables["pages"]:
        variables["pages"].insert(1, PAGE)
    app = BokehApplication({f"/{PAGE}": flowgpu_doc}, scheduler, prefix=dashboards[0]._prefix,
                           template_variables=variables)
    app._flowgpu_page = True
    http.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return True


# -- the page ------------------------------------------------------------------------------------------

def render_tables(view: dict[str, Any]) -> dict[str, str]:
    """The HTML of the page's tables (steps, batch items, memory per worker) from a board view
    (``templates/dashboard.html.j2``)."""
    page = templating.ENV.get_template("dashboard.html.j2").module  # its macros
    return {"head": str(page.head(view["run"])), "steps": str(page.steps(view, stepgraph.STATE_COLORS)),
            "items": str(page.items(view)), "memory": str(page.memory(view))}


def _columns(names: tuple[str, ...], rows: list[tuple]) -> dict[str, list]:
    return {k: [row[i] for row in rows] for i, k in enumerate(names)}


def _graph_data(view: dict[str, Any]) -> tuple[dict, dict]:
    """The step graph's boxes and arrows as Bokeh columns, each box coloured by its state on the board."""
    g = stepgraph.from_dict(view["graph"] or {"name": "", "nodes": [], "edges": []})
    xy = {n: (c * 2.0, -r * 1.0) for n, (c, r) in stepgraph.layout(g).items()}
    state = {s["id"]: s for s in view["steps"]}
    boxes = []
    for n, node in g.nodes.items():
        st, out = state.get(n, {"state": "waiting", "done": 0, "total": 0}), node.kind == "output"
        label = f"output {node.label}" if out else node.label
        boxes.append((*xy[n], "#c8e6c9" if out else stepgraph.STATE_COLORS.get(st["state"], "#fff"),
                      f"{label} {st['done']}/{st['total']}" if st["total"] else label,
                      "output" if out else st["state"], n))
    arrows = [(xy[e.source][0] + 0.7, xy[e.source][1], xy[e.target][0] - 0.7, xy[e.target][1])
              for e in g.edges]
    return (_columns(("x", "y", "color", "label", "state", "id"), boxes),
            _columns(("x0", "y0", "x1", "y1"), arrows))


def flowgpu_doc(scheduler: Any, extra: dict, doc: Any) -> None:
    """The Bokeh document of ``/flowgpu``, refreshed twice a second from the scheduler's board."""
    from bokeh.layouts import column, row  # noqa: PLC0415 - the dashboard's optional stack
    from bokeh.models import ColumnDataSource, Div, HoverTool, NumeralTickFormatter
    from bokeh.plotting import figure
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    board: Board = scheduler.plugins[PLUGIN_NAME].board
    tables = {k: Div(text="", name=f"flowgpu-{k}-div", sizing_mode="stretch_width") for k in
              ("head", "steps", "items", "memory")}
    nodes, edges = map(ColumnDataSource, _graph_data(board.view()))
    wide = {"sizing_mode": "stretch_width", "tools": "pan,wheel_zoom,reset"}
    graph = figure(title="steps (colour: state)", height=320, x_axis_type=None, y_axis_type=None, **wide)
    graph.segment("x0", "y0", "x1", "y1", source=edges, line_color="#777")
    graph.rect("x", "y", width=1.4, height=0.6, fill_color="color", line_color="#455a64", source=nodes)
    graph.text("x", "y", text="label", text_align="center", text_baseline="middle", text_font_size="9pt", source=nodes)
    graph.add_tools(HoverTool(tooltips=[("step", "@id"), ("state", "@state")]))
    graph.grid.visible = False
    series = ColumnDataSource({"t": [], **{t: [] for t in TIERS}, "gbps": []})
    tiers = figure(title="bytes per tier, all workers", height=240, x_axis_type="datetime", **wide)
    for tier, color in zip(TIERS, ("#1e88e5", "#fb8c00", "#8e24aa")):
        tiers.line("t", tier, source=series, legend_label=tier, line_color=color, line_width=2)
    tiers.legend.location = "top_left"
    tiers.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    moves = figure(title=f"moves between tiers, GB/s ({', '.join(m.replace('_', ' ') for m in MOVES[:2])}, ...)",
                   height=240, x_axis_type="datetime", **wide)
    moves.line("t", "gbps", source=series, line_color="#43a047", line_width=2)

    def update() -> None:
        view = board.view()
        for k, text in render_tables(view).items():
            if tables[k].text != text:
                tables[k].text = text
        nodes.data, edges.data = _graph_data(view)
        s = view["memory"]["series"]
        series.data = {**s, "t": [t * 1000 for t in s["t"]]}

    update()
    doc.add_periodic_callback(update, 500)
    doc.add_root(column(tables["head"], graph, tables["steps"], tables["items"], row(tiers, moves, sizing_mode="stretch_width"),
                        tables["memory"], sizing_mode="stretch_width"))
    doc.title = "Dask: flowgpu"
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME

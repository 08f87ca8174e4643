"""``flowgpu run --report run.html``: one self-contained HTML file per run.

It holds the run's summary, the step graph coloured by what happened, a table of the plan beside
what really happened for every step (tasks, bytes, compute time, errors), the peak memory per
worker against the plan's estimate, two plots drawn as inline SVG (compute time per step; bytes per
tier and the moves between tiers as GB/s over time) and dask's own ``performance_report`` (task
stream, worker profile, bandwidth) embedded as it is. Nothing is loaded from the network.
"""

from __future__ import annotations

import html
import os
import tempfile
from typing import Any

from flowgpu.diagnostics import stepgraph
from flowgpu.diagnostics.livestate import TIERS
from flowgpu.diagnostics.report import format_bytes
from flowgpu.errors import OutputExistsError
from flowgpu.io.atomic import starts_with

__all__ = ["is_report", "render", "write"]
_HEAD = b"<!DOCTYPE html><html><head><meta charset='utf-8'><title>flowgpu run report: "  # how render() begins

_STYLE = """
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#263238}
table{border-collapse:collapse;font-size:13px;margin:8px 0 20px}
td,th{border:1px solid #cfd8dc;padding:3px 8px;text-align:left}th{background:#eceff1}
td.num{text-align:right}.failed{color:#c62828}h2{margin-top:28px}
iframe{width:100%;height:900px;border:1px solid #cfd8dc}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _bars(rows: list[tuple[str, float]], title: str, unit: str = "s") -> str:
    """A horizontal bar chart as inline SVG."""
    top = max((v for _, v in rows), default=0.0) or 1.0
    h = 22 * len(rows) + 40
    parts = [f'<svg class="plot" id="plot-time-per-step" xmlns="http://www.w3.org/2000/svg" width="720" '
             f'height="{h}" font-size="12"><title>{_e(title)}</title>',
             f'<text x="0" y="14" font-weight="bold">{_e(title)}</text>']
    for i, (label, v) in enumerate(rows):
        y = 28 + 22 * i
        w = 440 * v / top
        parts.append(f'<text x="150" y="{y + 13}" text-anchor="end">{_e(label)}</text>'
                     f'<rect class="bar" data-step="{_e(label)}" x="160" y="{y}" width="{w:.1f}" height="16" '
                     f'fill="#42a5f5"/><text x="{165 + w:.1f}" y="{y + 13}">{v:.3g} {unit}</text>')
    return "\n".join(parts) + "</svg>"


def _lines(xs: list[float], series: dict[str, list[float]], title: str, pid: str, fmt) -> str:
    """A line chart as inline SVG: one polyline per series, the y axis from 0 to the largest value."""
    w, h, left, bottom = 720, 220, 70, 30
    t0, t1 = (xs[0], xs[-1]) if xs else (0.0, 1.0)
    top = max((max(v) for v in series.values() if v), default=0.0) or 1.0
    colors = ("#1e88e5", "#fb8c00", "#8e24aa", "#43a047")
    parts = [f'<svg class="plot" id="{pid}" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 40}" '
             f'font-size="12"><title>{_e(title)}</title><text x="0" y="14" font-weight="bold">{_e(title)}</text>',
             f'<line x1="{left}" y1="{h}" x2="{w}" y2="{h}" stroke="#90a4ae"/>'
             f'<line x1="{left}" y1="24" x2="{left}" y2="{h}" stroke="#90a4ae"/>'
             f'<text x="{left - 4}" y="30" text-anchor="end">{_e(fmt(top))}</text>'
             f'<text x="{left - 4}" y="{h}" text-anchor="end">0</text>'
             f'<text x="{w}" y="{h + bottom - 12}" text-anchor="end">{t1 - t0:.1f} s</text>']
    for i, (name, values) in enumerate(series.items()):
        pts = " ".join(f"{left + (w - left) * ((t - t0) / ((t1 - t0) or 1)):.1f},{h - (h - 24) * v / top:.1f}"
                       for t, v in zip(xs, values))
        color = colors[i % len(colors)]
        parts.append(f'<polyline class="series" data-name="{_e(name)}" points="{pts}" fill="none" stroke="{color}" '
                     f'stroke-width="2"/><text x="{left + 10 + 110 * i}" y="{h + bottom}" fill="{color}">'
                     f'{_e(name)}</text>')
    return "\n".join(parts) + "</svg>"


def _seconds(step: dict) -> str:
    return f"{step['seconds']:.3f} s" if step else "-"


def _step_table(desc: dict[str, Any], view: dict | None) -> str:
    happened = {s["id"]: s for s in (view or {}).get("steps", [])}
    rows = []
    for r in desc["steps"]:
        s = happened.get(r["name"], {})
        err = f'<td class="failed">{_e(s.get("error"))}</td>' if s.get("error") else "<td></td>"
        rows.append(f'<tr data-step="{_e(r["name"])}"><td>{_e(r["name"])}</td><td>{_e(r["what"])}</td>'
                    f'<td>{_e(s.get("state", "-"))}</td><td>{_e(r.get("shape"))}</td><td>{_e(r.get("chunks"))}</td>'
                    f'<td class="num">{_e(r.get("tasks"))}</td><td class="num">{_e(s.get("total", "-"))}</td>'
                    f'<td class="num">{format_bytes(r.get("bytes"))}</td>'
                    f'<td class="num">{format_bytes(s["bytes"]) if s else "-"}</td>'
                    f'<td class="num">{_seconds(s)}</td>{err}</tr>')
    return ('<table id="steps"><tr><th>step</th><th>op / source</th><th>state</th><th>shape</th><th>chunks</th>'
            '<th>tasks planned</th><th>tasks run</th><th>bytes planned</th><th>bytes produced</th>'
            '<th>compute time</th><th>error</th></tr>' + "".join(rows) + "</table>")


def _memory_table(desc: dict[str, Any], view: dict | None) -> str:
    peaks = ((view or {}).get("run") or {}).get("peak") or {}
    est = desc.get("peak_worker_bytes")
    rows = "".join(f'<tr data-worker="{_e(w)}"><td>{_e(w)}</td><td class="num">{format_bytes(p["store"])}</td>'
                   f'<td class="num">{format_bytes(p["process"])}</td><td class="num">{format_bytes(est)}</td></tr>'
                   for w, p in sorted(peaks.items()))
    return ('<table id="memory"><tr><th>worker</th><th>peak bytes in its data store</th><th>peak process memory</th>'
            '<th>plan\'s estimate per worker</th></tr>' + (rows or '<tr><td colspan="4">no cluster workers '
                                                             '(run in this process)</td></tr>') + "</table>")


def _section(part: dict[str, Any], sid: str) -> list[str]:
    """One run's (or batch item's) graph, tables and plots; ``sid`` keeps the ids of a batch's apart."""
    desc, view = part["description"], part.get("view")
    graph = stepgraph.from_description(desc)
    states = {s["id"]: s["state"] for s in view["steps"]} if view else None
    steps = [(s["id"], s["seconds"]) for s in (view or {}).get("steps", []) if s["kind"] != "output"]
    mem = ((view or {}).get("memory") or {}).get("series") or {"t": []}
    out = ["<h3>Steps</h3>", stepgraph.to_svg(graph, states), "<h3>The plan beside what happened</h3>",
           _step_table(desc, view).replace('id="steps"', f'id="steps{sid}"'), "<h3>Memory per worker</h3>",
           _memory_table(desc, view).replace('id="memory"', f'id="memory{sid}"'), "<h3>Plots</h3>",
           _bars(steps, "compute time per step").replace('id="plot-time-per-step"', f'id="plot-time-per-step{sid}"')
           if steps else "<p>no per-step times (run in this process)</p>"]
    if mem["t"]:
        out.append(_lines(mem["t"], {t: mem[t] for t in TIERS}, "bytes per tier, all workers", f"plot-tiers{sid}",
                          format_bytes))
        out.append(_lines(mem["t"], {"GB/s": mem["gbps"]}, "spilling throughput (moves between tiers), GB/s",
                          f"plot-spilling{sid}", lambda v: f"{v:.2f} GB/s"))
    return out


def _items_table(items: list[dict[str, Any]]) -> str:
    rows = "".join(f'<tr data-item="{i["index"]}" data-status="{_e(i["status"])}"><td>{i["index"] + 1}</td>'
                   f'<td>{_e(", ".join(f"{k}={v}" for k, v in (i.get("params") or {}).items()))}</td>'
                   f'<td>{_e(i["status"])}</td><td class="num">{i.get("wall_seconds") or 0:.2f} s</td>'
                   f'<td class="failed">{_e(i.get("error"))}</td></tr>' for i in items)
    return ('<table id="items"><tr><th>item</th><th>params</th><th>status</th><th>time</th><th>error</th></tr>'
            + rows + "</table>")


def render(summary: dict[str, Any], runs: list[tuple[str, dict[str, Any]]]) -> str:
    """The report's HTML: ``summary`` (the run's or the batch's summary) and, per run or batch item,
    ``(label, {"description": pipeline.describe(plan), "view": the dashboard board's view of it at
    its end (None without a cluster), "dask_html": dask's performance report of the same time})``."""
    moves = summary.get("memory") or {}
    moved = "; ".join(f"{a.replace('_', ' ')} {format_bytes(m['bytes'])}" + (f" at {m['gbps']:.2f} GB/s" if m.get("gbps")
                                                                            else "")
                      for a, m in (moves.get("moves") or {}).items()) or "nothing moved between tiers"
    session = summary.get("session") or {}
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>flowgpu run report: {_e(summary['name'])}"
           f"</title><style>{_STYLE}</style></head><body>",
           f'<h1>{_e(summary["name"])}: <span id="status">{_e(summary["status"])}</span> in '
           f'{summary["wall_seconds"]:.2f} s</h1>',
           (f'<p class="failed" id="error">{_e(summary.get("error_type"))}: {_e(summary["error"])}'
            + (f' (step {_e(summary["step"])})' if summary.get("step") else "") + "</p>" if summary.get("error") else ""),
           f'<p>{_e(summary.get("file") or "")} &middot; {summary.get("tasks", 0):,} tasks on {_e(session.get("n_workers"))} '
           f'worker(s) ({_e(session.get("backend"))}) &middot; read {format_bytes(summary.get("bytes_read"))}, '
           f'wrote {format_bytes(summary.get("bytes_written"))} &middot; spilling: {_e(moved)}</p>']
    if "items" in summary:
        out += ["<h2>Items</h2>", _items_table(summary["items"])]
    for i, (label, part) in enumerate(runs):
        out.append(f"<h2>{_e(label)}</h2>" if len(runs) > 1 else "")
        out += _section(part, f"-{i}" if i else "")
    dask_html = next((p["dask_html"] for _, p in runs if p.get("dask_html")), None)
    if dask_html:
        out += ["<h2>Dask performance report</h2>",
                f'<iframe id="dask-report" srcdoc="{html.escape(dask_html, quote=True)}"></iframe>']
    out.append("</body></html>")
    return "\n".join(out)


def is_report(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run report that flowgpu wrote (a file that begins as :func:`render` begins one)."""
    return starts_with(os.fspath(path), _HEAD)


def write(path: str | os.PathLike, text: str, overwrite: bool = True) -> None:
    """Write ``text`` at ``path`` atomically (a file beside it, renamed over it when complete).
    ``overwrite=False`` (a run's ``--report``): refuse to replace a file that is not a run report."""
    path = os.fspath(path)
    if not overwrite and os.path.lexists(path) and not is_report(path):
        raise OutputExistsError(f"{path!r} already exists and is not a run report flowgpu wrote; choose another "
                                "path, or pass --overwrite (overwrite=True) to replace it")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as an output's folder is made
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".part",
                               dir=os.path.dirname(os.path.abspath(path)))
    ok = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        ok = True
    finally:
        if not ok and os.path.exists(tmp):
            os.unlink(tmp)

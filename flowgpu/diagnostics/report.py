"""Rich tables for ``flowgpu plan`` and the end-of-run summary (plain dicts in, text out)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["format_bytes", "render_plan", "render_summary"]


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _shape(s: Any) -> str:
    return "-" if s is None else "(" + ", ".join(str(v) for v in s) + ("," if len(s) == 1 else "") + ")"


def render_plan(desc: dict[str, Any], console: Console) -> None:
    """Print the steps of a plan in order, then the outputs and the totals."""
    title = f"plan of {desc['name']!r}" + (f" ({desc['file']})" if desc.get("file") else "")
    t = Table(title=title, title_justify="left")
    for col in ("step", "op / source", "shape", "dtype", "chunks", "tasks", "bytes", "fused"):
        t.add_column(col, justify="right" if col in ("tasks", "bytes") else "left")
    for r in desc["steps"]:
        fused = r.get("fused") or (f"into {r['fused_into']}" if r.get("fused_into") else "")
        t.add_row(r["name"], r["what"], _shape(r["shape"]), r["dtype"] or "-", _shape(r["chunks"]),
                  str(r["tasks"]) if r["shape"] is not None else "-",
                  format_bytes(r["bytes"]) if r["shape"] is not None else "-", fused)
    console.print(t)
    o = Table(title="outputs", title_justify="left")
    for col in ("output", "from", "sink", "shape", "dtype", "bytes", "path"):
        o.add_column(col)
    for name, r in desc["outputs"].items():
        o.add_row(name, r["from"], r["sink"], _shape(r["shape"]), r["dtype"], format_bytes(r["bytes"]), r["path"] or "")
    console.print(o)
    console.print(f"tasks in the graph: {desc['tasks']:,}   fused: {'yes' if desc['fused'] else 'no'}   "
                  f"estimated peak memory per worker: {format_bytes(desc['peak_worker_bytes'])} "
                  f"({format_bytes(desc['peak_task_bytes'])} per task x {desc['threads_per_worker']} thread(s), "
                  "and chunks waiting)")


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """Print each output (shape, dtype, where it went or its value), wall time and bytes moved."""
    if console.quiet:  # building the table costs milliseconds; a quiet run does not pay them
        return
    t = Table(title=f"{summary['name']}: {summary['status']} in {summary['wall_seconds']:.2f}s", title_justify="left")
    for col in ("output", "shape", "dtype", "location / value"):
        t.add_column(col)
    for name, o in summary["outputs"].items():
        where = o.get("location")
        if where is None:
            text = repr(o.get("value"))
            where = text if len(text) <= 80 else text[:77] + "..."
        t.add_row(name, _shape(o["shape"]), o["dtype"], where)
    console.print(t)
    console.print(f"read {format_bytes(summary['bytes_read'])}, wrote {format_bytes(summary['bytes_written'])}; "
                  f"{summary['tasks']:,} tasks on {summary['session'].get('n_workers', '?')} worker(s) "
                  f"({summary['session'].get('backend', '?')})")
    memory = summary.get("memory") or {}
    moves = memory.get("moves") or {}
    if moves:
        parts = []
        for act, m in moves.items():
            rate = f" at {m['gbps']:.1f} GB/s" if m.get("gbps") else ""
            parts.append(f"{act.replace('_', ' ')} {format_bytes(m['bytes'])} in {m['count']} move(s){rate}")
        console.print("spilling: " + "; ".join(parts))
    for err in memory.get("errors") or []:
        console.print(f"[yellow]spilling: {err}[/yellow]")

"""Rich tables for ``flowgpu plan`` and the end-of-run summary (plain dicts in, text out). Every text
from the user (names, paths, params, values, errors) is escaped: rich reads ``[run]`` or ``[nan, 1.0]``
as markup and drops it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

__all__ = ["format_bytes", "render_batch", "render_plan", "render_status", "render_summary", "storage_lines",
           "workers_line"]


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _shape(s: Any) -> str:
    return "-" if s is None else "(" + ", ".join(str(v) for v in s) + ("," if len(s) == 1 else "") + ")"


def render_plan(desc: dict[str, Any], console: Console) -> None:
    """Print the steps of a plan in order, then the outputs and the totals."""
    title = escape(f"plan of {desc['name']!r}" + (f" ({desc['file']})" if desc.get("file") else ""))
    t = Table("step", "op / source", "shape", "dtype", "chunks", Column("tasks", justify="right"),
              Column("bytes", justify="right"), "fused", title=title, title_justify="left")
    for r in desc["steps"]:
        fused = r.get("fused") or (f"into {r['fused_into']}" if r.get("fused_into") else "")
        _row(t, r["name"], r["what"], _shape(r["shape"]), r["dtype"] or "-", _shape(r["chunks"]),
             str(r["tasks"]) if r["shape"] is not None else "-",
             format_bytes(r["bytes"]) if r["shape"] is not None else "-", fused)
    console.print(t)
    o = Table(*_columns("output", "from", "sink", "shape", "dtype", "bytes", "path"), title="outputs",
              title_justify="left")  # folded, not cut: the whole path
    for name, r in desc["outputs"].items():
        _row(o, name, r["from"], r["sink"], _shape(r["shape"]), r["dtype"], format_bytes(r["bytes"]), r["path"] or "")
    console.print(o)
    console.print(f"tasks in the graph: {desc['tasks']:,}   fused: {'yes' if desc['fused'] else 'no'}   "
                  f"estimated peak memory per worker: {format_bytes(desc['peak_worker_bytes'])} "
                  f"({format_bytes(desc['peak_task_bytes'])} per task x {desc['threads_per_worker']} thread(s), "
                  "and chunks waiting)")
    held = desc.get("held_whole")
    if held:
        console.print(f"{escape(repr(held['name']))} is held whole ({format_bytes(held['bytes'])}, shared by the "
                      "workers): a step reads it chunk by chunk and through a reduction of all of it, so every chunk "
                      "waits for that reduction (spilled past the memory limit)")


def _row(table: Table, *cells: str) -> None:
    table.add_row(*map(escape, cells))


def _columns(*names: str) -> list[Column]:
    return [Column(escape(c), overflow="fold") for c in names]


def _where(o: dict[str, Any], width: int = 80) -> str:
    if o.get("location") is not None:
        return o["location"]
    text = repr(o.get("value"))
    return text if len(text) <= width else text[:width - 3] + "..."


def render_batch(summary: dict[str, Any], console: Console) -> None:
    """Print one row per item of a batch: its params, status, outputs (values or locations), time, error."""
    items = summary["items"]
    counts = ", ".join(f"{n} {k}" for k, n in summary["counts"].items())
    names = list(items[0]["params"]) if items else []
    outputs = list(items[0]["outputs"]) if items else []
    t = Table(*_columns("#", *names, "status", *outputs, "seconds", "error"),
              title=escape(f"{summary['name']}: {len(items)} items in {summary['wall_seconds']:.2f}s ({counts})"),
              title_justify="left")
    for item in items:
        cells = [str(item["index"] + 1), *(str(item["params"][k]) for k in names), item["status"]]
        cells += [_where(item["outputs"][o], 40) if item["outputs"][o].get("status") != "not-computed" else "-"
                  for o in outputs]
        cells += [f"{item['wall_seconds']:.2f}" if item["status"] not in ("up-to-date", "cancelled") else "-",
                  item.get("error") or ""]
        _row(t, *cells)
    console.print(t)


def render_status(status: dict[str, Any], console: Console) -> None:
    """Print what a run would do: each output of each item, up to date or why it would be computed (or its
    table written again)."""
    names = list(status["items"][0]["params"]) if status["items"] else []
    t = Table(*_columns("#", *names, "output", "status", "why"), title=escape(f"{status['name']}: {status['line']}"),
              title_justify="left")
    for item in status["items"]:
        for out, v in item["outputs"].items():
            fresh = v["reason"] == "up to date"
            said = v["reason"] if fresh else "to write" if v["up_to_date"] else "to compute"
            _row(t, str(item["index"] + 1), *(str(item["params"][k]) for k in names), out, said,
                 "" if fresh else v["reason"])
    console.print(t)


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """Print each output (shape, dtype, where it went or its value), wall time and bytes moved."""
    if console.quiet:  # building the table costs milliseconds; a quiet run does not pay them
        return
    t = Table("output", "shape", "dtype", "location / value", "status",
              title=escape(f"{summary['name']}: {summary['status']} in {summary['wall_seconds']:.2f}s"),
              title_justify="left")
    for name, o in summary["outputs"].items():
        _row(t, name, _shape(o["shape"]), o["dtype"], _where(o), o.get("status", "computed"))
    console.print(t)
    if not summary.get("tasks"):
        return  # nothing was computed: nothing read, written or moved
    console.print(f"read {format_bytes(summary['bytes_read'])}, wrote {format_bytes(summary['bytes_written'])}; "
                  f"{summary['tasks']:,} tasks on {summary['session'].get('n_workers', '?')} worker(s) "
                  f"({summary['session'].get('backend', '?')})")
    places = workers_line(summary["session"].get("workers") or [])
    if places:
        console.print(places, soft_wrap=True, markup=False)
    memory = summary.get("memory") or {}
    moves = {a: m for a, m in (memory.get("moves") or {}).items() if not a.startswith("storage_")}
    if moves:
        console.print("spilling: " + "; ".join(
            f"{act.replace('_', ' ')} {format_bytes(m['bytes'])} in {m['count']} move(s)"
            + (f" at {m['gbps']:.1f} GB/s" if m.get("gbps") else "") for act, m in moves.items()))
    for err in memory.get("errors") or []:
        console.print(f"[yellow]spilling: {escape(err)}[/yellow]")
    for line in storage_lines(memory):
        console.print(line, soft_wrap=True, markup=False)


def workers_line(workers: list[dict[str, Any]]) -> str | None:
    """``workers: 2 on vm in /data/run`` (one part per host and working directory), or None."""
    places = Counter((w.get("host"), w.get("cwd")) for w in workers)
    if not places:
        return None
    return "workers: " + "; ".join(f"{n} on {host} in {cwd}" for (host, cwd), n in places.items())


def storage_lines(memory: dict[str, Any]) -> list[str]:
    """``storage: read X from storage, Y compressed moved, decode Z s, W GB/s``, then a line for the
    writes and one per reason chunks went through the CPU, from the ``storage_*`` moves and events
    (GB/s: bytes decoded per second spent reading and decoding, summed over tasks)."""
    moves, events = memory.get("moves") or {}, memory.get("events") or {}
    get = lambda a, k: (moves.get("storage_" + a) or {}).get(k, 0)  # noqa: E731
    parts = []
    if get("read", "count"):
        busy = get("read", "seconds") + get("decode", "seconds")
        rate = f", {get('decode', 'bytes') / busy / 1e9:.1f} GB/s" if busy > 0 else ""
        parts.append(f"read {format_bytes(get('read', 'bytes'))} from storage, {format_bytes(get('moved', 'bytes'))} "
                     f"compressed moved, decode {get('decode', 'seconds'):.2f} s{rate}")
    if get("write", "count"):
        busy = get("encode", "seconds") + get("write", "seconds")
        rate = f", {get('encode', 'bytes') / busy / 1e9:.1f} GB/s" if busy > 0 else ""
        parts.append(f"wrote {format_bytes(get('write', 'bytes'))} (encoded {format_bytes(get('encode', 'bytes'))} "
                     f"in {get('encode', 'seconds'):.2f} s{rate})")
    parts += [f"{n} chunk(s) decoded on the CPU: {e.split(': ', 1)[1]}" for e, n in events.items()
              if e.startswith("storage_fallback: ")]
    return ["storage: " + p for p in parts]

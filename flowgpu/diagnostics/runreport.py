"""``flowgpu run --report run.html``: one self-contained HTML file per run (``templates/report.html.j2``).

The summary, the step graph coloured by what happened, the plan beside what happened, peak memory per
worker, inline SVG plots and dask's own ``performance_report``; nothing is loaded from the network.
"""

from __future__ import annotations

import os
from typing import Any

from markupsafe import Markup

from flowgpu.diagnostics import stepgraph, templating
from flowgpu.diagnostics.livestate import TIERS
from flowgpu.io.atomic import starts_with, write_text

__all__ = ["is_report", "render", "write"]
_HEAD = b"<!DOCTYPE html><html><head><meta charset='utf-8'><title>flowgpu run report: "  # how render() begins


def _section(label: str, part: dict[str, Any], sid: str, step: str | None = None) -> dict[str, Any]:
    """What the template shows of one run (or batch item); ``sid`` keeps the ids of a batch's apart;
    ``step``: the step its summary says failed."""
    desc, view = part["description"], part.get("view") or {}
    happened = {s["id"]: dict(s) for s in view.get("steps", [])}
    if step in happened:  # the scheduler saw the error in the tasks it ran, which may be the next step's (Dask's
        # optimizer fuses a map_blocks into the sum it feeds): it goes where the summary says it was raised
        said = next((s["error"] for s in happened.values() if s["error"]), None)
        for s in happened.values():
            s["error"] = None if s["error"] == said else s["error"]
        happened[step].update(state="failed", error=said)
    mem = (view.get("memory") or {}).get("series") or {"t": []}
    tiers = {t: mem[t] for t in TIERS} if mem["t"] else {}
    states = {i: s["state"] for i, s in happened.items()} if view else None
    return {"label": label, "sid": sid, "estimate": desc.get("peak_worker_bytes"), "memory": mem, "tiers": tiers,
            "graph": Markup(stepgraph.to_svg(stepgraph.from_description(desc), states)),
            "steps": [(r, happened.get(r["name"], {})) for r in desc["steps"]],
            "outputs": [(name, r, happened.get(f"out:{name}", {})) for name, r in desc["outputs"].items()],
            "peaks": sorted(((view.get("run") or {}).get("peak") or {}).items()),
            "times": [(s["id"], s["seconds"]) for s in view.get("steps", []) if s["kind"] != "output"]}


def render(summary: dict[str, Any], runs: list[tuple[str, dict[str, Any]]]) -> str:
    """The report's HTML (``templates/report.html.j2``): ``summary`` (the run's or the batch's summary)
    and, per run or batch item, ``(label, {"description": pipeline.describe(plan), "view": the dashboard
    board's view of it at its end (None without a cluster), "dask_html": dask's performance report of
    the same time})``. The header's tasks are those the scheduler ran, the table's sum, where the board saw
    them; else the summary's (None: not known)."""
    page = templating.ENV.get_template("report.html.j2")
    named = [i.get("step") for i in summary["items"]] if "items" in summary else [summary.get("step")]
    views = [p["view"] for _, p in runs if p.get("view")]
    ran = sum(s["done"] + s["erred"] for v in views for s in v["steps"]) if views else None
    return page.render(summary=summary, session=summary.get("session") or {},
                       moves=(summary.get("memory") or {}).get("moves") or {},
                       tasks=summary.get("tasks") if ran is None else ran, ran=ran is not None,
                       runs=[_section(label, part, f"-{i}" if i else "", step)
                             for i, ((label, part), step) in enumerate(zip(runs, named))],
                       dask_html=next((p["dask_html"] for _, p in runs if p.get("dask_html")), None))


def is_report(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run report that flowgpu wrote (a file that begins as :func:`render` begins one)."""
    return starts_with(os.fspath(path), _HEAD)


def write(path: str | os.PathLike, text: str, overwrite: bool = True) -> None:
    """Write ``text`` at ``path`` atomically; ``overwrite=False`` (a run's ``--report``): refuse to
    replace a file that is not a run report."""
    write_text(path, text, head=None if overwrite else _HEAD, what="run report", public=True)

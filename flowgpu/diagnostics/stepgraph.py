"""The step graph of a pipeline: inputs, steps and outputs as nodes, their dependencies as edges.

Built from the plan's description (``pipeline.describe``), it is drawn by ``flowgpu plan --format
dot|svg``, the dashboard page and the run report. A fused step gets a dashed edge to its root; the
steps of an included pipeline (``uses``) are named ``parent/step`` and hang under the ``uses`` node.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import asdict, dataclass
from graphlib import TopologicalSorter
from typing import Any

from flowgpu.diagnostics import templating

__all__ = ["StepGraph", "GraphNode", "Edge", "STATE_COLORS", "from_description", "layout",
           "to_dot", "to_svg", "to_dict", "from_dict"]

# What a node can be doing during a run, and how every view colours it.
STATE_COLORS = {"waiting": "#e0e0e0", "running": "#ffd54f", "done": "#81c784", "failed": "#e57373",
                "fused": "#b0bec5", "up-to-date": "#90caf9", "cancelled": "#d7ccc8", "not-written": "#ffcc80"}
KIND_COLORS = {"input": "#bbdefb", "step": "#fff9c4", "uses": "#e1bee7", "output": "#c8e6c9"}


@dataclass
class GraphNode:
    """One input, step, included pipeline (``uses``) or output."""

    id: str
    label: str
    kind: str  # "input", "step", "uses" or "output"
    what: str  # source, op, included file, or sink
    parent: str | None = None  # the uses step that includes it
    fused_into: str | None = None


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "data", "uses" (into an included pipeline), "fused" (into its root), "output"


@dataclass
class StepGraph:
    name: str
    nodes: dict[str, GraphNode]
    edges: list[Edge]


def from_description(desc: dict[str, Any]) -> StepGraph:
    """The step graph of a plan description (``pipeline.describe(plan)``)."""
    nodes: dict[str, GraphNode] = {}
    edges: list[Edge] = []
    for row in desc["steps"]:
        name = row["name"]
        parent, _, label = name.rpartition("/")
        nodes[name] = GraphNode(name, label, row["kind"], str(row.get("what") or ""), parent or None,
                                row.get("fused_into"))
        edges += [Edge(dep, name, "data") for dep in row.get("deps") or []]
        if row["kind"] == "input" and row.get("what") == "bound" and parent:
            edges.append(Edge(parent, name, "uses"))
        if row.get("fused_into"):
            edges.append(Edge(name, row["fused_into"], "fused"))
    for out, o in desc.get("outputs", {}).items():
        nodes[f"out:{out}"] = GraphNode(f"out:{out}", out, "output", str(o.get("sink") or ""))
        edges.append(Edge(str(o["from"]).split(".")[0], f"out:{out}", "output"))
    edges = [e for e in edges if e.source in nodes and e.target in nodes]
    return StepGraph(str(desc.get("name") or "pipeline"), nodes, edges)


def layout(graph: StepGraph) -> dict[str, tuple[int, int]]:
    """``{node: (column, row)}``: columns by longest path from an input, rows in plan order."""
    preds: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for e in graph.edges:
        preds[e.target].append(e.source)
    depth: dict[str, int] = {}
    for n in TopologicalSorter(preds).static_order():  # one column right of its deepest predecessor
        depth[n] = 1 + max((depth[p] for p in preds[n]), default=-1)
    rows: Counter = Counter()  # nodes placed in each column so far
    out = {}
    for n in graph.nodes:
        out[n] = (depth[n], rows[depth[n]])
        rows[depth[n]] += 1
    return out


def _color(node: GraphNode, states: dict[str, str] | None) -> str:
    if states is not None:
        return STATE_COLORS.get(states.get(node.id, "waiting"), STATE_COLORS["waiting"])
    return "#eceff1" if node.fused_into else KIND_COLORS.get(node.kind, "#ffffff")


def _dot_id(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: StepGraph, states: dict[str, str] | None = None) -> str:
    """Graphviz text of the graph; ``states`` (node -> state) colours the nodes by state."""
    lines = [f"digraph {_dot_id(graph.name)} {{", "  rankdir=LR;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];']
    children: dict[str | None, list[GraphNode]] = {}
    for node in graph.nodes.values():
        children.setdefault(node.parent, []).append(node)

    def emit(parent: str | None, indent: str) -> None:
        for node in children.get(parent, []):
            label = f"{node.label}\n{node.what}" + (f"\n({states[node.id]})" if states and node.id in states else "")
            shape = ", shape=note" if node.kind == "output" else ""
            lines.append(f"{indent}{_dot_id(node.id)} [label={_dot_id(label)}, "
                         f"fillcolor={_dot_id(_color(node, states))}{shape}];")
            if node.id in children:
                lines.append(f"{indent}subgraph {_dot_id('cluster_' + node.id)} {{")
                lines.append(f"{indent}  label={_dot_id(node.id + ' (' + node.what + ')')}; style=dashed;")
                emit(node.id, indent + "  ")
                lines.append(f"{indent}}}")

    emit(None, "  ")
    styles = {"data": "", "output": "", "uses": " [style=dotted]", "fused": ' [style=dashed, label="fused"]'}
    for e in graph.edges:
        lines.append(f"  {_dot_id(e.source)} -> {_dot_id(e.target)}{styles[e.kind]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


_W, _H, _COL, _ROW, _PAD = 150, 46, 200, 64, 20


def _own_svg(graph: StepGraph, states: dict[str, str] | None) -> str:
    pos = layout(graph)
    cols = 1 + max((c for c, _ in pos.values()), default=0)
    rows = 1 + max((r for _, r in pos.values()), default=0)
    page = templating.ENV.get_template("stepgraph.svg.j2")
    return page.render(graph=graph, states=states, pad=_PAD, w=_W, h=_H,
                       width=2 * _PAD + (cols - 1) * _COL + _W, height=2 * _PAD + (rows - 1) * _ROW + _H + 20,
                       xy={n: (_PAD + c * _COL, _PAD + 20 + r * _ROW) for n, (c, r) in pos.items()},
                       colors={n: _color(node, states) for n, node in graph.nodes.items()}) + "\n"


def to_svg(graph: StepGraph, states: dict[str, str] | None = None, engine: str | None = "auto") -> str:
    """SVG of the graph: through Graphviz's ``dot`` where it is installed (``engine="auto"``), else
    (or with ``engine=None``) a plain layered drawing of our own."""
    dot = shutil.which("dot") if engine == "auto" else None
    if dot:
        try:
            done = subprocess.run([dot, "-Tsvg"], input=to_dot(graph, states), capture_output=True, text=True,
                                  timeout=60, check=True)
            return done.stdout
        except (OSError, subprocess.SubprocessError):
            pass  # a broken Graphviz: our own drawing is still a picture
    return _own_svg(graph, states)


def to_dict(graph: StepGraph) -> dict[str, Any]:
    """Plain data (for the scheduler, a report, JSON): ``{"name", "nodes": [...], "edges": [...]}``."""
    return {"name": graph.name, "nodes": [asdict(n) for n in graph.nodes.values()],
            "edges": [[e.source, e.target, e.kind] for e in graph.edges]}


def from_dict(data: dict[str, Any]) -> StepGraph:
    """The graph :func:`to_dict` made."""
    nodes = {n["id"]: GraphNode(**n) for n in data["nodes"]}
    return StepGraph(data["name"], nodes, [Edge(*e) for e in data["edges"]])

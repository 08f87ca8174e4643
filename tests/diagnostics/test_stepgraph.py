"""The step graph of ``flowgpu plan --format dot|svg``: every input, step and output, the right edges,
fused steps beside their root, the steps of an included pipeline under their ``uses`` node."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from flowgpu import pipeline
from flowgpu.cli import cli
from flowgpu.diagnostics import stepgraph

ROOT = pathlib.Path(__file__).resolve().parents[2] / "pipelines"
SVG = "{http://www.w3.org/2000/svg}"


def _graph(name: str) -> tuple[dict, stepgraph.StepGraph]:
    desc = pipeline.describe(pipeline.compile(pipeline.load(ROOT / name, {"params.size": 64})
                                              if name == "denoise_synthetic.yaml" else pipeline.load(ROOT / name)))
    return desc, stepgraph.from_description(desc)


def test_quickstart_graph_has_every_step_and_its_dependencies():
    desc, g = _graph("quickstart.yaml")
    assert [n for n, node in g.nodes.items() if node.kind != "output"] == [r["name"] for r in desc["steps"]]
    assert {n for n, node in g.nodes.items() if node.kind == "output"} == {"out:standardized", "out:energy", "out:mean"}
    data = {(e.source, e.target) for e in g.edges if e.kind == "data"}
    assert {("x", "mu"), ("x", "sigma"), ("mu", "z"), ("sigma", "z"), ("x", "z"), ("z", "z2")} <= data
    # z2 is fused into energy (square then sum, one kernel): drawn beside its root, joined to it
    assert g.nodes["z2"].fused_into == "energy"
    assert stepgraph.Edge("z2", "energy", "fused") in g.edges
    assert stepgraph.Edge("energy", "out:energy", "output") in g.edges
    pos = stepgraph.layout(g)
    for e in g.edges:  # layered: every edge goes left to right
        assert pos[e.source][0] < pos[e.target][0], e
    assert len(set(pos.values())) == len(pos)  # no two nodes on one place


def test_uses_children_hang_under_their_uses_node():
    desc, g = _graph("denoise_synthetic.yaml")
    children = [n for n, node in g.nodes.items() if node.parent == "denoise"]
    assert children and all(n.startswith("denoise/") for n in children)
    assert g.nodes["denoise"].kind == "uses"
    bound = [n for n in children if g.nodes[n].what == "bound"]
    assert bound and all(stepgraph.Edge("denoise", n, "uses") in g.edges for n in bound)
    assert stepgraph.Edge("noisy", "denoise", "data") in g.edges
    assert stepgraph.Edge("denoise", "err_after", "data") in g.edges


def _dot_edges(text: str) -> set[tuple[str, str]]:
    return set(re.findall(r'^\s*"([^"]+)" -> "([^"]+)"', text, flags=re.M))


def test_plan_format_dot_and_json(tmp_path):
    desc, g = _graph("denoise_synthetic.yaml")
    result = CliRunner().invoke(cli, ["plan", str(ROOT / "denoise_synthetic.yaml"), "--set", "params.size=64",
                                      "--format", "dot"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.startswith('digraph "denoise_synthetic" {') and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    for n in g.nodes:
        assert re.search(rf'^\s*"{re.escape(n)}" \[label=', text, flags=re.M), n
    assert _dot_edges(text) == {(e.source, e.target) for e in g.edges}
    assert 'subgraph "cluster_denoise"' in text
    as_json = CliRunner().invoke(cli, ["plan", str(ROOT / "quickstart.yaml"), "--json"])
    assert json.loads(as_json.output) == json.loads(
        CliRunner().invoke(cli, ["plan", str(ROOT / "quickstart.yaml"), "--format", "json"]).output)


def _check_svg(text: str, g: stepgraph.StepGraph) -> ET.Element:
    root = ET.fromstring(text)  # well-formed XML
    assert root.tag == SVG + "svg"
    titles = {t.text for t in root.iter(SVG + "title")}
    assert set(g.nodes) <= titles, set(g.nodes) - titles
    return root


def test_plan_format_svg_draws_every_node_and_edge_without_graphviz(monkeypatch):
    _, g = _graph("quickstart.yaml")
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as on a machine without Graphviz
    result = CliRunner().invoke(cli, ["plan", str(ROOT / "quickstart.yaml"), "--format", "svg"])
    assert result.exit_code == 0, result.output
    root = _check_svg(result.output, g)
    edges = {(el.get("data-source"), el.get("data-target")) for el in root.iter(SVG + "line")}
    assert edges == {(e.source, e.target) for e in g.edges}
    states = {n: "done" for n in g.nodes} | {"z": "running"}
    colored = ET.fromstring(stepgraph.to_svg(g, states, engine=None))
    z = next(el for el in colored.iter(SVG + "g") if el.get("id") == "node-z")
    assert z.get("data-state") == "running"
    assert z.find(SVG + "rect").get("fill") == stepgraph.STATE_COLORS["running"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz (dot) is not installed")
def test_plan_format_svg_through_graphviz():
    _, g = _graph("denoise_synthetic.yaml")
    _check_svg(stepgraph.to_svg(g), g)

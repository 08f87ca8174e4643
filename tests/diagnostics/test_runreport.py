"""``run --report``: one self-contained HTML file per run with the step table (plan beside what
happened), memory per worker against the plan's estimate, plots, and dask's performance report."""

from __future__ import annotations

import json
import os
import re
from html import unescape
from html.parser import HTMLParser

import numpy as np
import pytest
from click.testing import CliRunner

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.cli import cli
from flowgpu.diagnostics.report import format_bytes
from flowgpu.errors import RunError
from tests.diagnostics.specs import chain_spec

pytestmark = pytest.mark.timeout(240)


class _Elements(HTMLParser):
    """Every element's tag and attributes (the report is read as a browser would parse it)."""

    def __init__(self, text: str):
        super().__init__()
        self.found: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.found if "id" in a}

    def rows(self, attr: str) -> list[str]:
        return [a[attr] for t, a in self.found if t == "tr" and attr in a]


def _spec(tmp_path, rng, op="multiply"):
    return chain_spec(tmp_path, rng, "rep", (300, 200), 100, op, factor=2.0)


@pytest.fixture(scope="module")
def session():
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=2, dashboard_address=None) as s:
        yield s


def _no_network(text: str) -> None:
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="https?://', text)  # self-contained


def test_report_of_a_run_on_a_cluster(session, tmp_path, rng):
    x, spec = _spec(tmp_path, rng)
    path = tmp_path / "run.html"
    result = pipeline.run(spec, session=session, progress=False, report=str(path))
    assert np.isclose(result.outputs["s"], 2 * x.sum())
    text = path.read_text()
    page = _Elements(text)
    assert {"steps", "memory", "status", "plot-time-per-step", "plot-tiers", "plot-spilling", "dask-report"} <= page.ids()
    assert page.rows("data-step") == ["x", "y", "s"]
    y_row = re.search(r'<tr data-step="y">(.*?)</tr>', text).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", y_row)
    assert cells[2] == "done" and cells[5] == "3"  # state; tasks planned: one per chunk
    assert int(cells[6]) >= 3  # tasks run (Dask's optimizer may have merged reading x into them)
    assert cells[7] == cells[8] == "468.8 KiB"  # bytes planned and produced: the 300 x 200 float64 result
    assert len(page.rows("data-worker")) == 1  # peak memory of the one worker beside the estimate
    assert "Dask Performance Report" in text and "Task Stream" in text
    _no_network(text)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # written atomically (io.atomic.write_text)


def test_a_failed_run_reports_its_error(session, tmp_path, rng):
    _, spec = _spec(tmp_path, rng, op="test_explode")
    path = tmp_path / "run.html"
    with pytest.raises(RunError):
        pipeline.run(spec, session=session, progress=False, report=str(path))
    text = path.read_text()
    assert '<span id="status">failed</span>' in text and "boom while running" in text
    assert re.search(r'<tr data-step="y">.*?<td>failed</td>', text)


def _forked_spec(tmp_path, rng, bad: str = "b"):
    """``x`` (a fresh random .npy) feeds ``good`` (doubled, written to out/good.npy) and ``b`` (doubled,
    or raising where ``bad`` names it), whose sum ``t`` is the summary's: Dask fuses ``b`` into ``t``."""
    x = rng.random((300, int(rng.integers(20, 60))))
    np.save(tmp_path / "x.npy", x)
    fn = {s: "tests.pipeline.helpers:" + ("_explode" if s == bad else "finite") for s in ("good", "b")}
    return x, {
        "version": 1, "name": "forked",
        "inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy"), "chunks": [100, -1]}},
        "steps": {s: {"op": "map_blocks", "inputs": ["x"], "args": {"function": f}} for s, f in fn.items()}
        | {"t": {"op": "sum", "inputs": ["b"]}},
        "outputs": {"good": {"from": "good", "sink": "npy", "path": str(tmp_path / "out" / "good.npy")},
                    "t": {"from": "t"}},
    }


def _table(text: str) -> dict[str, list[str]]:
    """The steps table(s): each row's cells as shown, by step or ``out:`` output (a batch: ``#item/``)."""
    rows, item = {}, 0
    for table in re.findall(r'<table id="steps[-\d]*">(.*?)</table>', text, re.S):
        for key, name, cells in re.findall(r'<tr data-(step|output)="([^"]*)">(.*?)</tr>', table, re.S):
            rows[f"{item}/" * bool(item) + ("out:" if key == "output" else "") + unescape(name)] = \
                [unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", cells)]
        item += 1
    return rows


def _graph(text: str) -> dict[str, str]:
    """Each node's state as the step graph draws it (Graphviz's SVG, or flowgpu's own where there is no dot)."""
    out = {}
    for g in re.findall(r'<g [^>]*class="node".*?</g>', text.split("<iframe")[0], re.S):
        name = unescape(re.search(r"<title>(.*?)</title>", g).group(1))
        own = re.search(r'data-state="([^"]*)"', g)
        out[name] = own.group(1) if own else unescape(re.findall(r">\(([^<]*)\)</text>", g)[-1])
    return out


def _totals(text: str) -> str:
    """The header's line of tasks, workers and bytes, as shown."""
    return " ".join(unescape(re.search(r"<p[^>]*>([^<]*worker\(s\).*?)</p>", text, re.S).group(1)).split())


def _ran(cell: str) -> int:
    return int(cell.split(" of ")[0])  # "4", or "4 of 5" when the run ended before the rest ran


def test_a_failed_run_s_report_says_what_its_summary_says(session, tmp_path, rng):
    """One step writes, another raises in user code: nothing is shown running or written after the run, the
    error is on the step the summary names, and the header counts the tasks the table shows."""
    _, spec = _forked_spec(tmp_path, rng)
    path = tmp_path / "run.html"
    with pytest.raises(RunError, match="boom while running"):
        pipeline.run(spec, session=session, progress=False, report=str(path), summary_path=str(tmp_path / "s.json"))
    summary, text = json.loads((tmp_path / "s.json").read_text()), path.read_text()
    assert summary["step"] == "b" and summary["not_written"] == ["good", "t"]
    assert not (tmp_path / "out" / "good.npy").exists()
    rows, graph = _table(text), _graph(text)
    assert not {"running", "waiting"} & set(graph.values())  # the run has ended
    assert graph["out:good"] == "not-written" and graph["b"] == "failed"
    assert "boom while running" in rows["b"][-1] and not any(r[-1] for k, r in rows.items() if k != "b")
    assert graph == {k: r[2] for k, r in rows.items()}  # the table tells the drawing's story, outputs too
    assert "(step b)" in unescape(re.search(r'<p class="failed" id="error">(.*?)</p>', text, re.S).group(1))
    ran = sum(_ran(r[6]) for r in rows.values())
    assert ran > 0 and f"{ran:,} tasks run on" in _totals(text)
    assert "bytes read not known (the run failed), wrote 0 B" in _totals(text)


def test_a_local_failed_run_s_report_says_its_counts_are_not_known(tmp_path, rng):
    _, spec = _forked_spec(tmp_path, rng)
    with pytest.raises(RunError):
        pipeline.run(spec, session="local", progress=False, report=str(tmp_path / "run.html"))
    said = _totals((tmp_path / "run.html").read_text())
    assert "tasks run not known" in said and "bytes read not known (the run failed)" in said and " 0 tasks" not in said


def test_a_batch_report_counts_its_items_tasks_and_bytes(session, tmp_path, rng):
    """The header of a batch's report: the tasks its items ran (the tables' sum), the input they share read
    once, and every file written."""
    x, spec = _forked_spec(tmp_path, rng, bad="")
    spec["params"] = {"k": 1.0}
    spec["outputs"]["good"]["path"] = str(tmp_path / "out" / "good-${params.k}.npy")
    spec["steps"]["good"] = {"op": "multiply", "inputs": ["x"], "args": {"b": "${params.k}"}}  # one per item
    ks = [float(k) for k in rng.uniform(0.5, 2.0, 2)]
    result = pipeline.run(spec, session=session, progress=False, foreach={"k": ks}, report=str(tmp_path / "b.html"))
    assert result.ok and all(np.allclose(np.load(tmp_path / "out" / f"good-{k}.npy"), k * x) for k in ks)
    text = (tmp_path / "b.html").read_text()
    ran = sum(_ran(r[6]) for r in _table(text).values())
    wrote = sum(os.path.getsize(tmp_path / "out" / f"good-{k}.npy") for k in ks)
    said = _totals(text)
    assert ran > 0 and f"{ran:,} tasks run on" in said
    assert f"read {format_bytes(x.nbytes)}, wrote {format_bytes(wrote)}" in said


def test_report_of_a_local_run_and_from_the_command_line(tmp_path, rng, monkeypatch):
    x, spec = _spec(tmp_path, rng)
    pipeline.run(spec, session="local", progress=False, report=str(tmp_path / "local.html"))
    page = _Elements((tmp_path / "local.html").read_text())
    assert page.rows("data-step") == ["x", "y", "s"] and "dask-report" not in page.ids()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))  # JSON is YAML
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--workers", "1", "--overwrite", "--report", "cli.html",
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    page = _Elements((tmp_path / "cli.html").read_text())
    assert page.rows("data-step") == ["x", "y", "s"] and "plot-time-per-step" in page.ids()


class _Text(_Elements):
    """Also every piece of text, as a browser shows it (entities decoded)."""

    def __init__(self, text: str):
        self.data: list[str] = []
        super().__init__(text)

    def handle_data(self, data):
        self.data.append(data)


def test_user_text_in_a_report_stays_text(tmp_path, rng):
    """Params, paths and errors come from users: the report shows them as written and runs none of them."""
    hostile = ['<script>alert(1)</script>', 'a&b"c\'<img src=x onerror=alert(2)>']
    spec = {"version": 1, "name": "hostile", "params": {"tag": "t", "scale": 1.0},
            "inputs": {"x": {"source": "random", "shape": [40, 6], "seed": 3, "chunks": [20, -1]}},
            "steps": {"y": {"op": "multiply", "inputs": ["x"], "args": {"b": "${params.scale}"}},
                      "t": {"op": "sum", "inputs": ["y"]}},
            "outputs": {"t": {"from": "t"},
                        "y": {"from": "y", "sink": "npy", "path": str(tmp_path / "y-${params.tag}.npy")}}}
    scale = float(rng.uniform(0.5, 2.0))
    spec["params"]["scale"] = scale
    result = pipeline.run(spec, session="local", progress=False, foreach={"tag": hostile},
                          report=str(tmp_path / "r.html"))
    x = fg.random((40, 6), seed=3, chunks=(20, -1)).compute()
    assert all(np.isclose(r.outputs["t"], scale * x.sum()) for r in result.items)
    text = (tmp_path / "r.html").read_text()
    page = _Text(text)
    assert not [t for t, _ in page.found if t in ("script", "img")]  # nothing the user wrote became an element
    shown = "".join(page.data)
    assert all(f"tag={h}" in shown for h in hostile)  # and it reads as they wrote it
    assert all(np.array_equal(np.load(tmp_path / f"y-{h}.npy"), scale * x) for h in hostile)

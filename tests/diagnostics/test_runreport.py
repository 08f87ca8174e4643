"""``run --report``: one self-contained HTML file per run with the step table (plan beside what
happened), memory per worker against the plan's estimate, plots, and dask's performance report."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from click.testing import CliRunner

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.cli import cli
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

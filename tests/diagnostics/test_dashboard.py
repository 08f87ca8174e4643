"""The flowgpu page on a real cluster (no browser): installed on a cluster flowgpu starts and on one
joined by address, with a tab beside Status; a run's tasks land on the steps the compiler built."""

from __future__ import annotations

import functools
import types
import urllib.request

import numpy as np
import pytest
from distributed import LocalCluster

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.diagnostics import events, monitor
from flowgpu.errors import RunError
from tests.diagnostics.specs import chain_spec

pytestmark = pytest.mark.timeout(180)


def _spec(tmp_path, rng, op="multiply"):
    return chain_spec(tmp_path, rng, "dash", (400, 300), 100, op, mean=True)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        assert r.status == 200
        return r.read().decode()


def _check_page(session):
    link = monitor.page_link(session.dashboard_link)
    assert link.endswith("/flowgpu")
    page = _get(link)
    assert "bokeh.min.js" in page and "Bokeh.embed.embed_items" in page  # a Bokeh server document
    assert 'href="flowgpu"' in _get(link[: -len("flowgpu")] + "status")  # a tab beside Status


def _view(session):
    return session.client.sync(session.client.scheduler.flowgpu_board, action="view")


@pytest.fixture(scope="module")
def session():
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=2, dashboard_address="127.0.0.1:0") as s:
        yield s


def test_a_run_on_a_session_shows_every_step_done_on_the_flowgpu_page(session, tmp_path, rng):
    x, spec = _spec(tmp_path, rng)
    result = pipeline.run(spec, session=session, progress=False)
    assert np.allclose(result.outputs["s"], (3 * x).mean(axis=0).sum())
    _check_page(session)
    v = _view(session)
    assert v["run"]["status"] == "ok" and v["run"]["name"] == "dash"
    steps = {s["id"]: s for s in v["steps"]}
    assert set(steps) == {"x", "y", "m", "s", "out:y", "out:s"}
    assert all(s["state"] == "done" for s in steps.values())
    assert steps["y"]["total"] == 4 and steps["y"]["done"] == 4  # one task per chunk (reading x fused into it)
    assert steps["m"]["total"] > 0 and steps["x"]["total"] > 0
    assert steps["y"]["bytes"] == x.nbytes  # what the step's tasks produced
    assert steps["out:y"]["total"] > 0  # the writes count for the output


def test_a_failed_step_shows_its_error(session, tmp_path, rng):
    _, spec = _spec(tmp_path, rng, op="test_explode")
    with pytest.raises(RunError):
        pipeline.run(spec, session=session, progress=False)
    v = _view(session)
    steps = {s["id"]: s for s in v["steps"]}
    assert v["run"]["status"] == "failed"
    assert steps["y"]["state"] == "failed" and "boom while running" in steps["y"]["error"]
    assert steps["x"]["state"] in ("done", "running")  # the inputs were read (some may be cancelled)


def test_the_page_is_installed_on_a_cluster_joined_by_address(tmp_path, rng):
    x, spec = _spec(tmp_path, rng)
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            fg.Session(cluster.scheduler_address, dashboard_address=None) as s:
        assert "flowgpu-dashboard" not in cluster.scheduler.plugins  # nothing of flowgpu's yet
        result = pipeline.run(spec, session=s, progress=False)
        assert np.allclose(result.outputs["s"], (3 * x).mean(axis=0).sum())
        _check_page(s)
        assert all(st["state"] == "done" for st in _view(s)["steps"])



def test_a_batch_shows_one_row_per_item(session, tmp_path, rng):
    """What a batch's events do on the page (``monitor.Follower``): a row per item, all items in flight
    at once, each finished as it ends."""
    follower, runs = monitor.Follower(), []
    follower(events.SessionReady(session))
    for seed in range(3):
        (tmp_path / str(seed)).mkdir()
        x, spec = _spec(tmp_path / str(seed), rng)
        plan = pipeline.compile(spec)
        follower(events.ItemStarted(seed, f"params.seed={seed}", plan, functools.partial(pipeline.describe, plan), {}, ()))
        runs.append((x, plan))
    futures = session.client.compute([plan.outputs["s"] for _, plan in runs])
    for seed, ((x, _), f) in enumerate(zip(runs, futures)):
        assert np.isclose(f.result(), (3 * x).mean(axis=0).sum())
        follower(events.ItemFinished(seed, types.SimpleNamespace(status="ok", error=None, values={"s": f.result()})))
    items = _view(session)["items"]
    assert [(i["item"], i["status"]) for i in items] == [(f"params.seed={s}", "ok") for s in range(3)]
    assert all(i["done"] == i["total"] > 0 for i in items)


def test_a_foreach_batch_has_a_row_per_item_on_the_page_and_in_its_report(session, tmp_path):
    spec = {"version": 1, "name": "grid", "params": {"seed": 0, "out": str(tmp_path / "out")},
            "inputs": {"x": {"source": "random", "shape": [60, 5], "seed": "${params.seed}", "chunks": [20, -1]}},
            "steps": {"y": {"op": "multiply", "inputs": ["x"], "args": {"b": 2.0}}, "t": {"op": "sum", "inputs": ["y"]}},
            "outputs": {"t": {"from": "t"}, "y": {"from": "y", "sink": "npy", "path": "${params.out}/y-${params.seed}.npy"}}}
    result = pipeline.run(spec, session=session, progress=False, foreach={"seed": [1, 2, 3]},
                          report=str(tmp_path / "batch.html"))
    assert result.ok
    for r in result.items:
        x = fg.random((60, 5), seed=r.params["seed"], chunks=(20, -1)).compute()
        assert np.isclose(r.outputs["t"], 2 * x.sum())
    items = _view(session)["items"]
    assert [(i["item"], i["status"]) for i in items] == [(f"seed={s}", "ok") for s in (1, 2, 3)]
    text = (tmp_path / "batch.html").read_text()
    assert text.count('<tr data-item="') == 3 and text.count('data-status="ok"') == 3
    for sid in ("", "-1", "-2"):  # each item's steps: the plan beside what happened
        assert f'<table id="steps{sid}">' in text
    again = pipeline.run(spec, session=session, progress=False, foreach={"seed": [1, 2, 3]},
                         report=str(tmp_path / "again.html"))
    assert again.summary["counts"] == {"up-to-date": 3}
    assert (tmp_path / "again.html").read_text().count('data-status="up-to-date"') == 3  # said, not computed


@pytest.mark.gpu
def test_the_page_on_a_gpu_session_shows_a_batch_and_the_memory_tiers(tmp_path, rng):
    """On GPU workers: the page is served, a batch's items and steps are on it, with the tiers panel."""
    x, spec = _spec(tmp_path, rng)
    spec["params"] = {"k": 3.0}
    spec["steps"]["y"]["args"] = {"b": "${params.k}"}
    spec["outputs"]["y"]["path"] = str(tmp_path / "out" / "y-${params.k}.npy")
    with fg.Session(backend="gpu", dashboard_address="127.0.0.1:0") as s:
        result = pipeline.run(spec, session=s, progress=False, foreach={"k": [2.0, -1.5]})
        _check_page(s)
        v = _view(s)
    for item in result.items:
        np.testing.assert_allclose(item.outputs["s"], (item.params["k"] * x).mean(axis=0).sum(), rtol=1e-10)
    assert v["run"]["status"] == "ok" and {st["id"] for st in v["steps"]} >= {"x", "y", "m", "s"}
    assert {i["item"] for i in v["items"]} == {"k=2.0", "k=-1.5"} and all(i["status"] == "ok" for i in v["items"])
    assert set(v["memory"]["series"]) >= {"t", "device", "host", "disk", "gbps"}

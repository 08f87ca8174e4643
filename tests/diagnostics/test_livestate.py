"""The dashboard's state model without a scheduler or a browser: what is published and what the
scheduler reports becomes what the flowgpu page shows (steps coloured by state, tasks done/total,
bytes, time, errors, batch items, memory per tier and the moves between tiers as GB/s)."""

from __future__ import annotations

import re
from html import unescape

from bokeh.document import Document
from bokeh.models import ColumnDataSource, Div

from flowgpu.diagnostics import stepgraph
from flowgpu.diagnostics.dashboard import PLUGIN_NAME, flowgpu_doc, render_tables
from flowgpu.diagnostics.livestate import Board

DESC = {"name": "p", "steps": [
    {"name": "x", "kind": "input", "what": "normal", "deps": []},
    {"name": "y", "kind": "step", "what": "multiply", "deps": ["x"], "fused_into": "s"},
    {"name": "s", "kind": "step", "what": "sum", "deps": ["x"]},
    {"name": "sub", "kind": "uses", "what": "child.yaml", "deps": ["x"]},
    {"name": "sub/a", "kind": "input", "what": "bound", "deps": []},
    {"name": "sub/b", "kind": "step", "what": "negative", "deps": ["sub/a"]},
], "outputs": {"t": {"from": "s", "sink": "summary"}, "u": {"from": "sub.b", "sink": "npy"}}}
LAYERS = {"rand-1": "x", "sum-2": "s", "sum-agg-3": "s", "neg-4": "sub/b", "store-5": "out:u"}


def _board(rng, n_chunks=3):
    b = Board()
    b.publish("r", stepgraph.to_dict(stepgraph.from_description(DESC)), LAYERS, now=100.0)
    keys = {name: [(name, i) for i in range(n_chunks)] for name in ("rand-1", "sum-2", "neg-4", "store-5")}
    tasks = [(k, []) for k in keys["rand-1"]]
    tasks += [(("sum-2", i), [("rand-1", i)]) for i in range(n_chunks)]
    tasks += [("sum-agg-3", [("sum-2", i) for i in range(n_chunks)])]
    tasks += [("finalize-hlg-9", ["sum-agg-3"])]  # a layer Dask's optimizer named: the step of its dependency
    tasks += [(("neg-4", i), [("rand-1", i)]) for i in range(n_chunks)] + [(k, [k]) for k in keys["store-5"]]
    b.add_tasks(tasks)
    return b, keys


def _states(b):
    return {s["id"]: s["state"] for s in b.view()["steps"]}


def _finish(b, key, nbytes=80, seconds=0.5):
    b.transition(key, "waiting", "processing")
    b.transition(key, "processing", "memory", nbytes=nbytes, seconds=seconds)


def test_steps_move_from_waiting_to_running_to_done_with_tasks_bytes_and_time(rng):
    b, keys = _board(rng)
    steps = {s["id"]: s for s in b.view()["steps"]}
    assert {k: steps[k]["total"] for k in ("x", "s", "sub/b", "out:u")} == {"x": 3, "s": 5, "sub/b": 3, "out:u": 3}
    assert _states(b) == {"x": "waiting", "y": "fused", "s": "waiting", "sub": "waiting", "sub/a": "waiting",
                          "sub/b": "waiting", "out:t": "waiting", "out:u": "waiting"}
    sizes = rng.integers(1, 10_000, 3)
    b.transition(keys["rand-1"][0], "waiting", "processing")
    assert _states(b)["x"] == "running"
    for key, size in zip(keys["rand-1"], sizes):
        _finish(b, key, int(size), 0.25)
    x = next(s for s in b.view()["steps"] if s["id"] == "x")
    assert (x["state"], x["done"], x["total"], x["bytes"], x["seconds"]) == ("done", 3, 3, int(sizes.sum()), 0.75)
    _finish(b, keys["neg-4"][0])
    assert _states(b)["sub"] == "running"  # an included pipeline: what its steps are doing
    assert _states(b)["sub/a"] == "running"  # no tasks of its own (merged into sub/b's): as the step it feeds
    for key in keys["neg-4"][1:]:
        _finish(b, key)
    assert _states(b)["sub/b"] == "done"
    b.transition(("neg-4", 0), "processing", "memory", nbytes=80)  # told twice (a retry): counted once
    assert next(s for s in b.view()["steps"] if s["id"] == "sub/b")["done"] == 3


def test_a_failed_task_fails_its_step_with_the_error_and_the_run_ends(rng):
    b, keys = _board(rng)
    b.transition(("sum-2", 1), "waiting", "processing")
    b.transition(("sum-2", 1), "processing", "erred", error="RuntimeError: boom while running")
    b.finish("r", "failed", "RunError: pipeline 'p' failed", now=103.5)
    v = b.view()
    s = next(s for s in v["steps"] if s["id"] == "s")
    assert (s["state"], s["error"]) == ("failed", "RuntimeError: boom while running")
    assert v["run"]["status"] == "failed" and v["run"]["seconds"] == 3.5
    html = render_tables(v)
    assert 'data-step="s" data-state="failed"' in html["steps"] and "boom while running" in html["steps"]
    assert 'data-status="failed"' in html["head"]


def test_a_run_that_ended_shows_nothing_running_and_its_outputs_not_written(rng):
    """After a failed run what had not run is cancelled, not running or waiting, and an output the client
    says was not moved into place is not-written (unless its tasks failed), whatever its tasks did."""
    b, keys = _board(rng)
    _finish(b, keys["rand-1"][0])
    b.transition(keys["rand-1"][1], "waiting", "processing")
    b.transition(("sum-2", 1), "waiting", "processing")
    b.transition(("sum-2", 1), "processing", "erred", error="RuntimeError: boom while running")
    for key in keys["store-5"]:  # out:u's writes finished into their staging
        _finish(b, key, int(rng.integers(1, 100)))
    assert _states(b)["x"] == "running" and _states(b)["out:u"] == "done"
    b.finish("r", "failed", "RunError: boom", written=[], now=104.0)
    assert _states(b) == {"x": "cancelled", "y": "fused", "s": "failed", "sub": "cancelled", "sub/a": "cancelled",
                          "sub/b": "cancelled", "out:t": "failed", "out:u": "not-written"}
    x = next(s for s in b.view()["steps"] if s["id"] == "x")
    assert (x["done"], x["erred"], x["total"]) == (1, 0, 3)
    assert 'data-step="out:u" data-state="not-written"' in render_tables(b.view())["steps"]


def test_a_step_merged_into_a_write_follows_it():
    """A step with no tasks of its own whose chunks Dask computes inside an output's writes: it runs and is
    done as they do; the output's own state says whether it was moved into place."""
    desc = {"name": "w", "steps": [{"name": "x", "kind": "input", "what": "npy", "deps": []},
                                   {"name": "g", "kind": "step", "what": "map_blocks", "deps": ["x"]}],
            "outputs": {"o": {"from": "g", "sink": "npy"}}}
    states = {}
    for written in (["o"], []):
        b = Board()
        b.publish("r", stepgraph.to_dict(stepgraph.from_description(desc)), {"read-1": "x", "store-2": "out:o"})
        b.add_tasks([(("read-1", 0), []), (("store-2", 0), [("read-1", 0)])])
        _finish(b, ("read-1", 0))
        b.transition(("store-2", 0), "waiting", "processing")
        assert _states(b) == {"x": "done", "g": "running", "out:o": "running"}
        b.transition(("store-2", 0), "processing", "memory", nbytes=8)
        b.finish("r", "ok" if written else "failed", written=written)
        states[bool(written)] = _states(b)
    assert states == {True: {"x": "done", "g": "done", "out:o": "done"},
                      False: {"x": "done", "g": "done", "out:o": "not-written"}}


def test_error_text_and_worker_names_on_the_page_stay_text(rng):
    b, keys = _board(rng)
    b.transition(("sum-2", 1), "processing", "erred", error="ValueError: <img src=x onerror=alert(1)> & \"q\"")
    b.sample({"<script>w</script>": {"host_bytes": int(rng.integers(1, 1 << 20))}}, now=101.0)
    b.finish("r", "failed", "<b>bold</b>", now=102.0)
    html = "".join(render_tables(b.view()).values())
    assert "<img" not in html and "<script>" not in html and "<b>" not in html
    shown = unescape(html)  # what a browser shows
    assert 'ValueError: <img src=x onerror=alert(1)> & "q"' in shown and "<script>w</script>" in shown


def test_states_the_client_knows_and_batch_items(rng):
    b = Board()
    graph = stepgraph.to_dict(stepgraph.from_description(DESC))
    for i in range(3):
        b.publish(f"r{i}", graph, LAYERS, item=f"params.seed={i}", batch="B", states={"out:t": "up-to-date"})
    b.publish("other", graph, LAYERS, batch="C")
    b.finish("r0", "ok")
    b.finish("r1", "failed", "boom")
    v = b.view("r2")
    assert [(i["item"], i["status"]) for i in v["items"]] == [
        ("params.seed=0", "ok"), ("params.seed=1", "failed"), ("params.seed=2", "running")]
    states = {s["id"]: s["state"] for s in v["steps"]}
    assert states["out:t"] == "up-to-date"
    assert states["s"] == "up-to-date"  # no tasks to run: all it feeds is up to date
    assert states["sub/b"] == "waiting"  # it feeds out:u, which is to be computed
    rows = re.findall(r'<tr data-item="(\w+)" data-status="(\w+)">', render_tables(v)["items"])
    assert rows == [("r0", "ok"), ("r1", "failed"), ("r2", "running")]


def test_memory_per_tier_over_time_and_moves_as_gbps(rng):
    b, _ = _board(rng)
    host = rng.integers(1 << 20, 1 << 30, 3)
    moved = [0, 2_000_000_000, 5_000_000_000]
    for i, t in enumerate((100.0, 101.0, 103.0)):
        b.sample({"w1": {"host_bytes": int(host[i]), "disk_bytes": 10 * i, "host_to_disk_bytes": moved[i],
                         "host_to_disk_seconds": 0.5 * i, "gpu_memory_used": 7},
                  "w2": {"device_bytes": 5}}, now=t)
    m = b.view()["memory"]
    assert m["series"]["host"] == [int(h) for h in host] and m["series"]["disk"] == [0, 10, 20]
    assert m["series"]["gbps"] == [0.0, 2.0, 1.5]  # 2 GB in 1 s, then 3 GB in 2 s
    w1 = m["workers"][0]
    assert (w1["worker"], w1["host"], w1["gpu_memory"]) == ("w1", int(host[2]), 7)
    assert w1["moves"] == {"host_to_disk": {"bytes": 5_000_000_000, "gbps": 5.0}}  # the speed of the copies
    assert b.view()["run"]["peak"]["w1"]["store"] == max(int(h) + 10 * i for i, h in enumerate(host))
    html = render_tables(b.view())["memory"]
    assert 'data-worker="w1"' in html and "host to disk" in html and "5.00 GB/s" in html


def test_the_bokeh_document_draws_the_board(rng):
    b, keys = _board(rng)
    _finish(b, keys["rand-1"][0])
    b.sample({"w1": {"host_bytes": 1234}}, now=101.0)

    class _Scheduler:  # what the page reads of the scheduler: the plugin's board
        plugins = {PLUGIN_NAME: type("P", (), {"board": b})()}

    doc = Document()
    flowgpu_doc(_Scheduler(), {"pages": ["status", "flowgpu"], "prefix": "/"}, doc)
    divs = {d.name: d.text for d in doc.select({"type": Div})}
    assert 'data-step="x" data-state="running"' in divs["flowgpu-steps-div"]
    assert 'data-worker="w1" data-bytes="1234"' in divs["flowgpu-memory-div"]
    nodes = next(s for s in doc.select({"type": ColumnDataSource}) if "label" in s.data)
    assert set(nodes.data["id"]) == set(stepgraph.from_description(DESC).nodes)
    assert dict(zip(nodes.data["id"], nodes.data["color"]))["x"] == stepgraph.STATE_COLORS["running"]


def test_a_chain_of_thousands_of_steps_is_drawn_and_followed_without_recursion():
    n = 3000  # steps whose tasks Dask merged into the last one: each follows the next
    desc = {"name": "long", "steps": [{"name": "s0", "kind": "input", "what": "normal", "deps": []}]
            + [{"name": f"s{i}", "kind": "step", "what": "negative", "deps": [f"s{i - 1}"]} for i in range(1, n)],
            "outputs": {}}
    g = stepgraph.from_description(desc)
    assert stepgraph.layout(g)[f"s{n - 1}"] == (n - 1, 0)
    b = Board()
    b.publish("r", stepgraph.to_dict(g), {"neg-last": f"s{n - 1}"})
    b.add_tasks([(("neg-last", 0), [])])
    b.transition(("neg-last", 0), "waiting", "processing")
    assert {s["state"] for s in b.view()["steps"]} == {"running"}
    b.transition(("neg-last", 0), "processing", "memory", nbytes=8)
    assert {s["state"] for s in b.view()["steps"]} == {"done"}

"""run(): one graph, atomic outputs, summaries, and failures that leave nothing behind."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

import tests.pipeline.helpers  # noqa: F401  (registers the test ops)
from flowgpu import pipeline
from flowgpu.pipeline import runner
from flowgpu.pipeline.checks import _loopback
from flowgpu.errors import RunError, SpecError
from flowgpu.io.atomic import written_by_flowgpu


def spec_for(tmp_path, x_path):
    return {
        "name": "runner-test",
        "inputs": {"x": {"source": "npy", "path": str(x_path), "chunks": [16, 3]}},
        "steps": {"c": {"op": "subtract", "inputs": ["x"], "args": {"b": 0.5}},
                  "s": {"op": "sum", "inputs": ["c"], "args": {"axis": 0}},
                  "t": {"op": "transpose", "inputs": ["c"]}},
        "outputs": {"z": {"from": "t", "sink": "zarr", "path": str(tmp_path / "out" / "t.zarr")},
                    "n": {"from": "c", "sink": "npy", "path": str(tmp_path / "out" / "c.npy")},
                    "s": {"from": "s"}},
    }


@pytest.fixture
def x_file(tmp_path, rng):
    x = rng.random((50, 3))
    np.save(tmp_path / "x.npy", x)
    return x, tmp_path / "x.npy"


def test_an_output_without_a_sink_is_written_as_its_path_suffix_says(tmp_path, x_file):
    x, path = x_file
    spec = spec_for(tmp_path, path)
    spec["outputs"] = {"n": {"from": "c", "path": str(tmp_path / "out" / "c.npy")}, "s": {"from": "s"}}
    result = pipeline.run(spec, session="local", progress=False)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "c.npy"), x - 0.5)
    assert written_by_flowgpu(str(tmp_path / "out" / "c.npy"))
    assert result.summary["outputs"]["n"]["location"] == str(tmp_path / "out" / "c.npy")
    np.testing.assert_allclose(result.outputs["s"], (x - 0.5).sum(0))


def _leftovers(root):
    return [f for _, dirs, files in os.walk(root) for f in dirs + files if ".flowgpu-tmp-" in f]


def test_run_writes_every_output_and_a_summary(tmp_path, x_file):
    x, path = x_file
    result = pipeline.run(spec_for(tmp_path, path), session="local", progress=False,
                          summary_path=str(tmp_path / "run.json"))
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "out" / "t.zarr"))[:], (x - 0.5).T)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "c.npy"), x - 0.5)
    np.testing.assert_allclose(result.outputs["s"], (x - 0.5).sum(0))
    assert written_by_flowgpu(str(tmp_path / "out" / "t.zarr"))
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["status"] == "ok" and summary["name"] == "runner-test"
    assert summary["outputs"]["z"]["shape"] == [3, 50] and summary["outputs"]["z"]["dtype"] == "float64"
    assert summary["outputs"]["z"]["location"] == str(tmp_path / "out" / "t.zarr")
    np.testing.assert_allclose(summary["outputs"]["s"]["value"], (x - 0.5).sum(0))
    assert summary["bytes_read"] == x.nbytes and summary["bytes_written"] > x.nbytes
    assert summary["wall_seconds"] > 0
    assert not _leftovers(tmp_path)


def test_rerun_replaces_own_outputs_but_not_foreign_data(tmp_path, x_file):
    _, path = x_file
    spec = spec_for(tmp_path, path)
    pipeline.run(spec, session="local", progress=False)
    pipeline.run(spec, session="local", progress=False)  # flowgpu wrote them: replaced
    os.remove(tmp_path / "out" / ".c.npy.flowgpu-output.json")  # now it looks like someone else's file
    with pytest.raises(SpecError, match="not written by flowgpu") as e:
        pipeline.run(spec, session="local", progress=False)
    assert e.value.path == "outputs.n.path"
    pipeline.run(spec, session="local", progress=False, overwrite=True)
    assert written_by_flowgpu(str(tmp_path / "out" / "c.npy"))


def test_failure_while_running_leaves_no_output(tmp_path, x_file):
    _, path = x_file
    spec = spec_for(tmp_path, path)
    spec["steps"]["c"] = {"op": "test_explode", "inputs": ["x"]}
    with pytest.raises(RunError, match="boom while running"):
        pipeline.run(spec, session="local", progress=False)
    assert not (tmp_path / "out" / "t.zarr").exists() and not (tmp_path / "out" / "c.npy").exists()
    assert not _leftovers(tmp_path)


def test_run_on_a_cluster(tmp_path, x_file, cpu_session):
    x, path = x_file
    result = pipeline.run(spec_for(tmp_path, path), session=cpu_session, progress=False)
    assert result.summary["session"]["backend"] == "cpu" and result.summary["session"]["n_workers"] == 2
    np.testing.assert_allclose(np.load(tmp_path / "out" / "c.npy"), x - 0.5)
    np.testing.assert_allclose(result.outputs["s"], (x - 0.5).sum(0))


def test_summary_outputs_must_be_small(tmp_path):
    spec = {"inputs": {"x": {"source": "random", "shape": [200, 100]}}, "outputs": {"x": {"from": "x"}}}
    with pytest.raises(SpecError, match="holds at most 10000") as e:
        pipeline.run(spec, session="local", progress=False)
    assert e.value.path == "outputs.x"


def test_a_failed_run_writes_its_summary_naming_the_step(tmp_path, x_file):
    _, path = x_file
    spec = spec_for(tmp_path, path)
    spec["steps"]["c"] = {"op": "map_blocks", "inputs": ["x"], "args": {"function": "tests.pipeline.helpers:_explode"}}
    with pytest.raises(RunError, match="boom while running"):
        pipeline.run(spec, session="local", progress=False, summary_path=str(tmp_path / "run.json"))
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["status"] == "failed" and "boom while running" in summary["error"]
    assert summary["step"] == "c" and summary["error_type"] == "RunError"
    assert summary["written"] == [] and summary["not_written"] == ["n", "s", "z"]
    assert not (tmp_path / "out" / "c.npy").exists()
    assert [f for f in os.listdir(tmp_path) if f.startswith(".run.json")] == []  # written atomically


def test_a_spec_error_in_the_summary_names_its_step(tmp_path, x_file):
    _, path = x_file
    spec = spec_for(tmp_path, path)
    spec["steps"]["s"]["args"]["axis"] = 5
    with pytest.raises(SpecError):
        pipeline.run(spec, session="local", progress=False, summary_path=str(tmp_path / "run.json"))
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["status"] == "failed" and summary["step"] == "s"


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:8787", True), ("localhost:0", True), ("[::1]:8787", True), ("tcp://127.0.0.2:1", True),
    ("0.0.0.0:0", False), (":8787", False), ("8787", False), ("[::]:0", False), ("10.0.0.5:8787", False),
    ("example.org:8787", False),
])
def test_loopback_addresses(address, loopback):

    assert _loopback(address) is loopback


def test_session_options_refuse_a_spec_address_unless_confirmed():
    spec = pipeline.validate({"inputs": {"x": {"source": "random", "shape": [4]}}, "outputs": {"x": {"from": "x"}},
                              "cluster": {"address": "tcp://10.9.8.7:8786", "n_workers": 2}},
                             allow_spec_address=True)
    with pytest.raises(SpecError, match="sends this run, and its data, to the scheduler at") as e:
        runner.session_options(spec)
    assert e.value.path == "cluster.address"
    assert runner.session_options(spec, allow_spec_address=True)["address"] == "tcp://10.9.8.7:8786"
    assert runner.session_options(spec, {"address": "tcp://10.9.8.7:8786"})["n_workers"] == 2
    assert runner.session_options(spec, {"address": "tcp://127.0.0.1:1"})["address"] == "tcp://127.0.0.1:1"
    with pytest.raises(SpecError, match="sends this run"):
        pipeline.validate(spec)
    confirmed = pipeline.validate({**spec.model_dump(by_alias=True)}, {"cluster.address": "tcp://10.9.8.7:8786"})
    assert runner.session_options(confirmed)["address"] == "tcp://10.9.8.7:8786"  # set on the command line


def test_protected_paths_and_outputs_that_contain_them(tmp_path, x_file, monkeypatch):
    _, path = x_file
    monkeypatch.chdir(tmp_path)
    spec = pipeline.validate(spec_for(tmp_path, path))
    protected = runner.protected_paths(spec)
    assert protected[os.path.realpath(tmp_path)] == "the working directory"
    assert protected[os.path.realpath(path)] == "input 'x' (x.npy)"  # relative to the working directory, as written
    data = spec_for(tmp_path, path)
    data["outputs"]["n"]["path"] = str(tmp_path / "x.npy")
    with pytest.raises(SpecError, match="which is input 'x'") as e:
        pipeline.run(data, session="local", progress=False, overwrite=True)
    assert e.value.path == "outputs.n.path"
    assert (tmp_path / "x.npy").exists()


def test_a_run_config_runs_as_its_keywords_and_subscribers_hear_each_event_in_order(tmp_path, x_file):
    from flowgpu.diagnostics import events

    x, path = x_file
    heard = []
    config = pipeline.RunConfig(session="local", progress=False, subscribers=(heard.append,))
    result = pipeline.run(spec_for(tmp_path, path), config, summary_path=str(tmp_path / "run.json"))
    np.testing.assert_allclose(result.outputs["s"], (x - 0.5).sum(0))
    assert [type(e).__name__ for e in heard] == ["SessionReady", "ItemStarted", "ItemFinished", "RunFinished"]
    started, finished = heard[1], heard[2]
    assert started.label is None and set(started.targets) == {"z", "n", "s"} and started.describe()["name"] == "runner-test"
    assert finished.outcome.status == "ok" and finished.outcome.written["n"] == str(tmp_path / "out" / "c.npy")
    np.testing.assert_allclose(finished.outcome.values["s"], (x - 0.5).sum(0))
    assert heard[3].summary == result.summary == json.loads((tmp_path / "run.json").read_text())
    heard.clear()
    again = pipeline.run(spec_for(tmp_path, path), config)  # up to date: no session, nothing started
    assert [type(e) for e in heard] == [events.RunFinished] and again.summary["outputs"]["s"]["status"] == "up-to-date"
    heard.clear()
    spec = spec_for(tmp_path, path)
    spec["steps"]["c"] = {"op": "map_blocks", "inputs": ["x"], "args": {"function": "tests.pipeline.helpers:_explode"}}
    with pytest.raises(RunError, match="boom while running"):
        pipeline.run(spec, config)
    assert heard[2].outcome.status == "failed" and "boom while running" in str(heard[2].outcome.error)
    assert heard[3].summary["status"] == "failed" and heard[3].summary["step"] == "c"


def test_a_runs_moves_are_each_workers_own_since_the_run_began(rng):
    """A worker the nanny restarts (over its memory) is a new worker whose counters start at 0: the
    run's moves are its counters plus what the other workers moved since the run began, never a
    negative number (CI saw -16 bytes) nor what the other workers had moved before the run."""
    from flowgpu.memory import delta, summary

    def stats(worker, moved, count, spills=0):
        return {"store": "flowgpu", "worker": worker, "errors": [], "events": {"spill_failed": spills},
                "moves": {"disk_to_host": {"bytes": moved, "count": count, "seconds": count / 10}}}

    a, b, b_again, c = (int(v) for v in rng.integers(1, 1 << 20, 4))
    before = summary({"tcp://w1": stats("Worker-1", a, 4), "tcp://w2": stats("Worker-2", b, 8, spills=1)})
    # Worker-2 restarted at the same address, Worker-1 moved c more bytes, Worker-3 joined
    after = summary({"tcp://w1": stats("Worker-1", a + c, 6), "tcp://w2": stats("Worker-2b", b_again, 2, spills=1),
                     "tcp://w3": stats("Worker-3", 7, 1)})
    moved = delta(before, after)
    assert moved["moves"]["disk_to_host"]["bytes"] == c + b_again + 7
    assert moved["moves"]["disk_to_host"]["count"] == 2 + 2 + 1
    assert moved["events"] == {"spill_failed": 1}  # the restarted worker's, none of the old one's
    assert after["moves"]["disk_to_host"]["bytes"] == a + c + b_again + 7  # the sum still sums every worker
    nothing = delta(after, after)
    assert nothing["moves"] == {} and nothing["events"] == {}

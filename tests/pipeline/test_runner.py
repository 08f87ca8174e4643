"""run(): one graph, atomic outputs, summaries, and failures that leave nothing behind."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

import tests.pipeline.helpers  # noqa: F401  (registers the test ops)
from flowgpu import pipeline
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

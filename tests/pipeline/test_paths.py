"""A spec's paths are resolved on the client when it loads: no task depends on a worker's working directory."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from flowgpu import pipeline
from flowgpu.pipeline.cache import Cache
from flowgpu.pipeline.recipe import recipes


@pytest.fixture
def project(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "data").mkdir()
    (tmp_path / "home").mkdir()
    data = rng.random((12, 5)).astype("f4")
    np.save(tmp_path / "data" / "a.npy", data)
    np.save(tmp_path / "home" / "h.npy", data * 2)
    z = zarr.create_array(str(tmp_path / "data" / "b.zarr"), shape=(12, 5), chunks=(4, 5), dtype="f4")
    z[:] = data + 1
    spec = {"name": "paths",
            "inputs": {"a": {"source": "npy", "path": "data/a.npy"}, "b": {"source": "zarr", "path": "data/b.zarr"},
                       "h": {"source": "npy", "path": "~/h.npy"}},
            "steps": {"s": {"op": "add", "inputs": ["a", "b"]}, "t": {"op": "add", "inputs": ["s", "h"]}},
            "outputs": {"t": {"from": "t", "sink": "zarr", "path": "out/t.zarr"},
                        "u": {"from": "s", "sink": "npy", "path": "~/u.npy"}}}
    return tmp_path, data, spec


def test_input_and_output_paths_are_absolute_once_loaded(project):
    base, _, spec = project
    s = pipeline.from_dict(spec)
    assert s.inputs["a"].path == str(base / "data" / "a.npy")
    assert s.inputs["b"].path == str(base / "data" / "b.zarr")
    assert s.inputs["h"].path == str(base / "home" / "h.npy")  # ~ is this user's HOME, not a worker's
    assert s.outputs["t"].path == str(base / "out" / "t.zarr")
    assert s.outputs["u"].path == str(base / "home" / "u.npy")


def test_urls_stay_as_they_are(project):
    _, _, spec = project
    spec["inputs"]["b"]["path"] = "s3://bucket/b.zarr"
    with pytest.raises(Exception):  # no such bucket here; the path reached the source unchanged
        pipeline.compile(spec)
    assert pipeline.from_dict({**spec, "steps": {}, "outputs": {}}).inputs["b"].path == "s3://bucket/b.zarr"


def test_the_graph_names_no_relative_path(project):
    base, data, spec = project
    plan = pipeline.compile(spec)
    os.chdir(base / "home")  # a worker elsewhere: the graph reads the same files
    np.testing.assert_array_equal(plan.outputs["t"].compute(), data + (data + 1) + data * 2)


def test_a_cache_entry_of_an_older_flowgpu_is_not_trusted(project):
    """Entries recorded before paths were resolved on the client may hold fill values read by workers
    elsewhere: never up to date, whatever they say."""
    base, data, spec = project
    spec = {**spec, "outputs": {"m": {"from": "s"}}, "steps": {"s": {"op": "mean", "inputs": ["b"]}}}
    first = pipeline.run(spec, session="local", progress=False)
    assert first.summary["outputs"]["m"]["status"] == "computed"
    np.testing.assert_allclose(first.outputs["m"], (data + 1).astype(np.float64).mean(), rtol=1e-6)
    assert pipeline.run(spec, session="local", progress=False).summary["outputs"]["m"]["status"] == "up-to-date"
    cache = Cache()
    plan = pipeline.compile(spec)
    entry_path = cache.path(plan, "m")
    entry = json.loads(open(entry_path).read())
    entry["format"], entry["value"] = 1, 0.0  # what an older flowgpu recorded from a worker that saw no store
    with open(entry_path, "w") as f:
        json.dump(entry, f)
    verdict = cache.check(plan, recipes(plan))["m"]
    assert not verdict.up_to_date and verdict.reason == "recorded before paths were resolved on the client (an older flowgpu)"
    again = pipeline.run(spec, session="local", progress=False)
    assert again.summary["outputs"]["m"]["status"] == "computed" and again.outputs["m"] == first.outputs["m"]

"""What a run does beyond the graph it computes: a python source called once, its chain fused where
it is computed, and on a Session one wait for the cluster, as ``compute()`` makes."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
from distributed import Client

from flowgpu import pipeline
from flowgpu.backend import is_cupy
from flowgpu.errors import SpecError
from flowgpu.fusion import chunk, fusing
from tests.pipeline import helpers

pytestmark = pytest.mark.timeout(180)


def _spec(seed: int) -> dict:
    return {"name": "cost", "inputs": {"m": {"source": "python", "callable": "tests.pipeline.helpers:counted_matrix",
                                             "args": {"rows": 40, "cols": 30, "seed": seed}, "shape": [40, 30],
                                             "dtype": "float64", "chunks": [10, 15]}},
            "steps": {"y": {"op": "expr", "inputs": {"x": "m"}, "args": {"expression": "(x * 2 + 1) ** 2 - x"}},
                      "z": {"op": "multiply", "inputs": ["y"], "args": {"b": -3.0}},
                      "total": {"op": "sum", "inputs": ["z"], "args": {"axis": 0}}},
            "outputs": {"total": {"from": "total"}}}


def _want(seed: int) -> np.ndarray:
    x = helpers.make_matrix(40, 30, seed) + helpers.CALLS.get("shift", 0.0)
    return (-3.0 * ((x * 2 + 1) ** 2 - x)).sum(axis=0)


@pytest.fixture(params=["local", "cluster"])
def where(request):
    return "local" if request.param == "local" else request.getfixturevalue("cpu_session")


def test_each_run_calls_a_python_source_once_and_computes_its_chain_fused(where, rng):
    for _ in range(2):  # the second run too: nothing of the first is reused
        seed = int(rng.integers(1 << 30))
        helpers.CALLS["source"] = 0
        result = pipeline.run(_spec(seed), session=where, progress=False)
        assert helpers.CALLS["source"] == 1
        np.testing.assert_allclose(result.outputs["total"], _want(seed), rtol=1e-12)
        assert result.plan.fused and set(result.summary["fused"]) == {"total"}
        rows = {r["name"]: r for r in pipeline.describe(result.plan)["steps"]}
        assert rows["y"]["fused_into"] == "total" and rows["y"]["shape"] == [40, 30]  # the inlined steps still said
        assert rows["total"]["fused"].endswith("-> sum") and rows["total"]["shape"] == [30]


def test_a_spec_run_again_computes_its_new_data_and_sees_its_edits_and_the_files_it_reads(tmp_path, rng):
    """Nothing of the same spec's previous run stands for data."""
    seed = int(rng.integers(1 << 30))
    spec = _spec(seed)
    helpers.CALLS["shift"] = 0.0
    first = pipeline.run(spec, session="local", progress=False).outputs["total"]
    np.testing.assert_allclose(first, _want(seed), rtol=1e-12)
    helpers.CALLS["shift"], helpers.CALLS["source"] = float(rng.random()) + 1.0, 0
    again = pipeline.run(spec, session="local", progress=False, force=True).outputs["total"]
    assert helpers.CALLS["source"] == 1
    np.testing.assert_allclose(again, _want(seed), rtol=1e-12)  # the new data, not the first run's
    helpers.CALLS["shift"] = 0.0
    spec["steps"]["z"]["args"]["b"] = 5.0  # an edit: a new recipe
    edited = pipeline.run(spec, session="local", progress=False).outputs["total"]
    np.testing.assert_allclose(edited, _want(seed) * (5.0 / -3.0), rtol=1e-12)
    path = tmp_path / "w.npy"
    for cols in (30, 31):  # an input read from a file: its new shape is seen
        np.save(path, rng.random(cols))
        spec["inputs"]["w"] = {"source": "npy", "path": str(path)}
        spec["steps"]["total"]["inputs"] = ["z"]
        spec["steps"]["wz"] = {"op": "multiply", "inputs": ["total", "w"]}
        spec["outputs"] = {"wz": {"from": "wz"}}
        if cols == 30:
            got = pipeline.run(spec, session="local", progress=False).outputs["wz"]
            np.testing.assert_allclose(got, _want(seed) * (5.0 / -3.0) * np.load(path), rtol=1e-12)
        else:  # refused by the checks before anything runs: the source is not called
            helpers.CALLS["source"] = 0
            with pytest.raises(SpecError, match="wz"):
                pipeline.run(spec, session="local", progress=False)
            assert helpers.CALLS["source"] == 0


def test_a_chain_whose_kernel_does_not_compile_runs_unfused_with_one_warning(rng, monkeypatch):
    """The run's graph is fused where it is computed (the Session's hook, as for any dask code); a
    kernel that the compiler refuses is computed unfused there: the same values, one warning."""
    def refuse(*args, **kwargs):
        raise ValueError("no kernel for this")

    monkeypatch.setattr(chunk, "reduce_kernel", refuse)
    monkeypatch.setattr(chunk, "elementwise_kernel", refuse)
    monkeypatch.setattr(chunk, "_warned", set())
    seed = int(rng.integers(1 << 30))
    helpers.CALLS["source"] = 0
    with fusing(), pytest.warns(RuntimeWarning, match="could not compile a fused kernel .*no kernel for this"):
        result = pipeline.run(_spec(seed), session="local", progress=False)
    assert helpers.CALLS["source"] == 1
    np.testing.assert_allclose(result.outputs["total"], _want(seed), rtol=1e-12)
    assert result.summary["fused"] == {"total": "(((m * 2 + 1) ** 2 - m) * (-3.0)) -> sum"}


def _waits(fn) -> Counter:
    """What ``fn`` waits for on the cluster from this thread (each a round trip), by name."""
    seen: Counter = Counter()
    original = Client.sync

    def counted(self, func, *args, **kwargs):
        if threading.current_thread() is threading.main_thread() and not kwargs.get("asynchronous"):
            seen[getattr(func, "__name__", repr(func))] += 1  # asynchronous: sent, answered on the loop
        return original(self, func, *args, **kwargs)

    Client.sync = counted
    try:
        fn()
    finally:
        Client.sync = original
    return seen


def test_a_run_on_a_session_waits_for_the_cluster_once_like_compute(cpu_session, rng):
    seed = int(rng.integers(1 << 30))
    spec = _spec(seed)
    plan = pipeline.compile(spec, for_run=True)
    with cpu_session.client.as_current():
        python = _waits(lambda: plan.outputs["total"].compute())
    got = {}
    run = _waits(lambda: got.update(pipeline.run(spec, session=cpu_session, progress=False, force=True).outputs))
    np.testing.assert_allclose(got["total"], _want(seed), rtol=1e-12)
    assert run == python == Counter({"_gather": 1})
    assert "memory" in pipeline.run(spec, session=cpu_session, progress=False, force=True).summary


@pytest.mark.gpu
def test_a_run_on_a_gpu_session_waits_once_and_computes_its_chain_fused_on_the_device(gpu_session, rng):
    for _ in range(2):  # the second run too
        seed = int(rng.integers(1 << 30))
        helpers.CALLS["source"] = 0
        got = {}
        waits = _waits(lambda: got.update(pipeline.run(_spec(seed), session=gpu_session, progress=False).__dict__))
        assert waits == Counter({"_gather": 1}) and helpers.CALLS["source"] == 1
        np.testing.assert_allclose(got["outputs"]["total"], _want(seed), rtol=1e-12)
        assert got["plan"].fused and is_cupy(got["plan"].outputs["total"]._meta)


def test_a_spec_is_compiled_for_the_facts_it_is_given_and_nothing_global(rng):
    """``compile(spec, facts=...)``: chunks="auto" follows the given workers' budget, not dask.config."""
    import dask

    from flowgpu.backend import Facts

    spec = {"name": "facts", "inputs": {"x": {"source": "random", "shape": [4096, 512], "seed": 3}},
            "steps": {"s": {"op": "sum", "inputs": ["x"], "args": {"axis": 0}}}, "outputs": {"s": {"from": "s"}}}
    published = dask.config.get("flowgpu.worker.budget", None)  # an open Session's, if any
    plain = pipeline.compile(spec)
    tight = pipeline.compile(spec, facts=Facts("numpy", budget=4 << 20, threads=1))
    assert plain.facts == Facts.here() and tight.facts == Facts("numpy", 4 << 20, 1)
    assert tight.outputs["s"].chunks != plain.outputs["s"].chunks or tight.arrays["x"].chunks != plain.arrays["x"].chunks
    assert max(tight.arrays["x"].chunks[0]) * 512 * 8 <= (4 << 20)  # a chunk fits the given budget's share
    assert dask.config.get("flowgpu.worker.budget", None) == published  # nothing was published to get there
    assert pipeline.compile(spec).facts == plain.facts  # and nothing of the given facts stays
    np.testing.assert_allclose(tight.outputs["s"].compute(), plain.outputs["s"].compute(), rtol=1e-12)


def test_a_run_on_an_open_session_compiles_once_and_one_that_starts_its_cluster_again_only_for_its_workers(
        cpu_session, rng, monkeypatch):
    from flowgpu.pipeline import batch

    compiled = []
    original = batch.compile
    monkeypatch.setattr(batch, "compile", lambda *a, **k: compiled.append(k) or original(*a, **k))
    spec = {"name": "once", "inputs": {"x": {"source": "random", "shape": [300, 200], "seed": 5}},
            "steps": {"y": {"op": "multiply", "inputs": ["x"], "args": {"b": 2.0}},
                      "s": {"op": "sum", "inputs": ["y"]}}, "outputs": {"s": {"from": "s"}}}
    result = pipeline.run(spec, session=cpu_session, progress=False, cache=False)
    assert compiled == [] and result.plan.facts == cpu_session.facts  # built for its workers at once
    x = pipeline.compile(spec).arrays["x"].compute()
    np.testing.assert_allclose(result.outputs["s"], (x * 2.0).sum(), rtol=1e-12)
    result = pipeline.run(spec, session="local", progress=False, cache=False)
    assert compiled == []  # the local threaded scheduler: this machine's facts, as compiled


@pytest.mark.parametrize("how", [{"force": True}, {"cache": False}])
def test_a_forced_run_of_a_python_source_on_a_session_calls_it_once_and_compiles_once(cpu_session, rng, monkeypatch,
                                                                                       how):
    """Every output will be computed: the source is called while the spec compiles, not compiled again."""
    from flowgpu.pipeline import batch

    compiled = []
    original = batch.compile
    monkeypatch.setattr(batch, "compile", lambda *a, **k: compiled.append(k) or original(*a, **k))
    seed = int(rng.integers(1 << 30))
    helpers.CALLS["source"] = 0
    result = pipeline.run(_spec(seed), session=cpu_session, progress=False, **how)
    assert compiled == [] and helpers.CALLS["source"] == 1
    np.testing.assert_allclose(result.outputs["total"], _want(seed), rtol=1e-12)
    helpers.CALLS["source"] = 0  # a run that may find its outputs up to date calls it only when it must
    pipeline.run(_spec(seed), session=cpu_session, progress=False)
    assert helpers.CALLS["source"] == ("cache" in how) and len(compiled) == ("cache" in how)
    compiled.clear()
    helpers.CALLS["source"] = 0
    seed += 1  # new args: not up to date, so called (once) and compiled for the run
    result = pipeline.run(_spec(seed), session=cpu_session, progress=False)
    assert helpers.CALLS["source"] == 1 and len(compiled) == 1
    np.testing.assert_allclose(result.outputs["total"], _want(seed), rtol=1e-12)

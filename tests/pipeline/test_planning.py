"""The tasks a plan counts, and ``check_memory``: a plan refused before it runs when one task or its
largest array cannot fit the workers (their probe results stand in for a session here), with the
numbers, the input or step, and where it is in the spec."""

from __future__ import annotations

import numpy as np
import pytest
from dask.highlevelgraph import HighLevelGraph

from flowgpu import pipeline
from flowgpu.errors import SpecError
from flowgpu.pipeline.planning import check_memory, footprints

MiB = 1 << 20


def _plan(shape, chunks):
    return pipeline.compile({
        "version": 1, "name": "p",
        "inputs": {"x": {"source": "zeros", "shape": list(shape), "dtype": "float64", "chunks": list(chunks)}},
        "steps": {"y": {"op": "add", "inputs": ["x", "x"]}, "s": {"op": "sum", "inputs": ["y"]}},
        "outputs": {"t": {"from": "s"}},
    })


def _workers(n, free, kernels=0):
    return {f"w{i}": {"rss": 80 * MiB, "kernels": kernels, "spill_free": free, "spill_disk": "host:1",
                      "local_directory": "/spill"} for i in range(n)}


def test_footprint_of_a_step_is_its_output_chunk_and_its_inputs_chunks():
    plan = _plan((1000, 1000), (100, 1000))  # 0.76 MiB chunks
    feet = {name: (section, working, chunk) for name, section, working, chunk, _ in footprints(plan)}
    chunk = 100 * 1000 * 8
    assert feet["x"] == ("inputs", chunk, chunk)
    assert feet["y"] == ("steps", 2 * chunk, chunk)  # its output and x's chunk (once, though named twice)


def test_a_task_that_cannot_fit_a_worker_is_refused_with_the_numbers():
    plan = _plan((1000, 1000), (500, 1000))  # 3.81 MiB chunks; y holds 7.63 MiB
    check_memory(plan, _workers(2, 1 << 40), threads=1, budget=12 * MiB)  # fits
    with pytest.raises(SpecError, match=r"one task of 'y' holds about 7.63 MiB .* 2 at a time per worker, "
                                        r"but a worker can hold 12.00 MiB") as e:
        check_memory(plan, _workers(2, 1 << 40), threads=2, budget=12 * MiB)
    assert e.value.path == "steps.y" and "smaller chunks" in str(e.value)


def test_an_array_larger_than_the_clusters_memory_and_spill_disk_is_refused():
    plan = _plan((4000, 1000), (500, 1000))  # 30.52 MiB arrays
    check_memory(plan, _workers(2, 10 * MiB), threads=1, budget=12 * MiB)  # 2 x 12 + 10 (one disk) = 34 MiB
    with pytest.raises(SpecError, match=r"'x' is 30.52 MiB, more than the cluster can hold: 2 worker\(s\) of "
                                        r"12.00 MiB and 5.00 MiB free"):
        check_memory(plan, _workers(2, 5 * MiB), threads=1, budget=12 * MiB)


def test_no_workers_no_check():
    check_memory(_plan((4000, 1000), (500, 1000)), {}, threads=1, budget=1)


def test_gpu_workers_count_their_host_memory_as_room():
    plan = _plan((4000, 1000), (500, 1000))  # 30.52 MiB arrays
    workers = {k: {**w, "gpus": 1, "memory_limit": 8 * MiB} for k, w in _workers(2, 0).items()}
    check_memory(plan, workers, threads=1, budget=8 * MiB)  # 2 x 8 device + 2 x 8 host = 32 MiB
    smaller = {k: {**w, "memory_limit": 6 * MiB} for k, w in workers.items()}
    with pytest.raises(SpecError, match="12.00 MiB of host memory"):
        check_memory(plan, smaller, threads=1, budget=8 * MiB)


def test_tasks_counted_are_the_keys_of_the_graph_that_runs(rng):
    """``tasks`` in ``flowgpu plan`` and in a run's summary (and each step's row) are the keys of the
    outputs' graph, counted from its layers without building them; outputs sharing steps count them once."""
    seed = int(rng.integers(1 << 30))
    spec = {"version": 1, "name": "count",
            "inputs": {"x": {"source": "random", "shape": [60, 40], "chunks": [15, 20], "seed": seed}},
            "steps": {"xt": {"op": "transpose", "inputs": ["x"]},
                      "y": {"op": "expr", "inputs": {"a": "x"}, "args": {"expression": "(a * 2 + 1) ** 2"}},
                      "m": {"op": "mean", "inputs": ["y"], "args": {"axis": 0}},
                      "s": {"op": "sum", "inputs": ["xt"], "args": {"axis": 1}},
                      "both": {"op": "add", "inputs": ["m", "s"]}},
            "outputs": {"both": {"from": "both"}, "m": {"from": "m"}}}
    plan = pipeline.compile(spec)
    keys = HighLevelGraph.merge(*(x.__dask_graph__() for x in plan.outputs.values())).to_dict()
    desc = pipeline.describe(plan)
    assert desc["tasks"] == len(keys) > 0
    rows = {r["name"]: r for r in desc["steps"]}
    for name in ("xt", "m", "s", "both"):
        own = set(plan.arrays[name].__dask_graph__().to_dict())
        before = set().union(*(plan.arrays[d].__dask_graph__().to_dict() for d in plan.nodes[name].deps))
        assert rows[name]["tasks"] == len(own - before) > 0, name
    result = pipeline.run(spec, session="local", progress=False, cache=False)
    assert result.summary["tasks"] == len(keys)
    x = plan.arrays["x"].compute()
    np.testing.assert_allclose(result.outputs["both"], ((x * 2 + 1) ** 2).mean(axis=0) + x.T.sum(axis=1), rtol=1e-10)

"""The store as the data of real Dask workers: a session over data larger than their memory."""

from __future__ import annotations

import time

import dask.array as da
import numpy as np
import pytest

import flowgpu
from flowgpu.diagnostics import render_summary
from flowgpu.memory import summary


def _scheduler_metrics(dask_scheduler=None):
    return {w: ws.metrics.get("flowgpu-memory") for w, ws in dask_scheduler.workers.items()}


def _spilled(seen: dict) -> int:
    return sum(m.get("host_to_disk_bytes", 0) for m in seen.values() if m)


@pytest.mark.slow
def test_two_gib_through_two_workers_of_600_mb(rng):
    """A worker that has compiled the fused kernel holds about 300 MB (numba), so 600 MB each."""
    from distributed import wait

    seed = int(rng.integers(2**31))
    x = da.random.default_rng(seed).standard_normal(2**28, chunks=2**21)  # 2 GiB of float64, 16 MiB chunks
    expr = lambda a: ((a * 2 + 1) ** 2 - a).sum()  # noqa: E731
    start = time.perf_counter()
    with flowgpu.Session(backend="cpu", n_workers=2, threads_per_worker=1, memory_limit="600MB",
                         dashboard_address=None) as s:
        xp = x.persist()
        wait(xp)
        got = float(expr(xp).compute())
        tail = xp[-5:].compute()
        per_worker = s.client.run(flowgpu.memory.stats)
        deadline = time.monotonic() + 60  # the dashboard's view: the heartbeat metric on the scheduler
        while time.monotonic() < deadline:
            seen = s.client.run_on_scheduler(_scheduler_metrics)
            if seen and all(seen.values()) and _spilled(seen) >= 2**31 - 2 * 600e6:
                break
            time.sleep(0.2)
    elapsed = time.perf_counter() - start
    want = float(expr(x).compute(scheduler="threads"))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(tail, x[-5:].compute(scheduler="threads"))
    assert all(st["store"] == "flowgpu" for st in per_worker.values())
    for st in per_worker.values():  # each worker kept to its host budget and used its disk
        assert st["tiers"]["host"]["limit"] == int(600e6 * 0.6)
        assert st["tiers"]["host"]["bytes"] <= st["tiers"]["host"]["limit"]
    total = summary(per_worker)
    assert total["moves"]["host_to_disk"]["bytes"] >= 2**31 - 2 * 600e6
    assert total["moves"]["disk_to_host"]["count"] > 0 and not total["errors"]
    # every worker reports its store, and the spill adds up there too (which worker spills is the scheduler's
    # choice: on a busy machine one worker may be given nearly all the chunks)
    assert len(seen) == 2 and all(seen.values()) and _spilled(seen) >= 2**31 - 2 * 600e6, seen
    print(f"2 GiB through 2 x 600 MB: {elapsed:.1f} s; moves {total['moves']}")


_HELD: dict = {}


def held(name: str):
    """A persisted array for the pipeline below (its ``python`` source)."""
    return _HELD[name]


@pytest.mark.slow
def test_pipeline_summary_reports_what_the_run_moved_between_tiers(rng):
    """A run over data spilled to disk: its summary (and printed report) says what moved, for this run only."""
    import io

    from distributed import wait
    from rich.console import Console

    from flowgpu import pipeline

    seed = int(rng.integers(2**31))
    x = da.random.default_rng(seed).standard_normal(2**26, chunks=2**20)  # 512 MiB of float64, 8 MiB chunks
    spec = {"version": 1, "name": "spilled", "inputs": {"x": {"source": "python", "callable": f"{__name__}:held",
                                                               "args": {"name": "x"}, "shape": [2**26],
                                                               "dtype": "float64"}},
            "steps": {"total": {"op": "sum", "inputs": ["x"]}}, "outputs": {"total": {"from": "total"}}}
    # 700 MB: the store's host tier (0.6 of it) holds 420 of the 537 MB, the rest goes to disk; at 400 MB
    # the worker's process (about 150 MB of its own) came within 95% and its nanny restarted it once in CI
    with flowgpu.Session(backend="cpu", n_workers=1, threads_per_worker=1, memory_limit="700MB",
                         dashboard_address=None) as s:
        _HELD["x"] = xp = x.persist()
        wait(xp)
        out = io.StringIO()
        try:
            result = pipeline.run(spec, session=s, console=Console(file=out, width=200))
            # again, forced: the workers are asked for their accounting before it while it compiles
            again = pipeline.run(spec, session=s, progress=False, force=True)
            since_start = summary(s.client.run(flowgpu.memory.stats))["moves"]
        finally:
            _HELD.clear()
    want = float(x.sum().compute(scheduler="threads"))
    for run in (result, again):
        np.testing.assert_allclose(float(run.outputs["total"]), want, rtol=1e-12)
        moves = run.summary["memory"]["moves"]
        assert moves["disk_to_host"]["bytes"] > 0  # the pass read spilled chunks back
        assert moves["disk_to_host"]["bytes"] <= 2**29 + 2**16  # each spilled chunk read back once at most
        # this run's moves only, not the persist's writes to disk before it
        assert moves.get("host_to_disk", {}).get("bytes", 0) < since_start["host_to_disk"]["bytes"]
    both = sum(run.summary["memory"]["moves"]["disk_to_host"]["bytes"] for run in (result, again))
    assert both <= since_start["disk_to_host"]["bytes"]  # neither counts the other's reads
    render_summary(result.summary, Console(file=out, width=200))  # what `flowgpu run` prints on stdout
    assert "spilling: disk to host" in out.getvalue()

"""The several-GPU columns of the suite and the out-of-core table (``--gpus``), on the GPUs there are.

On one GPU (``--gpus 0``) they run the same code: each column's result is checked against the
float64 reference and is bit-identical to the one-GPU column beside it; a UCX column runs where
distributed-ucxx is installed and otherwise says why it was skipped.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.out_of_core import run as out_of_core
from benchmarks.suite import run

def test_out_of_core_setups_one_gpu_then_all():
    assert out_of_core.setups(["flowgpu"], [0], ["tcp"]) == [("flowgpu", "flowgpu", (0,), "tcp")]
    assert out_of_core.setups(["flowgpu", "dask-cuda"], [0, 1], ["tcp", "ucx"]) == [
        ("flowgpu", "flowgpu", (0,), "tcp"), ("flowgpu", "flowgpu 2 GPUs", (0, 1), "tcp"),
        ("flowgpu", "flowgpu 2 GPUs UCX", (0, 1), "ucx"), ("dask-cuda", "dask-cuda", (0,), "tcp"),
        ("dask-cuda", "dask-cuda 2 GPUs", (0, 1), "tcp"), ("dask-cuda", "dask-cuda 2 GPUs UCX", (0, 1), "ucx")]
    assert [s[1] for s in out_of_core.setups(["flowgpu"], [3], ["tcp", "ucx"])] == ["flowgpu", "flowgpu 1 GPU UCX"]


def test_out_of_core_ratios_compare_like_with_like(rng):
    t = {label: float(rng.uniform(1, 10)) for label in ("flowgpu", "dask-cuda", "flowgpu 2 GPUs", "dask-cuda 2 GPUs")}
    rows = [dict(workload="chain", store=label, seconds=s) for label, s in t.items()]
    rows.append(dict(workload="chain", store="flowgpu 2 GPUs UCX", seconds=None, error="ConfigError: no UCX"))
    out_of_core._ratios(rows, None)
    by = {r["store"]: r for r in rows}
    assert by["flowgpu"]["speedup"] == pytest.approx(t["dask-cuda"] / t["flowgpu"])
    assert by["flowgpu 2 GPUs"]["speedup"] == pytest.approx(t["dask-cuda 2 GPUs"] / t["flowgpu 2 GPUs"])
    assert by["flowgpu 2 GPUs"]["vs_one_gpu"] == pytest.approx(t["flowgpu"] / t["flowgpu 2 GPUs"])
    assert by["dask-cuda 2 GPUs"]["vs_one_gpu"] == pytest.approx(t["dask-cuda"] / t["dask-cuda 2 GPUs"])
    assert "vs_one_gpu" not in by["flowgpu"] and "speedup" not in by["flowgpu 2 GPUs UCX"]
    assert "ConfigError: no UCX" in out_of_core.table(rows)


def _gpus() -> str:
    import cupy  # noqa: PLC0415 - GPU tests only

    return ",".join(str(g) for g in range(min(2, cupy.cuda.runtime.getDeviceCount())))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_suite_columns_on_the_gpus(tmp_path):
    gpus = _gpus()
    n = len(gpus.split(","))
    path = tmp_path / "suite.json"
    assert run.main(["--size", "small", "--gpus", gpus, "--only", "chain_sum", "--only", "transpose_sum",
                     "--repeats", "1", "--json", str(path)]) == 0
    for w in json.loads(path.read_text())["workloads"]:
        by = {r["column"]: r for r in w["results"]}
        plural = "s" if n > 1 else ""
        for label in (f"flowgpu {n} GPU{plural}", f"dask-cuda {n} GPU{plural}"):
            r = by[label]
            assert r["error"] is None, (w["name"], label, r["error"])
            assert r["check"].startswith("ok") and "bit-identical" in r["check"], (w["name"], label, r["check"])
        for label in (f"flowgpu {n} GPU{plural} UCX", f"dask-cuda {n} GPU{plural} UCX"):
            r = by[label]
            assert ("bit-identical" in r["check"]) if r["error"] is None else r["error"], (w["name"], label)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_out_of_core_on_the_gpus(tmp_path):
    gpus = _gpus()
    path = tmp_path / "ooc.json"
    assert out_of_core.main(["--size", "small", "--gpus", gpus, "--workloads", "chain,transpose",
                             "--repeats", "1", "--json", str(path)]) == 0
    results = json.loads(path.read_text())["results"]
    setups = {r["store"] for r in results if r["store"] != "-"}  # a setup that could not start has its row too
    assert {"flowgpu", "dask-cuda"} <= setups and len(setups) >= 4, setups
    rows = [r for r in results if r.get("key")]
    ran = {r["store"] for r in rows}
    assert {"flowgpu", "dask-cuda"} <= ran and ("," not in gpus or {"flowgpu 2 GPUs", "dask-cuda 2 GPUs"} <= ran), ran
    for r in rows:
        assert r["identical"] == "yes", r

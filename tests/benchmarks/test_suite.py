"""Small CPU runs of the benchmarks that have a CPU mode: every column runs, and its result is right.

The suite checks each column against a float64 reference itself; these tests also check the
reference, by recomputing a workload with NumPy, and read what ``--json`` wrote.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.out_of_core import run as out_of_core
import flowgpu as fg
from benchmarks.suite import chunk_size, run, vectorize

pytestmark = pytest.mark.slow


def test_suite_cpu_small_chain_sum(tmp_path, capsys):
    path = tmp_path / "suite.json"
    assert run.main(["--cpu", "--size", "small", "--only", "chain_sum", "--repeats", "1", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["command"] == f"python -m benchmarks.suite.run --cpu --size small --only chain_sum --repeats 1 --json {path}"
    assert {"date", "python", "numpy", "dask", "distributed"} <= set(doc["environment"])
    (first, second) = doc["workloads"]
    for w in (first, second):
        by = {r["column"]: r for r in w["results"]}
        assert set(by) == {"floor", "NumPy", "numba fused", "dask threaded", "dask, flowgpu's chunks", "flowgpu API",
                           "plain dask on a Session", "flowgpu YAML"}
        for col, r in by.items():
            assert r["error"] is None, (col, r["error"])
            assert r["time_s"] > 0 and len(r["times"]) == (0 if col == "floor" else 1)
            if col != "floor":
                assert r["check"].startswith("ok"), (col, r["check"])
    out = capsys.readouterr().out.splitlines()
    assert "| chain_sum" in out[-1]  # the table comes last
    assert any(line.startswith(doc["environment"]["date"]) and "python" in line for line in out)


@pytest.mark.parametrize("workload, expr", [
    ("chain_sum", lambda x: ((x * 2 + 1) ** 2 - x).sum()),
    ("transpose_sum", lambda x: (x + x.T).sum()),
])
def test_suite_results_match_numpy(tmp_path, workload, expr):
    """Each column's result equals NumPy's on the same data, made again from the seed the run used."""
    path = tmp_path / "suite.json"
    assert run.main(["--cpu", "--size", "small", "--only", workload, "--repeats", "1", "--json", str(path)]) == 0
    for w in json.loads(path.read_text())["workloads"]:
        x = fg.random(tuple(w["inputs"]["shape"]), dtype=w["inputs"]["dtype"], seed=w["inputs"]["seed"],
                      chunks=(97, -1)).compute(scheduler="sync")
        want = float(expr(x.astype(np.float64)))
        assert w["reference"] == pytest.approx(want, rel=1e-12)
        values = {r["column"]: r["value"] for r in w["results"] if r["column"] != "floor"}
        assert len(values) == 7
        for col, got in values.items():
            assert got == pytest.approx(want, rel=1e-5), col


def test_chunk_size_sweep_cpu(tmp_path):
    path = tmp_path / "chunk_size.json"
    assert chunk_size.main(["--cpu", "--total", "0.03125", "--chunks", "2,8", "--repeats", "1",
                            "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert [r["chunk_MiB"] for r in doc["sweep"]] == [2, 8]
    assert [r["chunks"] for r in doc["sweep"]] == [16, 4]
    assert doc["suggested_MiB"] in (2, 8)


def test_vectorize_cpu_small(tmp_path):
    path = tmp_path / "vectorize.json"
    assert vectorize.main(["--cpu", "--size", "small", "--repeats", "1", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [r["result"] for r in rows] == ["ok", "ok", "ok"]


def test_out_of_core_cpu_small(tmp_path):
    """Both stores spill 2 GiB under two workers of 600 MB and give the same sum."""
    path = tmp_path / "out_of_core.json"
    assert out_of_core.main(["--cpu", "--size", "small", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    assert [(r["store"], r["workload"].split()[0]) for r in rows] == [
        ("flowgpu", "persist"), ("flowgpu", "chain+sum"), ("dask", "persist"), ("dask", "chain+sum")]
    assert all(r["seconds"] > 0 for r in rows)
    assert [r["identical"] for r in rows if "identical" in r] == ["yes", "yes"]


def test_suite_cold_cpu_small(tmp_path):
    """--cold: fresh processes, the first with empty kernel caches compiles, the one after it loads."""
    path = tmp_path / "cold.json"
    assert run.main(["--cold", "--cpu", "--size", "small", "--only", "abs_max", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["workload"] == "abs_max" and row["check"] == "ok"
    plain_cold, plain_warm, fused_cold, fused_warm = map(int, row["cache files written (runs 1-4)"].split("/"))
    assert plain_cold == plain_warm == 0 and fused_cold >= 1 and fused_warm == 0
    assert all(row[k] > 0 for k in row if k.endswith("(s)"))


def test_suite_cold_only_with_cold():
    with pytest.raises(SystemExit):
        run.main(["--cpu", "--only", "abs_max"])

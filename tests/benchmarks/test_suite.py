"""A quick CPU smoke run of the benchmark suite and the chunk-size sweep: every column runs and checks."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_suite_cpu_small_chain_sum(tmp_path, capsys):
    from benchmarks import run

    assert run.main(["--cpu", "--size", "small", "--only", "chain_sum", "--repeats", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results-cpu-small.json").read_text())
    (first, second) = doc["workloads"]
    for w in (first, second):
        by = {r["column"]: r for r in w["results"]}
        assert set(by) == {"floor", "NumPy", "numba fused", "dask threaded", "flowgpu API", "flowgpu YAML"}
        for col, r in by.items():
            assert r["error"] is None, (col, r["error"])
            assert r["time_s"] > 0
            if col != "floor":
                assert r["check"].startswith("ok"), (col, r["check"])
    assert "| chain_sum" in capsys.readouterr().out.splitlines()[-1]


def test_chunk_size_sweep_cpu(tmp_path):
    from benchmarks import chunk_size

    assert chunk_size.main(["--cpu", "--total", "0.03125", "--chunks", "2,8", "--repeats", "1",
                            "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "chunk_size-cpu.json").read_text())
    assert [r["chunk_MiB"] for r in doc["rows"]] == [2, 8]
    assert doc["suggested_MiB"] in (2, 8)

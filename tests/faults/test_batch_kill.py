"""A batch killed while it commits: no output is ever marked up to date that is not complete.

Real ``python -m flowgpu run --foreach`` processes, killed (``os._exit``, as SIGKILL leaves things)
at a named point of the N-th item's commit or between an item's commit and its cache entries
(``FLOWGPU_TEST_FAULT=POINT#N@kill``). Afterwards every output that ``flowgpu status`` calls up to
date is read back and compared with NumPy, and a second run completes the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

import flowgpu as fg
from tests.faults.test_commit import flowgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # kills runs of a batch mid-way: the full tier

SPEC = """
name: killed-batch
params: {seed: 0, out: out}
inputs:
  x: {source: random, shape: [80, 12], seed: "${params.seed}", chunks: [20, -1]}
steps:
  y: {op: expr, inputs: {x: x}, args: {expression: "x * 3 - 1"}}
  total: {op: sum, inputs: [y]}
outputs:
  y: {from: y, sink: zarr, path: "${params.out}/y-${params.seed}.zarr"}
  total: {from: total}
cluster: {backend: cpu, n_workers: 1, threads_per_worker: 2, dashboard_address: null}
"""
SEEDS = (4, 5, 6, 7)


def _want(seed: int) -> np.ndarray:
    return fg.random((80, 12), seed=seed, chunks=(20, -1)).compute() * 3 - 1


def _status(tmp: Path) -> dict[int, dict]:
    done = flowgpu("status", "spec.yaml", "--foreach", "params.seed=4:8", "--json", cwd=tmp)
    assert done.returncode == 0, done.stderr
    return {item["params"]["seed"]: item["outputs"] for item in json.loads(done.stdout)["items"]}


def _complete_if_up_to_date(tmp: Path) -> int:
    """Every output said up to date holds exactly its values; returns how many items are up to date."""
    fresh = 0
    for seed, outputs in _status(tmp).items():
        if outputs["y"]["up_to_date"]:
            np.testing.assert_allclose(zarr.open_array(str(tmp / "out" / f"y-{seed}.zarr"))[:], _want(seed))
        if outputs["total"]["up_to_date"]:
            np.testing.assert_allclose(outputs["total"]["value"], _want(seed).sum())
        fresh += all(o["up_to_date"] for o in outputs.values())
    return fresh


@pytest.mark.parametrize("point", ["commit:after-first-rename#2", "item-committed#2", "after-compute#3"])
def test_a_killed_batch_marks_nothing_up_to_date_that_is_not_complete(tmp_path, point):
    (tmp_path / "spec.yaml").write_text(SPEC)
    killed = flowgpu("run", "spec.yaml", "--foreach", "params.seed=4:8", cwd=tmp_path, fault=f"{point}@kill",
                     timeout=180)
    assert killed.returncode == 137, killed.stderr
    fresh = _complete_if_up_to_date(tmp_path)
    assert fresh < len(SEEDS)  # the kill stopped the batch before its end
    again = flowgpu("run", "spec.yaml", "--foreach", "params.seed=4:8", "--json", cwd=tmp_path, timeout=180)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["counts"].get("up-to-date", 0) == fresh  # what was recorded is not computed again
    for item in summary["items"]:
        np.testing.assert_allclose(item["outputs"]["total"]["value"], _want(item["params"]["seed"]).sum())
    assert _complete_if_up_to_date(tmp_path) == len(SEEDS)
    out = tmp_path / "out"
    markers = {f".{p.name}.flowgpu-output.json" for p in out.iterdir()}  # an output's marker sits beside it
    leftovers = [p.name for p in out.iterdir() if ".flowgpu-" in p.name and p.name not in markers]
    assert not leftovers  # the second run's locks finished or removed what the killed one left

"""A Zarr output written on the device path (the NumPy stand-in device: flowgpu.zarr.device fake)
whose worker process is killed after it wrote some of its shards: the old store stays whole, the
run fails with one line, and the next run writes the new store and leaves no staging behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.faults.test_commit import TRACEBACK, flowgpu, leftovers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # kills a worker mid-write: the full tier


def _spec(tmp: Path) -> Path:
    spec = tmp / "spec.yaml"
    spec.write_text(f"""
params: {{k: 2.0}}
inputs:
  x: {{source: npy, path: "{tmp / 'x.npy'}", chunks: [64, 48]}}
steps:
  y: {{op: multiply, inputs: [x], args: {{b: "${{params.k}}"}}}}
outputs:
  z: {{from: y, sink: zarr, path: "{tmp / 'out' / 'z.zarr'}", codec: lz4, chunks: [16, 48], shards: [64, 48]}}
cluster: {{backend: cpu, n_workers: 1, threads_per_worker: 1}}
""")
    return spec


def test_a_worker_killed_mid_device_write_keeps_the_old_store(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("DASK_FLOWGPU__ZARR__DEVICE", "fake")  # the device path, encoded by the stand-in
    x = np.round(rng.standard_normal((256, 48)) * 100, 1)
    np.save(tmp_path / "x.npy", x)
    spec = _spec(tmp_path)
    first = flowgpu("run", str(spec), "-q", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    store = tmp_path / "out" / "z.zarr"
    assert np.array_equal(zarr.open_array(str(store), mode="r")[:], x * 2)
    # every worker process that writes its second shard dies (the nanny restarts it, it dies again)
    killed = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp_path, fault="zarr:unit-written#2@kill",
                     timeout=150)
    assert killed.returncode != 0, killed.stdout
    assert "killed the worker processes" in killed.stderr and "Nothing was written" in killed.stderr, killed.stderr
    assert "Numcodecs codecs are not in the Zarr version 3" not in killed.stderr  # no warning per task
    assert TRACEBACK not in killed.stderr, killed.stderr
    assert np.array_equal(zarr.open_array(str(store), mode="r")[:], x * 2), "the old store changed"
    again = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert np.array_equal(zarr.open_array(str(store), mode="r")[:], x * 3)
    assert leftovers(tmp_path) == [], "staging left behind"

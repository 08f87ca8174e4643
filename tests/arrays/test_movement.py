"""Chunks between host and device: ``to_device`` stages through pinned buffers whatever was imported
first, and the round trip gives back the same values."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent.parent

# A fresh interpreter that imports flowgpu and nothing else of it, with a stand-in CuPy (this machine
# may have no GPU): until issue 26, to_device staged through pinned buffers only once something had
# imported flowgpu.memory, and through pageable memory at a sixth of the speed otherwise.
FRESH = """
import json, sys
from tests.transfer import cupy_standin
sys.modules["cupy"] = cupy_standin

import dask
import dask.array as da
import numpy as np
import flowgpu as fg

data = np.random.default_rng(int(sys.argv[1])).standard_normal((1 << 20) + 5)
with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
    got = fg.to_numpy(fg.to_device(da.from_array(data, chunks=(1 << 19) + 3)))  # two blocks over 4 MiB
memory_imported = "flowgpu.memory" in sys.modules
from flowgpu.transfer.staging import staging_pool
print(json.dumps({"same": bool(np.array_equal(got, data)), "memory_imported": memory_imported,
                  "pool": staging_pool().stats(), "plain_copies": cupy_standin.plain_copies,
                  "pinned_bytes": sum(cupy_standin.registered)}))
"""


def test_to_device_stages_through_pinned_buffers_in_a_fresh_process(rng):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", FRESH, str(int(rng.integers(2**31)))], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"]
    assert not got["memory_imported"]  # nothing but flowgpu's public API was imported
    assert got["plain_copies"] == 0  # no block went through pageable cupy.asarray
    pool = got["pool"]
    assert pool["allocations"] >= 1 and pool["allocations"] + pool["reuses"] == 2  # one staging take per block
    assert pool["pageable_fallbacks"] == 0 and pool["in_use"] == 0 and got["pinned_bytes"] >= 4 << 20

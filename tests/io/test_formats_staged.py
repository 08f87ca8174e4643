"""``from_hdf5`` and ``from_tiff`` on a GPU session, end to end in a fresh process with the stand-in CuPy
(this machine may have no GPU): every block large enough reaches the "device" through pinned staging
buffers, none through pageable ``cupy.asarray``, and the values are the file's."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
tifffile = pytest.importorskip("tifffile")

ROOT = pathlib.Path(__file__).parent.parent.parent

FRESH = """
import json, sys
from tests.transfer import cupy_standin
sys.modules["cupy"] = cupy_standin

import dask
import numpy as np
import flowgpu as fg

folder = sys.argv[1]
with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
    arrays = {"contiguous": fg.from_hdf5(folder + "/f.h5", "/c", chunks=(300, -1)),
              "chunked": fg.from_hdf5(folder + "/f.h5", "/g/z", chunks=(256, 1500)),
              "multipage": fg.from_tiff(folder + "/stack.tif", chunks=[8, -1, -1]),
              "pages": fg.from_tiff(folder + "/pages/p*.tif", chunks=[8, -1, -1])}
    metas = {k: type(x._meta).__module__ for k, x in arrays.items()}
    got = {k: x.compute() for k, x in arrays.items()}
for k, v in got.items():
    np.save(folder + f"/got-{k}.npy", v.view(np.ndarray))
print(json.dumps({"metas": metas, "plain_copies": cupy_standin.plain_copies}))
"""


@pytest.mark.slow  # a fresh process
def test_gpu_sessions_read_both_formats_through_pinned_staging(tmp_path, rng):
    want = {"contiguous": rng.standard_normal((1200, 2000)),  # 4.8 MB row blocks: one byte range each
            "chunked": rng.integers(-9, 9, (768, 3000)).astype("int32"),  # 1.5 MB blocks: decoded by HDF5
            "multipage": rng.integers(0, 60000, (24, 512, 512)).astype("uint16"),  # 4 MiB page blocks
            "pages": rng.random((16, 360, 400)).astype("float32")}  # 4.6 MB page blocks
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("/c", data=want["contiguous"])
        f.create_dataset("/g/z", data=want["chunked"], chunks=(128, 500), compression="gzip")
    tifffile.imwrite(tmp_path / "stack.tif", want["multipage"], compression="zlib")
    (tmp_path / "pages").mkdir()
    for i, page in enumerate(want["pages"]):
        tifffile.imwrite(tmp_path / "pages" / f"p{i}.tif", page)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(report["metas"].values()) == {"cupy"}, report  # CuPy chunks (joined by NumPy's concatenate here)
    for name, data in want.items():
        np.testing.assert_array_equal(np.load(tmp_path / f"got-{name}.npy"), data)
    # blocks of 4 MiB or more are staged; the smaller ones (the chunked dataset's 1.5 MB blocks, 3 x 2)
    # are plain copies, one per block, and nothing else is
    assert report["plain_copies"] == 6, report

"""xarray's own tests of dask-backed arrays pass with every computation fused by flowgpu (the
README's claim): ``test_weighted.py``, ``test_coarsen.py`` and ``test_rolling.py`` of the installed
xarray, run with ``-p benchmarks.dask_suite.plugin`` (flowgpu's ``array_optimize`` for the whole
session), and some of their computations do run a flowgpu kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

xr = pytest.importorskip("xarray")

ROOT = Path(__file__).resolve().parents[2]
FILES = ["test_weighted.py", "test_coarsen.py", "test_rolling.py"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_xarrays_own_dask_tests_pass_fused(tmp_path):
    tests = Path(xr.__file__).parent / "tests"
    if not (tests / FILES[0]).exists():
        pytest.skip("this xarray was installed without its tests")
    shutil.copytree(tests, tmp_path / "xtests", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               FLOWGPU_DASK_SUITE_CENSUS=str(tmp_path / "census"))
    done = subprocess.run([sys.executable, "-m", "pytest", *(f"xtests/{f}" for f in FILES), "-k", "dask", "-q",
                           "-p", "no:cacheprovider", "-p", "benchmarks.dask_suite.plugin", "-n", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    census = json.loads((tmp_path / "census" / "census-main.json").read_text())
    assert census["computes"] > 100 and census["fused"] > 0, census

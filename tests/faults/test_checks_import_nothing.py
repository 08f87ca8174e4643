"""validate, plan, status and run --dry-run run none of the spec's code: the modules it names are checked
in their source (the name is there, the arguments fit), never imported; run imports and calls them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

MODULE = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("top-level code ran")  # what a check must not do

import numpy as np


def load(n, seed=0):
    return np.random.default_rng(seed).random((n, 3))


def twice(block, k=2.0):
    return k * block


if __name__ == "__main__":
    def only_when_run_as_a_script(n, seed=0):
        pass
'''

SPEC = """\
inputs:
  x: {source: python, callable: "sidefx:load", args: {n: 12, seed: 4}, shape: [12, 3], dtype: float64}
steps:
  y: {op: map_blocks, inputs: [x], args: {function: "sidefx:twice", kwargs: {k: 3.0}}}
  s: {op: sum, inputs: [y]}
outputs:
  s: {from: s}
"""


def flowgpu(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "sidefx.py").write_text(MODULE)
    (tmp_path / "s.yaml").write_text(SPEC)
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_checks_import_nothing_and_run_imports(project):
    for args in (("validate", "s.yaml"), ("plan", "s.yaml"), ("status", "s.yaml"), ("run", "--dry-run", "s.yaml"),
                 ("plan", "--format", "json", "s.yaml")):
        done = flowgpu(project, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert not (project / "IMPORTED").exists(), f"{args} ran the module's top-level code"
    said = flowgpu(project, "validate", "s.yaml").stdout
    assert "imports sidefx:load" in said and "imports sidefx:twice" in said  # what a run will import
    done = flowgpu(project, "run", "s.yaml", "--json", "--standalone", "--workers", "1", "-q")
    assert done.returncode == 0, done.stderr
    assert (project / "IMPORTED").exists()  # a run imports and calls it
    want = 3.0 * np.random.default_rng(4).random((12, 3)).sum()
    np.testing.assert_allclose(json.loads(done.stdout)["outputs"]["s"]["value"], want, rtol=1e-12)


@pytest.mark.parametrize("typo, said", [
    ("sidefx:lod", "'sidefx' has no attribute 'lod'; did you mean 'load'?"),
    ("sidefx:only_when_run_as_a_script", None),  # defined under `if`: there, as far as a check can tell
    ("nosuchmodule:load", "no module named 'nosuchmodule'"),
])
def test_a_bad_path_is_said_as_an_import_would_say_it_without_importing(project, typo, said):
    (project / "s.yaml").write_text(SPEC.replace('"sidefx:load"', f'"{typo}"'))
    done = flowgpu(project, "validate", "s.yaml")
    assert not (project / "IMPORTED").exists()
    if said is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and said in done.stderr and "s.yaml:2:" in done.stderr, done.stderr


def test_arguments_that_do_not_fit_the_function_are_refused_from_its_source(project):
    (project / "s.yaml").write_text(SPEC.replace("args: {n: 12, seed: 4}", "args: {n: 12, size: 4}"))
    done = flowgpu(project, "validate", "s.yaml")
    assert done.returncode == 2 and "does not take arguments ['n', 'size']" in done.stderr, done.stderr
    assert not (project / "IMPORTED").exists()

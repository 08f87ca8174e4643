"""Batches and includes are bounded before they are built: a range of 10**7 items, a grid past
``flowgpu.spec.max-items``, a spec of 12,000 steps included 10 times (``flowgpu.spec.max-steps``) are
refused at once with exit 2 and the numbers; a glob over a folder linked into itself ends, each real
file one item."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.errors import SpecLimitError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
pytestmark = pytest.mark.timeout(300)

SPEC = """\
params:
  seed: {type: int, default: 0}
  n: {type: int, default: 8}
  input: {type: str, default: data/a.npy}
inputs:
  x: {source: random, shape: ["${params.n}", 3], seed: "${params.seed}"}
  f: {source: npy, path: "${params.input}"}
steps:
  total: {op: sum, inputs: [x]}
  ftotal: {op: sum, inputs: [f]}
outputs:
  total: {from: total}
  ftotal: {from: ftotal}
"""


def _bounded() -> None:
    """A regression fails on memory instead of filling the machine's (the refusals need far less)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def flowgpu(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=ENV, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=_bounded)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"flowgpu {' '.join(args)[:100]} still ran after {timeout}s") from None


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-2000:])
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    for w in words:
        assert w in line, line
    return line


@pytest.fixture
def project(tmp_path, rng):
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "a.npy", rng.standard_normal((5, 3)))
    (tmp_path / "spec.yaml").write_text(SPEC)
    return tmp_path


def test_a_range_of_ten_million_items_is_refused_before_any_is_built(project):
    line = refused(flowgpu("run", "spec.yaml", "--foreach", "params.seed=0:10000000", cwd=project),
                   "--foreach params.seed", "'0:10000000' holds 10,000,000 values", "the 10,000 items",
                   "flowgpu.spec.max-items")
    assert line.count("--foreach params.seed") == 1  # said once
    assert sorted(os.listdir(project)) == ["data", "spec.yaml"]  # nothing written


def test_a_grid_past_the_limit_is_refused_with_its_numbers(project):
    refused(flowgpu("status", "spec.yaml", "--foreach", "params.seed=0:200", "--foreach", "params.n=1:201",
                    cwd=project), "40,000 items (200 seed x 200 n)", "10,000", "max-items")


def test_a_foreach_block_past_the_limit_points_into_the_spec(project):
    (project / "spec.yaml").write_text(SPEC + "foreach:\n  seed: {range: 0:20000}\n")
    line = refused(flowgpu("status", "spec.yaml", cwd=project), "20,000 values")
    assert line.startswith(f"error: spec.yaml:{SPEC.count(chr(10)) + 2}:9: foreach.seed: the range")


@pytest.mark.parametrize("given", ["0:7", "0,1,2,3,4,5,6", {"range": [0, 7]}])
def test_the_limit_is_exact(project, given, monkeypatch):
    spec = str(project / "spec.yaml")
    monkeypatch.chdir(project)
    with dask.config.set({"flowgpu.spec.max-items": 7}):
        assert len(pipeline.status(spec, foreach={"seed": given})["items"]) == 7
        with pytest.raises(SpecLimitError, match=r"14 items \(7 seed x 2 n\), more than the 7"):
            pipeline.status(spec, foreach={"seed": given, "n": [1, 2]})
    with dask.config.set({"flowgpu.spec.max-items": 6}), pytest.raises(SpecLimitError, match="7 values, more than the 6"):
        pipeline.status(spec, foreach={"seed": given})


def test_a_glob_past_the_limit_is_refused(project, rng):
    for i in range(9):
        np.save(project / "data" / f"m{i}.npy", rng.standard_normal((2, 3)))
    with dask.config.set({"flowgpu.spec.max-items": 9}):
        with pytest.raises(SpecLimitError, match=r"the glob '.*\*\.npy' matches more than 9 paths"):
            pipeline.status(str(project / "spec.yaml"), foreach={"input": str(project / "data" / "*.npy")})


def test_a_glob_over_a_folder_linked_into_itself_ends_and_each_real_file_is_one_item(project, rng):
    data = project / "data"
    (data / "sub" / "deeper").mkdir(parents=True)
    arrays = {"data/a.npy": np.load(data / "a.npy")}
    for name in ("data/sub/b.npy", "data/sub/deeper/c.npy"):
        arrays[name] = rng.standard_normal((4, 3))
        np.save(project / name, arrays[name])
    os.symlink(".", data / "self")  # a link to the folder it is in
    os.symlink("..", data / "sub" / "deeper" / "up")  # and one to the folder above
    os.link(data / "sub" / "b.npy", data / "b-again.npy")  # one file, two names
    done = flowgpu("status", "spec.yaml", "--foreach", "params.input=data/**/*.npy", "--json", cwd=project)
    assert done.returncode == 0, done.stderr[-2000:]
    items = json.loads(done.stdout)["items"]
    assert [i["params"]["input"] for i in items] == ["data/a.npy", "data/sub/b.npy", "data/sub/deeper/c.npy"]
    result = pipeline.run(str(project / "spec.yaml"), session="local", progress=False,
                          foreach={"input": str(data / "**" / "*.npy")})  # an absolute pattern too
    sums = {os.path.relpath(r.params["input"], project): r.outputs["ftotal"] for r in result.items}
    assert sums.keys() == arrays.keys()
    for name, x in arrays.items():
        np.testing.assert_allclose(sums[name], x.sum(), rtol=1e-12)


def chain(steps: int) -> str:
    lines = ["inputs:", "  x: {source: random, shape: [4, 4], seed: 1}", "steps:"]
    prev = "x"
    for i in range(steps):
        lines.append(f"  s{i}: {{op: abs, inputs: [{prev}]}}")
        prev = f"s{i}"
    return "\n".join([*lines, "outputs:", f"  y: {{from: {prev}}}"]) + "\n"


def including(file: str, times: int) -> str:
    uses = [f"  u{i}: {{uses: {file}, inputs: {{x: x}}}}" for i in range(times)]
    return "\n".join(["inputs:", "  x: {source: random, shape: [4, 4], seed: 2}", "steps:", *uses,
                      "outputs:", "  y: {from: u0.y}"]) + "\n"


def test_a_large_spec_included_ten_times_is_refused_before_it_is_built(tmp_path):
    (tmp_path / "big.yaml").write_text(chain(12_000))
    (tmp_path / "ten.yaml").write_text(including("big.yaml", 10))
    refused(flowgpu("validate", "ten.yaml", cwd=tmp_path), "ten.yaml:4:", "steps.u0.uses", "12,010 steps",
            "more than 10,000", "flowgpu.spec.max-steps")


def test_steps_are_counted_each_time_they_are_included(tmp_path):
    (tmp_path / "part.yaml").write_text(chain(10))
    (tmp_path / "two.yaml").write_text(including("part.yaml", 2))  # 2 + 2 x 10 = 22 steps
    (tmp_path / "three.yaml").write_text(including("part.yaml", 3))  # 3 + 3 x 10 = 33 steps
    with dask.config.set({"flowgpu.spec.max-steps": 22}):
        result = pipeline.run(str(tmp_path / "two.yaml"), session="local", progress=False, cache=False)
        np.testing.assert_allclose(result.outputs["y"], np.abs(fg.random((4, 4), seed=2).compute()))
        with pytest.raises(SpecLimitError) as e:  # 3 + 10 for u0, then 10 more for u1
            pipeline.compile(str(tmp_path / "three.yaml"))
        assert "would make 23 steps to compile, more than 22" in str(e.value)
        assert str(e.value).startswith(f"{tmp_path / 'three.yaml'}:5:") and "steps.u1.uses" in str(e.value)

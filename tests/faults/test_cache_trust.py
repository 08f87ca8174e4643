"""The output cache trusts nothing it did not check: an entry edited by hand, of the wrong types, too
large, or replaced by a FIFO, a link to /dev/zero or a folder is a miss (one line on stderr, the output
computed again), never the printed answer, an internal error, a hang or a flood of memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowgpu.pipeline.cache import entry_checksum

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
pytestmark = pytest.mark.timeout(300)

SPEC = """\
inputs:
  x: {source: npy, path: x.npy, chunks: [40, -1]}
steps:
  total: {op: sum, inputs: [x]}
  colmean: {op: mean, inputs: [x], args: {axis: 0}}
outputs:
  total: {from: total}
  colmean: {from: colmean}
  y: {from: x, sink: npy, path: y.npy}
"""


def _bounded() -> None:
    """What an unbounded read of /dev/zero would take is capped, so a regression fails instead of
    filling the machine's memory (reading a spec and its cache needs far less)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def flowgpu(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    bounded = args[0] == "status"  # run starts workers, which need more address space than that
    try:
        return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=ENV, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              preexec_fn=_bounded if bounded else None)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"flowgpu {' '.join(args)} still ran after {timeout}s") from None


@pytest.fixture
def project(tmp_path, rng):
    """A spec whose outputs (a scalar, a vector, a file) were computed once and recorded."""
    x = rng.standard_normal((120, 3))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "spec.yaml").write_text(SPEC)
    done = flowgpu("run", "spec.yaml", "--workers", "1", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path, x


def entry_file(cwd: Path, output: str) -> Path:
    for path in (cwd / ".flowgpu" / "cache").iterdir():
        if json.loads(path.read_text())["output"] == output:
            return path
    raise AssertionError(f"no entry for {output}")


def status(cwd: Path) -> tuple[dict, str]:
    done = flowgpu("status", "spec.yaml", "--json", cwd=cwd, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    outputs = json.loads(done.stdout)["items"][0]["outputs"]
    return outputs, done.stderr


def assert_missed(cwd: Path, output: str, *words: str) -> None:
    """``flowgpu status`` says ``output`` is to be computed, in one line on stderr that names why."""
    outputs, err = status(cwd)
    assert outputs[output] == {"up_to_date": False, "reason": "cache entry damaged", "value": None}, outputs[output]
    assert all(v["up_to_date"] for name, v in outputs.items() if name != output), outputs
    notes = [line for line in err.splitlines() if "cache entry" in line]
    assert len(notes) == 1 and f"output {output!r}" in notes[0], err
    for w in words:
        assert w in notes[0], notes[0]


def assert_recomputed(cwd: Path, x: np.ndarray) -> None:
    """A run computes the damaged output again, right, and records it: the next status is all up to date."""
    done = flowgpu("run", "spec.yaml", "--workers", "1", "-q", "--summary", "s.json", cwd=cwd)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    outputs = json.loads((cwd / "s.json").read_text())["outputs"]
    np.testing.assert_allclose(outputs["total"]["value"], x.sum(), rtol=1e-12)
    np.testing.assert_allclose(outputs["colmean"]["value"], x.mean(axis=0), rtol=1e-12)
    after, err = status(cwd)
    assert all(v["up_to_date"] for v in after.values()) and "cache entry" not in err, (after, err)


def edit(path: Path, **fields) -> None:
    entry = json.loads(path.read_text())
    entry.update(fields)
    path.write_text(json.dumps(entry))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["script", "five million zeros", "one value nudged"])
def test_an_edited_value_is_never_the_answer(project, case):
    cwd, x = project
    if case == "script":
        edit(entry_file(cwd, "total"), value="<script>alert(1)</script>")
        output, words = "total", ["checksum does not match"]
    elif case == "five million zeros":
        edit(entry_file(cwd, "total"), value=[0.0] * 5_000_000)
        output, words = "total", ["more bytes than an entry of this output can"]
    else:
        path = entry_file(cwd, "colmean")
        value = json.loads(path.read_text())["value"]
        edit(path, value=[value[0], value[1] + 1e-9, value[2]])
        output, words = "colmean", ["checksum does not match"]
    assert_missed(cwd, output, *words)
    assert_recomputed(cwd, x)


WRONG = {
    "inputs of text": ("total", {"inputs": "each fingerprint as text"}, "'inputs' are not fingerprints"),
    "params a list": ("total", {"params": [1, 2]}, "'params' is not an object"),
    "digest a number": ("total", {"digest": 5}, "'digest' is not a string"),
    "value an object": ("total", {"value": {"a": 1}}, "its value is not float64 of shape []"),
    "a vector for a scalar": ("total", {"value": [1.0, 2.0]}, "its value is not float64 of shape []"),
    "a value of other dtype": ("colmean", {"dtype": "int64", "value": [1, 2, 3]}, "dtype 'int64'"),
    "a row too short": ("colmean", {"value": [0.5, 0.25]}, "its value is not float64 of shape [3]"),
    "output fingerprint text": ("y", {"output_fingerprint": "same"}, "'output_fingerprint' is not an object"),
    "another output's key": ("total", {"key": {"path": "/elsewhere"}}, "another output's entry"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(WRONG))
def test_an_entry_of_the_wrong_form_is_a_miss_not_an_error(project, case):
    """Edited with its checksum made right again: the checks of each field still refuse it."""
    cwd, x = project
    output, fields, words = WRONG[case]
    path = entry_file(cwd, output)
    entry = json.loads(path.read_text())
    if case == "inputs of text":  # what made an older flowgpu fail with "internal error" on every run
        fields = {"inputs": dict.fromkeys(entry["inputs"], "changed")}
    entry.update(fields)
    entry["checksum"] = entry_checksum(entry)
    path.write_text(json.dumps(entry))
    outputs, err = status(cwd)
    assert outputs[output]["reason"] == "cache entry damaged" and words in err, err
    if case == "inputs of text":
        assert_recomputed(cwd, x)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "folder"])
def test_an_entry_that_is_not_a_regular_file_is_never_waited_on_or_read(project, kind):
    cwd, x = project
    path = entry_file(cwd, "total")
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        words = "it is a FIFO"
    elif kind == "folder":
        path.mkdir()
        words = "it is a folder"
    else:
        path.symlink_to("/dev/zero")
        words = "symbolic link"
    assert_missed(cwd, "total", words)
    if kind == "fifo":  # the run replaces it with an entry
        assert_recomputed(cwd, x)
        assert path.is_file()

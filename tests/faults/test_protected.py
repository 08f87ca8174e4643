"""What a command replaces is checked before it starts (issue 27, findings 2, 3, 8 and 16): no
command replaces what it reads, the working directory or a folder above it (``--overwrite`` or
not); ``--summary`` and ``--report`` follow the rules of outputs; two outputs that are one file
through a linked folder are refused, never a wait on their own lock; a spec holding a NUL byte or
including a file of the kernel is a spec error. Real ``python -m flowgpu`` processes, exit 2, one
``error:`` line, and nothing changed byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flowgpu.errors import OutputError
from flowgpu.io.atomic import hold

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
pytestmark = pytest.mark.timeout(240)


def flowgpu(*args: str, cwd: Path, limit: float = 120) -> tuple[int, str, str, float]:
    """``python -m flowgpu ARGS``: exit code, stdout, stderr, wall seconds; killed (and failed) after ``limit``."""
    start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=ENV, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # this test's own process and its workers
        p.communicate()
        raise AssertionError(f"flowgpu {' '.join(args)} still ran after {limit}s (waiting on its own lock?)") from None
    return p.returncode, out, err, time.monotonic() - start


def refused(result, *words: str) -> str:
    code, out, err, _ = result
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes | None]:
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), root)] = None
        for name in files:
            out[os.path.relpath(os.path.join(d, name), root)] = Path(d, name).read_bytes()
    return out


# -- finding 2: convert protects what run protects ------------------------------------------------

@pytest.mark.parametrize("cwd, src, dst, what", [
    ("work", "data/a.npy", "data", "contains its source"),
    ("work", "data/a.npy", ".", "is the working directory"),
    ("work/data", "a.npy", "..", "contains the working directory"),
])
def test_convert_never_replaces_its_source_folder_the_working_directory_or_its_parent(tmp_path, rng, cwd, src,
                                                                                       dst, what):
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    np.save(data / "a.npy", rng.standard_normal((64, 8)))
    (data / "notes.txt").write_bytes(rng.bytes(400))
    (tmp_path / "work" / "other.bin").write_bytes(rng.bytes(400))
    before = snapshot(tmp_path)
    line = refused(flowgpu("convert", src, dst, "--overwrite", "--backend", "cpu", "--workers", "1",
                           cwd=tmp_path / cwd), what, "--overwrite never replaces")
    assert repr(dst) in line
    assert snapshot(tmp_path) == before, "convert replaced what it must never replace"


# -- finding 3: --summary and --report follow the rules of outputs --------------------------------

SPEC = """\
inputs:
  x: {source: npy, path: x.npy}
steps:
  y: {op: multiply, inputs: [x], args: {b: 2.0}}
  total: {op: sum, inputs: [y]}
outputs:
  y: {from: y, sink: npy, path: out/y.npy}
  total: {from: total}
cluster: {backend: cpu, n_workers: 1, threads_per_worker: 2}
"""


@pytest.fixture
def job(tmp_path, rng):
    x = rng.standard_normal((120, 6))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "bad.yaml").write_text(SPEC.replace("inputs:\n", "inputs: [\n"))  # does not load
    (tmp_path / "notes.txt").write_bytes(rng.bytes(300))
    return x, tmp_path


@pytest.mark.parametrize("args, words", [
    (["spec.yaml", "--summary", "spec.yaml"], ["--summary 'spec.yaml' is the spec"]),
    (["spec.yaml", "--report", "x.npy", "--overwrite"], ["--report 'x.npy' is input 'x'", "--overwrite never"]),
    (["spec.yaml", "--summary", "notes.txt"], ["--summary 'notes.txt' already exists", "--overwrite"]),
    (["spec.yaml", "--report", "notes.txt"], ["--report 'notes.txt' already exists", "--overwrite"]),
    (["spec.yaml", "--summary", "out/y.npy"], ["is the path of output 'y'"]),
    (["spec.yaml", "--summary", "r.json", "--report", "r.json"], ["--summary and --report are both"]),
    (["bad.yaml", "--summary", "bad.yaml"], ["bad.yaml:", "malformed YAML"]),  # its own error; no summary over it
    (["spec.yaml", "--summary", "s.json", "--dry-run", "--report", "spec.yaml"], ["--report 'spec.yaml' is the spec"]),
], ids=["spec", "input", "user-summary", "user-report", "output", "both", "invalid-spec", "dry-run"])
@pytest.mark.slow
def test_summary_and_report_are_refused_before_the_run(job, args, words):
    x, tmp = job
    before = snapshot(tmp)
    refused(flowgpu("run", *args, cwd=tmp), *words)
    assert snapshot(tmp) == before, "written or replaced: the run was not refused before it started"


@pytest.mark.slow
def test_summary_and_report_replace_their_own_and_with_overwrite_a_users(job):
    x, tmp = job
    code, out, err, _ = flowgpu("run", "spec.yaml", "-q", "--summary", "s.json", "--report", "r.html", cwd=tmp)
    assert code == 0, err
    code, out, err, _ = flowgpu("run", "spec.yaml", "-q", "--summary", "s.json", "--report", "notes.txt",
                                "--overwrite", cwd=tmp)
    assert code == 0, err  # s.json is flowgpu's summary: replaced; notes.txt replaced as --overwrite says
    summary = json.loads((tmp / "s.json").read_text())
    np.testing.assert_allclose(summary["outputs"]["total"]["value"], (x * 2.0).sum(), rtol=1e-12)
    assert (tmp / "notes.txt").read_text().startswith("<!DOCTYPE html>")
    np.testing.assert_array_equal(np.load(tmp / "out" / "y.npy"), x * 2.0)


# -- finding 8: one file through a linked folder -------------------------------------------------

@pytest.fixture
def linked(tmp_path, rng):
    np.save(tmp_path / "x.npy", rng.standard_normal((50, 4)))
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "link")
    return tmp_path


@pytest.mark.parametrize("command", ["validate", "run"])
def test_two_outputs_that_are_one_file_through_a_linked_folder_are_refused(linked, command):
    (linked / "spec.yaml").write_text("""\
inputs:
  x: {source: npy, path: x.npy}
outputs:
  a: {from: x, sink: npy, path: real/y.npy}
  b: {from: x, sink: npy, path: link/y.npy}
cluster: {backend: cpu, n_workers: 1}
""")
    refused(flowgpu(command, "spec.yaml", cwd=linked, limit=60), "spec.yaml:5:", "outputs.b.path",
            "outputs 'a' and 'b' both write", "linked folder", "hint:")
    assert os.listdir(linked / "real") == []


def test_two_batch_items_that_write_one_file_through_a_linked_folder_are_refused(linked):
    (linked / "spec.yaml").write_text("""\
params:
  d: {type: str, default: real}
inputs:
  x: {source: npy, path: x.npy}
outputs:
  y: {from: x, sink: npy, path: "${params.d}/y.npy"}
cluster: {backend: cpu, n_workers: 1}
""")
    refused(flowgpu("run", "spec.yaml", "--foreach", "params.d=real,link", cwd=linked, limit=60),
            "batch items 1", "and 2", "linked folder", "outputs.y.path")
    assert os.listdir(linked / "real") == []


@pytest.mark.timeout(120)
def test_holding_one_file_under_two_names_fails_instead_of_waiting_forever(linked):
    with pytest.raises(OutputError, match="are the same file"):
        with hold([str(linked / "real" / "y.npy"), str(linked / "link" / "y.npy")], wait=True):
            pass
    assert os.listdir(linked / "real") == []  # no lock file left behind


# -- finding 16: a NUL byte, a file of the kernel ------------------------------------------------

BAD_SPECS = {
    "NUL byte in the text": ('inputs:\n  x: {source: random, shape: [4, 4], seed: 1}\noutputs:\n'
                             '  y: {from: x, sink: npy, path: "o\x00ut.npy"}\n', ["spec.yaml:4:", "NUL byte"]),
    "NUL escape in a value": ('inputs:\n  x: {source: random, shape: [4, 4], seed: 1}\noutputs:\n'
                              '  y: {from: x, sink: npy, path: "o\\0ut.npy"}\n',
                              ["spec.yaml:4:", "outputs.y.path", "NUL character"]),
    "uses /proc/self/environ": ('inputs:\n  x: {source: random, shape: [4, 4], seed: 1}\nsteps:\n'
                                '  s: {uses: /proc/self/environ, inputs: {x: x}}\noutputs:\n  y: {from: x}\n',
                                ["spec.yaml:4:", "steps.s.uses", "file the kernel makes up"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_a_nul_byte_or_a_kernel_file_is_a_spec_error(tmp_path, case, command):
    text, words = BAD_SPECS[case]
    (tmp_path / "spec.yaml").write_text(text)
    before = snapshot(tmp_path)
    refused(flowgpu(command, "spec.yaml", cwd=tmp_path, limit=60), *words, "hint:")
    assert snapshot(tmp_path) == before


def test_checking_the_summary_path_reads_each_include_once(tmp_path):
    """What --summary may not replace includes every included spec: each is read once per set of params,
    so an include bomb (2**20 includes) is still refused by the compile's limit, in seconds."""
    for i in range(20):
        (tmp_path / f"l{i}.yaml").write_text(
            f"inputs:\n  x: {{source: random, shape: [4]}}\nsteps:\n  a: {{uses: l{i + 1}.yaml, inputs: {{x: x}}}}\n"
            f"  b: {{uses: l{i + 1}.yaml, inputs: {{x: x}}}}\noutputs:\n  y: {{from: x, sink: npy, path: out.npy}}\n")
    (tmp_path / "l20.yaml").write_text("inputs:\n  x: {source: random, shape: [4]}\noutputs:\n  y: {from: x}\n")
    refused(flowgpu("run", "l0.yaml", "--summary", "s.json", cwd=tmp_path, limit=60), "more than 200 included specs")
    assert not (tmp_path / "s.json").exists() or json.loads((tmp_path / "s.json").read_text())["status"] == "failed"
    assert not (tmp_path / "out.npy").exists()


# -- an output inside an input store, or inside another output ------------------------------------

def _store(tmp_path, rng):
    import zarr

    group = zarr.open_group(str(tmp_path / "era.zarr"), mode="w")
    group.create_array("t2m", data=rng.standard_normal((30, 6, 8)).astype("float32"), chunks=(10, 6, 8))
    np.save(tmp_path / "x.npy", rng.standard_normal((40, 6)))


@pytest.mark.parametrize("command", ["validate", "run"])
def test_no_output_is_written_inside_an_input_store(tmp_path, rng, command):
    """``path: era.zarr/t2m`` over an input ``era.zarr`` (component t2m) with --overwrite replaced the
    input array itself (each re-run subtracted again); ``path: era.zarr`` was refused, this was not."""
    _store(tmp_path, rng)
    (tmp_path / "spec.yaml").write_text("""\
inputs:  {e: {source: zarr, path: era.zarr, component: t2m}}
steps:   {c: {op: scale, inputs: [e], args: {offset: -273.15}}}
outputs: {c: {from: c, sink: zarr, path: era.zarr/t2m}}
cluster: {backend: cpu, n_workers: 1}
""")
    before = snapshot(tmp_path)
    refused(flowgpu(command, "spec.yaml", "--overwrite", cwd=tmp_path, limit=60), "spec.yaml:3:", "outputs.c.path",
            "would replace 'era.zarr/t2m', which is inside input 'e' (era.zarr)", "--overwrite never")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_output_inside_another_output_is_refused(tmp_path, rng, command):
    """Two outputs at ``o.zarr`` and ``o.zarr/sub``: one commit replaced the other's folder, and the run
    said both were computed (exit 0) while ``o.zarr/sub`` was gone."""
    _store(tmp_path, rng)
    (tmp_path / "spec.yaml").write_text("""\
inputs:  {x: {source: npy, path: x.npy}}
outputs: {s: {from: x, sink: zarr, path: o.zarr}, t: {from: x, sink: zarr, path: o.zarr/sub}}
cluster: {backend: cpu, n_workers: 1}
""")
    before = snapshot(tmp_path)
    refused(flowgpu(command, "spec.yaml", "--overwrite", cwd=tmp_path, limit=60), "spec.yaml:2:", "outputs.t.path",
            "outputs 's' and 't': 'o.zarr/sub' is inside 'o.zarr'", "hint: give each output a path outside")
    assert snapshot(tmp_path) == before


def test_no_output_replaces_flowgpus_record_of_outputs(tmp_path, rng):
    _store(tmp_path, rng)
    (tmp_path / "spec.yaml").write_text("""\
inputs:  {x: {source: npy, path: x.npy}}
outputs: {s: {from: x, sink: zarr, path: .flowgpu}}
""")
    refused(flowgpu("validate", "spec.yaml", "--overwrite", cwd=tmp_path, limit=60), "spec.yaml:2:", "outputs.s.path",
            "which contains flowgpu's record of outputs (.flowgpu/cache)")

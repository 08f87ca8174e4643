"""Hostile input is bounded: every spec, params file, include or --set value below is refused by a
real ``python -m flowgpu`` within 300 MB, with exit 2, one ``error:`` line and no traceback, and
nothing is written where the outputs would go; one that would run forever is killed (and fails the
test) after 60 s. A valid 350-step chain runs and equals NumPy. (How fast a refusal is belongs in
benchmarks/: a busy machine must not fail these.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT_MB = 300
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
pytestmark = pytest.mark.timeout(120)


# A small launcher forks and execs the command and reports its peak RSS (os.wait4). The test session
# cannot do it itself: Linux carries the RSS peak of the process image replaced by exec into the
# child's ru_maxrss, so a child forked from a 500 MB pytest would read 500 MB.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def flowgpu(*args: str, cwd: Path, kill_after: float = 60) -> tuple[int, str, str, float, float]:
    """Run ``python -m flowgpu ARGS``: exit code, stdout, stderr, wall seconds and its peak RSS in MB."""
    rss_file = cwd.parent / f".{cwd.name}.rss"
    start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-S", "-I", "-c", LAUNCHER, str(rss_file), sys.executable, "-m", "flowgpu",
                          *args], cwd=cwd, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the launcher and flowgpu under it: this test's own processes
        p.communicate()
        raise AssertionError(f"flowgpu {' '.join(args)[:80]} still ran after {kill_after}s") from None
    wall = time.monotonic() - start
    rss = int(rss_file.read_text()) / 1024
    rss_file.unlink()
    return p.returncode, out, err, wall, rss


def assert_refused(result, *words: str) -> str:
    code, out, err, _, rss = result
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    assert rss < LIMIT_MB, f"used {rss:.0f} MB"
    return lines[0]


def laughs(key: str = "name") -> str:
    """Nine levels of nine aliases: 387 million strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + f"\n{key}: *a8\n"


SPEC = """\
params:
  n: {type: int, default: 8}
inputs:
  x: {source: random, shape: ["${params.n}", 4], seed: 1}
outputs:
  y: {from: x, sink: zarr, path: out.zarr}
"""


def input_spec(options: str) -> str:
    return f"inputs:\n  x: {{{options}}}\noutputs:\n  y: {{from: x, sink: zarr, path: out.zarr}}\n"


BAD_INPUTS = {
    "billion laughs": (laughs() + SPEC, "billion laughs"),
    "nesting 1000 deep": ("name: " + "[" * 1000 + "]" * 1000 + "\n" + SPEC.split("\n", 3)[3], "nests deeper than"),
    "mappings 1000 deep": ("".join("  " * i + f"k{i}:\n" for i in range(1000)) + "  " * 1000 + "v: 1\n",
                           "nests deeper than"),
    "shape overflowing int64": (input_spec("source: random, shape: [1000000000000, 1000000000000]"),
                                "more than a 64-bit index can count"),
    "shape 1e12 x 1e12 as floats": (input_spec("source: random, shape: [1.0e+12, 1.0e+12]"), "64-bit"),
    "shape of 80 PB": (input_spec("source: zeros, shape: [100000000, 100000000]"), "max-array-bytes"),
    "too many chunks": (input_spec("source: random, shape: [100000000, 1000000]"), "max-chunks"),
    "chunks of 1 over 10**12 values": (input_spec("source: zeros, shape: [1000000000000], dtype: int8, chunks: 1"),
                                       "max-chunks"),
    "chunks of 1B over 10**12 values": (input_spec("source: zeros, shape: [1000000000000], dtype: int8, chunks: 1B"),
                                        "max-chunks"),
    "fill .inf as int32": (input_spec("source: full, shape: [4, 4], dtype: int32, fill_value: .inf"),
                           "int32 cannot hold it"),
    "fill 1e10 as int32": (input_spec("source: full, shape: [4, 4], dtype: int32, fill_value: 10000000000"),
                           "outside int32's range"),
    "chunks [0]": (input_spec("source: random, shape: [4, 4], chunks: [0, 2]"), "block length of 0"),
    "chunks 0": (input_spec("source: random, shape: [4, 4], chunks: 0"), "block length of 0"),
    "chunks of 1e400": (input_spec("source: random, shape: [4, 4], chunks: 1e400"), "inputs.x.chunks: wrong type or value inf"),
    "npy input /dev/zero": (input_spec("source: npy, path: /dev/zero"), "is a device or socket, not a file"),
    "zarr input /dev/zero": (input_spec("source: zarr, path: /dev/zero"), "is a device or socket, not a file"),
    "arange to .inf": (input_spec("source: arange, stop: .inf"), "stop=inf is not a finite number"),
    "expression 5000 operations long": (input_spec("source: random, shape: [4, 4]").replace(
        "outputs:", "steps:\n  e: {op: expr, inputs: {x: x}, args: {expression: 'x" + " + x" * 5000 + "'}}\noutputs:"),
        "nests more than 200 operations deep"),
    "expression 300 parentheses deep": (input_spec("source: random, shape: [4, 4]").replace(
        "outputs:", "steps:\n  e: {op: expr, inputs: {x: x}, args: {expression: '" + "(" * 300 + "x" + ")" * 300
        + "'}}\noutputs:"), "too many nested parentheses"),
    "arange by a tiny step": (input_spec("source: arange, stop: 1.0e+300, step: 1.0e-300"), "too many values"),
}


@pytest.mark.parametrize("command", ["validate", pytest.param("run", marks=pytest.mark.slow)])  # one parser
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_hostile_spec_is_refused_and_nothing_is_written(tmp_path, case, command):
    text, words = BAD_INPUTS[case]
    (tmp_path / "spec.yaml").write_text(text)
    before = sorted(os.listdir(tmp_path))
    line = assert_refused(flowgpu(command, "spec.yaml", *(["--workers", "1"] if command == "run" else []),
                                  cwd=tmp_path), words)
    assert "spec.yaml" in line  # where: the file, and for fields their line, column and path
    assert sorted(os.listdir(tmp_path)) == before, "lost: nothing; written: nothing (no output, no staging)"


def test_field_errors_name_the_field(tmp_path):
    (tmp_path / "spec.yaml").write_text(BAD_INPUTS["fill .inf as int32"][0])
    assert "inputs.x.fill_value" in assert_refused(flowgpu("validate", "spec.yaml", cwd=tmp_path))
    (tmp_path / "spec.yaml").write_text(BAD_INPUTS["shape overflowing int64"][0])
    assert "inputs.x.shape" in assert_refused(flowgpu("validate", "spec.yaml", cwd=tmp_path))


def test_billion_laughs_in_a_params_file_is_refused(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "p.yaml").write_text(laughs("n"))
    assert_refused(flowgpu("run", "spec.yaml", "--params", "p.yaml", cwd=tmp_path), "p.yaml", "billion laughs")
    assert not (tmp_path / "out.zarr").exists(), "nothing written"


@pytest.mark.parametrize("setting, words", [
    ("cluster." + ".".join(["k"] * 1000) + "=1", "max-depth"),
    ("params.n=" + "[" * 1000 + "]" * 1000, "nests deeper than"),
    ("params.n=" + laughs().replace("\n", ", ").join("{}").replace(", }", "}"), "billion laughs"),
])
def test_hostile_set_is_refused(tmp_path, setting, words):
    (tmp_path / "spec.yaml").write_text(SPEC)
    assert_refused(flowgpu("validate", "spec.yaml", "--set", setting, cwd=tmp_path), words)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "too large"])
@pytest.mark.parametrize("role", ["spec", pytest.param("params", marks=pytest.mark.slow),
                                  pytest.param("include", marks=pytest.mark.slow)])
def test_non_regular_or_large_files_are_refused_at_once(tmp_path, kind, role):
    """A FIFO would block the reader forever and /dev/zero fill its memory: both are refused by stat."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "bad.yaml")
        bad, words = "bad.yaml", "is a FIFO, not a regular file"
    elif kind == "device":
        bad, words = "/dev/zero", "is a device, not a regular file"
    elif kind == "directory":
        (tmp_path / "bad.yaml").mkdir()
        bad, words = "bad.yaml", "is a directory"  # click says so for SPEC and --params, flowgpu for uses:
    else:
        (tmp_path / "bad.yaml").write_text("# padding\n" * 200_000)  # 2 MB of comments
        bad, words = "bad.yaml", "more than the 1,048,576 a spec may hold"
    (tmp_path / "spec.yaml").write_text(SPEC)
    args = {"spec": [bad], "params": ["spec.yaml", "--params", bad]}.get(role)
    if role == "include":
        (tmp_path / "main.yaml").write_text(f"inputs:\n  x: {{source: random, shape: [4]}}\nsteps:\n"
                                            f"  s: {{uses: {bad}, inputs: {{x: x}}}}\noutputs:\n  y: {{from: x}}\n")
        args = ["main.yaml"]
    code, out, err, wall, rss = result = flowgpu("validate", *args, cwd=tmp_path, kill_after=60)
    assert code == 2 and "Traceback" not in err, err
    assert words in err, err
    assert rss < LIMIT_MB, rss
    if not (role != "include" and kind == "directory"):  # click's usage error is its own two lines
        assert_refused(result)


def test_a_fifo_as_input_data_is_refused_at_once(tmp_path):
    """Opening a FIFO waits for a writer forever; the input's path is checked by stat first."""
    os.mkfifo(tmp_path / "x.npy")
    (tmp_path / "spec.yaml").write_text(input_spec("source: npy, path: x.npy"))
    assert "inputs.x.path" in assert_refused(flowgpu("run", "spec.yaml", cwd=tmp_path, kill_after=60), "a FIFO")
    assert not (tmp_path / "out.zarr").exists(), "nothing written"


def test_an_include_bomb_is_refused(tmp_path):
    """Two steps using a file with two steps using the next ...: 2**20 compiles, refused after max-includes."""
    for i in range(20):
        (tmp_path / f"l{i}.yaml").write_text(
            f"inputs:\n  x: {{source: random, shape: [4]}}\nsteps:\n  a: {{uses: l{i + 1}.yaml, inputs: {{x: x}}}}\n"
            f"  b: {{uses: l{i + 1}.yaml, inputs: {{x: x}}}}\noutputs:\n  y: {{from: x, sink: zarr, path: out.zarr}}\n")
    (tmp_path / "l20.yaml").write_text("inputs:\n  x: {source: random, shape: [4]}\noutputs:\n  y: {from: x}\n")
    assert_refused(flowgpu("run", "l0.yaml", cwd=tmp_path, kill_after=60), "more than 200 included specs")
    assert not (tmp_path / "out.zarr").exists(), "nothing written"


def test_an_internal_error_is_one_line_and_a_log_file(tmp_path):
    """A bug (here: a command that raises what flowgpu never means to) is said in one line, with where the
    traceback went; --debug shows it."""
    script = ("import sys, click\nfrom flowgpu.cli import cli, handle_errors\n"
              "@cli.command()\n@handle_errors\ndef boom():\n    {}['missing']\n"
              "sys.argv = ['flowgpu', *sys.argv[1:]]\ncli()\n")
    p = subprocess.run([sys.executable, "-c", script, "boom"], cwd=tmp_path, env=ENV, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "internal error KeyError" in line and "bug in flowgpu" in line and "--debug" in line
    log = line.split("written to ")[1].split(" ")[0]
    assert "KeyError" in Path(log).read_text()
    os.unlink(log)
    p = subprocess.run([sys.executable, "-c", script, "--debug", "boom"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "Traceback" in p.stderr and "shown above" in p.stderr


def chain_spec(steps: int) -> str:
    lines = ["inputs:", "  x: {source: npy, path: x.npy, chunks: [250, -1]}", "steps:"]
    prev = "x"
    for i in range(steps):
        op, arg = [("add", "b: 0.25"), ("multiply", "b: 0.997"), ("abs", None), ("subtract", "b: 0.125")][i % 4]
        args = f", args: {{{arg}}}" if arg else ""
        lines.append(f"  s{i}: {{op: {op}, inputs: [{prev}]{args}}}")
        prev = f"s{i}"
    lines.append(f"  total: {{op: sum, inputs: [{prev}]}}")
    lines += ["outputs:", f"  y: {{from: {prev}, sink: npy, path: y.npy}}", "  t: {from: total}"]
    return "\n".join(lines) + "\n"


def chain_numpy(x: np.ndarray, steps: int) -> np.ndarray:
    for i in range(steps):
        x = [lambda v: v + 0.25, lambda v: v * 0.997, np.abs, lambda v: v - 0.125][i % 4](x)
    return x


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_chain_of_350_steps_runs_and_matches_numpy(tmp_path, rng):
    """350 elementwise steps and a sum: fused in kernels of at most 32 steps, never a RecursionError."""
    x = rng.standard_normal((1000, 40))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "chain.yaml").write_text(chain_spec(350))
    code, out, err, wall, rss = flowgpu("validate", "chain.yaml", cwd=tmp_path)
    assert code == 0 and "Traceback" not in err, err
    code, out, err, wall, rss = flowgpu("run", "chain.yaml", "--workers", "1", "-q", "--summary", "s.json",
                                        cwd=tmp_path, kill_after=240)
    assert code == 0, err
    want = chain_numpy(x, 350)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-12, atol=1e-12)
    summary = json.loads((tmp_path / "s.json").read_text())
    np.testing.assert_allclose(summary["outputs"]["t"]["value"], want.sum(), rtol=1e-9)
    segments = summary["fused"]
    assert len(segments) >= 350 // 32  # kernels chained: each segment reads the one before it
    assert any(re.search(rf"\b{other}\b", e) for k, e in segments.items() for other in segments if other != k)


@pytest.mark.timeout(120)
def test_a_script_without_the_main_guard_is_told_so(tmp_path):
    """Spawned workers import the script again; the Session says the guard is missing, not 'check ports'."""
    (tmp_path / "noguard.py").write_text(
        "import flowgpu as fg\n"
        "with fg.Session(backend='cpu', n_workers=1, dashboard_address=None) as s:\n"
        "    print(float(fg.random((10, 10), seed=0).sum().compute()))\n")
    start = time.monotonic()
    p = subprocess.run([sys.executable, "noguard.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=90)
    assert time.monotonic() - start < 60
    assert p.returncode != 0
    assert "SessionError" in p.stderr and "if __name__ == \"__main__\":" in p.stderr, p.stderr
    assert "check host, ports" not in p.stderr
    assert p.stderr.count("Traceback") == 1, p.stderr  # the script's own, once; not a wall of them

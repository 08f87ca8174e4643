"""Ctrl-C (SIGINT to the run's whole process group, as a terminal sends it) and SIGTERM: one line that
says which outputs were moved into place and which were not, exit 130 (143), no worker's traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

SPEC = """\
params: {tile: 0}
foreach: {tile: [0, 1, 2]}
inputs: {t: {source: npy, path: "data/t${params.tile}.npy"}}
steps: {y: {op: multiply, inputs: [t], args: {b: 3.0}}}
outputs: {y: {from: y, sink: npy, path: "out/t${params.tile}.npy"}}
"""


def _interrupt(tmp_path: Path, point: str, sig: int, rng) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "data").mkdir()
    tiles = {i: rng.random((30, 4)) for i in range(3)}
    for i, t in tiles.items():
        np.save(tmp_path / "data" / f"t{i}.npy", t)
    (tmp_path / "spec.yaml").write_text(SPEC)
    pause = tmp_path / "pause"
    pause.mkdir()
    run = subprocess.Popen([sys.executable, "-m", "flowgpu", "run", "spec.yaml", "--standalone", "--workers", "2"],
                           cwd=tmp_path, env={**ENV, "FLOWGPU_TEST_FAULT": f"{point}@pause={pause}"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # its own process group, as a terminal's foreground job
    deadline = time.monotonic() + 180
    reached = pause / (point.split("#")[0].replace(":", "-") + ".reached")
    while not reached.exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the run never reached the fault point"
        time.sleep(0.05)
    os.killpg(run.pid, sig) if sig == signal.SIGINT else os.kill(run.pid, sig)
    out, err = run.communicate(timeout=120)
    return subprocess.CompletedProcess(run.args, run.returncode, out, err), tiles


def _one_line(err: str) -> str:
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(said) == 1, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err  # neither the client's nor a worker's
    return said[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_after_an_item_committed_says_what_was_moved_and_what_was_not(tmp_path, rng):
    done, tiles = _interrupt(tmp_path, "item-committed#1", signal.SIGINT, rng)
    assert done.returncode == 130, done.stderr
    said = _one_line(done.stderr)
    written = sorted(p.name for p in (tmp_path / "out").glob("t*.npy"))
    assert len(written) == 1, written  # the item whose commit was done when the interrupt came
    first = written[0]
    np.testing.assert_array_equal(np.load(tmp_path / "out" / first), 3.0 * tiles[int(first[1])])
    others = sorted({"t0.npy", "t1.npy", "t2.npy"} - {first})
    assert said == (f"error: interrupted after 1 output(s) were moved into place (1 of 3 batch items committed): "
                    f"out/{first}; not written: out/{others[0]}, out/{others[1]} (as they were before the run)"), said
    assert not [p for p in (tmp_path / "out").iterdir() if "flowgpu-tmp" in p.name]  # no staging left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_before_any_commit_and_sigterm(tmp_path, rng):
    done, _ = _interrupt(tmp_path, "after-prepare", signal.SIGTERM, rng)
    assert done.returncode == 143, done.stderr
    said = _one_line(done.stderr)
    assert said.startswith("error: interrupted; no output was moved into place (not written: out/t0.npy, out/t1.npy, "
                           "out/t2.npy, as they were before the run)"), said
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


SLOW_STEP = """\
import os, time


def slow(block, pause):
    open(os.path.join(pause, "computing.reached"), "w").close()
    time.sleep(60)
    return block * 2
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_while_the_workers_compute_says_one_line(tmp_path, rng):
    """Interrupted while the client gathers results (a task still running): the one line and exit
    130, and no asyncio report of distributed's cancelled gather ('Task exception was never retrieved')."""
    np.save(tmp_path / "x.npy", rng.random((40, 3)))
    pause = tmp_path / "pause"
    pause.mkdir()
    (tmp_path / "steps_mod.py").write_text(SLOW_STEP)
    (tmp_path / "spec.yaml").write_text(
        "inputs: {x: {source: npy, path: x.npy, chunks: [10, 3]}}\n"
        f"steps: {{y: {{op: map_blocks, inputs: [x], args: {{function: 'steps_mod:slow', kwargs: {{pause: '{pause}'}}}}}}}}\n"
        "outputs: {y: {from: y, sink: zarr, path: out/y.zarr}}\n")
    run = subprocess.Popen([sys.executable, "-m", "flowgpu", "run", "spec.yaml", "--standalone", "--workers", "1"],
                           cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 180
    while not (pause / "computing.reached").exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    time.sleep(0.5)  # the client is waiting for the results
    os.killpg(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    said = _one_line(err)
    assert said.startswith("error: interrupted; no output was moved into place (not written: out/y.zarr"), said
    assert "never retrieved" not in err and "AllExit" not in err, err
    assert not (tmp_path / "out" / "y.zarr").exists()


def test_quiet_prints_no_progress_line(tmp_path, rng):
    busy = socket.socket()
    try:  # the dashboard's port taken: distributed warns, and moves it
        busy.bind(("127.0.0.1", 8787))
        busy.listen()
    except OSError:
        pass  # taken already
    np.save(tmp_path / "x.npy", rng.random(10))
    (tmp_path / "s.yaml").write_text("inputs: {x: {source: npy, path: x.npy}}\nsteps: {s: {op: sum, inputs: [x]}}\n"
                                     "outputs: {s: {from: s}}\n")
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", "s.yaml", "-q", "--standalone", "--workers", "1"],
                          cwd=tmp_path, env={**ENV, "DASK_FLOWGPU__DASHBOARD_ADDRESS": "127.0.0.1:8787"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    busy.close()
    assert "running" not in done.stderr and "dashboard" not in done.stderr and "Port" not in done.stderr, done.stderr


def test_ctrl_c_while_the_command_loads_its_libraries_is_one_line(tmp_path):
    """A Ctrl-C in the second or two while `flowgpu` imports dask printed a KeyboardInterrupt traceback.
    Here the interrupt is raised exactly as the command module is imported (an audit hook sends it)."""
    (tmp_path / "spec.yaml").write_text("inputs: {x: {source: random, shape: [4]}}\n")
    code = ("import os, signal, sys\n"
            "sys.addaudithook(lambda ev, a: ev == 'import' and a[0] == 'flowgpu.cli.run' "
            "and os.kill(os.getpid(), signal.SIGINT))\n"
            "sys.argv = ['flowgpu', 'validate', 'spec.yaml']\n"
            "from flowgpu.cli import main\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130, done.stderr
    assert _one_line(done.stderr) == "error: interrupted while starting; nothing ran"
    assert done.stdout == "" and os.listdir(tmp_path) == ["spec.yaml"]

"""Outputs under faults: real `python -m flowgpu run` processes killed or failed at named points of
the commit (FLOWGPU_TEST_FAULT), concurrent writers, full and read-only filesystems.

Every test ends with the outputs either all old or all new (bytes compared against NumPy), and no
staging dir, journal or lock file left: nothing is lost, nothing is half-written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from flowgpu import pipeline

ROOT = Path(__file__).resolve().parents[2]
POINTS_BEFORE_DECISION = ["after-compute", "commit:before-marker", "commit:after-journal", "commit:after-aside"]
POINTS_AFTER_DECISION = ["commit:after-decision", "commit:after-first-rename", "commit:before-cleanup"]
LEFTOVER_TAGS = (".flowgpu-tmp-", ".flowgpu-journal-", ".flowgpu-lock")
TRACEBACK = "Traceback (most recent call last)"  # a Python traceback (distributed's worker log lines aside)

pytestmark = pytest.mark.timeout(120)


def _env(fault: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLOWGPU_TEST_FAULT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if fault:
        env["FLOWGPU_TEST_FAULT"] = fault
    return env


def flowgpu(*args: str, cwd: Path, fault: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=_env(fault),
                          capture_output=True, text=True, timeout=timeout)


def start(*args: str, cwd: Path, fault: str | None = None, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=_env(fault),
                                stdout=f, stderr=subprocess.STDOUT, text=True)


def wait_for(path: Path, proc: subprocess.Popen | None = None, text: str | None = None, limit: float = 60) -> None:
    """Until ``path`` exists (holds ``text``); fails if ``proc`` ends first or after ``limit`` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists() and (text is None or text in path.read_text()):
            return
        assert proc is None or proc.poll() is None, f"process ended early: {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared" + (f" with {text!r}" if text else ""))


def write_spec(tmp: Path, x: Path, out: Path, sinks: tuple[str, ...] = ("npy", "zarr")) -> Path:
    outputs = "\n".join(f"  {s}: {{from: y, sink: {s}, path: \"{out}/{s[0]}.{s}\"}}" for s in sinks)
    spec = tmp / "spec.yaml"
    spec.write_text(f"""
params: {{k: 2.0}}
inputs:
  x: {{source: npy, path: "{x}", chunks: [50, 8]}}
steps:
  y: {{op: multiply, inputs: [x], args: {{b: "${{params.k}}"}}}}
outputs:
{outputs}
cluster: {{backend: cpu, n_workers: 1, threads_per_worker: 2}}
""")
    return spec


@pytest.fixture
def job(tmp_path, rng):
    """A spec with two outputs (n.npy, z.zarr) of ``x * k``, already run once with k=2 (the old outputs)."""
    x = rng.standard_normal((200, 8))
    np.save(tmp_path / "x.npy", x)
    spec = write_spec(tmp_path, tmp_path / "x.npy", tmp_path / "out")
    pipeline.run(str(spec), session="local", progress=False)
    return x, spec, tmp_path


def generation(x: np.ndarray, out: Path, ks=(2.0, 3.0, 4.0)) -> float | None:
    """Which run wrote the outputs: the k whose ``x * k`` both hold bit for bit (None: no outputs)."""
    if not (out / "n.npy").exists() and not (out / "z.zarr").exists():
        return None
    n, z = np.load(out / "n.npy"), zarr.open_array(str(out / "z.zarr"), mode="r")[:]
    for k in ks:
        if np.array_equal(n, x * k) and np.array_equal(z, x * k):
            return k
    raise AssertionError("the outputs are not both the complete result of one run: data was lost or mixed")


def leftovers(root: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(root)) for d, dirs, files in os.walk(root)
                  for f in dirs + files if any(t in f for t in LEFTOVER_TAGS))


@pytest.mark.slow
@pytest.mark.parametrize("recover_by", ["next-run", "clean"])
@pytest.mark.parametrize("point", POINTS_BEFORE_DECISION + POINTS_AFTER_DECISION)
def test_kill_at_a_commit_point_is_recovered(job, point, recover_by):
    x, spec, tmp = job
    killed = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp, fault=f"{point}@kill")
    assert killed.returncode == 137, killed.stderr
    if recover_by == "clean":
        done = flowgpu("clean", "out", cwd=tmp)
        assert done.returncode == 0, done.stderr
    else:  # the next run recovers when it takes the lock; it then fails its own commit, keeping the recovered state
        done = flowgpu("run", str(spec), "-q", "--set", "params.k=4", cwd=tmp, fault="after-compute@raise")
        assert done.returncode == 1 and "injected at after-compute" in done.stderr, done.stderr
    expected = 3.0 if point in POINTS_AFTER_DECISION else 2.0
    assert generation(x, tmp / "out") == expected, "lost: the outputs are not all old or all new"
    assert leftovers(tmp) == [], "staging or journal left behind"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signal_mid_run_leaves_only_staging_that_the_next_run_removes(job, sig):
    x, spec, tmp = job
    proc = start("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp, log=tmp / "run.log",
                 fault=f"after-prepare@pause={tmp}")
    wait_for(tmp / "after-prepare.reached", proc)
    staged = [p for p in leftovers(tmp) if ".flowgpu-tmp-" in p and p.count("/") == 1]
    assert len(staged) == 2, staged
    npy_stage = next(tmp / p for p in staged if ".n.npy" in p)
    assert os.stat(npy_stage / "data").st_blocks * 512 >= x.nbytes  # really allocated, not sparse
    proc.send_signal(sig)
    want = 128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL  # 143: as Unix tools exit on SIGTERM
    assert proc.wait(timeout=60) == want
    if sig == signal.SIGTERM:
        assert "interrupted; no output was moved into place" in (tmp / "run.log").read_text()
        assert leftovers(tmp) == []
    else:
        assert leftovers(tmp) != []
    assert generation(x, tmp / "out") == 2.0, "lost: the old outputs changed"
    again = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert generation(x, tmp / "out") == 3.0 and leftovers(tmp) == [], "the dead run's staging was not removed"


def test_user_function_raising_leaves_nothing(job):
    x, spec, tmp = job
    spec.write_text(spec.read_text().replace(
        "{op: multiply, inputs: [x], args: {b: \"${params.k}\"}}",
        "{op: map_blocks, inputs: [x], args: {function: \"tests.faults.userfuncs:explode\", dtype: float64}}"))
    failed = flowgpu("run", str(spec), "-q", cwd=tmp)
    assert failed.returncode == 1 and "user function failed" in failed.stderr, failed.stderr
    # one line says where the user's function failed; the workers' per-task logs do not repeat it
    assert "(raised at userfuncs.py:" in failed.stderr and "in explode)" in failed.stderr, failed.stderr
    assert "Compute Failed" not in failed.stderr and "Traceback" not in failed.stderr, failed.stderr
    assert generation(x, tmp / "out") == 2.0 and leftovers(tmp) == [], "staging left behind, or old outputs lost"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["commit:after-aside", "commit:after-first-rename"])
def test_second_output_failing_to_commit_keeps_both_old(job, point):
    x, spec, tmp = job
    failed = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp, fault=f"{point}@raise")
    assert failed.returncode == 1 and TRACEBACK not in failed.stderr, failed.stderr
    assert "cannot write output" in failed.stderr and "Nothing was replaced" in failed.stderr
    assert generation(x, tmp / "out") == 2.0, "lost: one output new, the other old"
    assert leftovers(tmp) == []


@pytest.mark.slow
def test_marker_write_failing_keeps_the_old_outputs(job):
    x, spec, tmp = job
    failed = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp, fault="commit:before-marker@raise=ENOSPC")
    assert failed.returncode == 1 and "No space left on device" in failed.stderr, failed.stderr
    assert TRACEBACK not in failed.stderr
    assert generation(x, tmp / "out") == 2.0 and leftovers(tmp) == []
    again = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp)  # nothing to fix by hand
    assert again.returncode == 0, again.stderr
    assert generation(x, tmp / "out") == 3.0


def test_user_file_appearing_during_the_run_is_kept(tmp_path, rng):
    x = rng.standard_normal((200, 8))
    np.save(tmp_path / "x.npy", x)
    spec = write_spec(tmp_path, tmp_path / "x.npy", tmp_path / "out")
    proc = start("run", str(spec), "-q", cwd=tmp_path, log=tmp_path / "run.log", fault=f"after-compute@pause={tmp_path}")
    wait_for(tmp_path / "after-compute.reached", proc)
    theirs = rng.bytes(1000)
    (tmp_path / "out" / "n.npy").write_bytes(theirs)  # the user's file, at the path the run is about to commit
    (tmp_path / "after-compute.go").touch()
    assert proc.wait(timeout=60) == 1
    log = (tmp_path / "run.log").read_text()
    assert "was created or replaced while the run was in progress" in log and TRACEBACK not in log, log
    assert (tmp_path / "out" / "n.npy").read_bytes() == theirs, "lost: the user's file"
    assert not (tmp_path / "out" / "z.zarr").exists(), "half a run committed"
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_writers_of_one_output(job):
    x, spec, tmp = job
    first = start("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp, log=tmp / "first.log",
                  fault=f"after-compute@pause={tmp}")
    wait_for(tmp / "after-compute.reached", first)
    refused = flowgpu("run", str(spec), "-q", "--no-wait", "--set", "params.k=4", cwd=tmp)
    assert refused.returncode == 1, refused.stderr
    assert f"is being written by flowgpu run pid {first.pid}" in refused.stderr
    second = start("run", str(spec), "-q", "--set", "params.k=4", cwd=tmp, log=tmp / "second.log")
    wait_for(tmp / "second.log", second, text=f"waiting for flowgpu run pid {first.pid}")
    assert generation(x, tmp / "out") == 2.0
    (tmp / "after-compute.go").touch()
    assert first.wait(timeout=60) == 0, (tmp / "first.log").read_text()
    assert second.wait(timeout=60) == 0, (tmp / "second.log").read_text()
    assert generation(x, tmp / "out") == 4.0, "the second writer did not write after the first"
    assert leftovers(tmp) == []


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["npy", "zarr"])
def test_full_filesystem_fails_with_a_message_and_keeps_the_old_output(tmp_path, small_fs, rng, sink):
    small, big = rng.standard_normal((100, 8)), rng.standard_normal((40_000, 8))  # 2.5 MB: more than it holds
    np.save(tmp_path / "small.npy", small)
    np.save(tmp_path / "big.npy", big)
    spec = write_spec(tmp_path, tmp_path / "small.npy", small_fs / "out", sinks=(sink,))
    pipeline.run(str(spec), session="local", progress=False)
    old = small_fs / "out" / f"{sink[0]}.{sink}"
    failed = flowgpu("run", str(spec), "-q", "--set", f"inputs.x.path={tmp_path / 'big.npy'}", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "No space left on device" in failed.stderr and TRACEBACK not in failed.stderr, failed.stderr
    assert "KilledWorker" not in failed.stderr and "Nothing was replaced" in failed.stderr.splitlines()[-1]
    got = np.load(old) if sink == "npy" else zarr.open_array(str(old), mode="r")[:]
    assert np.array_equal(got, small * 2.0), "lost: the old output"
    assert leftovers(small_fs) == []


def test_read_only_filesystem_fails_with_a_message_and_keeps_the_old_output(tmp_path, small_fs, rng):
    x = rng.standard_normal((100, 8))
    np.save(tmp_path / "x.npy", x)
    spec = write_spec(tmp_path, tmp_path / "x.npy", small_fs / "out")
    pipeline.run(str(spec), session="local", progress=False)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    failed = flowgpu("run", str(spec), "-q", "--set", "params.k=3", cwd=tmp_path)
    assert failed.returncode == 1 and TRACEBACK not in failed.stderr, failed.stderr
    assert "Read-only file system (EROFS)" in failed.stderr and "read-only: choose a path" in failed.stderr
    assert generation(x, small_fs / "out") == 2.0, "lost: the old outputs"

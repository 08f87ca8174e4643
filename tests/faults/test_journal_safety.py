"""Nothing is deleted that flowgpu did not write (issue 27, findings 1 and 16): a journal, a staging
folder or a lock file that flowgpu cannot tell it made for that place is never followed nor
removed, by ``flowgpu clean`` or by a run, however it names other paths; what it names stays as it
was, byte for byte. Real ``python -m flowgpu`` processes where the finding is about the command.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowgpu.errors import OutputError
from flowgpu.io import journal
from flowgpu.io.atomic import AtomicPath, clean, commit_together
from flowgpu.io.lock import OutputLock

ROOT = Path(__file__).resolve().parents[2]
RUN = "r" + "0123456789abcdef"
TRACEBACK = "Traceback (most recent call last)"
pytestmark = pytest.mark.timeout(180)


def flowgpu(*args: str, cwd: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLOWGPU_TEST_FAULT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if fault:
        env["FLOWGPU_TEST_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=150)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (itself included) with its bytes (None for a folder)."""
    out = {".": None}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), root)] = None
        for name in files:
            out[os.path.relpath(os.path.join(d, name), root)] = Path(d, name).read_bytes()
    return out


@pytest.fixture
def victims(tmp_path, rng):
    """A folder of the user's and a file of the user's, random bytes, outside any output folder."""
    folder = tmp_path / "thesis"
    (folder / "chapters").mkdir(parents=True)
    for i in range(3):
        (folder / "chapters" / f"{i}.tex").write_bytes(rng.bytes(2000))
    (tmp_path / "secret.key").write_bytes(rng.bytes(64))
    return {"folder": folder, "file": tmp_path / "secret.key",
            "before": (snapshot(folder), (tmp_path / "secret.key").read_bytes())}


def unlocked(tree: dict[str, bytes | None]) -> dict[str, bytes | None]:
    return {k: v for k, v in tree.items() if not k.endswith(".flowgpu-lock")}


def intact(victims) -> bool:
    return victims["folder"].is_dir() and victims["file"].exists() and \
        (snapshot(victims["folder"]), victims["file"].read_bytes()) == victims["before"]


def j_name() -> str:
    return f".flowgpu-journal-{RUN}.json"


def plant(folder: Path, output: str, stage: str, journals: list[str], committed: bool) -> Path:
    """A journal as the finding describes it: its entries name the user's paths (relative ones work)."""
    folder.mkdir(parents=True, exist_ok=True)
    j = folder / f".flowgpu-journal-{RUN}.json"
    dead = {"pid": 1, "host": socket.gethostname(), "start": 0.0}
    j.write_text(json.dumps({"run": RUN, "owner": dead, "journals": [*journals],
                             "outputs": [{"path": output, "stage": stage, "id": "r" + "f" * 16}]}))
    if committed:
        j.with_suffix(".committed").touch()
    return j


def refused(p: subprocess.CompletedProcess, journal_file: Path) -> None:
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert TRACEBACK not in p.stderr and TRACEBACK not in p.stdout, p.stderr
    lines = [line for line in p.stderr.splitlines() if journal_file.name in line]
    assert len(lines) == 1 and lines[0].startswith("error: left alone"), p.stderr
    assert "touched nothing it names" in lines[0] and "then remove it" in lines[0], lines[0]


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "undecided"])
def test_clean_does_not_follow_a_journal_planted_in_a_clone(tmp_path, victims, committed):
    """A cloned repository holds a journal naming the user's folder as staging and the user's file as
    another journal (relative paths): `flowgpu clean` refuses it, and deletes nothing."""
    clone = tmp_path / "clone"
    j = plant(clone, "clone/result.npy", "thesis", [f"clone/{j_name()}", "secret.key"], committed)
    refused(flowgpu("clean", "clone", cwd=tmp_path), j)
    assert intact(victims), "clean deleted the user's files"
    assert j.exists(), "the planted journal is the user's to look at, not removed"


def test_a_hand_written_journal_with_its_own_inode_touches_nothing_outside_its_folder(tmp_path, victims):
    """Even a journal whose content records its own inode (as only flowgpu's own can) touches only
    what is derived from it, beside it: the staging and journal paths it writes down are not read."""
    out = tmp_path / "out"
    out.mkdir()
    j = out / j_name()
    j.touch()
    record = {"writer": "flowgpu", "run": RUN, "ino": j.stat().st_ino,
              "journals": [str(victims["file"])],  # ignored: derived from the run id
              "outputs": [{"path": str(out / "y.npy"), "id": "r" + "f" * 16, "stage": str(victims["folder"]),
                           "stage_ino": victims["folder"].stat().st_ino}]}
    j.write_text(json.dumps(record))
    j.with_suffix(".committed").touch()
    p = flowgpu("clean", "out", cwd=tmp_path)
    assert p.returncode == 0 and TRACEBACK not in p.stderr, p.stderr
    assert intact(victims), "a path the journal wrote down was followed"


@pytest.mark.timeout(240)
def test_a_run_leaves_a_journal_planted_in_its_output_folder_alone(tmp_path, victims, rng):
    """A shared output folder holds a journal (another user's, when the test can make one) naming the
    run's output: the run writes its output, says the journal was left alone, and deletes nothing."""
    x = rng.standard_normal((300, 6))
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "shared"
    j = plant(out, str(out / "y.npy"), str(victims["folder"]), [str(out / j_name()), str(victims["file"])], False)
    if os.geteuid() == 0:
        os.chown(j, 65534, 65534)  # written by someone else who can write the shared folder
    (tmp_path / "spec.yaml").write_text(f"""
inputs:
  x: {{source: npy, path: x.npy}}
steps:
  y: {{op: multiply, inputs: [x], args: {{b: 3.0}}}}
outputs:
  y: {{from: y, sink: npy, path: "{out}/y.npy"}}
cluster: {{backend: cpu, n_workers: 1, threads_per_worker: 2}}
""")
    p = flowgpu("run", "spec.yaml", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert intact(victims), "the run deleted the user's files by following a planted journal"
    assert f"left alone {j}" in p.stderr and TRACEBACK not in p.stderr, p.stderr
    np.testing.assert_array_equal(np.load(out / "y.npy"), x * 3.0)
    assert j.exists()


@pytest.mark.timeout(300)
def test_a_copied_journal_is_refused_and_the_original_is_recovered(tmp_path, rng):
    """A run killed after its decision leaves a journal; a copy of that folder (cp -a: other inodes)
    is refused and touches nothing, the original is completed by `flowgpu clean`."""
    x = rng.standard_normal((200, 8))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "spec.yaml").write_text("""
params: {k: 2.0}
inputs:
  x: {source: npy, path: x.npy}
steps:
  y: {op: multiply, inputs: [x], args: {b: "${params.k}"}}
outputs:
  n: {from: y, sink: npy, path: out/n.npy}
  m: {from: y, sink: npy, path: out/m.npy}
cluster: {backend: cpu, n_workers: 1, threads_per_worker: 2}
""")
    assert flowgpu("run", "spec.yaml", "-q", cwd=tmp_path).returncode == 0
    killed = flowgpu("run", "spec.yaml", "-q", "--set", "params.k=3", cwd=tmp_path, fault="commit:after-decision@kill")
    assert killed.returncode == 137, killed.stderr
    (j,) = (tmp_path / "out").glob(".flowgpu-journal-*.json")
    shutil.copytree(tmp_path / "out", tmp_path / "copy", symlinks=True)
    original, copy = snapshot(tmp_path / "out"), unlocked(snapshot(tmp_path / "copy"))
    refused(flowgpu("clean", "copy", cwd=tmp_path), tmp_path / "copy" / j.name)
    assert snapshot(tmp_path / "out") == original, "cleaning the copy touched the folder its journal names"
    assert unlocked(snapshot(tmp_path / "copy")) == copy  # copied stale lock files (flowgpu's records) may go
    done = flowgpu("clean", "out", cwd=tmp_path)
    assert done.returncode == 0 and "was completed (all new)" in done.stdout, done.stderr
    for name in ("n.npy", "m.npy"):
        np.testing.assert_array_equal(np.load(tmp_path / "out" / name), x * 3.0)
    assert sorted(os.listdir(tmp_path / "out")) == [".m.npy.flowgpu-output.json", ".n.npy.flowgpu-output.json",
                                                     "m.npy", "n.npy"]


def test_clean_leaves_a_users_folder_named_like_staging_and_a_users_lock_file(tmp_path, rng):
    """Only what carries flowgpu's owner record is removed: not a user's folder named like a staging
    folder (also a copy of a real one: another inode), nor a user's file named like a lock file."""
    data = tmp_path / "data"
    folder = data / f".results.flowgpu-tmp-{RUN}"
    folder.mkdir(parents=True)
    (folder / "table.csv").write_bytes(rng.bytes(500))
    copied = data / f".other.flowgpu-tmp-r{'1' * 16}"
    copied.mkdir()
    (copied / "owner.json").write_text(json.dumps({"pid": 1, "host": "elsewhere", "start": 0.0, "ino": 12345}))
    (copied / "data").write_bytes(rng.bytes(500))
    (data / ".notes.flowgpu-lock").write_bytes(rng.bytes(300))
    before = snapshot(data)
    p = flowgpu("clean", "data", cwd=tmp_path)
    assert p.returncode == 1 and TRACEBACK not in p.stderr, (p.stdout, p.stderr)
    said = [line for line in p.stderr.splitlines() if line.startswith("error: left alone")]
    assert len(said) == 3, p.stderr
    assert snapshot(data) == before, "clean removed or changed what flowgpu did not make"


def _stuck_commit(tmp_path, rng, monkeypatch) -> dict[str, bytes]:
    """Two outputs whose commit failed and could not be undone: journal and staging left for recovery."""
    old = {name: rng.bytes(64) for name in ("a.bin", "b.bin")}
    for name, data in old.items():
        t = AtomicPath(str(tmp_path / name))
        Path(t.begin()).write_bytes(data)
        t.commit()
    monkeypatch.setenv("FLOWGPU_TEST_FAULT", "commit:after-first-rename@raise")

    def broken(o, notes):
        raise OSError(5, "disk went away")

    monkeypatch.setattr(journal, "_roll_back", broken)
    targets = []
    for name in old:
        t = AtomicPath(str(tmp_path / name))
        Path(t.begin()).write_bytes(rng.bytes(64))
        targets.append(t)
    with pytest.raises(OutputError, match="could not be undone"):
        commit_together(targets)
    monkeypatch.undo()
    return old


def test_a_staging_dir_replaced_after_the_crash_is_not_followed(tmp_path, rng, monkeypatch):
    """The journal records each staging dir's inode: a folder put in its place is refused, untouched;
    with the real one back, recovery restores the old outputs."""
    old = _stuck_commit(tmp_path, rng, monkeypatch)
    (stage,) = tmp_path.glob(".a.bin.flowgpu-tmp-*")
    stage.rename(tmp_path / "kept-aside")
    stage.mkdir()
    (stage / "mine.txt").write_bytes(rng.bytes(100))
    before = snapshot(tmp_path)
    notes = clean([str(tmp_path)])
    assert snapshot(tmp_path) == before, "a journal followed a staging dir that is not the one it recorded"
    assert any("is not the staging dir flowgpu made" in n for n in notes), notes
    shutil.rmtree(stage)
    (tmp_path / "kept-aside").rename(stage)
    notes = clean([str(tmp_path)])
    assert any("was undone (all old)" in n for n in notes), notes
    assert {name: (tmp_path / name).read_bytes() for name in old} == old


@pytest.mark.timeout(120)
def test_a_lock_path_that_is_not_flowgpus_is_never_written(tmp_path, rng):
    """A user's file, or a link to one, at an output's lock path is refused, not truncated."""
    theirs = rng.bytes(300)
    (tmp_path / ".out.flowgpu-lock").write_bytes(theirs)
    with pytest.raises(OutputError, match="not flowgpu's owner record"):
        OutputLock(str(tmp_path / "out")).acquire(wait=False)
    assert (tmp_path / ".out.flowgpu-lock").read_bytes() == theirs
    (tmp_path / "diary.txt").write_bytes(theirs)
    os.symlink(tmp_path / "diary.txt", tmp_path / ".other.flowgpu-lock")
    with pytest.raises(OutputError, match="symbolic link"):
        OutputLock(str(tmp_path / "other")).acquire(wait=False)
    assert (tmp_path / "diary.txt").read_bytes() == theirs

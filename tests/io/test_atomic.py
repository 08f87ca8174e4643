"""Atomic outputs: nothing appears until complete; foreign data is never replaced silently."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest

from flowgpu.errors import OutputError, OutputExistsError, OutputLockedError
from flowgpu.io.atomic import AtomicPath, atomic_output, clean, commit_together, hold, written_by_flowgpu
from flowgpu.io import journal
from flowgpu.io.lock import OutputLock, owner

TAGS = (".flowgpu-tmp-", ".flowgpu-journal-", ".flowgpu-lock")


def leftovers(root):
    return [f for _, dirs, files in os.walk(root) for f in dirs + files if any(t in f for t in TAGS)]


def staged(path, data: bytes) -> AtomicPath:
    target = AtomicPath(str(path))
    with open(target.begin(), "wb") as f:
        f.write(data)
    return target


def test_commit_moves_into_place_with_marker(tmp_path):
    target = AtomicPath(str(tmp_path / "a" / "out.bin"))
    tmp = target.begin()
    with open(tmp, "wb") as f:
        f.write(b"data")
    assert not (tmp_path / "a" / "out.bin").exists()
    target.commit()
    assert (tmp_path / "a" / "out.bin").read_bytes() == b"data"
    assert written_by_flowgpu(str(tmp_path / "a" / "out.bin"))
    assert sorted(os.listdir(tmp_path / "a")) == [".out.bin.flowgpu-output.json", "out.bin"]


def test_abort_and_exceptions_leave_the_destination_alone(tmp_path):
    dest = tmp_path / "keep.npy"
    with atomic_output(str(dest)) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.arange(3))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(RuntimeError):
        with atomic_output(str(dest)) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("killed")
    assert sorted(os.listdir(tmp_path)) == before
    np.testing.assert_array_equal(np.load(dest), np.arange(3))


def test_foreign_data_needs_overwrite(tmp_path):
    dest = tmp_path / "theirs"
    dest.mkdir()
    (dest / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="not written by flowgpu"):
        AtomicPath(str(dest)).begin()
    target = AtomicPath(str(dest), overwrite=True)
    os.makedirs(target.begin())
    target.commit()
    assert written_by_flowgpu(str(dest)) and not (dest / "precious.txt").exists()
    again = AtomicPath(str(dest))  # now it is flowgpu's: replaced without overwrite
    os.makedirs(again.begin())
    again.commit()


def test_outputs_commit_together_or_not_at_all(tmp_path, rng, monkeypatch):
    old = {name: rng.bytes(64) for name in ("a.bin", "b.bin")}
    commit_together([staged(tmp_path / name, data) for name, data in old.items()])
    monkeypatch.setenv("FLOWGPU_TEST_FAULT", "commit:after-first-rename@raise")
    with pytest.raises(OutputError, match="injected at commit:after-first-rename"):
        commit_together([staged(tmp_path / name, rng.bytes(64)) for name in old])
    assert {name: (tmp_path / name).read_bytes() for name in old} == old, "lost: one output new, one old"
    assert all(written_by_flowgpu(str(tmp_path / name)) for name in old) and leftovers(tmp_path) == []
    monkeypatch.delenv("FLOWGPU_TEST_FAULT")
    new = {name: rng.bytes(64) for name in old}
    commit_together([staged(tmp_path / name, data) for name, data in new.items()])
    assert {name: (tmp_path / name).read_bytes() for name in old} == new and leftovers(tmp_path) == []


def test_data_appearing_during_the_run_is_put_back_at_commit(tmp_path, rng):
    target = staged(tmp_path / "out.bin", rng.bytes(64))
    theirs = rng.bytes(64)
    (tmp_path / "out.bin").write_bytes(theirs)
    with pytest.raises(OutputError, match="created or replaced while the run was in progress"):
        target.commit()
    assert (tmp_path / "out.bin").read_bytes() == theirs and leftovers(tmp_path) == []


def test_one_writer_at_a_time(tmp_path):
    out = str(tmp_path / "out.bin")
    with hold([out]):
        with pytest.raises(OutputLockedError, match=f"being written by flowgpu run pid {os.getpid()}"):
            OutputLock(out).acquire(wait=False)
    OutputLock(out).acquire(wait=False).release()  # free again, and the lock file is gone
    assert leftovers(tmp_path) == []


def _stage(tmp_path, name, who):
    stage = tmp_path / f".{name}.flowgpu-tmp-r{os.urandom(8).hex()}"
    stage.mkdir()
    (stage / "data").write_bytes(b"half")
    (stage / "owner.json").write_text(json.dumps({**who, "ino": stage.stat().st_ino}))  # as flowgpu makes them
    return stage


def test_staging_of_dead_runs_is_removed_and_of_live_ones_kept(tmp_path):
    dead = _stage(tmp_path, "out.bin", {"pid": os.getpid(), "host": socket.gethostname(), "start": 1.0})
    live = _stage(tmp_path, "out.bin", owner())
    target = AtomicPath(str(tmp_path / "out.bin"))
    target.begin()
    assert not dead.exists() and live.exists()
    target.abort()
    other = _stage(tmp_path, "other.bin", {"pid": 1, "host": "elsewhere", "start": 0})
    notes = clean([str(tmp_path)])
    assert not other.exists() and live.exists() and any("still running" in n for n in notes)


def test_a_commit_that_cannot_be_undone_is_finished_by_clean(tmp_path, rng, monkeypatch):
    old = {name: rng.bytes(64) for name in ("a.bin", "b.bin")}
    commit_together([staged(tmp_path / name, data) for name, data in old.items()])
    monkeypatch.setenv("FLOWGPU_TEST_FAULT", "commit:after-first-rename@raise")

    def broken(o, notes):
        raise OSError(5, "disk went away")

    monkeypatch.setattr(journal, "_roll_back", broken)
    targets = [staged(tmp_path / name, rng.bytes(64)) for name in old]
    with pytest.raises(OutputError, match="could not be undone .*flowgpu clean"):
        commit_together(targets)
    for t in targets:
        t.abort()  # what the runner does on failure: it must not delete the staged old output
    monkeypatch.undo()
    notes = clean([str(tmp_path)])
    assert any("was undone (all old)" in n for n in notes), notes
    assert {name: (tmp_path / name).read_bytes() for name in old} == old, "lost: an old output"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("where", [".", "..", "../..", "~"])
def test_python_writers_never_replace_the_working_directory_or_home(tmp_path, monkeypatch, rng, where):
    """``fg.to_zarr(x, "..", overwrite=True)`` replaced the folder holding the working directory (and
    the user's files in it) with a store: the CLI refused it, the Python writers did not."""
    import flowgpu as fg

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "a"))
    x = fg.from_array(rng.standard_normal((8, 8)), chunks=4)
    for write in (fg.to_zarr, fg.to_npy):
        with pytest.raises(OutputError, match=r"(is|contains) (the working directory|your home folder), which no "
                                              r"write replaces, overwrite or not"):
            write(x, where, overwrite=True)
    assert (work / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["a"] and sorted(os.listdir(tmp_path / "a")) == ["b"]
    assert sorted(os.listdir(work)) == ["keep.txt"]


def _sources(folder, rng):
    """Each kind of file an array can be read from, in ``folder``, and what each holds."""
    import dask.array as da
    import h5py
    import tifffile
    import zarr

    import flowgpu as fg

    folder.mkdir()
    a = rng.standard_normal((8, 6))
    np.save(folder / "a.npy", a)
    zarr.save_array(str(folder / "a.zarr"), a)
    with h5py.File(folder / "a.h5", "w") as f:
        f["a"] = a
    pages = rng.integers(0, 1000, (3, 8, 6), dtype=np.uint16)
    for i, page in enumerate(pages):
        tifffile.imwrite(folder / f"p{i}.tif", page)
    h5 = h5py.File(folder / "a.h5", "r")
    return [(fg.from_npy(str(folder / "a.npy")), a), (fg.from_zarr(str(folder / "a.zarr")), a),
            (da.from_zarr(str(folder / "a.zarr")), a), (fg.from_hdf5(str(folder / "a.h5"), "a"), a),
            (da.from_array(h5["a"], chunks=4), a), (fg.from_tiff(str(folder / "p*.tif")), pages)]


def test_python_writers_never_replace_an_input_of_the_array_or_its_folder(tmp_path, rng):
    """``fg.to_zarr(x * 2, folder, overwrite=True)`` replaced the folder holding x's own .npy file (and
    everything else in it) with a store: the CLI refuses an input or its folder, the Python writers
    did not. Every source kind, flowgpu's and dask's own, is refused, and nothing is touched."""
    import flowgpu as fg

    folder = tmp_path / "data"
    sources = _sources(folder, rng)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    for x, values in sources:
        for where in (folder, tmp_path):
            with pytest.raises(OutputError, match=r"contains an input of the array written \('" + str(folder)):
                fg.to_zarr(x * 2, str(where), overwrite=True)
        out = fg.to_npy(x * 2, str(tmp_path / "out.npy"), overwrite=True)  # another folder: written
        np.testing.assert_array_equal(np.load(out), values * 2)
    with pytest.raises(OutputError, match=r"is an input of the array written"):
        fg.to_npy(sources[0][0] + 1, str(folder / "a.npy"), overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert sorted(os.listdir(tmp_path)) == [".out.npy.flowgpu-output.json", "data", "out.npy"]


def test_a_users_file_given_the_inode_of_flowgpus_deleted_output_is_not_replaced(tmp_path, rng):
    """A user deleted flowgpu's output and put a file of their own at its path; ext4 gave the new file
    the freed inode, which the marker named, so the next run replaced it without --overwrite. The
    marker also names the inode's generation, which a reused inode does not keep."""
    import fcntl

    import flowgpu as fg

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x80087601, bytes(8))  # FS_IOC_GETVERSION
    except OSError:
        pytest.skip("this file system keeps no inode generations (FS_IOC_GETVERSION)")
    finally:
        os.close(fd)
    out = tmp_path / "y.npy"
    fg.to_npy(fg.from_array(rng.standard_normal((6, 4)), chunks=3), str(out))
    assert written_by_flowgpu(str(out))
    mark_file = tmp_path / ".y.npy.flowgpu-output.json"
    mark = json.loads(mark_file.read_text())
    out.unlink()
    mine = rng.bytes(100)
    out.write_bytes(mine)
    mark_file.write_text(json.dumps({**mark, "ino": out.stat().st_ino}))  # as a reused inode looks
    assert not written_by_flowgpu(str(out))
    with pytest.raises(OutputExistsError, match="is not the one flowgpu wrote there: a new file took its place"):
        fg.to_npy(fg.from_array(rng.standard_normal((6, 4)), chunks=3), str(out))
    assert out.read_bytes() == mine


def test_a_users_file_beside_a_marker_it_did_not_get_from_flowgpu_is_not_replaced(tmp_path, rng):
    """A file named like flowgpu's marker made any file at the output's path count as flowgpu's (an
    empty ``.y.npy.flowgpu-output.json`` was enough); so did a user's file put where an output was."""
    out = tmp_path / "y.npy"
    mine = rng.bytes(64)
    out.write_bytes(mine)
    (tmp_path / ".y.npy.flowgpu-output.json").write_text("")
    assert not written_by_flowgpu(str(out))
    with pytest.raises(OutputExistsError, match="was not written by flowgpu"):
        staged(out, b"new")
    assert out.read_bytes() == mine
    os.remove(tmp_path / ".y.npy.flowgpu-output.json")
    os.remove(out)
    staged(out, rng.bytes(32)).commit()  # flowgpu's own output now: replaced by the next run
    assert written_by_flowgpu(str(out))
    staged(out, rng.bytes(32)).commit()
    replaced = tmp_path / "other.npy"  # the user moves a file of their own over it: theirs now
    replaced.write_bytes(mine)
    os.replace(replaced, out)
    assert not written_by_flowgpu(str(out))
    with pytest.raises(OutputExistsError, match="is not the one flowgpu wrote there: a new file took its place"):
        staged(out, b"new")
    assert out.read_bytes() == mine

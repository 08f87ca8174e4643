"""Atomic outputs: nothing appears until complete; foreign data is never replaced silently."""

from __future__ import annotations

import os

import numpy as np
import pytest

from flowgpu.errors import OutputExistsError
from flowgpu.io.atomic import AtomicPath, atomic_output, written_by_flowgpu


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

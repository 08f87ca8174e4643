"""Source and sink registries: synthetic and file sources, lazy atomic writes."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import zarr

from flowgpu.errors import ConfigError, ImportPathError
from flowgpu.io import sinks, sources


def test_synthetic_sources_match_flowgpu_arrays():
    from flowgpu import arrays

    x = sources.open_source("normal", shape=[6, 5], dtype="float32", seed=4, chunks=[3, 5], scale=2.0)
    np.testing.assert_array_equal(x.compute(), arrays.normal((6, 5), "float32", seed=4, chunks=3, scale=2.0).compute())
    np.testing.assert_array_equal(sources.open_source("arange", start=2, stop=9, step=3).compute(), [2, 5, 8])
    assert sources.open_source("full", shape=[2], fill_value=7, dtype="int32").compute().tolist() == [7, 7]


def test_unknown_source_and_bad_callable():
    with pytest.raises(ConfigError, match="unknown source 'nope'"):
        sources.open_source("nope")
    with pytest.raises(ImportPathError, match="callable .no_such_module_xyz:f.: no module named .no_such_module_xyz."):
        sources.open_source("python", callable="no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="does not take arguments"):
        sources.open_source("python", callable="tests.pipeline.helpers:make_matrix", args={"bogus": 1})


@pytest.mark.parametrize("sink", ["npy", "zarr"])
def test_lazy_writes_appear_only_on_commit(tmp_path, rng, sink):
    x = rng.standard_normal((9, 4))
    arr = dask.array.from_array(x, chunks=(4, 4))
    dest = tmp_path / f"out.{sink}"
    pending = sinks.prepare_write(sink, arr, str(dest))
    assert not dest.exists()
    dask.compute(pending.target)
    assert not dest.exists()
    pending.commit()
    got = np.load(dest) if sink == "npy" else zarr.open_array(str(dest))[:]
    np.testing.assert_array_equal(got, x)


def test_summary_values_are_plain_python(rng):
    v = rng.random(3)
    assert sinks.to_summary_value(v) == v.tolist()
    assert sinks.to_summary_value(np.float32(2.5)) == 2.5


def test_a_zstd_level_is_written_and_a_level_zstd_has_not_is_refused(tmp_path, rng):
    """A level given alone was dropped (zarr's default layout took the store, at level 0), one past
    zstd's range failed inside zarr as an internal error, and one for lz4 was silently ignored."""
    import json

    import flowgpu as fg
    from flowgpu.errors import SpecError
    from flowgpu.pipeline import load

    x = rng.standard_normal((40, 30))
    out = fg.to_zarr(fg.from_array(x, chunks=20), str(tmp_path / "a.zarr"), level=7)
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], x)
    codecs = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())["codecs"]
    assert {"name": "zstd", "configuration": {"level": 7, "checksum": False}} in codecs
    with pytest.raises(ConfigError, match=r"zarr level 30 is not a zstd level: give a whole number from -131072"):
        fg.to_zarr(fg.from_array(x, chunks=20), str(tmp_path / "b.zarr"), level=30)
    with pytest.raises(ConfigError, match=r"zarr level 5 is for codec zstd only; leave it out for codec 'lz4'"):
        fg.to_zarr(fg.from_array(x, chunks=20), str(tmp_path / "c.zarr"), codec="lz4", level=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.zarr.flowgpu-output.json", "a.zarr"]
    spec = tmp_path / "s.yaml"
    spec.write_text("inputs:\n  x: {source: normal, shape: [4]}\n"
                    "outputs:\n  z: {from: x, sink: zarr, path: z.zarr, level: 23}\n")
    with pytest.raises(SpecError) as e:
        load(spec)
    assert (e.value.line, e.value.path) == (4, "outputs.z.level") and "less than or equal to 22" in e.value.message


def test_the_python_writers_take_an_array_in_memory(tmp_path, rng):
    """fg.to_zarr and fg.to_npy failed on a NumPy array ('numpy.ndarray' object has no attribute '_meta')."""
    import flowgpu as fg

    a = rng.standard_normal((7, 5)).astype(np.float32)
    np.testing.assert_array_equal(np.load(fg.to_npy(a, str(tmp_path / "a.npy"))), a)
    got = zarr.open_array(fg.to_zarr(a, str(tmp_path / "a.zarr")), mode="r")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[:], a)

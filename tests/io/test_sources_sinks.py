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

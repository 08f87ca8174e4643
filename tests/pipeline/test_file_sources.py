"""``source: hdf5`` and ``source: tiff`` in specs: runs equal NumPy's reads, errors point into the file,
a glob's pages are each an input of the incremental runs."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from flowgpu import pipeline
from flowgpu.cli import cli
from flowgpu.errors import SpecError

h5py = pytest.importorskip("h5py")
tifffile = pytest.importorskip("tifffile")

SPEC = """\
inputs:
  field:
    source: hdf5
    path: data/run.h5
    dataset: /fields/temp
    chunks: [16, -1, -1]
  pages: {source: tiff, path: "data/pages/page_*.tif", chunks: [3, -1, -1]}
  stack: {source: tiff, path: data/stack.tif}
steps:
  anomaly: {op: expr, inputs: {x: field, m: clim}, args: {expression: "x - m"}}
  clim: {op: mean, inputs: [field], args: {axis: 0, keepdims: true}}
  brightest: {op: max, inputs: [pages], args: {axis: 0}}
  stack_mean: {op: mean, inputs: [stack], args: {axis: [1, 2]}}
outputs:
  anomaly: {from: anomaly, sink: zarr, path: out/anomaly.zarr}
  brightest: {from: brightest, sink: npy, path: out/brightest.npy}
  stack_mean: {from: stack_mean}
"""


@pytest.fixture
def project(tmp_path, rng, monkeypatch):
    """A folder with the spec and its data: an HDF5 file, 11 TIFF pages and a multi-page TIFF file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "pages").mkdir(parents=True)
    field = rng.standard_normal((50, 12, 10)).astype("float32")
    with h5py.File(tmp_path / "data" / "run.h5", "w") as f:
        f.create_dataset("/fields/temp", data=field, chunks=(8, 12, 10), compression="gzip")
        f.create_dataset("/fields/wind", data=field[:, :2])
    pages = rng.integers(0, 4000, (11, 16, 14)).astype("uint16")
    for i, page in enumerate(pages):
        tifffile.imwrite(tmp_path / "data" / "pages" / f"page_{i}.tif", page)
    stack = rng.random((7, 9, 8)).astype("float32")
    tifffile.imwrite(tmp_path / "data" / "stack.tif", stack)
    (tmp_path / "spec.yaml").write_text(SPEC)
    return tmp_path, {"field": field, "pages": pages, "stack": stack}


def test_a_spec_reads_hdf5_and_tiff_equal_to_numpy(project):
    folder, data = project
    result = pipeline.run(folder / "spec.yaml", session="local", progress=False)
    assert result.summary["status"] == "ok"
    field = data["field"]
    np.testing.assert_allclose(zarr.open_array(str(folder / "out" / "anomaly.zarr"))[:],
                               field - field.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.load(folder / "out" / "brightest.npy"), data["pages"].max(0))
    np.testing.assert_allclose(result.outputs["stack_mean"], data["stack"].mean((1, 2)), rtol=1e-6)
    assert result.summary["bytes_read"] == sum(a.nbytes for a in data.values())  # all three count as read


def test_a_glob_page_that_changes_makes_its_outputs_stale(project):
    folder, data = project
    pipeline.run(folder / "spec.yaml", session="local", progress=False)
    assert "3 up to date" in pipeline.status(folder / "spec.yaml")["line"]
    page = folder / "data" / "pages" / "page_10.tif"
    tifffile.imwrite(page, data["pages"][10][::-1].copy())
    st = os.stat(page)
    os.utime(page, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    line = pipeline.status(folder / "spec.yaml")["line"]
    assert "2 up to date, 1 to compute" in line and "page_10.tif" in line, line
    result = pipeline.run(folder / "spec.yaml", session="local", progress=False)
    want = data["pages"].copy()
    want[10] = want[10][::-1]
    np.testing.assert_array_equal(np.load(folder / "out" / "brightest.npy"), want.max(0))
    assert result.summary["status"] == "ok"


def test_a_glob_page_that_is_removed_makes_its_outputs_stale(project):
    folder, data = project
    pipeline.run(folder / "spec.yaml", session="local", progress=False)
    for i in (3, 10):  # one in the middle, the last
        os.remove(folder / "data" / "pages" / f"page_{i}.tif")
    line = pipeline.status(folder / "spec.yaml")["line"]
    assert "2 up to date, 1 to compute" in line and "page_3.tif (removed)" in line, line
    pipeline.run(folder / "spec.yaml", session="local", progress=False)
    want = np.delete(data["pages"], [3, 10], axis=0).max(0)
    assert not np.array_equal(want, data["pages"].max(0))  # the removed pages held some of the maxima
    np.testing.assert_array_equal(np.load(folder / "out" / "brightest.npy"), want)
    assert "3 up to date" in pipeline.status(folder / "spec.yaml")["line"]


def _error(folder, text: str) -> SpecError:
    (folder / "bad.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        pipeline.validate(folder / "bad.yaml")
    return e.value


def test_a_missing_dataset_points_at_its_line_and_lists_the_datasets(project):
    folder, _ = project
    err = _error(folder, SPEC.replace("dataset: /fields/temp", "dataset: /fields/tmp"))
    assert (err.line, err.col, err.path) == (5, 14, "inputs.field.dataset")
    assert "has no dataset '/fields/tmp'; it holds /fields/temp, /fields/wind; did you mean '/fields/temp'?" in str(err)
    err = _error(folder, SPEC.replace("path: data/run.h5", "path: data/stack.tif"))
    assert (err.line, err.path) == (4, "inputs.field.path") and "is not an HDF5 file" in str(err)


def test_a_page_that_does_not_match_is_named_at_the_path(project, rng):
    folder, _ = project
    tifffile.imwrite(folder / "data" / "pages" / "page_4.tif", rng.integers(0, 9, (16, 15)).astype("uint16"))
    err = _error(folder, SPEC)
    assert (err.line, err.path) == (7, "inputs.pages.path")
    assert "page_4.tif' holds a (16, 15) uint16 page, but" in str(err)
    assert "page_0.tif' holds (16, 14) uint16" in str(err)


def test_no_output_replaces_the_pages_of_a_glob(project):
    folder, _ = project
    (folder / "bad.yaml").write_text(SPEC.replace("path: out/brightest.npy", "path: data/pages"))
    with pytest.raises(SpecError, match=r"output 'brightest' would replace 'data/pages', which contains input "
                                        r"'pages' \(data/pages/page_0.tif\)"):
        pipeline.validate(folder / "bad.yaml", overwrite=True)
    assert len(os.listdir(folder / "data" / "pages")) == 11


def test_the_cli_says_it_in_one_line_without_a_traceback(project):
    folder, _ = project
    (folder / "bad.yaml").write_text(SPEC.replace("data/pages/page_*.tif", "data/nothing/*.tif"))
    r = CliRunner().invoke(cli, ["validate", "bad.yaml"])
    assert r.exit_code == 2, r.output
    assert "bad.yaml:7:" in r.output and "inputs.pages.path" in r.output and "matches no files" in r.output
    assert "Traceback" not in r.output


@pytest.mark.gpu
def test_gpu_session_reads_hdf5_and_tiff_through_the_device(project, gpu_session):
    folder, data = project
    result = pipeline.run(folder / "spec.yaml", session=gpu_session, progress=False)
    assert result.summary["status"] == "ok"
    field = data["field"]
    np.testing.assert_allclose(zarr.open_array(str(folder / "out" / "anomaly.zarr"))[:],
                               field - field.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.load(folder / "out" / "brightest.npy"), data["pages"].max(0))
    np.testing.assert_allclose(result.outputs["stack_mean"], data["stack"].mean((1, 2)), rtol=1e-5)


def test_a_zarr_group_without_component_lists_its_arrays(tmp_path, monkeypatch, rng):
    monkeypatch.chdir(tmp_path)
    group = zarr.open_group("data/store.zarr", mode="w")
    for name in ("temp", "wind"):
        group.create_array(name, shape=(6, 4), dtype="float32")[:] = rng.random((6, 4), dtype=np.float32)
    spec = ("version: 1\nname: g\ninputs:\n  x: {source: zarr, path: data/store.zarr}\n"
            "steps:\n  s: {op: sum, inputs: [x]}\noutputs:\n  s: {from: s}\n")
    (tmp_path / "g.yaml").write_text(spec)
    with pytest.raises(SpecError) as e:
        pipeline.compile("g.yaml")
    assert "g.yaml:4:" in str(e.value) and "inputs.x" in str(e.value)
    assert "is a group, not an array; its arrays: temp, wind; give the one to read as component" in str(e.value)
    (tmp_path / "g.yaml").write_text(spec.replace("data/store.zarr}", "data/store.zarr, component: wind}"))
    np.testing.assert_allclose(pipeline.run("g.yaml", session="local", progress=False).outputs["s"],
                               group["wind"][:].sum(), rtol=1e-6)

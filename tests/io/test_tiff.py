"""``source: tiff`` / ``fg.from_tiff``: a multi-page file and a glob of pages, made here with tifffile,
read page block by page block equal to NumPy's, on the CPU and through the device path."""

from __future__ import annotations

import sys

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import ConfigError, SourceError
from flowgpu.io import sources, tiff
from flowgpu.transfer import staging
from tests.transfer.fakes import fake_staging

tifffile = pytest.importorskip("tifffile")


def stack(rng, pages=23, shape=(37, 29), dtype="uint16"):
    return rng.integers(0, 60000, (pages, *shape)).astype(dtype)


@pytest.fixture
def multipage(tmp_path, rng):
    want = stack(rng)
    path = tmp_path / "stack.tif"
    tifffile.imwrite(path, want, compression="zlib")  # one page per frame
    return str(path), want


@pytest.fixture
def pages(tmp_path, rng):
    """One file per page, named so that plain string order is wrong (page_10 before page_2)."""
    want = stack(rng, pages=12, dtype="float32")
    (tmp_path / "pages").mkdir()
    for i, page in enumerate(want):
        tifffile.imwrite(tmp_path / "pages" / f"page_{i}.tif", page)
    return str(tmp_path / "pages" / "page_*.tif"), want


@pytest.mark.parametrize("chunks", [[5, -1, -1], "auto", [4, 10, 7]])
def test_a_multipage_file_reads_block_by_block(multipage, chunks):
    path, want = multipage
    x = fg.from_tiff(path, chunks=chunks)
    assert (x.shape, x.dtype) == (want.shape, want.dtype)
    for index in np.ndindex(*x.numblocks):
        sl = tuple(slice(sum(c[:i]), sum(c[:i + 1])) for c, i in zip(x.chunks, index))
        np.testing.assert_array_equal(x.blocks[index].compute(), want[sl])
    np.testing.assert_array_equal(x.compute(), want)


def test_a_glob_of_pages_stacks_in_natural_order(pages):
    path, want = pages
    x = sources.open_source("tiff", path=path, chunks=[5, -1, -1])
    assert x.chunks[0] == (5, 5, 2)
    np.testing.assert_array_equal(x.compute(), want)  # page_2 before page_10
    np.testing.assert_array_equal(x.compute(), tifffile.imread(path))  # the order tifffile gives a glob


def test_a_block_reads_only_its_own_pages(multipage, monkeypatch):
    path, want = multipage
    read = []
    real = tifffile.TiffPage.asarray
    # read in this process (sync), also while a test Session is open
    monkeypatch.setattr(tifffile.TiffPage, "asarray", lambda self, **k: read.append(self.index) or real(self, **k))
    x = fg.from_tiff(path, chunks=[6, -1, -1])
    np.testing.assert_array_equal(x.blocks[2].compute(scheduler="sync"), want[12:18])
    assert sorted(read) == list(range(12, 18))


def test_auto_chunks_are_whole_pages_sized_for_the_workers(tmp_path, rng):
    want = stack(rng, pages=40, shape=(256, 256))  # 128 KiB a page
    path = str(tmp_path / "big.tif")
    tifffile.imwrite(path, want)
    with dask.config.set({"flowgpu.chunks.cpu-target": "1MiB"}):
        x = fg.from_tiff(path)
    assert x.chunks[1:] == ((256,), (256,)) and x.npartitions == 5 and x.chunks[0] == (8,) * 5
    y = fg.from_tiff(path, chunks="512KiB")
    assert y.chunks[0] == (4,) * 10
    np.testing.assert_array_equal(x.compute(), want)


def test_pages_that_do_not_match_are_refused_naming_the_first(tmp_path, rng):
    (tmp_path / "p").mkdir()
    for i in range(4):
        tifffile.imwrite(tmp_path / "p" / f"f{i}.tif", stack(rng, 1, (8, 8))[0])
    tifffile.imwrite(tmp_path / "p" / "f5.tif", stack(rng, 1, (8, 9))[0])  # other shape
    tifffile.imwrite(tmp_path / "p" / "f6.tif", stack(rng, 1, (8, 8), "float32")[0])
    with pytest.raises(SourceError, match=r"f5.tif' holds a \(8, 9\) uint16 page, but '.*f0.tif' holds \(8, 8\) "
                                          r"uint16") as e:
        fg.from_tiff(str(tmp_path / "p" / "*.tif"))
    assert e.value.option == "path"
    (tmp_path / "p" / "f5.tif").unlink()
    with pytest.raises(SourceError, match=r"f6.tif' holds a \(8, 8\) float32 page"):
        fg.from_tiff(str(tmp_path / "p" / "*.tif"))
    mixed = str(tmp_path / "mixed.tif")
    with tifffile.TiffWriter(mixed) as w:
        w.write(stack(rng, 1, (8, 8))[0])
        w.write(stack(rng, 1, (8, 8))[0])
        w.write(stack(rng, 1, (6, 8))[0])
    with pytest.raises(SourceError, match=r"page 2 of .*mixed.tif' holds a \(6, 8\) uint16 page, but page 0"):
        fg.from_tiff(mixed)


def test_bad_paths_are_one_clear_error(tmp_path, multipage):
    with pytest.raises(SourceError, match="matches no files"):
        fg.from_tiff(str(tmp_path / "none" / "*.tif"))
    (tmp_path / "g").mkdir()
    tifffile.imwrite(tmp_path / "g" / "a.tif", np.ones((3, 8, 8), "uint8"), photometric="minisblack")
    with pytest.raises(SourceError, match="holds 3 pages, but a glob stacks files of one page each"):
        fg.from_tiff(str(tmp_path / "g" / "*.tif"))
    (tmp_path / "x.tif").write_bytes(b"GIF89a not a tiff")
    with pytest.raises(SourceError, match="is not a TIFF file"):
        fg.from_tiff(str(tmp_path / "x.tif"))
    with pytest.raises(SourceError, match="does not exist"):
        fg.from_tiff(str(tmp_path / "gone.tif"))


@pytest.mark.parametrize("kind", ["multipage", "pages"])
@pytest.mark.parametrize("index", [(2, slice(1, 5), 3), (-1, Ellipsis, slice(None, None, -1)), (slice(None, None, 3), 0),
                                   (slice(9, 1, -4), -1, -2), ([7, 2], slice(30, 4, -5))],
                         ids=["int-slice-int", "negative-ellipsis", "page-step", "reversed", "list"])
def test_any_numpy_index_reads_what_tifffile_decodes(request, kind, index):
    """Integer indexes (``op: slice``) reach the reader fused into its block's slices."""
    path, _ = request.getfixturevalue(kind)
    want = tifffile.imread(path)  # the stack as tifffile reads it
    got = fg.from_tiff(path, chunks=[4, 16, -1])[index].compute()
    assert got.shape == want[index].shape
    np.testing.assert_array_equal(got, want[index])


def test_a_stack_changed_after_planning_is_an_error_not_other_values(multipage, pages, rng):
    path, want = multipage
    x = fg.from_tiff(path, chunks=[5, -1, -1])
    tifffile.imwrite(path, want[:8])
    with pytest.raises(OSError, match="holds fewer pages than the 23 the run was planned for"):
        x.compute()
    glob_path, _ = pages
    y = fg.from_tiff(glob_path, chunks=[5, -1, -1])
    tifffile.imwrite(glob_path.replace("*", "3"), rng.random((5, 5)).astype("float32"))
    with pytest.raises(OSError, match=r"page_3.tif is now a \(5, 5\) float32 page, but the run was planned for"):
        y.compute()


def test_missing_tifffile_says_how_to_install(monkeypatch, multipage):
    monkeypatch.setitem(sys.modules, "tifffile", None)
    with pytest.raises(ConfigError, match=r"needs tifffile.*pip install 'flowgpu\[formats\]'"):
        fg.from_tiff(multipage[0])


@pytest.mark.parametrize("kind", ["multipage", "pages"])
def test_device_reads_decode_pages_into_staging(request, monkeypatch, kind):
    cp = fake_staging(monkeypatch)
    monkeypatch.setattr(staging, "STAGE_MIN", 1 << 10)  # small test pages: stage them anyway
    monkeypatch.setattr(staging, "STAGING_BYTES", 5000)  # a few pages per slice, several slices per block
    path, want = request.getfixturevalue(kind)
    files, multi, shape, dtype = tiff._scan(path)
    r = tiff.TiffReader(tuple(files), multi, shape, dtype, device=True)
    got = r[(slice(1, 11), slice(0, shape[1]), slice(0, shape[2]))]
    np.testing.assert_array_equal(got.a, want[1:11])
    part = r[(slice(2, 9), slice(3, 20), slice(0, 11))]
    np.testing.assert_array_equal(part.a, want[2:9, 3:20, :11])
    assert getattr(cp, "plain_copies", 0) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["multipage", "pages"])
def test_gpu_from_tiff_matches_the_pages(request, kind):
    import cupy as cp

    path, want = request.getfixturevalue(kind)
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        x = fg.from_tiff(path, chunks=[5, -1, -1])
        assert isinstance(x._meta, cp.ndarray)
        got = x.compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.gpu
@pytest.mark.parametrize("multi", [True, False], ids=["multipage", "pages"])
def test_gpu_large_page_blocks_stage_through_pinned_buffers(tmp_path, rng, monkeypatch, multi):
    """Blocks of 5 MiB (10 pages of 512 x 512 uint16) are decoded into 1 MiB staging slices."""
    import cupy as cp

    monkeypatch.setattr(staging, "STAGING_BYTES", 1 << 20)
    want = rng.integers(0, 60000, (24, 512, 512)).astype("uint16")
    if multi:
        path = str(tmp_path / "big.tif")
        tifffile.imwrite(path, want, compression="zlib")
    else:
        for i, page in enumerate(want):
            tifffile.imwrite(tmp_path / f"f{i}.tif", page)
        path = str(tmp_path / "f*.tif")
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        got = fg.from_tiff(path, chunks=[10, -1, -1]).compute()
    np.testing.assert_array_equal(cp.asnumpy(got), want)

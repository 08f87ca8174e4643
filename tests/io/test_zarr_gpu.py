"""The Zarr device path on a GPU (``pytest -m gpu``): stores that zarr-python wrote, decoded by nvCOMP on
the device, bit-identical to zarr's CPU read; stores written from the device, read back by zarr on the
CPU. A failure names the codec, the chunk and the first value that differs."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import flowgpu as fg
from flowgpu.io.devcodec import ALIGN, DevicePlan, plan_codec
from flowgpu.io.zarrread import read_plan
from tests.io.zarr_data import STORES, field, first_mismatch, make_store

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

SHAPE, CHUNKS = (1000, 600), (200, 96)  # ragged along both axes


def _where(got: np.ndarray, want: np.ndarray, chunks: tuple) -> str:
    bad = np.argwhere(got != want) if got.shape == want.shape else []
    if not len(bad):
        return first_mismatch(got, want)
    i = tuple(int(v) for v in bad[0])
    return f"chunk {tuple(a // c for a, c in zip(i, chunks))}: {first_mismatch(got, want)}"


@pytest.mark.parametrize("name", sorted(STORES))
def test_nvcomp_decodes_what_zarr_wrote(tmp_path, rng, gpu_session, name):
    data = field(rng, SHAPE)
    root = str(tmp_path / f"{name}.zarr")
    extra = {"shards": (400, 192)} if name.startswith("sharded") else {}
    make_store(root, data, name, chunks=CHUNKS, **extra)
    plan = plan_codec(zarr.open_array(root))
    assert isinstance(plan, DevicePlan), f"{name}: planned to fall back: {plan}"
    x = fg.from_zarr(root)
    assert x.name.startswith("from-zarr-device"), f"{name}: not read on the device ({x.name})"
    block = x.blocks[0, 0].compute()
    assert type(block).__module__.startswith("cupy"), f"{name}: a chunk came back as {type(block)}"
    got = fg.to_numpy(x)
    want = zarr.open_array(root)[:]
    assert np.array_equal(got, want), f"codec {name} ({plan.frame}): {_where(got, want, plan.chunk)}"
    st = gpu_session.memory_summary()
    assert st is not None and st["moves"]["storage_decode"]["bytes"] > 0, f"{name}: no device decode counted: {st}"


@pytest.mark.parametrize("codec,shards", [("zstd", None), ("lz4", None), ("none", None), ("zstd", (400, 192)),
                                          ("lz4", (400, 192))])
def test_device_writes_are_read_back_by_zarr_on_the_cpu(tmp_path, rng, gpu_session, codec, shards):
    data = field(rng, SHAPE)
    out = str(tmp_path / "w.zarr")
    x = fg.from_array(data, chunks=(250, 600)) * 1
    fg.to_zarr(x, out, codec=codec, chunks=CHUNKS, shards=shards)
    a = zarr.open_array(out)
    got = a[:]
    assert np.array_equal(got, data), f"codec {codec}, shards {shards}: {_where(got, data, CHUNKS)}"
    st = gpu_session.memory_summary()
    assert st["moves"]["storage_encode"]["bytes"] > 0, f"{codec}: not encoded on the device: {st}"
    back = fg.to_numpy(fg.from_zarr(out))  # and decoded on the device again
    assert np.array_equal(back, data), f"codec {codec}, shards {shards}, device read: {_where(back, data, CHUNKS)}"
    if shards:  # every payload nvCOMP reads starts aligned in the shard: the reader copies none
        plan = plan_codec(a)
        reads = read_plan(plan, tuple(slice(0, n) for n in SHAPE))
        bad = [(r.path, r.offset + c.start) for r in reads for c in r.chunks if (r.offset + c.start) % ALIGN]
        assert not bad, f"codec {codec}: payloads at unaligned offsets {bad[:3]}"


def test_a_pass_over_a_sharded_store_is_bit_identical_to_the_in_memory_one(tmp_path, rng, gpu_session):
    data = field(rng, (4096, 1024))
    root = str(tmp_path / "big.zarr")
    make_store(root, data, "sharded-lz4", chunks=(64, 1024), shards=(1024, 1024))
    stored = fg.from_zarr(root)
    memory = fg.from_array(data, chunks=(1024, 1024))
    assert stored.chunks == memory.chunks
    got, want = (float((da.sin(x) * 2 + 1).sum(dtype=np.float64).compute()) for x in (stored, memory))
    assert got == want, f"from the store {got!r}, in memory {want!r}"


def test_kvikio_reader_gives_the_same_values(tmp_path, rng, gpu_session):
    pytest.importorskip("kvikio")
    data = field(rng, SHAPE)
    root = str(tmp_path / "k.zarr")
    make_store(root, data, "sharded-zstd", chunks=CHUNKS, shards=(400, 192))
    with dask.config.set({"flowgpu.zarr.reader": "kvikio"}):
        x = fg.from_zarr(root)
    assert x.name.startswith("from-zarr-device")
    got = fg.to_numpy(x)
    assert np.array_equal(got, data), f"kvikio reader, sharded zstd: {_where(got, data, CHUNKS)}"


def _sharded(root: str, data: np.ndarray, codec: str, writer: str, chunks: tuple, shards: tuple) -> None:
    """``data`` as a sharded store written by zarr-python (payloads packed) or by flowgpu (aligned)."""
    if writer == "zarr":
        make_store(root, data, f"sharded-{codec}", chunks=chunks, shards=shards)
    else:
        fg.to_zarr(fg.from_array(data, chunks=shards) * 1, root, codec=codec, chunks=chunks, shards=shards)


@pytest.mark.parametrize("name", ["sharded-zstd", "sharded-lz4"])
@pytest.mark.parametrize("writer", ["zarr", "flowgpu"])
def test_shards_read_in_groups_are_bit_identical(tmp_path, rng, gpu_session, name, writer):
    """Each group decoded while the next is read (flowgpu.zarr.read-group), on stores zarr wrote
    (payloads gathered to align them) and flowgpu wrote (aligned in place)."""
    data = field(rng, (4096, 1024))
    root = str(tmp_path / "g.zarr")
    _sharded(root, data, name.split("-")[1], writer, (64, 1024), (1024, 1024))
    with dask.config.set({"flowgpu.zarr.read-group": "256kB"}):
        x = fg.from_zarr(root)
    assert x.name.startswith("from-zarr-device")
    got = fg.to_numpy(x)
    assert np.array_equal(got, data), f"{writer} {name}, grouped reads: {_where(got, data, (64, 1024))}"


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("writer", ["zarr", "flowgpu"])
def test_thousands_of_small_chunks_a_shard_are_bit_identical(tmp_path, rng, gpu_session, codec, writer):
    """Pieces of rows (16 KiB chunks, 1024 a shard): decoded as one batch straight into the block."""
    data = field(rng, (2048, 4096))
    root = str(tmp_path / "s.zarr")
    _sharded(root, data, codec, writer, (1, 4096), (1024, 4096))
    if writer == "flowgpu":
        assert np.array_equal(zarr.open_array(root)[:], data), f"{codec}: zarr reads flowgpu's store wrong"
    got = fg.to_numpy(fg.from_zarr(root))
    assert np.array_equal(got, data), f"{writer} {codec}, 16 KiB chunks: {_where(got, data, (1, 4096))}"


_DAMAGED_READ = """
import sys
import numpy as np
import flowgpu as fg

if __name__ == "__main__":
    root, want = sys.argv[1], np.load(sys.argv[2])
    with fg.Session(backend="gpu", dashboard_address=None):
        try:
            got = fg.to_numpy(fg.from_zarr(root))
        except Exception as e:
            print(f"ERROR {type(e).__name__}: {e}")
            sys.exit(3)
    print("SAME" if np.array_equal(got, want) else f"WRONG {int((got != want).sum())} values differ")
"""


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("checksum", [True, False])
def test_a_damaged_chunk_is_an_error_not_wrong_values(tmp_path, rng, gpu_session, codec, checksum):
    """Read in a process of its own: a decoder fed damaged bytes may leave its CUDA context unusable.
    One payload is overwritten with 0xff bytes (a broken zstd frame header; an LZ4 literal run longer
    than its input): with the crc32c flowgpu writes when asked (checksum=True) the reader refuses it on the host, before
    nvCOMP; without (stores written by others) the walkers and nvCOMP's per-chunk status must report it."""
    import subprocess
    import sys

    data = field(rng, (512, 4096))
    root = str(tmp_path / "d.zarr")
    fg.to_zarr(fg.from_array(data, chunks=(256, 4096)) * 1, root, codec=codec, chunks=(16, 4096), shards=(256, 4096),
               checksum=checksum)
    plan = plan_codec(zarr.open_array(root))
    r = read_plan(plan, (slice(0, 256), slice(0, 4096)))[0]
    c = r.chunks[3]
    with open(r.path, "r+b") as f:
        f.seek(r.offset + c.start)
        f.write(b"\xff" * (c.stop - c.start))
    np.save(tmp_path / "want.npy", data)
    script = tmp_path / "read.py"
    script.write_text(_DAMAGED_READ)
    out = subprocess.run([sys.executable, str(script), root, str(tmp_path / "want.npy")], capture_output=True,
                         text=True, timeout=240)
    said = out.stdout.strip().splitlines()[-1:] or [f"(nothing; exit {out.returncode}) {out.stderr[-500:]}"]
    assert said[0].startswith("ERROR"), f"{codec}: a damaged chunk read without an error: {said[0]}"
    assert f"chunk {c.coords}" in said[0] and "damaged" in said[0], said[0]
    assert ("crc32c" in said[0]) == checksum, said[0]

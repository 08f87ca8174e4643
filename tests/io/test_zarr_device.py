"""The Zarr device path on a CPU: codec planning and fallbacks, which files and byte ranges a block
reads, decoding and encoding through the NumPy stand-in device (``flowgpu.zarr.device: fake``),
bit-identical to zarr-python, and atomic writes."""

from __future__ import annotations

import os
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

from flowgpu.diagnostics.report import storage_lines
from flowgpu.errors import ConfigError
from flowgpu.io import storage
from flowgpu.io.devcodec import ALIGN, DevicePlan, Fallback, plan_codec
from flowgpu.io.devices import HostDevice
from flowgpu.io.faults import ENV
from flowgpu.io.zarr import from_zarr, to_zarr
from flowgpu.io import zarrread, zarrwrite
from flowgpu.io.zarrread import read_plan
from tests.io.zarr_data import STORES, field, first_mismatch, make_store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fake():
    """The NumPy stand-in device, computing in this process (where its counters are), even when
    another test's Session is the default client."""
    storage.COUNTERS.reset()
    with dask.config.set({"flowgpu.zarr.device": "fake", "scheduler": "sync"}):
        yield storage.COUNTERS


@pytest.mark.parametrize("name", sorted(STORES))
def test_each_codec_plans_its_nvcomp_stream(tmp_path, rng, name):
    a = make_store(str(tmp_path / "a.zarr"), field(rng, (37, 23)), name)
    plan = plan_codec(a)
    assert isinstance(plan, DevicePlan), plan
    f = plan.frame
    assert (f.algorithm, f.head, f.tail) == STORES[name][1]
    assert plan.sharded == name.startswith("sharded")
    assert plan.chunk == (10, 6) and plan.unit == ((20, 12) if plan.sharded else (10, 6))


def test_codecs_the_device_lacks_fall_back_with_their_reason(tmp_path, rng):
    data = field(rng, (30, 20))
    cases = {
        "blosc": dict(compressors=zarr.codecs.BloscCodec()),
        "transpose": dict(filters=[zarr.codecs.TransposeCodec(order=(1, 0))]),
        "two compressors": dict(compressors=[zarr.codecs.GzipCodec(), zarr.codecs.ZstdCodec()]),
        "big-endian": dict(serializer=zarr.codecs.BytesCodec(endian="big")),
        "checksums": dict(compressors=zarr.codecs.ZstdCodec(checksum=True)),
    }
    reasons = {}
    for what, kw in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = zarr.create_array(str(tmp_path / f"{what}.zarr"), shape=data.shape, chunks=(10, 10), dtype="f4", **kw)
        plan = plan_codec(a)
        assert isinstance(plan, Fallback), what
        reasons[what] = plan.reason
    assert "blosc" in reasons["blosc"]
    assert "transpose" in reasons["transpose"]
    assert "2 byte codecs" in reasons["two compressors"]
    assert "big-endian" in reasons["big-endian"]
    assert "checksum" in reasons["checksums"]
    mem = zarr.create_array({}, shape=(4,), chunks=(2,), dtype="f4")
    assert "MemoryStore" in plan_codec(mem).reason


def test_a_block_reads_its_files_and_byte_ranges_edges_and_missing_chunks(tmp_path, rng):
    data = field(rng, (37, 23))
    a = make_store(str(tmp_path / "a.zarr"), data, "lz4")
    plan = plan_codec(a)
    root = str(tmp_path / "a.zarr")
    # the ragged corner chunk: one file, all of it read but the 4-byte size header (the payload
    # then starts the device buffer: aligned for nvCOMP)
    (r,) = read_plan(plan, (slice(30, 37), slice(18, 23)))
    assert r.path == os.path.join(root, "c", "3", "3")
    assert (r.offset, r.nbytes) == (4, os.path.getsize(r.path) - 4)
    assert (r.chunks[0].coords, r.chunks[0].start, r.chunks[0].stop) == ((3, 3), 0, r.nbytes)
    # a block of 2 x 2 chunks reads 4 files; one that is not there is the fill value
    os.remove(os.path.join(root, "c", "1", "2"))
    reads = read_plan(plan, (slice(0, 20), slice(6, 18)))
    assert sorted(os.path.relpath(u.path, root) for u in reads) == ["c/0/1", "c/0/2", "c/1/1", "c/1/2"]
    assert [u.missing for u in reads if u.nbytes == 0] == [((1, 2),)]
    # a block that is not whole chunks is not read this way
    assert read_plan(plan, (slice(0, 15), slice(0, 23))) is None
    with dask.config.set({"flowgpu.zarr.device": "fake"}):
        got = from_zarr(root).compute(scheduler="sync")
    want = zarr.open_array(root)[:]
    assert (want[10:20, 12:18] == 0).all() and not (data[10:20, 12:18] == 0).all()
    assert np.array_equal(got, want), first_mismatch(got, want)


def test_a_shard_is_one_read_of_the_ranges_its_index_gives(tmp_path, rng):
    data = field(rng, (37, 23))
    data[20:30, 12:18] = 0  # one inner chunk all fill: zarr leaves it out of the shard
    root = str(tmp_path / "s.zarr")
    make_store(root, data, "sharded-zstd", config={"write_empty_chunks": False})
    plan = plan_codec(zarr.open_array(root))
    (r,) = read_plan(plan, (slice(20, 37), slice(12, 23)))  # the ragged corner shard
    assert r.path == os.path.join(root, "c", "1", "1")
    assert r.offset == 0 and r.nbytes == os.path.getsize(r.path) - plan.index_bytes()
    assert r.missing == ((2, 2),)
    assert sorted(c.coords for c in r.chunks) == [(2, 3), (3, 2), (3, 3)]
    assert all(0 <= c.start < c.stop <= r.nbytes for c in r.chunks)
    with dask.config.set({"flowgpu.zarr.device": "fake"}):
        x = from_zarr(root)
        got = x.compute(scheduler="sync")
    assert x.chunksize == (20, 12)  # one task per shard
    assert np.array_equal(got, data), first_mismatch(got, data)


@pytest.mark.parametrize("name", sorted(STORES))
def test_reads_are_bit_identical_to_zarr(tmp_path, rng, fake, name):
    data = field(rng, (37, 23))
    root = str(tmp_path / "a.zarr")
    make_store(root, data, name)
    x = from_zarr(root)
    assert x.name.startswith("from-zarr-device")
    got = x.compute(scheduler="sync")
    assert np.array_equal(got, data), f"{name}: {first_mismatch(got, data)}"
    moves = fake.moves()
    files = [f for _, _, fs in os.walk(root) for f in fs if f != "zarr.json" and not f.startswith(".")]
    assert moves["storage_read"]["count"] == len(files)  # one read per chunk (or shard) file
    assert moves["storage_read"]["bytes"] <= sum(os.path.getsize(p) for p in _paths(root))
    assert moves["storage_decode"]["bytes"] == 40 * 24 * 4  # 4 x 4 whole chunks of 10 x 6, edges included
    y = from_zarr(root, chunks=(15, 23))  # chunks that are not the store's: rechunked after the reads
    assert np.array_equal(y.compute(scheduler="sync"), data)


def _paths(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f != "zarr.json" and not f.startswith(".")]


def test_fallback_chunks_are_counted_with_their_reason(tmp_path, rng, fake):
    data = field(rng, (30, 20))
    root = str(tmp_path / "b.zarr")
    zarr.create_array(root, shape=data.shape, chunks=(10, 10), dtype="f4", compressors=zarr.codecs.BloscCodec())[:] = data
    got = from_zarr(root).compute(scheduler="sync")
    assert np.array_equal(got, data)
    (reason, n), = fake.events().items()
    assert "blosc" in reason and n == 6
    (line,) = storage_lines({"moves": fake.moves(), "events": fake.events()})
    assert line.startswith("storage: 6 chunk(s) decoded on the CPU: blosc")


def test_cpu_sessions_keep_zarrs_own_path(tmp_path, rng):
    root = str(tmp_path / "a.zarr")
    data = field(rng, (30, 20))
    make_store(root, data, "zstd")
    x = from_zarr(root)
    assert not x.name.startswith("from-zarr-device")
    assert np.array_equal(x.compute(scheduler="sync"), data)


@pytest.mark.parametrize("codec,shards", [("zstd", None), ("lz4", None), ("none", None), ("zstd", (24, 12)),
                                          ("lz4", (24, 12))])
def test_device_writes_are_read_back_by_zarr(tmp_path, rng, fake, codec, shards):
    data = field(rng, (37, 23))
    out = str(tmp_path / "w.zarr")
    to_zarr(da.from_array(data, chunks=(11, 9)) * 1, out, codec=codec, chunks=(8, 6), shards=shards)
    a = zarr.open_array(out)
    assert a.chunks == (8, 6) and a.shards == shards
    got = a[:]
    assert np.array_equal(got, data), f"{codec} {shards}: {first_mismatch(got, data)}"
    assert fake.moves()["storage_encode"]["bytes"] == 40 * 24 * 4  # edge chunks padded to whole chunks
    back = from_zarr(out).compute(scheduler="sync")  # and by the device path
    assert np.array_equal(back, data)


def test_a_failed_device_write_leaves_nothing(tmp_path, rng, fake, monkeypatch):
    data = field(rng, (40, 20))
    out = tmp_path / "w.zarr"
    monkeypatch.setenv(ENV, "zarr:unit-written@raise=ENOSPC")
    with pytest.raises(OSError, match="injected at zarr:unit-written"):
        to_zarr(da.from_array(data, chunks=(10, 20)), str(out), codec="lz4", chunks=(10, 20))
    assert sorted(os.listdir(tmp_path)) == []  # neither the store nor its staging


def test_bad_layouts_are_refused_before_writing(tmp_path, rng, fake):
    x = da.from_array(field(rng, (20, 10)), chunks=10)
    with pytest.raises(ConfigError, match="not whole multiples"):
        to_zarr(x, str(tmp_path / "a.zarr"), chunks=(4, 4), shards=(6, 8))
    with pytest.raises(ConfigError, match="one length >= 1 per axis"):
        to_zarr(x, str(tmp_path / "a.zarr"), chunks=(4,))
    with pytest.raises(ConfigError, match="choose one of"):
        to_zarr(x, str(tmp_path / "a.zarr"), codec="brotli")
    assert os.listdir(tmp_path) == []


def test_chunks_larger_than_nvcomp_takes_fall_back_and_device_writes_shard_them(tmp_path, rng, fake):
    data = field(rng, (2100, 2048))  # 17 MB: more than nvCOMP's 16 MiB chunk
    big = str(tmp_path / "big.zarr")
    make_store(big, data, "lz4", chunks=data.shape)
    plan = plan_codec(zarr.open_array(big))
    assert isinstance(plan, Fallback) and "flowgpu convert" in plan.reason
    out = str(tmp_path / "w.zarr")
    to_zarr(da.from_array(data, chunks=data.shape), out, codec="lz4")  # no layout given: shards of 64 KiB chunks
    a = zarr.open_array(out)
    assert a.shards == data.shape and a.chunks == (7, 2048)  # 7 rows of 8 KiB divide 2100, 8 would not
    assert np.array_equal(a[:], data)
    assert isinstance(plan_codec(a), DevicePlan)


def test_zstd_frames_without_their_size_are_written_with_it(tmp_path, rng, fake, monkeypatch):
    """nvCOMP's zstd may leave the content size out of a frame; the writer puts it back."""
    encode = HostDevice.encode

    def sizeless(self, algorithm, arrays, level=None):
        out = []
        for f in encode(self, algorithm, arrays, level):
            f = bytes(f)
            assert f[4] >> 6 == 2 and not f[4] & 0x20  # a 4-byte size and a window descriptor
            out.append(np.frombuffer(f[:4] + bytes([f[4] & 0x3F]) + f[5:6] + f[10:], np.uint8))
        return out

    monkeypatch.setattr(HostDevice, "encode", sizeless)
    data = field(rng, (4096, 512))  # chunks of 4 MiB: zstd frames with a window descriptor
    out = str(tmp_path / "w.zarr")
    to_zarr(da.from_array(data, chunks=(2048, 512)), out, codec="zstd", chunks=(2048, 512))
    for p in _paths(out):
        with open(p, "rb") as f:
            head = f.read(14)
        assert head[4] >> 6 == 3 and int.from_bytes(head[6:14], "little") == 2048 * 512 * 4, p
    assert np.array_equal(zarr.open_array(out)[:], data)


@pytest.mark.parametrize("rows", [100, 95])  # 95: the last chunk runs past the end, decoded aside and cut
def test_whole_row_chunks_decode_straight_into_their_block(tmp_path, rng, fake, monkeypatch, rows):
    data = field(rng, (rows, 30))
    root = str(tmp_path / "r.zarr")
    make_store(root, data, "sharded-lz4", chunks=(10, 30), shards=(40, 30))
    used = []
    in_place = zarrread._in_place
    monkeypatch.setattr(zarrread, "_in_place", lambda *a: used.append(in_place(*a) is not None) or in_place(*a))
    got = from_zarr(root).compute(scheduler="sync")
    assert np.array_equal(got, data), first_mismatch(got, data)
    assert sorted(used) == ([True, True, True] if rows == 100 else [False, True, True])  # per shard


def _payload_offsets(root):
    """Each stored chunk's payload (what nvCOMP reads) as a file offset, from the shard indexes."""
    plan = plan_codec(zarr.open_array(root))
    key = tuple(slice(0, n) for n in plan.shape)
    return [r.offset + c.start for r in read_plan(plan, key) for c in r.chunks], plan


@pytest.mark.parametrize("codec,sizeless", [("zstd", False), ("zstd", True), ("lz4", False), ("none", False)])
def test_device_written_shards_align_every_payload_and_zarr_reads_them(tmp_path, rng, fake, monkeypatch,
                                                                        codec, sizeless):
    if sizeless:  # nvCOMP's zstd frames: no content size, the writer adds it in front
        encode = HostDevice.encode
        monkeypatch.setattr(HostDevice, "encode", lambda self, alg, arrays, level=None: [
            np.frombuffer((f := bytes(e))[:4] + bytes([f[4] & 0x3F]) + f[5:6] + f[10:], np.uint8)
            for e in encode(self, alg, arrays, level)])
    # sizeless frames need a window descriptor to strip the size from: chunks of 1 MiB at level 1
    shape, chunks, shards, n = ((4096, 512), (1024, 256), (2048, 512), 8) if sizeless else \
        ((300, 70), (20, 35), (100, 70), 30)
    data = field(rng, shape)
    out = str(tmp_path / "w.zarr")
    to_zarr(da.from_array(data, chunks=shards) * 1, out, codec=codec, level=1 if sizeless else None, chunks=chunks,
            shards=shards)
    offsets, plan = _payload_offsets(out)
    assert len(offsets) == n and all(o % ALIGN == 0 for o in offsets), offsets  # no copy before nvCOMP reads
    if sizeless:
        for r in read_plan(plan, (slice(0, shape[0]), slice(0, shape[1]))):
            with open(r.path, "rb") as f:
                raw = f.read()
            assert all(raw[r.offset + c.start + 4] >> 6 == 3 for c in r.chunks)  # each frame has its size again
    got = zarr.open_array(out)[:]  # the gaps between chunks are legal: zarr-python reads the store
    assert np.array_equal(got, data), f"{codec}: {first_mismatch(got, data)}"
    back = from_zarr(out).compute(scheduler="sync")
    assert np.array_equal(back, data), f"{codec}, device read: {first_mismatch(back, data)}"


def test_a_unit_written_in_parallel_pieces_is_whole(tmp_path, rng, fake, monkeypatch):
    monkeypatch.setattr(zarrwrite, "WRITE_PIECE", 1000)  # shards of several pieces, on the writer threads
    data = field(rng, (200, 64))
    out = str(tmp_path / "p.zarr")
    to_zarr(da.from_array(data, chunks=(100, 64)) * 1, out, codec="lz4", chunks=(10, 64), shards=(100, 64))
    sizes = sorted(os.path.getsize(p) for p in _paths(out))
    assert len(sizes) == 2 and sizes[0] > 3 * 1000  # several pieces each
    got = zarr.open_array(out)[:]
    assert np.array_equal(got, data), first_mismatch(got, data)


def test_stores_zarr_wrote_read_their_shards_from_an_aligned_offset(tmp_path, rng, fake):
    data = field(rng, (120, 40))
    root = str(tmp_path / "z.zarr")
    make_store(root, data, "sharded-lz4", chunks=(10, 40), shards=(60, 40))
    plan = plan_codec(zarr.open_array(root))
    reads = read_plan(plan, (slice(0, 120), slice(0, 40)))
    assert [r.offset % ALIGN for r in reads] == [0, 0]
    assert any((r.offset + c.start) % 16 for r in reads for c in r.chunks)  # zarr packs chunks: nvCOMP needs copies
    got = from_zarr(root).compute(scheduler="sync")
    assert np.array_equal(got, data), first_mismatch(got, data)


@pytest.mark.parametrize("name", ["sharded-zstd", "sharded-lz4", "sharded-lz4-crc32c"])
def test_a_shard_read_in_groups_decodes_each_as_it_arrives(tmp_path, rng, fake, monkeypatch, name):
    data = field(rng, (120, 40))
    root = str(tmp_path / "g.zarr")
    make_store(root, data, name, chunks=(10, 40), shards=(60, 40))
    plan = plan_codec(zarr.open_array(root))
    (r,) = read_plan(plan, (slice(0, 60), slice(0, 40)))
    framing = (plan.frame.head, plan.frame.tail) if plan.frame.checksum else (0, 0)
    groups = zarrread._groups(r, 1000, *framing)
    assert 1 < len(groups) < len(r.chunks) + 1
    assert all(off % ALIGN == 0 for _, off, _, _ in groups)
    assert sorted(c.coords for g in groups for c in g[3]) == sorted(c.coords for c in r.chunks)
    with open(r.path, "rb") as f:
        raw = f.read()
    whole = {c.coords: raw[r.offset + c.start:r.offset + c.stop] for c in r.chunks}
    assert all(raw[off + c.start:off + c.stop] == whole[c.coords] for _, off, _, cs in groups for c in cs)
    assert all(c.start >= framing[0] and c.stop + framing[1] <= n for _, _, n, cs in groups for c in cs)  # checks read
    reads, read = [], HostDevice.read_host
    monkeypatch.setattr(HostDevice, "read_host", lambda self, p, o, n, out=None: reads.append(n) or read(self, p, o, n, out))
    with dask.config.set({"flowgpu.zarr.read-group": "1kB"}):
        x = from_zarr(root)
    got = x.compute(scheduler="sync")
    assert np.array_equal(got, data), first_mismatch(got, data)
    assert len(reads) > 2 and fake.moves()["storage_decode"]["count"] == 12  # 2 shards, in several reads


@pytest.mark.parametrize("name", ["zstd", "sharded-lz4", "sharded-zstd"])
def test_chunks_of_odd_byte_sizes_decode_aside_at_aligned_offsets(tmp_path, rng, fake, name):
    """7 x 5 float32 chunks are 140 bytes: decoded into a scratch buffer at 16-byte strides (nvCOMP's
    alignment), then copied into the block."""
    data = field(rng, (37, 23))
    root = str(tmp_path / "o.zarr")
    make_store(root, data, name, chunks=(7, 5), **({"shards": (14, 10)} if name.startswith("sharded") else {}))
    got = from_zarr(root).compute(scheduler="sync")
    assert np.array_equal(got, data), f"{name}: {first_mismatch(got, data)}"


@pytest.mark.parametrize("name", ["zstd", "lz4", "sharded-zstd", "sharded-lz4"])
def test_a_damaged_chunk_is_an_error_that_names_it(tmp_path, rng, fake, name):
    """One payload overwritten with 0xff bytes: the decoder's per-chunk status names it (file and
    chunk), and no block of wrong values comes back."""
    data = field(rng, (40, 24))
    root = str(tmp_path / "d.zarr")
    make_store(root, data, name)
    r = read_plan(plan_codec(zarr.open_array(root)), (slice(20, 40), slice(12, 24)))[0]
    c = r.chunks[len(r.chunks) - 1]
    with open(r.path, "r+b") as f:
        f.seek(r.offset + c.start)
        f.write(b"\xff" * (c.stop - c.start))
    assert np.array_equal(from_zarr(root)[:20, :12].compute(scheduler="sync"), data[:20, :12])  # others intact
    with pytest.raises(OSError, match="did not decode") as e:
        from_zarr(root).compute(scheduler="sync")
    assert r.path in str(e.value) and f"chunk {c.coords}" in str(e.value) and "damaged" in str(e.value)


def _flip_a_byte(path: str, lo: int, hi: int, rng) -> None:
    """One bit of one byte in ``path[lo:hi]`` flipped (a damage a decoder may not notice)."""
    at = int(rng.integers(lo, hi))
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << int(rng.integers(0, 8)))]))


def _codec_names(a: zarr.Array) -> list[str]:
    codecs = a.metadata.codecs[0].codecs if a.shards else a.metadata.codecs
    return [c.to_dict()["name"] for c in codecs]


@pytest.mark.parametrize("name", ["zstd-crc32c", "lz4-crc32c", "none-crc32c", "sharded-lz4-crc32c"])
def test_a_chunk_that_fails_its_crc32c_is_named_before_anything_decodes_it(tmp_path, rng, fake, monkeypatch, name):
    """One bit flipped anywhere in one chunk (framing, payload or checksum) of a store whose codecs end
    in crc32c: the reader checks the checksums on the host and names the chunk; the block's bytes are
    never handed to the decoder (nvCOMP, which can crash on damaged input), and the rest reads."""
    data = field(rng, (40, 24))
    root = str(tmp_path / "c.zarr")
    make_store(root, data, name)
    plan = plan_codec(zarr.open_array(root))
    assert plan.frame.checksum
    r = read_plan(plan, (slice(20, 40), slice(12, 24)))[0]  # the unit at (20, 12)
    c = r.chunks[len(r.chunks) - 1]
    _flip_a_byte(r.path, r.offset + c.start - plan.frame.head, r.offset + c.stop + plan.frame.tail, rng)
    unit = (slice(20, 20 + plan.unit[0]), slice(12, 12 + plan.unit[1]))
    calls = []
    for method in ("decode_into", "place"):
        orig = getattr(HostDevice, method)
        monkeypatch.setattr(HostDevice, method, lambda self, *a, _o=orig, _m=method: calls.append(_m) or _o(self, *a))
    with pytest.raises(OSError, match="do not match their crc32c checksum") as e:
        from_zarr(root)[unit].compute(scheduler="sync")
    assert calls == []
    assert r.path in str(e.value) and f"chunk {c.coords}" in str(e.value) and "the store is damaged" in str(e.value)
    with pytest.raises(ValueError, match="checksum"):  # zarr-python agrees
        zarr.open_array(root)[unit]
    assert np.array_equal(from_zarr(root)[:20, :12].compute(scheduler="sync"), data[:20, :12])


@pytest.mark.parametrize("codec,shards", [("zstd", None), ("lz4", (24, 12)), ("none", None)])
def test_device_written_stores_end_each_chunk_in_a_crc32c_both_readers_check(tmp_path, rng, fake, codec, shards):
    data = field(rng, (37, 23))
    out = str(tmp_path / "w.zarr")
    to_zarr(da.from_array(data, chunks=(11, 9)) * 1, out, codec=codec, chunks=(8, 6), shards=shards, checksum=True)
    a = zarr.open_array(out)
    assert _codec_names(a)[-1] == "crc32c"
    assert np.array_equal(a[:], data)  # zarr-python checks the checksums the device writer appended
    plan = plan_codec(a)
    lo = [c // u * u for c, u in zip((8, 6), plan.unit)]  # the unit (chunk or shard) holding chunk (1, 1)
    (r,) = read_plan(plan, tuple(slice(a, min(a + u, n)) for a, u, n in zip(lo, plan.unit, plan.shape)))
    c = next(c for c in r.chunks if c.coords == (1, 1))
    _flip_a_byte(r.path, r.offset + c.start - plan.frame.head, r.offset + c.stop + plan.frame.tail, rng)
    with pytest.raises(OSError, match=r"crc32c checksum \(the first is chunk \(1, 1\)"):
        from_zarr(out).compute(scheduler="sync")
    with pytest.raises(ValueError, match="checksum"):
        zarr.open_array(out)[8:16, 6:12]


def test_a_gpu_fault_while_decoding_says_what_to_do(tmp_path, rng, fake, monkeypatch):
    """A CUDA error at the decode's sync (nvCOMP faulting on a damaged chunk) comes back as one
    OSError naming the file and the way to find the chunk, not as CuPy's bare error."""
    class CUDARuntimeError(RuntimeError):  # what CuPy raises, by name
        pass

    def faults(self):
        raise CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    data = field(rng, (40, 24))
    root = str(tmp_path / "f.zarr")
    make_store(root, data, "sharded-zstd")
    monkeypatch.setattr(HostDevice, "sync", faults)
    with pytest.raises(OSError, match="faulted decoding its Zstd chunks") as e:
        from_zarr(root).compute(scheduler="sync")
    assert "flowgpu.zarr.device: cpu" in str(e.value) and root in str(e.value)


@pytest.mark.parametrize("codec,chunks,shards", [("zstd", (7, 5), (14, 10)), ("lz4", (7, 5), (14, 10)),
                                                 ("lz4", (7, 5), None), ("zstd", (1, 23), (4, 23))])
def test_chunks_of_odd_byte_sizes_are_encoded_from_aligned_offsets(tmp_path, rng, fake, codec, chunks, shards):
    """140-byte chunks (7 x 5 float32), and rows of 92 bytes: a shard of 4 rows is one contiguous run of
    its chunks, but not at aligned offsets."""
    data = field(rng, (37, 23))
    out = str(tmp_path / "o.zarr")
    to_zarr(da.from_array(data, chunks=(14, 23)) * 1, out, codec=codec, chunks=chunks, shards=shards)
    got = zarr.open_array(out)[:]
    assert np.array_equal(got, data), f"{codec} {shards}: {first_mismatch(got, data)}"
    back = from_zarr(out).compute(scheduler="sync")
    assert np.array_equal(back, data), f"{codec} {shards}, device read: {first_mismatch(back, data)}"

"""The walks that keep damaged payloads away from nvCOMP's decoders (they do not bound themselves):
LZ4's against the lz4 library's own bounded decoder, zstd's frame and block headers against frames
zstd wrote and broke; on a GPU, the device walks against the host ones."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowgpu.io.nvcompc import check_source, damaged, lz4_walk, zstd_walk
from tests.io.zarr_data import field


def _block(rng, n: int = 4096) -> tuple[bytes, int]:
    """One raw LZ4 block of fresh field data (numcodecs' framing minus its 4-byte size) and its size."""
    data = field(rng, (n // 4,)).astype(np.float32).tobytes()
    return numcodecs.LZ4().encode(data)[4:], len(data)


def _lz4_decodes(block: bytes, nbytes: int) -> bool:
    try:
        return len(numcodecs.LZ4().decode(nbytes.to_bytes(4, "little") + block)) == nbytes
    except (RuntimeError, ValueError):
        return False


def test_blocks_lz4_wrote_pass_the_walk(rng):
    for n in (16, 100, 4096, 65536):
        block, nbytes = _block(rng, n)
        assert lz4_walk(block, nbytes), f"{n}-byte block"
        assert not lz4_walk(block, nbytes + 1) and not lz4_walk(block, nbytes - 1)  # not its size


def test_what_breaks_a_block_fails_the_walk(rng):
    block, nbytes = _block(rng)
    assert not lz4_walk(b"\xff" * len(block), nbytes)  # a literal run longer than the input
    assert not lz4_walk(block[: len(block) // 2], nbytes)  # cut short
    assert not lz4_walk(b"", nbytes)
    assert not lz4_walk(bytes([0x0F, 0x00, 0x00]), nbytes)  # a match at offset 0


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), where=st.floats(0, 1), width=st.integers(1, 64))
def test_a_damaged_block_the_walk_passes_stays_in_bounds(seed, where, width):
    """Random bytes over part of a block: whenever the walk passes it, the lz4 library's bounded
    decoder decodes it to its size too (the walk passes nothing that copies out of bounds)."""
    rng = np.random.default_rng(seed)
    block, nbytes = _block(rng)
    b = bytearray(block)
    at = int(where * (len(b) - 1))
    b[at:at + width] = rng.integers(0, 256, len(b[at:at + width]), dtype=np.uint8).tobytes()
    if lz4_walk(bytes(b), nbytes):
        assert _lz4_decodes(bytes(b), nbytes), f"the walk passed a block lz4 refuses (damage at {at}, {width} B)"


def _frame(rng, n: int = 4096, **kw) -> tuple[bytes, int]:
    data = field(rng, (n // 4,)).astype(np.float32).tobytes()
    return numcodecs.Zstd(**kw).encode(data), len(data)


def test_frames_zstd_wrote_pass_the_zstd_walk(rng):
    for n, kw in ((16, {}), (4096, {}), (65536, {"level": 9}), (300_000, {"checksum": True}), (1 << 20, {})):
        frame, nbytes = _frame(rng, n, **kw)
        assert zstd_walk(frame, nbytes), f"{n} bytes {kw}"
        assert not zstd_walk(frame, nbytes + 4), "a content size other than the chunk's"
    a, na = _frame(rng, 4096)
    b, nb = _frame(rng, 8192)
    assert zstd_walk(a + b, na + nb), "two frames, one chunk"
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    assert zstd_walk(skippable + a, na)


def test_what_breaks_a_frame_header_fails_the_zstd_walk(rng):
    frame, nbytes = _frame(rng, 65536)
    assert not zstd_walk(b"\xff" * len(frame), nbytes)
    assert not zstd_walk(frame[: len(frame) - 7], nbytes)  # cut short
    assert not zstd_walk(frame + b"\0" * 5, nbytes)  # trailing bytes that are no frame
    assert not zstd_walk(b"\0" + frame[1:], nbytes)  # magic number
    assert not zstd_walk(frame[:4] + bytes([frame[4] | 0x08]) + frame[5:], nbytes)  # the reserved bit
    broken = bytearray(frame)
    at = 5 + (not (frame[4] >> 5) & 1) + (0, 1, 2, 4)[frame[4] & 3]  # the content size field
    broken[at] ^= 0x40
    assert not zstd_walk(bytes(broken), nbytes)


def test_damaged_names_bad_statuses_and_short_chunks():
    st_ = np.array([0, 12, 0, 0], np.int32)
    got = np.array([64, 64, 63, 64], np.uint64)
    assert damaged(st_, got, 64).tolist() == [1, 2]


_HOST = r"""
#define __device__ static
#define __global__
struct flowgpu_dim { unsigned int x; };
static flowgpu_dim blockIdx, blockDim, threadIdx;
"""
_DRIVER = r"""
extern "C" void flowgpu_run(unsigned long long* src, unsigned long long* n, long long cap, int* status,
                            int count, unsigned long long safe, unsigned long long safe_n) {
    blockDim.x = 1;
    threadIdx.x = 0;
    for (int i = 0; i < count; i++) { blockIdx.x = i; flowgpu_check(src, n, cap, status, count, safe, safe_n); }
}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    """The device walks' CUDA source compiled for the CPU (one "thread" at a time), by name."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler here to run the device walks' source on the CPU")
    runs = {}
    for algorithm in ("LZ4", "Zstd"):
        d = tmp_path_factory.mktemp(algorithm)
        (d / "walk.cpp").write_text(_HOST + check_source(algorithm) + _DRIVER)
        subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(d / "walk.so"), str(d / "walk.cpp")], check=True,
                       capture_output=True, timeout=120)
        fn = ctypes.CDLL(str(d / "walk.so")).flowgpu_run
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int,
                       ctypes.c_ulonglong, ctypes.c_ulonglong]
        fn.restype = None
        runs[algorithm] = fn
    return runs


def _damaged_batch(rng, algorithm: str, count: int, nbytes: int) -> tuple[list[bytes], list[bool]]:
    """``count`` payloads of fresh data, three in four damaged (random bytes anywhere, a 0xff payload,
    cut short or grown, a zstd block of the reserved type), with whether each is the intact one."""
    make = _block if algorithm == "LZ4" else _frame
    payloads, intact = [], []
    for i in range(count):
        good, _ = make(rng, nbytes)
        b = bytearray(good)
        kind = i % 8
        if kind == 5 and algorithm == "Zstd":  # the first block's type made the reserved one
            assert b[4] == 0x60  # single segment, a 2-byte content size: the block header at 7
            b[7] |= 0x06
        elif kind in (1, 2, 3, 5):
            at, w = int(rng.integers(0, len(b))), int(rng.integers(1, 48))
            b[at:at + w] = rng.integers(0, 256, len(b[at:at + w]), dtype=np.uint8).tobytes()
        elif kind == 6:
            b = bytearray(b"\xff" * len(b))
        elif kind == 7:
            b = b[: int(rng.integers(0, len(b)))] if i % 16 == 7 else b + bytes(int(rng.integers(1, 9)))
        payloads.append(bytes(b))
        intact.append(bytes(b) == good)
    return payloads, intact


@pytest.mark.parametrize("algorithm", ["LZ4", "Zstd"])
def test_the_device_walks_source_gives_the_host_walks_verdicts(rng, host_kernels, algorithm):
    """The CUDA source the device runs, compiled for the CPU, refuses exactly the payloads the host
    walk refuses, and points each refused one at the safe stream; intact payloads all pass."""
    nbytes = 4096
    payloads, intact = _damaged_batch(rng, algorithm, 800, nbytes)
    walk = lz4_walk if algorithm == "LZ4" else zstd_walk
    want = np.array([walk(p, nbytes) for p in payloads])
    assert want[np.array(intact)].all() and not want.all()  # the batch holds both kinds
    buf = np.frombuffer(b"".join(payloads), np.uint8).copy()
    starts = np.cumsum([0] + [len(p) for p in payloads[:-1]]).astype(np.uint64)
    src = (np.uint64(buf.ctypes.data) + starts).astype(np.uint64)
    n = np.array([len(p) for p in payloads], np.uint64)
    status = np.full(len(payloads), -1, np.int32)
    safe = np.zeros(16, np.uint8)
    host_kernels[algorithm](src.ctypes.data, n.ctypes.data, nbytes, status.ctypes.data, len(payloads),
                            safe.ctypes.data, 2)
    assert ((status == 0) == want).all(), f"verdicts differ at {np.flatnonzero((status == 0) != want)[:5]}"
    assert (status[~want] == 12).all() and (n[~want] == 2).all() and (src[~want] == safe.ctypes.data).all()
    assert (n[want] == [len(p) for p, ok in zip(payloads, want) if ok]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["LZ4", "Zstd"])
def test_the_device_walk_agrees_with_the_host_walk(rng, gpu_session, algorithm):
    """Hundreds of randomly damaged payloads in one batch (LZ4 anywhere; zstd in its magic number or
    content size): the device marks at least those the host walk refuses, decodes the intact ones to
    what the CPU library gives, and the CUDA context survives."""
    import cupy as cp

    from flowgpu.io import nvcompc

    make, walk = (_block, lz4_walk) if algorithm == "LZ4" else (_frame, zstd_walk)
    cpu = numcodecs.LZ4() if algorithm == "LZ4" else numcodecs.Zstd()
    payloads, want, intact, sizes = [], [], [], []
    nbytes = 4096
    for i in range(400):
        block, _ = make(rng, nbytes)
        b = bytearray(block)
        if i % 4 and algorithm == "LZ4":  # three in four damaged anywhere, one in four intact
            at, w = int(rng.integers(0, len(b))), int(rng.integers(1, 48))
            b[at:at + w] = rng.integers(0, 256, len(b[at:at + w]), dtype=np.uint8).tobytes()
        elif i % 4:  # zstd: its magic number or its content size, what the walk must refuse (damage inside
            at = 0 if i % 2 else 6  # a block can fault nvCOMP's zstd decoder: benchmarks/probes/nvcomp_status)
            assert at == 0 or b[4] == 0x60  # single segment, a 2-byte content size at offset 5: b[6] its high byte
            b[at] ^= int(rng.integers(1, 256))
        if i % 50 == 7:
            b = bytearray(b"\xff" * len(b))
        payloads.append(bytes(b))
        want.append(walk(bytes(b), nbytes))
        intact.append(bytes(b) == block)
    starts, end = [], 0
    for p in payloads:
        starts.append(end)
        sizes.append(len(p))
        end = -(-(end + len(p)) // 16) * 16
    host = np.zeros(end, np.uint8)
    for a, p in zip(starts, payloads):
        host[a:a + len(p)] = np.frombuffer(p, np.uint8)
    out = cp.zeros(len(payloads) * nbytes, cp.uint8)
    pending = nvcompc.decode(algorithm, cp.asarray(host), np.array(starts), np.array(sizes), out,
                             np.arange(len(payloads)) * nbytes, nbytes)
    cp.cuda.get_current_stream().synchronize()
    bad = set(pending.damaged()[0].tolist())
    refused = {i for i, ok in enumerate(want) if not ok}
    assert refused <= bad, f"the device decoded payloads the walk refuses: {sorted(refused - bad)[:5]}"
    assert not bad & {i for i, ok in enumerate(intact) if ok}, "an intact payload marked damaged"
    got = cp.asnumpy(out).reshape(len(payloads), nbytes)
    for i in range(len(payloads)):
        if intact[i] or (algorithm == "LZ4" and i not in bad):
            ref = cpu.decode((nbytes.to_bytes(4, "little") if algorithm == "LZ4" else b"") + payloads[i])
            assert got[i].tobytes() == ref, f"payload {i} decoded to other bytes than the CPU library's"
    assert float(cp.arange(10).sum()) == 45.0  # the CUDA context still works

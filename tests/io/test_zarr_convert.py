"""``flowgpu convert`` and the summary's ``storage:`` line, in real processes (``python -m flowgpu``),
with the NumPy stand-in device (``DASK_FLOWGPU__ZARR__DEVICE=fake``) so the device path runs here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from flowgpu.io.convert import choose_layout
from tests.io.zarr_data import field, first_mismatch, make_store

ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"

pytestmark = pytest.mark.timeout(180)


def flowgpu(*args: str, cwd: Path, fault: str | None = None, device: str = "fake") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLOWGPU_TEST_FAULT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["DASK_FLOWGPU__ZARR__DEVICE"] = device
    if fault:
        env["FLOWGPU_TEST_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=150)


CPU = ("--backend", "cpu", "--workers", "1")


def test_layout_is_whole_rows_chunks_inside_shards():
    chunks, shards = choose_layout((100_000, 1000), "float32", chunk_bytes=4 << 20, shard_bytes=1 << 30)
    assert chunks == (1048, 1000) and shards == (96 * 1048, 1000)  # one shard of whole chunks holds all rows
    chunks, shards = choose_layout((8, 3000, 3000), "float64", chunk_bytes=4 << 20, shard_bytes=64 << 20)
    assert chunks == (1, 174, 3000) and shards == (1, 2784, 3000)
    assert choose_layout((1000,), "float32", chunk_bytes=4 << 20, shard_bytes=1 << 20) == ((1000,), None)


def test_convert_npy_then_zarr_round_trips_bit_identical(tmp_path, rng):
    data = field(rng, (3000, 700))
    np.save(tmp_path / "x.npy", data)
    r = flowgpu("convert", "x.npy", "x.zarr", "--chunk-bytes", "256KiB", "--shard-bytes", "2MiB", *CPU, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("wrote x.zarr: (3000, 700) float32, chunks (93, 700), shards (744, 700), zstd")
    a = zarr.open_array(str(tmp_path / "x.zarr"))
    assert (a.chunks, a.shards) == ((93, 700), (744, 700))
    assert [c.to_dict()["name"] for c in a.metadata.codecs[0].codecs] == ["bytes", "zstd"]  # flowgpu.zarr.checksum: off
    assert np.array_equal(a[:], data), first_mismatch(a[:], data)
    # a Zarr source (v2, zlib) into lz4 without shards, each chunk ending in its crc32c
    make_store(str(tmp_path / "v2.zarr"), data, "v2-zlib", chunks=(500, 700))
    r = flowgpu("convert", "v2.zarr", "y.zarr", "--codec", "lz4", "--chunk-bytes", "1MiB", "--shard-bytes", "1MiB",
                "--checksum", "--json", *CPU, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["codec"], out["shards"], out["chunks"]) == ("lz4", None, [374, 700])
    b = zarr.open_array(str(tmp_path / "y.zarr"))
    assert [c.to_dict()["name"] for c in b.metadata.codecs] == ["bytes", "numcodecs.lz4", "crc32c"]  # checked on read
    assert np.array_equal(b[:], data), first_mismatch(b[:], data)


@pytest.mark.slow
def test_convert_refuses_bad_input_with_one_line_and_writes_nothing(tmp_path, rng):
    np.save(tmp_path / "x.npy", field(rng, (50, 40)))
    (tmp_path / "foreign.zarr").mkdir()
    (tmp_path / "foreign.zarr" / "keep.txt").write_text("mine")
    cases = [
        (("convert", "missing.npy", "o.zarr"), "does not exist"),
        (("convert", "x.npy", "foreign.zarr", *CPU), "already exists and was not written by flowgpu"),
        (("convert", "x.npy", "o.zarr", "--chunk-bytes", "lots"), "is not a size"),
        (("convert", "x.npy", "o.zarr", "--chunk-bytes", "32MiB", *CPU), "16MiB or less"),
        (("convert", "x.npy", "o.zarr", "--codec", "brotli"), "brotli"),
        (("convert", "x.npy", "x.npy", *CPU), "the source itself"),
        (("convert", "x.npy", "back.npy", *CPU), "the name of a .npy file, but convert writes a Zarr store: name it e.g. 'back.zarr'"),
    ]
    for args, said in cases:
        r = flowgpu(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert said in r.stderr and TRACEBACK not in r.stderr, (args, r.stderr)
    assert sorted(os.listdir(tmp_path)) == ["foreign.zarr", "x.npy"]
    assert os.listdir(tmp_path / "foreign.zarr") == ["keep.txt"]


@pytest.mark.slow
def test_a_write_that_fails_midway_leaves_no_store(tmp_path, rng):
    np.save(tmp_path / "x.npy", field(rng, (2000, 300)))
    r = flowgpu("convert", "x.npy", "o.zarr", "--chunk-bytes", "64KiB", "--shard-bytes", "256KiB", *CPU,
                cwd=tmp_path, fault="zarr:unit-written#2@raise=ENOSPC")
    assert r.returncode == 1, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "o.zarr" in err[0] and "No space left" in err[0], r.stderr
    assert TRACEBACK not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]  # no store, no staging, no lock


@pytest.mark.slow
def test_an_interrupted_convert_leaves_nothing_once_its_last_write_ends(tmp_path, rng):
    """Ctrl-C while a worker writes: the staging folder goes after that write, not before it (a late write
    made it again with no owner record, and neither `clean` nor the next convert would remove it)."""
    np.save(tmp_path / "x.npy", field(rng, (2000, 300)))
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLOWGPU_TEST_FAULT"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
               DASK_FLOWGPU__ZARR__DEVICE="fake", FLOWGPU_TEST_FAULT=f"zarr:unit-writing#2@pause={hold}")
    p = subprocess.Popen([sys.executable, "-m", "flowgpu", "convert", "x.npy", "o.zarr", "--chunk-bytes", "64KiB",
                          "--shard-bytes", "256KiB", *CPU], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (hold / "zarr-unit-writing.reached").exists():  # a worker holds its second unit's write
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        time.sleep(2)  # the command has been told; the held write goes on only now
        (hold / "zarr-unit-writing.go").touch()
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "error: interrupted" in err and TRACEBACK not in err, err
    time.sleep(1)
    assert sorted(os.listdir(tmp_path)) == ["hold", "x.npy"]  # no store, no staging, no lock


@pytest.mark.slow
def test_run_summary_has_a_storage_line(tmp_path, rng):
    data = field(rng, (400, 300))
    make_store(str(tmp_path / "in.zarr"), data, "lz4", chunks=(100, 300))
    make_store(str(tmp_path / "b.zarr"), data, "zstd", chunks=(100, 300), compressors=zarr.codecs.BloscCodec())
    (tmp_path / "p.yaml").write_text(
        "name: s\ninputs:\n  x: {source: zarr, path: in.zarr}\n  b: {source: zarr, path: b.zarr}\n"
        "steps:\n  t: {op: sum, inputs: [x]}\n  u: {op: sum, inputs: [b]}\n"
        "outputs:\n  t: {from: t}\n  u: {from: u}\n"
        "  z: {from: x, sink: zarr, path: z.zarr, codec: lz4, chunks: [50, 300], shards: [200, 300], checksum: true}\n")
    r = flowgpu("run", "p.yaml", "--backend", "cpu", "--workers", "1", "--no-cache", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    want = float(data.astype(np.float64).sum())
    assert abs(summary["outputs"]["t"]["value"] - want) <= 1e-5 * abs(want)
    z = zarr.open_array(str(tmp_path / "z.zarr"))  # the sink's layout options, encoded on the device path
    assert (z.chunks, z.shards) == ((50, 300), (200, 300))
    assert [c.to_dict()["name"] for c in z.metadata.codecs[0].codecs] == ["bytes", "numcodecs.lz4", "crc32c"]
    assert np.array_equal(z[:], data)
    r = flowgpu("run", "p.yaml", "--backend", "cpu", "--workers", "1", "--no-cache", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    read, wrote, fell_back = [x for x in r.stdout.splitlines() if x.startswith("storage:")]
    assert "from storage" in read and "compressed moved" in read and "GB/s" in read
    assert wrote.startswith("storage: wrote ") and "(encoded 468.8 KiB" in wrote  # 400 x 300 float32
    assert fell_back.startswith("storage: 4 chunk(s) decoded on the CPU: blosc")


def test_a_bad_sink_codec_is_a_spec_error_with_its_place(tmp_path):
    (tmp_path / "p.yaml").write_text(
        "name: s\ninputs:\n  x: {source: random, shape: [10, 10]}\n"
        "outputs:\n  z: {from: x, sink: zarr, path: z.zarr, codec: brotli}\n")
    r = flowgpu("validate", "p.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "p.yaml:5:" in r.stderr and "codec" in r.stderr and TRACEBACK not in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["p.yaml"]

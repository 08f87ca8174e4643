"""Does a damaged chunk decode silently on the device, and what does checking cost?

nvCOMP's Python API (``Codec.decode`` with a configuration built from the known sizes, what the
reader used) reads no per-chunk status back; its C API (:mod:`flowgpu.io.nvcompc`) writes one per
chunk. On one 1 GiB shard of 64 KiB chunks of the benchmark's data (a smooth field plus noise),
per codec, this times both decoders (median of 5, bit-identity checked; the C API's time includes
the LZ4 walk) and then damages one chunk three ways (its payload overwritten with 0xff bytes; 64
random bytes in its middle; its first 16 bytes random) and reports, for each decoder, whether it
raised, what the statuses say and how many bytes came out wrong. Each damage case runs in a process
of its own: a decoder that writes out of bounds leaves its CUDA context unusable.

    python -m benchmarks.probes.nvcomp_status
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks import harness
from benchmarks.probes.nvcomp_batch import _field

CHUNK = 64 << 10


def _timed(cp, fn, repeats: int = 5) -> float:
    fn()
    cp.cuda.get_current_stream().synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        cp.cuda.get_current_stream().synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _shard(alg: str):
    import cupy as cp

    from flowgpu.io.devices import CupyDevice

    data = _field(cp)
    flat = data.reshape(-1).view(cp.uint8)
    n = flat.size // CHUNK
    offsets = np.arange(n, dtype=np.int64) * CHUNK
    host, starts, sizes = CupyDevice().pack(alg, flat, offsets, CHUNK, None)
    return cp, flat, n, offsets, cp.asarray(host), starts, sizes


def _decoders(cp, alg, n, starts, sizes, out, at):
    from nvidia import nvcomp

    from flowgpu.io import nvcompc

    stream = cp.cuda.get_current_stream().ptr
    codec = nvcomp.Codec(algorithm=alg, bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=stream)
    config = codec.decompression_config(codec.compression_config([CHUNK] * n))

    def python_api(shard):
        codec.decode(nvcomp.as_arrays(shard, starts.tolist(), sizes.tolist(), cuda_stream=stream),
                     out=nvcomp.as_arrays(out, at.tolist(), [CHUNK] * n, cuda_stream=stream),
                     decompression_config=config)

    def c_api(shard):
        return nvcompc.decode(alg, shard, starts, sizes, out, at, CHUNK)

    return python_api, c_api


def case(alg: str, how: str, api: str) -> None:
    cp, flat, n, at, shard, starts, sizes = _shard(alg)
    out = cp.empty(n * CHUNK, cp.uint8)
    python_api, c_api = _decoders(cp, alg, n, starts, sizes, out, at)
    victim = n // 2
    a, b = int(starts[victim]), int(starts[victim] + sizes[victim])
    noise = cp.asarray(np.random.default_rng(7).integers(0, 256, 64, dtype=np.uint8))
    if how == "0xff":
        shard[a:b] = 255
    elif how == "mid":
        m = (a + b) // 2
        shard[m:m + 64] = noise
    elif how == "head":
        shard[a:a + 16] = noise[:16]
    else:  # "many": 8 random bytes inside each of 1000 payloads (not their headers)
        rng = np.random.default_rng(11)
        picked = rng.choice(n, 1000, replace=False)
        for k in picked.tolist():
            lo, size = int(starts[k]), int(sizes[k])
            at = lo + 32 + int(rng.integers(0, max(size - 40, 1)))
            shard[at:at + 8] = cp.asarray(rng.integers(0, 256, 8, dtype=np.uint8))
    said = "no error"
    try:
        if api == "python":
            python_api(shard)
            cp.cuda.get_current_stream().synchronize()
        else:
            p = c_api(shard)
            cp.cuda.get_current_stream().synchronize()
            idx, st, got = p.damaged()
            said = f"statuses flag chunks {idx.tolist()[:4]} (status {st.tolist()[:4]}, decoded {got.tolist()[:4]} B)"
            if how == "many":
                rows = (out != flat).reshape(n, CHUNK).any(axis=1)
                silent = int((rows & ~cp.isin(cp.arange(n), cp.asarray(idx))).sum())
                said = (f"{len(idx)} of 1000 damaged chunks flagged; {silent} chunks wrong without a flag "
                        f"(statuses {sorted(set(st.tolist()))})")
    except Exception as e:  # noqa: BLE001 - what the decoder does is the measurement
        said = f"raised {type(e).__name__}: {str(e)[:100]}"
    wrong = int((out != flat).sum())
    print(f"{said}; {wrong} bytes wrong (chunk {victim} of {n}, {CHUNK} B)")


def _probe(args) -> None:
    import cupy as cp

    for alg in ("Zstd", "LZ4"):
        _, flat, n, at, shard, starts, sizes = _shard(alg)
        out = cp.empty(n * CHUNK, cp.uint8)
        python_api, c_api = _decoders(cp, alg, n, starts, sizes, out, at)
        t_py = _timed(cp, lambda: python_api(shard), args.repeats)
        same_py = bool(cp.array_equal(out, flat))
        out.fill(0)
        t_c = _timed(cp, lambda: c_api(shard), args.repeats)
        same_c = bool(cp.array_equal(out, flat))
        gb = flat.size / 1e9
        print(f"{alg}: {n} chunks of {CHUNK >> 10} KiB, ratio {flat.size / int(sizes.sum()):.2f}x · python API "
              f"{t_py * 1e3:.1f} ms ({gb / t_py:.1f} GB/s, identical {same_py}) · C API with statuses "
              f"{t_c * 1e3:.1f} ms ({gb / t_c:.1f} GB/s, identical {same_c})", flush=True)
        shard = out = None  # freed before the damage cases run in processes of their own
        for how, what in (("0xff", "payload all 0xff"), ("mid", "64 random bytes mid-payload"),
                          ("head", "first 16 bytes random"), ("many", "8 random bytes inside 1000 payloads")):
            for api in ("python", "C") if how != "many" else ("C",):
                r = subprocess.run([sys.executable, "-m", "benchmarks.probes.nvcomp_status", "--case", alg, how, api],
                                   capture_output=True, text=True, timeout=120)
                errors = [x.strip()[:120] for x in r.stderr.splitlines() if "Error:" in x or "illegal" in x][-1:]
                said = r.stdout.strip().splitlines()[-1:] or [f"process died (exit {r.returncode}): {errors}"]
                print(f"  {alg}, {what}, {api} API: {said[0]}", flush=True)


def _parser():
    p = harness.parser(__spec__.name, __doc__, repeats=5)
    p.add_argument("--case", nargs=3, metavar=("ALGORITHM", "DAMAGE", "API"),
                   help="one damage case only (Zstd|LZ4, 0xff|mid|head|many, python|C): what the probe runs "
                        "in a process of its own")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.case:
        case(*args.case)
        return 0
    return harness.captured_main(_parser, _probe, argv)


if __name__ == "__main__":
    sys.exit(main())

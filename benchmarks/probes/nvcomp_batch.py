"""Where does a 1 GiB shard's decode time go on the device? nvCOMP batch variants, side by side.

The first compressed-Zarr pass decoded a 1 GiB shard of 4 MiB zstd chunks in 0.2-0.25 s per task
(4-5 GB/s) and read its compressed bytes at 0.9 GB/s per task. This takes one shard of the
benchmark's data (a smooth field plus noise, 2048 x 131072 float32) on the device and, per codec
and inner chunk size, times:

* encode: a list of per-chunk views (what ``zarrwrite`` does) against one buffer carved by an
  offset table (``nvcomp.as_arrays(buffer, offsets, sizes)``);
* decode: per-chunk views and no config (what ``zarrread`` does: nvCOMP syncs to parse sizes)
  against one buffer carved by offsets with a config built from the known sizes (no sync), with
  the ``CONCURRENCY`` (default) and ``LATENCY`` execution policies;
* whether the call holds the GIL: how far a Python thread counting in a loop gets during it,
  against the same time idle;
* four threads decoding four shards at once, each on its own stream and codec.

Every decode is checked bit-identical with the data.

    python -m benchmarks.probes.nvcomp_batch
    python -m benchmarks.probes.nvcomp_batch --chunks-kib 64,1024 --algorithms LZ4
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from benchmarks import harness

ROWS, COLS = 2048, 131072  # one 1 GiB shard of the out-of-core Zarr benchmark


def _field(cp, r0: int = 0):
    rng = cp.random.default_rng(r0)
    i = cp.arange(r0, r0 + ROWS, dtype=cp.float32)[:, None]
    j = cp.arange(COLS, dtype=cp.float32)[None, :]
    smooth = cp.sin(i * 3e-4) * cp.cos(j * 7e-5) * 1000
    return cp.rint(smooth + rng.standard_normal((ROWS, COLS), dtype=cp.float32) * 4).astype(cp.float32)


class GilMeter:
    """How far a thread counting in a Python loop gets while ``fn`` runs (counts per second); the
    thread runs only inside :meth:`window` (a busy thread slows every GIL hand-back elsewhere)."""

    def window(self, fn):
        n, stop = [0], [False]

        def run():
            while not stop[0]:
                n[0] += 1

        th = threading.Thread(target=run, daemon=True)
        th.start()
        time.sleep(0.01)
        n0, t0 = n[0], time.perf_counter()
        out = fn()
        rate = (n[0] - n0) / (time.perf_counter() - t0)
        stop[0] = True
        th.join()
        return out, rate


def _as_shard(cp, batch, n: int, stream) -> tuple:
    """nvCOMP's compressed batch laid out as a shard: one buffer, each payload at a 256-byte aligned
    start. Returns ``(buffer, starts, sizes)``."""
    sizes = [int(x) for x in batch.buffer_sizes]
    starts, end = [], 0
    for x in sizes:
        at = -(-end // 256) * 256
        starts.append(at)
        end = at + x
    shard = cp.zeros(end, cp.uint8)
    for i, (at, x) in enumerate(zip(starts, sizes)):
        cp.cuda.runtime.memcpyAsync(shard.data.ptr + at, int(batch[i].__cuda_array_interface__["data"][0]), x,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    stream.synchronize()
    return shard, starts, sizes


def main(argv=None) -> int:
    p = harness.parser(__spec__.name, __doc__, repeats=3)
    p.add_argument("--chunks-kib", default="64,256,1024")
    p.add_argument("--algorithms", default="Zstd,LZ4")
    a = p.parse_args(argv)
    import cupy as cp
    from nvidia import nvcomp

    print(f"nvcomp {nvcomp.__version__}, cupy {cp.__version__}", flush=True)
    data = _field(cp)
    raw = data.reshape(-1).view(cp.uint8)
    total = raw.size
    meter = GilMeter()
    _, idle = meter.window(lambda: time.sleep(0.2))
    print(f"GIL meter idle: {idle / 1e6:.1f} M counts/s", flush=True)

    def timed(fn):
        fn()
        ts = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    rows = []
    for algo in a.algorithms.split(","):
        for kib in (int(k) for k in a.chunks_kib.split(",")):
            chunk = kib << 10
            n = total // chunk
            offs = [i * chunk for i in range(n)]
            stream = cp.cuda.Stream(non_blocking=True)
            try:
                with stream:
                    codec = nvcomp.Codec(algorithm=algo, bitstream_kind=nvcomp.BitstreamKind.RAW,
                                         cuda_stream=stream.ptr)
                    views = [raw[o:o + chunk] for o in offs]

                    def enc_list():
                        b = codec.encode(nvcomp.as_arrays(views, cuda_stream=stream.ptr))
                        stream.synchronize()
                        return b

                    def enc_contig():
                        b = codec.encode(nvcomp.as_arrays(raw, offs, [chunk] * n, cuda_stream=stream.ptr))
                        stream.synchronize()
                        return b

                    t_el = timed(enc_list)
                    t_ec = timed(enc_contig)
                    batch = enc_contig()
                    shard, starts, sizes = _as_shard(cp, batch, n, stream)
                    end = shard.size
                    del batch
                    out = cp.empty(total, cp.uint8)
                    pviews = [shard[at:at + s] for at, s in zip(starts, sizes)]
                    oviews = [out[o:o + chunk] for o in offs]

                    def dec_views():
                        codec.decode(nvcomp.as_arrays(pviews, cuda_stream=stream.ptr),
                                     out=nvcomp.as_arrays(oviews, cuda_stream=stream.ptr))
                        stream.synchronize()

                    def make_dec(c):
                        cfg = c.decompression_config(c.compression_config([chunk] * n))

                        def dec():
                            c.decode(nvcomp.as_arrays(shard, starts, sizes, cuda_stream=stream.ptr),
                                     out=nvcomp.as_arrays(out, offs, [chunk] * n, cuda_stream=stream.ptr),
                                     decompression_config=cfg)
                            stream.synchronize()
                        return dec

                    def check(what):
                        ok = bool(cp.array_equal(out, raw))
                        out.fill(0)
                        return what if ok else what + " WRONG"

                    results = {}
                    if n <= 4096:
                        t = timed(dec_views)
                        results["views, no config"] = (t, check("views, no config"))
                    dec_c = make_dec(codec)
                    t = timed(dec_c)
                    results["offsets + config, CONCURRENCY"] = (t, check("offsets + config"))
                    lat = nvcomp.Codec(algorithm=algo, bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=stream.ptr,
                                       execution_policy=nvcomp.ExecutionPolicy.LATENCY)
                    dec_l = make_dec(lat)
                    t = timed(dec_l)
                    results["offsets + config, LATENCY"] = (t, check("offsets + config, LATENCY"))
                    _, gil_views = meter.window(dec_views) if n <= 4096 else (None, 0)
                    _, gil_cfg = meter.window(dec_c)
                    t_call = timed(lambda: (codec.decode(nvcomp.as_arrays(shard, starts, sizes, cuda_stream=stream.ptr),
                                                         out=nvcomp.as_arrays(out, offs, [chunk] * n,
                                                                              cuda_stream=stream.ptr),
                                                         decompression_config=codec.decompression_config(
                                                             codec.compression_config([chunk] * n))),
                                            stream.synchronize()))
                    check("x")
                    ratio = total / end
                    print(f"{algo} {kib} KiB chunks ({n}): ratio {ratio:.2f}x; encode list {t_el * 1e3:.1f} ms "
                          f"({total / t_el / 1e9:.1f} GB/s), contiguous {t_ec * 1e3:.1f} ms ({total / t_ec / 1e9:.1f})",
                          flush=True)
                    for k, (t, ok) in results.items():
                        print(f"  decode {k}: {t * 1e3:.1f} ms = {total / t / 1e9:.1f} GB/s out [{ok}]", flush=True)
                    print(f"  GIL meter during decode: views {gil_views / idle:.0%} of idle, offsets+config "
                          f"{gil_cfg / idle:.0%}; config built per call: {t_call * 1e3:.1f} ms", flush=True)
                    best = min(results.items(), key=lambda kv: kv[1][0])
                    rows.append(dict(algo=algo, kib=kib, n=n, ratio=ratio, enc_list=t_el, enc_contig=t_ec,
                                     **{k: v[0] for k, v in results.items()}, best=best[0]))
                    shard = out = pviews = oviews = views = None  # noqa: F841 - freed before the next size
            except Exception:
                print(f"{algo} {kib} KiB: FAILED", flush=True)
                traceback.print_exc()
            cp.get_default_memory_pool().free_all_blocks()

    # four threads at once, each its own shard copy, stream and codec, offsets + config
    for algo in a.algorithms.split(","):
        for kib in (int(k) for k in a.chunks_kib.split(",")):
            try:
                chunk = kib << 10
                n = total // chunk
                offs = [i * chunk for i in range(n)]

                def worker(k, algo=algo, chunk=chunk, n=n, offs=offs):
                    s = cp.cuda.Stream(non_blocking=True)
                    with s:
                        c = nvcomp.Codec(algorithm=algo, bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=s.ptr)
                        b = c.encode(nvcomp.as_arrays(raw, offs, [chunk] * n, cuda_stream=s.ptr))
                        shard, starts, sizes = _as_shard(cp, b, n, s)
                        del b
                        out = cp.empty(total, cp.uint8)
                        cfg = c.decompression_config(c.compression_config([chunk] * n))
                        s.synchronize()
                    return s, c, shard, starts, sizes, out, cfg

                with ThreadPoolExecutor(4) as ex:
                    ctx = list(ex.map(worker, range(4)))

                    def one(t):
                        s, c, shard, starts, sizes, out, cfg = t
                        with s:
                            c.decode(nvcomp.as_arrays(shard, starts, sizes, cuda_stream=s.ptr),
                                     out=nvcomp.as_arrays(out, offs, [chunk] * n, cuda_stream=s.ptr),
                                     decompression_config=cfg)
                            s.synchronize()

                    t = timed(lambda: list(ex.map(one, ctx)))
                ok = all(bool(cp.array_equal(c[5], raw)) for c in ctx)
                print(f"4 threads {algo} {kib} KiB: {t * 1e3:.1f} ms for 4 GiB = {4 * total / t / 1e9:.1f} GB/s out"
                      f"{'' if ok else ' WRONG'}", flush=True)
                ctx = None  # noqa: F841
            except Exception:
                print(f"4 threads {algo} {kib} KiB: FAILED", flush=True)
                traceback.print_exc()
            cp.get_default_memory_pool().free_all_blocks()
    for r in rows:
        print(r, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

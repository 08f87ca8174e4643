"""Where a YAML run's compile spends its time on a GPU Session (session 14): cProfile of plan_items alone,
on the yaml_cost probe's chain_sum and transpose_sum specs over a persisted CuPy array.
    python benchmarks/recorded/h200-2026-12-04-s14/compile_profile.py"""
import cProfile
import pstats
import time

import dask.array as da
import numpy as np

import flowgpu as fg
from benchmarks.probes.yaml_cost import WORKLOADS
from benchmarks.suite import data
from flowgpu.backend import import_cupy
from flowgpu.pipeline import runner
from flowgpu.pipeline.foreach import expand

if __name__ == "__main__":
    host = np.random.default_rng().random((1024, 1024), dtype=np.float32)
    with fg.Session(backend="gpu", gpus=[0], dashboard_address=None) as s:
        x = s.client.persist(da.from_array(host, chunks=(256, 256)).map_blocks(import_cupy().asarray))
        data.ARRAYS["x"] = x
        for name, (_, make_spec, _) in WORKLOADS.items():
            items = expand(runner.load_spec(make_spec(host), None, None, None), None)
            plan = lambda: runner.plan_items(items, True, None, s.facts, for_run=True)  # noqa: E731
            for _ in range(20):
                plan()
            t = time.perf_counter()
            for _ in range(100):
                plan()
            print(f"{name}: plan_items {(time.perf_counter() - t) * 10:.2f} ms")
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(100):
                plan()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(35)

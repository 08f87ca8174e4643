"""Benchmarks of flowgpu against raw CuPy/NumPy, hand fusion and dask.array, and the probes behind them.

One folder per kind: ``suite`` (side-by-side workloads in memory), ``out_of_core`` (data larger than
device or host memory), ``probes`` (where the time goes; what the machine allows). Every script runs
as ``python -m benchmarks.<kind>.<name> [--help]`` from the repository root; ``harness`` holds what
they share. BENCHMARKS.md gives the figures, DEVELOPERS.md ("Benchmarks") how to run them.
"""

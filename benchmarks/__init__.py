"""Side-by-side benchmarks of flowgpu against raw CuPy/NumPy, hand fusion and dask.array.

Run ``python -m benchmarks.run --help``.
"""

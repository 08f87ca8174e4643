"""The side-by-side suite: the same workloads on raw CuPy/NumPy, hand fusion, dask.array and flowgpu."""

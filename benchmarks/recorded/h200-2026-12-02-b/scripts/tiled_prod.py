"""Why a fused float32 product of a transposed input lost precision on the H200: the tiled kernel's
partials against CuPy's own product and NumPy's, on the test's data (1 +- 5e-4, float32)."""
import numpy as np
import cupy as cp
import dask.array as da

from flowgpu.fusion import tiled
from flowgpu.fusion.kernel import fused_elementwise

rng = np.random.default_rng(0)
for rows, cols in [(700, 513), (1024, 1024)]:
    xn = (1 + (rng.random((rows, cols)) - 0.5) * 1e-3).astype("float32")
    yn = np.ones((cols, rows), dtype="float32")
    want = np.prod(xn.astype(np.float64))
    x = da.from_array(cp.asarray(xn), chunks=(rows, cols))
    y = da.from_array(cp.asarray(yn), chunks=(cols, rows))
    tiled._kernels.clear()
    got_t = float(fused_elementwise("x * y", {"x": x, "y": y.T}, reduction="prod").compute())
    used = bool(tiled._kernels)
    yc = da.from_array(cp.ones((rows, cols), dtype="float32"), chunks=(rows, cols))
    got_c = float(fused_elementwise("x * y", {"x": x, "y": yc}, reduction="prod").compute())  # C-order: general kernel
    cp_prod = float(cp.prod(cp.asarray(xn)))
    print(f"{rows}x{cols}: float64 {want:.7f}; NumPy float32 {float(np.prod(xn)):.7f}; CuPy float32 {cp_prod:.7f}; "
          f"fused, transposed input (tiled={used}) {got_t:.7f} (rel {got_t / want - 1:+.2e}); "
          f"fused, C-order {got_c:.7f} (rel {got_c / want - 1:+.2e})")

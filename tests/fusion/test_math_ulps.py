"""How close fused math functions come to NumPy's, on fresh random data.

Arithmetic, comparisons, ``sqrt``, ``abs`` and ``hypot`` are NumPy's to the bit in a fused kernel.
Transcendental functions are not: on NumPy chunks a fused kernel calls numba's math library, on CuPy
chunks CUDA's, while NumPy has SIMD loops of its own; each is within a few ulp of the exact value,
so they differ from NumPy in the last bits (the README says so). These tests hold each to the
bound the README states, and the exact ones to the bit.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.backend import import_cupy

TRANSCENDENTAL = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": lambda v: np.log(abs(v) + 0.1),
    "log10": lambda v: np.log10(abs(v) + 0.1), "log1p": lambda v: np.log1p(abs(v)), "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "arcsin": lambda v: np.arcsin(np.clip(v / 10, -1, 1)), "sinh": np.sinh, "tanh": np.tanh,
    "cbrt": np.cbrt, "arctan2": lambda v: np.arctan2(v, v * 0.5 + 0.3), "power": lambda v: abs(v) ** 1.7,
}
EXACT = {"arithmetic": lambda v: (v * 2 + 1) ** 2 - v / 3, "sqrt": lambda v: np.sqrt(abs(v)) * 2,
         "hypot": lambda v: np.hypot(v, v * 0.3), "compare": lambda v: np.where(v > 0.5, v, -v) + abs(v)}
MAX_ULPS = {"numpy": 4, "cupy": 4}  # measured at most 3: numba on the 2-core CPU, CUDA 13 on the H200 (2026-12-04)

BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def _fused(xp: str, f, a: np.ndarray) -> np.ndarray:
    x = da.from_array(a, chunks=a.size // 4)
    if xp == "cupy":
        x = x.map_blocks(import_cupy().asarray)
    out = fg.fuse(lambda v: f(v) * 2)(x).compute(scheduler="sync")
    return out.get() if xp == "cupy" else out


@pytest.mark.parametrize("xp", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_transcendental_functions_are_within_a_few_ulp_of_numpys(rng, xp, dtype):
    a = (rng.standard_normal(40_000) * 3).astype(dtype)
    worst = {}
    for name, f in {**TRANSCENDENTAL, **({"hypot": EXACT["hypot"]} if xp == "cupy" else {})}.items():
        got, want = _fused(xp, f, a), f(a) * 2
        assert got.dtype == want.dtype, name
        finite = np.isfinite(want)
        assert (np.isfinite(got) == finite).all(), name
        worst[name] = int(np.max(np.abs(got[finite].astype("float64") - want[finite]) /
                                 np.spacing(np.abs(want[finite])).astype("float64")))
    print(f"{xp} {dtype} largest difference from NumPy, in ulp: {worst}")
    assert max(worst.values()) <= MAX_ULPS[xp], worst


@pytest.mark.parametrize("xp", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_arithmetic_sqrt_and_hypot_are_numpys_to_the_bit(rng, xp, dtype):
    a = (rng.standard_normal(40_000) * 3).astype(dtype)
    for name, f in EXACT.items():
        if xp == "cupy" and name == "hypot":  # CUDA's hypot is within 2 ulp, not correctly rounded: above
            continue
        got, want = _fused(xp, f, a), f(a) * 2
        assert got.dtype == want.dtype and np.array_equal(got, want), name

"""real, imag, conj, angle against NumPy, and astype refusing to drop an imaginary part."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get
from tests.ops.conftest import chunked, computed


@pytest.mark.parametrize("name, reference", [("real", np.real), ("imag", np.imag), ("conj", np.conj),
                                             ("angle", np.angle)])
@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float64"])
def test_complex_parts_match_numpy(name, reference, dtype, rng, backend):
    x = rng.standard_normal((7, 5)) + (1j * rng.standard_normal((7, 5)) if dtype.startswith("complex") else 0)
    x = x.astype(dtype)
    out = get(name)(chunked(x, 3, backend))
    expected = reference(x)
    got = computed(out, backend)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == "complex64" else 1e-14)


def test_astype_refuses_to_drop_the_imaginary_part(rng, backend):
    z = chunked(rng.standard_normal(6) + 1j * rng.standard_normal(6), 3, backend)
    with pytest.raises(OpError, match="complex128 to float64 would drop the imaginary part; use op 'real'"):
        get("astype")(z, dtype="float64")
    np.testing.assert_array_equal(computed(get("astype")(z, dtype="complex64"), backend),
                                  computed(z, backend).astype("complex64"))
    re = get("astype")(get("real")(z), dtype="float32")
    np.testing.assert_array_equal(computed(re, backend), computed(z, backend).real.astype("float32"))


def test_expr_over_a_spectrum_gives_numpys_power(rng, backend):
    # the power spectrum a user writes after an fft step: no kernel takes complex, dask's operations do
    a = rng.standard_normal((6, 32))
    spectrum = get("rfft")(chunked(a, (2, 32), backend))
    power = get("expr")("abs(z) ** 2 / n", z=spectrum, n=32)
    got = computed(power, backend)
    expected = np.abs(np.fft.rfft(a)) ** 2 / 32
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12)

"""FFT ops equal numpy.fft on the whole array; split transformed axes are rechunked with a warning."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get
from flowgpu.ops.fft import FFTRechunkWarning
from tests.ops.conftest import chunked, computed

ONE_AXIS = ["fft", "ifft", "rfft"]
MANY_AXES = ["fft2", "ifft2", "rfft2", "fftn", "ifftn"]


@pytest.mark.parametrize("name", ONE_AXIS)
@pytest.mark.parametrize("axis, n", [(-1, None), (0, None), (1, 9), (0, 20)])
def test_one_axis_transforms(name, axis, n, rng, backend):
    a = rng.normal(size=(12, 10))
    x = chunked(a, (12, 10) if axis == 0 else (4, 10), backend)  # whole along the transformed axis
    x = x.rechunk({1 - (axis % 2): 4})
    out = get(name)(x, n=n, axis=axis)
    ref = getattr(np.fft, name)(a, n=n, axis=axis)
    assert out.shape == ref.shape
    np.testing.assert_allclose(computed(out, backend), ref, rtol=1e-10, atol=1e-12)


def test_irfft_inverts_rfft(rng, backend):
    a = rng.normal(size=(6, 14))
    x = chunked(a, (2, 14), backend)
    back = get("irfft")(get("rfft")(x), n=14)
    np.testing.assert_allclose(computed(back, backend), a, atol=1e-12)
    np.testing.assert_allclose(computed(get("irfft")(get("rfft")(x)), backend),
                               np.fft.irfft(np.fft.rfft(a)), atol=1e-12)


@pytest.mark.parametrize("name", MANY_AXES)
def test_many_axes_transforms(name, rng, backend):
    a = rng.normal(size=(3, 8, 6))
    x = chunked(a, (1, 8, 6), backend)
    out = get(name)(x) if not name.endswith("n") else get(name)(x, axes=[1, 2])
    ref = getattr(np.fft, name)(a) if not name.endswith("n") else getattr(np.fft, name)(a, axes=[1, 2])
    assert out.chunks[0] == (1, 1, 1)  # the untouched axis keeps its chunks
    np.testing.assert_allclose(computed(out, backend), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", [*MANY_AXES, "irfft2"])
def test_transforms_in_threads_that_come_and_go(name, rng, backend):
    # each compute on a pool of new threads, as a dask pool's or a worker's new threads are: on CuPy
    # the second pool's threads reused plans from threads that had ended, and cuFFT's R2C failed
    for _ in range(3):
        a = rng.normal(size=(3, 8, 6))
        if name.startswith("irfft"):
            a = np.fft.rfftn(a, axes=(1, 2))
        out = get(name)(chunked(a, (1, *a.shape[1:]), backend), axes=[1, 2])
        with ThreadPoolExecutor(3) as pool:
            got = out.compute(scheduler="threads", pool=pool)
        got = got.get() if backend == "cupy" else got
        np.testing.assert_allclose(got, getattr(np.fft, name)(a, axes=[1, 2]), rtol=1e-10, atol=1e-12)


def test_fft2_with_s_crops_and_pads(rng, backend):
    a = rng.normal(size=(8, 6))
    out = get("fft2")(chunked(a, (8, 6), backend), s=[5, 9])
    np.testing.assert_allclose(computed(out, backend), np.fft.fft2(a, s=(5, 9)), rtol=1e-10, atol=1e-12)


def test_float32_gives_complex64_close_to_float64_reference(rng, backend):
    a = rng.normal(size=(4, 64)).astype(np.float32)
    result = computed(get("fft")(chunked(a, (2, 64), backend)), backend)
    assert result.dtype == np.complex64
    ref = np.fft.fft(a.astype(np.float64))
    assert np.max(np.abs(result - ref)) / np.max(np.abs(ref)) < 1e-6


def test_split_axis_is_rechunked_with_a_warning(rng, backend):
    a = rng.normal(size=(6, 20))
    with pytest.warns(FFTRechunkWarning, match="axis \\[1\\]"):
        out = get("fft")(chunked(a, (3, 7), backend))
    assert out.chunks == ((3, 3), (20,))
    np.testing.assert_allclose(computed(out, backend), np.fft.fft(a), rtol=1e-10, atol=1e-12)


def test_bad_axes_and_lengths(rng):
    import dask.array as da

    x = da.from_array(rng.normal(size=(4, 4)))
    with pytest.raises(OpError, match="out of range or repeated"):
        get("fft")(x, axis=2)
    with pytest.raises(OpError, match="one positive length per transformed axis"):
        get("fft2")(x, s=[4])
    with pytest.raises(OpError, match="argument 'norm' must be one of"):
        get("fft")(x, norm="sideways")

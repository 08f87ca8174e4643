"""Floating-point checks whose tolerance follows the size of what was added up, not of the result.

A sum whose terms nearly cancel has a result much smaller than its rounding error allows for, so a
relative bound on the result fails on some fresh random data. Rounding error is bounded by a few
epsilons of the terms' magnitudes (``|a| @ |b|`` for ``a @ b``, ``|w * a| + |b|`` for
``w * a + b``); these checks assert that, which still catches any wrong term.
"""

from __future__ import annotations

import numpy as np


def assert_within_terms(result, reference, terms, epsilons: float, dtype=np.float64) -> None:
    """Assert ``|result - reference| <= epsilons * eps(dtype) * terms``, elementwise.

    Parameters
    ----------
    result : what the code under test computed.
    reference : the same computed in float64.
    terms : magnitude of the quantities rounded on the way (same shape, or broadcastable).
    epsilons : how many epsilons of ``terms`` the arithmetic may lose (about the number of roundings).
    dtype : the precision the code under test computed in.
    """
    result = np.asarray(result, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    assert result.shape == reference.shape, (result.shape, reference.shape)
    bound = epsilons * np.finfo(dtype).eps * np.asarray(terms, dtype=np.float64)
    err = np.abs(result - reference)
    bad = err > bound
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} elements off by more than {epsilons} epsilons of their terms; "
        f"worst: {float(np.max(err / np.maximum(bound, np.finfo(np.float64).tiny)))} times the bound"
    )

"""Imports the built-in op modules, each of which registers a family of ops with
:mod:`flowgpu.ops.registry` (``flowgpu ops`` lists them); :mod:`flowgpu.ops` imports this module,
so every built-in op is registered once the package is imported."""

from __future__ import annotations

from flowgpu.ops import elementwise, expression, fft, grouping, linalg, reductions, shape, stencil, user  # noqa: F401

__all__: list[str] = []

"""Ops for pipelines: the registry and the built-in ops (each module below registers its family of ops
when this package imports it, so every built-in op is registered once the package is imported)."""

from flowgpu.ops.registry import OPS, Op, all_ops, get, names, op, register
from flowgpu.ops import (elementwise, expression, fft, grouping, linalg, reductions, shape,  # noqa: F401,I001
                         stencil, user)

__all__ = ["OPS", "Op", "all_ops", "get", "names", "op", "register"]

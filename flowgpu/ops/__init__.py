"""Ops for pipelines: the registry and the built-in ops (registered when this package is imported)."""

from flowgpu.ops.registry import OPS, Op, all_ops, get, names, op, register
from flowgpu.ops import builtin  # noqa: E402,F401,I001  (registers the built-in ops)

__all__ = ["OPS", "Op", "all_ops", "get", "names", "op", "register"]

"""Ops for pipelines: the registry and the built-in ops."""

from flowgpu.ops.registry import Op, all_ops, get, names, op, register

__all__ = ["Op", "all_ops", "get", "names", "op", "register"]

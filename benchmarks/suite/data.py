"""Arrays shared between benchmark columns in one process (the YAML column's ``python`` source)."""

from __future__ import annotations

from typing import Any

ARRAYS: dict[str, Any] = {}


def shared(name: str) -> Any:
    """The array registered as ``name`` (used as ``source: python, callable: benchmarks.suite.data:shared``)."""
    return ARRAYS[name]

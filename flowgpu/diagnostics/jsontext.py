"""JSON text every JSON reader takes: NaN and the infinities (a z-score of a constant column) are
written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, not as Python's bare ``NaN``,
which ``jq`` and most parsers refuse."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NONFINITE", "plain", "dumps"]

NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def plain(obj: Any) -> Any:
    """``obj`` with every non-finite float (Python's or NumPy's) replaced by its string."""
    if isinstance(obj, float) or (hasattr(obj, "dtype") and getattr(obj, "shape", None) == () and obj.dtype.kind == "f"):
        value = float(obj)
        return value if math.isfinite(value) else NONFINITE[repr(value)]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`plain` ``obj``: never NaN or Infinity; other objects as their text."""
    return json.dumps(plain(obj), allow_nan=False, default=str, **kwargs)

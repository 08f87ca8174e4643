"""A small spec over a fresh random ``.npy`` for the dashboard and report tests."""

from __future__ import annotations

import numpy as np

import tests.pipeline.helpers  # noqa: F401  (registers test_explode, a step that fails while running)


def chain_spec(tmp_path, rng, name: str, shape: tuple[int, int], rows: int, op: str = "multiply",
               factor: float = 3.0, mean: bool = False) -> tuple[np.ndarray, dict]:
    """``x`` (npy, chunks of ``rows`` rows) -> ``y = op(x)`` (x * factor) [-> ``m``, its column means]
    -> ``s``, the sum; outputs ``y`` (npy) and ``s`` (summary). Returns the data and the spec dict."""
    x = rng.random(shape)
    np.save(tmp_path / "x.npy", x)
    steps = {"y": {"op": op, "inputs": ["x"], **({"args": {"b": factor}} if op == "multiply" else {})}}
    if mean:
        steps["m"] = {"op": "mean", "inputs": ["y"], "args": {"axis": 0}}
    steps["s"] = {"op": "sum", "inputs": ["m" if mean else "y"]}
    return x, {
        "version": 1, "name": name,
        "inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy"), "chunks": [rows, shape[1]]}},
        "steps": steps,
        "outputs": {"y": {"from": "y", "sink": "npy", "path": str(tmp_path / "out" / "y.npy")}, "s": {"from": "s"}},
    }

"""A pytest plugin that runs every selected test twice in a row, in the same process.

    python -m pytest -p benchmarks.dask_suite.twice ...

The runner's recheck uses it: the second run of a test finds the kernels the first compiled, so
its time is the test's warm time (the JUnit report holds both runs, the second last).
"""

from __future__ import annotations

from typing import Any


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    items[:] = [item for item in items for _ in range(2)]

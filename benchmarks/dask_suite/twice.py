"""A pytest plugin that runs every selected test twice in a row, in the same process.

    python -m pytest -p benchmarks.dask_suite.twice ...

The runner's recheck uses it: the second run of a test finds the kernels the first compiled, so
its time is the test's warm time (the JUnit report holds both runs under the same name, the second
last). The second run is a fresh item of the same function and parameters, so fixtures and
parameters are set up again as for any test.
"""

from __future__ import annotations

from typing import Any

import pytest


def _again(item: Any) -> Any:
    if type(item) is not pytest.Function:
        return item
    extra = {"callspec": item.callspec} if hasattr(item, "callspec") else {}
    return pytest.Function.from_parent(item.parent, name=item.name, callobj=item.obj, originalname=item.originalname,
                                       fixtureinfo=item._fixtureinfo, **extra)


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    items[:] = [run for item in items for run in (item, _again(item))]

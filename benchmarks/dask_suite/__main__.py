"""``python -m benchmarks.dask_suite``: the same as ``python -m benchmarks.dask_suite.run``."""

import sys

from benchmarks.dask_suite import run

if __name__ == "__main__":
    sys.argv[0] = "benchmarks.dask_suite.run"
    sys.exit(run.main())

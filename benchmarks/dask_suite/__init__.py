"""dask's own array test suite, run plain and with flowgpu's fusion on for every compute, compared.

``python -m benchmarks.dask_suite.run --help`` (or ``python -m benchmarks.dask_suite``); the
pytest plugin is :mod:`benchmarks.dask_suite.plugin`, usable on its own with ``-p``.
"""

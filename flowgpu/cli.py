"""The ``flowgpu`` command: a thin click layer over library functions."""

from __future__ import annotations

import sys

import click


@click.group(name="flowgpu", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flowgpu")
def cli() -> None:
    """flowgpu: out-of-core dataflow pipelines on GPUs (or CPUs), scheduled by Dask."""


@cli.command()
def info() -> None:
    """Show what this machine offers: GPUs, CuPy, and the backend a Session would use."""
    from flowgpu import backend

    n = backend.gpu_count()
    cupy = backend.import_cupy(strict=False) is not None if n else False
    click.echo(f"GPUs visible: {n}")
    click.echo(f"CuPy: {'yes' if cupy else 'no'}")
    click.echo(f"Session() would use: {'gpu (dask-cuda)' if n and cupy else 'cpu (distributed)'}")


def main() -> None:
    sys.exit(cli(standalone_mode=True))

"""The ``flowgpu`` command: a thin click layer over library functions, one module per family of commands.

Exit codes: 0 ok; 2 an invalid spec or argument (nothing ran, nothing was written); 1 a failure
while running.
"""

from __future__ import annotations

import os
import sys

try:  # the libraries load in a second or two: a Ctrl-C meanwhile is one line and 130, as during a run
    import click

    from flowgpu.cli import cluster, convert, listing, run
    from flowgpu.cli.common import EXIT_FAILED, EXIT_INVALID, EXIT_OK, handle_errors
except KeyboardInterrupt:
    sys.stderr.write("error: interrupted while starting; nothing ran\n")
    sys.exit(130)

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "cli", "handle_errors", "main"]


@click.group(name="flowgpu", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flowgpu")
@click.option("--debug", is_flag=True, help="Show the traceback of an internal error instead of writing it to a file.")
def cli(debug: bool) -> None:
    """flowgpu: out-of-core dataflow pipelines on GPUs (or CPUs), scheduled by Dask."""
    if debug:
        os.environ["FLOWGPU_DEBUG"] = "1"


for _command in (listing.info, run.run, run.status, run.clean, run.validate, run.plan, listing.ops, listing.sources,
                 listing.sinks, listing.schema, cluster.cluster, convert.convert):
    cli.add_command(_command)


def main() -> None:
    sys.exit(cli(standalone_mode=True))

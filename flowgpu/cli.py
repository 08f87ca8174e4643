"""The ``flowgpu`` command: a thin click layer over library functions.

Exit codes: 0 ok; 2 an invalid spec or argument (nothing ran, nothing was written); 1 a failure
while running.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowgpu import backend, pipeline
from flowgpu.diagnostics import render_plan
from flowgpu.errors import BackendError, ConfigError, FlowgpuError, OpError, OutputExistsError, SpecError
from flowgpu.io import atomic
from flowgpu.io.sinks import SINKS
from flowgpu.io.sources import SOURCES
from flowgpu.ops import all_ops
from flowgpu.registry import Entry, trusting

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _console(stderr: bool = True) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 140  # pipes and CI logs: wide enough for the plan table
    return Console(stderr=stderr, highlight=False, width=width)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _bug(error: BaseException) -> None:
    """An error flowgpu did not mean to raise: one line, the traceback in a log file (or shown with --debug)."""
    if os.environ.get("FLOWGPU_DEBUG"):
        traceback.print_exception(error)
        where = "shown above"
    else:
        fd, path = tempfile.mkstemp(prefix="flowgpu-error-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            traceback.print_exception(error, file=f)
        where = f"written to {path} (or run with --debug to show it)"
    said = " ".join(str(error).split())[:200]
    _fail(f"internal error {type(error).__name__}: {said}; this is a bug in flowgpu, please report "
          f"it; the traceback is {where}", EXIT_FAILED)


def handle_errors(func: Callable) -> Callable:
    """Turn flowgpu errors into one message and an exit code (2 invalid input, 1 failure while running);
    any other error is a bug, said in one line (never a traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (SpecError, ConfigError, OpError, OutputExistsError) as e:
            _fail(str(e), EXIT_INVALID)
        except BackendError as e:
            _fail(str(e), EXIT_INVALID)
        except FlowgpuError as e:
            _fail(str(e), EXIT_FAILED)
        except KeyboardInterrupt:
            _fail("interrupted; no output was moved into place", EXIT_FAILED)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback reaches the user
            _bug(e)

    return wrapper


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: give KEY=VALUE, e.g. params.n=1000", param_hint="--set")
        out[key.strip()] = value
    return out


def spec_options(func: Callable) -> Callable:
    """--set, --params and --trust, shared by run, validate and plan (--trust applies while the command runs)."""

    command = func

    @functools.wraps(command)
    def trusted(*args: Any, trust: tuple[str, ...] = (), **kwargs: Any) -> Any:
        with trusting(trust):
            return command(*args, **kwargs)

    func = click.option("--trust", "trust", multiple=True, metavar="MODULE",
                        help="Let the spec import callables from MODULE (and its submodules) only, with the "
                             "flowgpu.trusted-modules setting; repeatable. A spec's callables run when it runs.")(trusted)
    func = click.option("--params", "params_file", type=click.Path(dir_okay=False),
                        help="YAML file of param values (name: value).")(func)
    func = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                        help="Set a value, e.g. params.n=1000 or cluster.n_workers=2 (repeatable).")(func)
    return func


def allow_address_option(func: Callable) -> Callable:
    return click.option("--allow-spec-address", is_flag=True,
                        help="Let the spec's cluster.address (another scheduler) or a dashboard_address open to "
                             "the network take effect; otherwise they are refused.")(func)


def tls_options(func: Callable) -> Callable:
    """--tls-ca-file, --tls-cert and --tls-key (PEM files to join a tls:// scheduler with), named as
    `dask scheduler` and `dask worker` name them; they reach the command as tls_ca_file, tls_cert, tls_key."""
    for flag, what in (("--tls-key", "private key of --tls-cert, unless that file holds it"),
                       ("--tls-cert", "certificate the cluster's CA signed, presented to the scheduler"),
                       ("--tls-ca-file", "CA certificate(s) of the cluster")):
        func = click.option(flag, type=click.Path(dir_okay=False), default=None, metavar="PEM",
                            help=f"Joining a tls:// --scheduler: the {what} (else dask's distributed.comm.tls.* "
                                 "config).")(func)
    return func


@click.group(name="flowgpu", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flowgpu")
@click.option("--debug", is_flag=True, help="Show the traceback of an internal error instead of writing it to a file.")
def cli(debug: bool) -> None:
    """flowgpu: out-of-core dataflow pipelines on GPUs (or CPUs), scheduled by Dask."""
    if debug:
        os.environ["FLOWGPU_DEBUG"] = "1"


@cli.command()
def info() -> None:
    """Show what this machine offers: GPUs, CuPy, and the backend a Session would use."""
    n = backend.gpu_count()
    cupy = backend.import_cupy(strict=False) is not None if n else False
    click.echo(f"GPUs visible: {n}")
    click.echo(f"CuPy: {'yes' if cupy else 'no'}")
    click.echo(f"Session() would use: {'gpu (dask-cuda)' if n and cupy else 'cpu (distributed)'}")


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@spec_options
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Join this scheduler (tcp://host:port, tls://host:port or a scheduler file) instead of "
                   "starting a cluster.")
@tls_options
@click.option("--gpus", default=None, metavar="0,1,...", help="GPU ordinals to use (one worker each).")
@click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default=None, help="Array backend.")
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None, help="Workers of a CPU cluster.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the run summary as JSON here.")
@click.option("--overwrite", is_flag=True, help="Replace output paths that hold data flowgpu did not write.")
@click.option("--dry-run", is_flag=True, help="Check and plan only; start no cluster, write nothing.")
@click.option("--no-wait", is_flag=True, help="Fail at once if another run is writing one of the outputs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary table.")
@allow_address_option
@handle_errors
def run(spec: str, sets: tuple[str, ...], params_file: str | None, scheduler: str | None, gpus: str | None,
        backend: str | None, n_workers: int | None, summary_path: str | None, overwrite: bool, dry_run: bool,
        no_wait: bool, quiet: bool, allow_spec_address: bool, **tls: str | None) -> None:
    """Run the pipeline SPEC (a YAML file)."""
    signal.signal(signal.SIGTERM, _terminated)  # like Ctrl-C: staging removed, nothing moved into place
    overrides = _parse_sets(sets)
    console = _console()
    cluster = {"address": scheduler, "gpus": gpus, "backend": backend, "n_workers": n_workers, **tls}
    if dry_run:
        s = pipeline.validate(spec, overrides, params_file, overwrite=overwrite, cluster=cluster,
                              allow_spec_address=allow_spec_address)
        render_plan(pipeline.describe(pipeline.compile(s)), _console(stderr=False))
        click.echo("dry run: nothing was run or written")
        return

    def announce(session: Any) -> None:
        link = getattr(session, "dashboard_link", None)
        console.print(f"[bold]flowgpu[/] running {escape(spec)} on {getattr(session, 'backend', '?')} "
                      f"({getattr(session, 'n_workers', '?')} worker(s)); dashboard: {link or 'off'}")

    pipeline.run(spec, overrides=overrides, params_file=params_file, overwrite=overwrite,
                 summary_path=summary_path, cluster=cluster, console=console if not quiet else None,
                 progress=not quiet, on_session=announce, allow_spec_address=allow_spec_address,
                 wait=not no_wait)


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path())
@handle_errors
def clean(paths: tuple[str, ...]) -> None:
    """Finish what interrupted runs left at output PATHs (default: the current folder).

    A commit a run left half-done is completed or undone (every output of that run all new or all
    old), and the staging dirs of runs that no longer run are removed; a PATH that is a folder
    but not an output is cleaned of all of them. Runs still alive are left alone.
    """
    notes = atomic.clean(paths or (".",))
    for note in notes:
        click.echo(note)
    if not notes:
        click.echo("nothing to clean")


@cli.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@spec_options
@click.option("--overwrite", is_flag=True, help="Check the outputs as 'run --overwrite' would.")
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Check the spec as 'run --scheduler' would.")
@allow_address_option
@handle_errors
def validate(specs: tuple[str, ...], sets: tuple[str, ...], params_file: str | None, overwrite: bool,
             scheduler: str | None, allow_spec_address: bool) -> None:
    """Check spec files completely, refusing all that run would refuse before computing; runs nothing.

    Prints each callable a spec would import (and so run when it runs).
    """
    overrides = _parse_sets(sets)
    bad = 0
    for path in specs:
        try:
            _, imported = pipeline.imports(path, overrides, params_file, overwrite=overwrite,
                                           cluster={"address": scheduler}, allow_spec_address=allow_spec_address)
            click.echo(f"{path}: ok")
            for what, target in imported:
                click.echo(f"  imports {target} ({what}; runs when the spec runs)")
        except SpecError as e:
            bad += 1
            click.echo(f"error: {e}", err=True)
    if bad:
        sys.exit(EXIT_INVALID)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@handle_errors
def plan(spec: str, sets: tuple[str, ...], params_file: str | None, as_json: bool) -> None:
    """Show the steps of SPEC in order: shapes, dtypes, chunks, tasks, bytes, peak memory per worker."""
    desc = pipeline.describe(pipeline.compile(pipeline.load(spec, _parse_sets(sets), params_file)))
    if as_json:
        click.echo(json.dumps(desc, indent=2, default=str))
        return
    render_plan(desc, _console(stderr=False))


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print a table; every cell verbatim (docstrings hold '[lo, hi]', which rich would read as markup)."""
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*(escape(cell) for cell in row))
    _console(stderr=False).print(t)


def _options(entry: Entry) -> str:
    fields = entry.options.model_fields if entry.options is not None else {}
    return ", ".join(name if f.is_required() else f"{name}={f.default!r}" if f.default_factory is None
                     else f"{name}=..." for name, f in fields.items())


@cli.command()
def ops() -> None:
    """List the registered ops with their signatures."""
    rows = []
    for o in all_ops():
        try:
            sig = str(o.signature)
        except (TypeError, ValueError):
            sig = "(...)"
        rows.append((o.name, o.kind, sig, o.summary))
    _table("flowgpu ops", ("op", "kind", "signature", "summary"), rows)


@cli.command()
def sources() -> None:
    """List the registered sources (built in, registered in Python, or from plugins) with their options."""
    _table("flowgpu sources", ("source", "reads files", "options", "summary"),
           [(e.name, "yes" if e.has("reads_files") else "no", _options(e), e.summary) for e in SOURCES.entries()])


@cli.command()
def sinks() -> None:
    """List the registered sinks with their capabilities and options."""
    _table("flowgpu sinks", ("sink", "capabilities", "options", "summary"),
           [(e.name, ", ".join(sorted(e.capabilities)) or "-", _options(e), e.summary) for e in SINKS.entries()])


@cli.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write to a file.")
def schema(output: str | None) -> None:
    """Print the JSON schema of spec files (for yaml-language-server's $schema modeline)."""
    text = json.dumps(pipeline.json_schema(), indent=2) + "\n"
    if output:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as e:
            _fail(f"cannot write {output}: {e.strerror}", EXIT_FAILED)
    else:
        click.echo(text, nl=False)


def main() -> None:
    sys.exit(cli(standalone_mode=True))

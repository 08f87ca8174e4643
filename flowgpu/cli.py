"""The ``flowgpu`` command: a thin click layer over library functions.

Exit codes: 0 ok; 2 an invalid spec or argument (nothing ran, nothing was written); 1 a failure
while running.
"""

from __future__ import annotations

import functools
import json
import os
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
from flowgpu.io.sinks import SINKS
from flowgpu.io.sources import SOURCES
from flowgpu.ops import all_ops
from flowgpu.registry import Entry

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
    """--set and --params, shared by run, validate and plan."""
    func = click.option("--params", "params_file", type=click.Path(dir_okay=False),
                        help="YAML file of param values (name: value).")(func)
    func = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                        help="Set a value, e.g. params.n=1000 or cluster.n_workers=2 (repeatable).")(func)
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
              help="Join this scheduler (tcp://host:port or a scheduler file) instead of starting a cluster.")
@click.option("--gpus", default=None, metavar="0,1,...", help="GPU ordinals to use (one worker each).")
@click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default=None, help="Array backend.")
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None, help="Workers of a CPU cluster.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the run summary as JSON here.")
@click.option("--overwrite", is_flag=True, help="Replace output paths that hold data flowgpu did not write.")
@click.option("--dry-run", is_flag=True, help="Check and plan only; start no cluster, write nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary table.")
@handle_errors
def run(spec: str, sets: tuple[str, ...], params_file: str | None, scheduler: str | None, gpus: str | None,
        backend: str | None, n_workers: int | None, summary_path: str | None, overwrite: bool, dry_run: bool,
        quiet: bool) -> None:
    """Run the pipeline SPEC (a YAML file)."""
    overrides = _parse_sets(sets)
    console = _console()
    if dry_run:
        s = pipeline.load(spec, overrides, params_file)
        plan = pipeline.compile(s)
        pipeline.runner.check_outputs(s, overwrite)
        render_plan(pipeline.describe(plan), _console(stderr=False))
        click.echo("dry run: nothing was run or written")
        return
    cluster = {"address": scheduler, "gpus": gpus, "backend": backend, "n_workers": n_workers}

    def announce(session: Any) -> None:
        link = getattr(session, "dashboard_link", None)
        console.print(f"[bold]flowgpu[/] running {escape(spec)} on {getattr(session, 'backend', '?')} "
                      f"({getattr(session, 'n_workers', '?')} worker(s)); dashboard: {link or 'off'}")

    pipeline.run(spec, overrides=overrides, params_file=params_file, overwrite=overwrite,
                 summary_path=summary_path, cluster=cluster, console=console if not quiet else None,
                 progress=not quiet, on_session=announce)


@cli.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@spec_options
@handle_errors
def validate(specs: tuple[str, ...], sets: tuple[str, ...], params_file: str | None) -> None:
    """Check spec files completely (schema, references, includes, shapes, dtypes); runs nothing."""
    overrides = _parse_sets(sets)
    bad = 0
    for path in specs:
        try:
            pipeline.validate(path, overrides, params_file)
            click.echo(f"{path}: ok")
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

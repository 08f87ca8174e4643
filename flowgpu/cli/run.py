"""``flowgpu run``, ``validate``, ``plan`` and ``clean``: specs checked, planned, run, and cleaned up after."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any

import click
from rich.markup import escape

from flowgpu import pipeline
from flowgpu.cli.common import (EXIT_FAILED, EXIT_INVALID, _console, _parse_sets, allow_address_option,
                                cluster_kind_options, handle_errors, options, protocol_option,
                                scheduler_options, spec_options, worker_options)
from flowgpu.diagnostics import (events, jsontext, monitor, render_batch, render_plan, render_status,
                                 render_summary, stepgraph)
from flowgpu.errors import SpecError
from flowgpu.io import atomic
from flowgpu.pipeline.checks import check_side_files
from flowgpu.pipeline.foreach import parse_option
from flowgpu.registry import checking_only


def _results(data: dict, as_json: bool, render: Callable[[dict, Any], None]) -> None:
    """Results on stdout: JSON (for scripts: ``flowgpu run x.yaml --json | jq``) or the table."""
    if as_json:
        click.echo(jsontext.dumps(data, indent=2))
    else:
        render(data, _console(stderr=False))


def _parse_foreach(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in values:
        name, given = parse_option(text)
        if name in out:
            raise click.BadParameter(f"params.{name} is given twice", param_hint="--foreach")
        out[name] = given
    return out


foreach_option = click.option(  # run, status, validate and plan
    "--foreach", multiple=True, metavar="params.NAME=VALUES",
    help="Run once per value: a comma list (0,1,2), a glob of paths (data/*.npy) or a range (start:stop[:step]); "
         "several make a grid. Repeatable.")
foreach_options = options(  # shared by run and status
    foreach_option,
    click.option("--force", is_flag=True, help="Compute every output, up to date or not."),
    click.option("--checksum", is_flag=True, help="Tell changed input files by their content (a hash), not "
                                                  "only their size and modification time; a file whose bytes did "
                                                  "not change is recorded with its new ones, so checks without "
                                                  "--checksum agree."))


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@spec_options
@scheduler_options("Join this scheduler (tcp://host:port, tls://host:port or a scheduler file) instead of "
                   "starting a cluster.")
@worker_options
@protocol_option
@cluster_kind_options
@click.option("--standalone", is_flag=True,
              help="Start a cluster of its own even when one started by 'flowgpu cluster start' runs.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the run summary as JSON here.")
@click.option("--report", "report", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report of the run here (steps, memory, plots, dask's report).")
@click.option("--overwrite", is_flag=True, help="Replace output paths that hold data flowgpu did not write.")
@click.option("--dry-run", is_flag=True, help="Check and plan only; start no cluster, write nothing.")
@click.option("--no-wait", is_flag=True, help="Fail at once if another run is writing one of the outputs.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or notes on stderr (results still go to stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout instead of the table.")
@foreach_options
@click.option("--keep-going", is_flag=True, help="A failing batch item does not stop the others (exit code 1 if any "
                                                 "failed).")
@click.option("--no-cache", is_flag=True, help="Compute everything and record nothing (see flowgpu.cache.directory).")
@allow_address_option
@handle_errors
def run(spec: str, sets: tuple[str, ...], params_file: str | None, standalone: bool, summary_path: str | None,
        report: str | None, overwrite: bool, dry_run: bool, no_wait: bool, quiet: bool, as_json: bool,
        foreach: tuple[str, ...], force: bool, checksum: bool, keep_going: bool, no_cache: bool,
        allow_spec_address: bool, **cluster: Any) -> None:
    """Run the pipeline SPEC (a YAML file), or a batch of it (--foreach, or the spec's foreach: block).

    Outputs that are up to date (same recipe, same input files) are not computed again; --force
    computes them anyway. A cluster that stays up (flowgpu cluster start) is used when one runs.
    Results go to stdout (a table, or JSON with --json); progress and notes to stderr. Exit codes:
    0 every item ok, 1 a failure while running, 2 an invalid spec or argument, 130 interrupted (Ctrl-C;
    143 on SIGTERM), saying which outputs were moved into place and which were not.
    """
    signal.signal(signal.SIGTERM, _terminated)  # like Ctrl-C: staging removed, nothing moved into place
    # distributed's warning that the dashboard took another port (with its file and line): the run's own line
    # gives the dashboard's address, wherever it is
    warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
    overrides = _parse_sets(sets)
    batch = _parse_foreach(foreach)
    console = _console()
    cluster["standalone"] = standalone or None  # the scheduler, its PEM files and the options of the workers
    if dry_run:  # every item of a batch is checked
        s = pipeline.validate(spec, overrides, params_file, foreach=batch, overwrite=overwrite, cluster=cluster,
                              allow_spec_address=allow_spec_address)
        check_side_files(s, summary_path, report, overwrite, params_file)  # as the run would refuse them
        with checking_only():  # the spec's callables are checked in their source, never imported
            render_plan(pipeline.describe(pipeline.compile(s)), _console(stderr=False))
        items = len(pipeline.expand(s, batch))
        click.echo(f"dry run: {f'{items} batch items checked; ' if items > 1 else ''}nothing was run or written")
        return

    ended: list[dict] = []  # the summary of the run, failed or not

    def announce(event: events.Event) -> None:  # the run's subscriber: the dashboard link once the session is ready
        if isinstance(event, events.RunFinished):
            ended.append(event.summary)
        if isinstance(event, events.SessionReady) and not quiet:
            session, link = event.session, event.session.dashboard_link
            link = monitor.page_link(link) if link and monitor.install(session.client) else link  # the flowgpu page
            console.print(f"[bold]flowgpu[/] running {escape(spec)} on {session.backend} "
                          f"({session.n_workers} worker(s)); dashboard: {link or 'off'}")

    config = pipeline.RunConfig(overrides=overrides, params_file=params_file, overwrite=overwrite,
                                summary_path=summary_path, cluster=cluster, console=console if not quiet else None,
                                progress=not quiet, subscribers=(announce,), allow_spec_address=allow_spec_address,
                                wait=not no_wait, foreach=batch, keep_going=keep_going, force=force,
                                checksum=checksum, cache=not no_cache, report=report)
    try:
        result = pipeline.run(spec, config)
    except Exception:
        # a failed run's summary is a result too: --json gets it on stdout, a batch its table (the error: stderr)
        if ended and (as_json or "items" in ended[0]):
            _results(ended[0], as_json, render_batch)
        raise
    _results(result.summary, as_json, render_batch if isinstance(result, pipeline.BatchResult) else render_summary)
    if result.summary["status"] != "ok":
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@spec_options
@foreach_options
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@handle_errors
def status(spec: str, sets: tuple[str, ...], params_file: str | None, foreach: tuple[str, ...], force: bool,
           checksum: bool, as_json: bool) -> None:
    """Say what 'flowgpu run SPEC' would do, without running: which outputs are up to date, and why
    the others would be computed. Starts no cluster and calls no user code."""
    result = pipeline.status(spec, overrides=_parse_sets(sets), params_file=params_file,
                             foreach=_parse_foreach(foreach), checksum=checksum, force=force)
    _results(result, as_json, render_status)


def _terminated(signum: int, frame: Any) -> None:
    stop = KeyboardInterrupt()  # as Ctrl-C: staging removed, nothing half moved into place
    stop.exit_code = 128 + signum
    raise stop


@click.command()
@click.argument("paths", nargs=-1, type=click.Path())
@handle_errors
def clean(paths: tuple[str, ...]) -> None:
    """Finish what interrupted runs left at output PATHs (default: the current folder).

    A commit a run left half-done is completed or undone (every output of that run all new or all
    old), and the staging dirs of runs that no longer run are removed; a PATH that is a folder
    but not an output is cleaned of all of them. Runs still alive are left alone, and so is anything
    named like flowgpu's that flowgpu cannot tell it made (a copied or planted journal, your own
    folder): said on stderr, exit code 1.
    """
    notes = []
    for path in paths or (".",):
        found = atomic.clean([path])
        if not found and not os.path.lexists(path):  # a typo would say "nothing to clean"
            raise click.BadParameter(f"{path!r} does not exist, and no run left anything for it there",
                                     param_hint="PATHS")
        notes += found
    for note in notes:
        refused = isinstance(note, atomic.Refused)
        click.echo(f"error: {note}" if refused else note, err=refused)
    if not notes:
        click.echo("nothing to clean")
    if any(isinstance(n, atomic.Refused) for n in notes):
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@spec_options
@click.option("--overwrite", is_flag=True, help="Check the outputs as 'run --overwrite' would.")
@foreach_option
@scheduler_options("Check the spec as 'run --scheduler' would, and ask that cluster's workers whether they "
                   "see its inputs and can write its outputs' folders.")
@allow_address_option
@handle_errors
def validate(specs: tuple[str, ...], sets: tuple[str, ...], params_file: str | None, overwrite: bool,
             foreach: tuple[str, ...], allow_spec_address: bool, **cluster: str | None) -> None:
    """Check spec files completely, refusing all that run would refuse before computing (every item of a
    batch: --foreach, or the spec's foreach: block); runs nothing.

    Prints each callable a spec would import (and so run when it runs). With --scheduler, the workers
    there are asked whether they see each input and can write each output's folder (nothing is written).
    """
    overrides, batch = _parse_sets(sets), _parse_foreach(foreach)
    bad = 0
    for path in specs:
        try:
            _, imported = pipeline.imports(path, overrides, params_file, foreach=batch, overwrite=overwrite,
                                           cluster=cluster, allow_spec_address=allow_spec_address)
            click.echo(f"{path}: ok")
            for what, target in imported:
                click.echo(f"  imports {target} ({what}; runs when the spec runs)")
        except SpecError as e:
            bad += 1
            click.echo(f"error: {e}", err=True)
    if bad:
        sys.exit(EXIT_INVALID)


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@spec_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "dot", "svg"]), default="table",
              help="table (default), JSON, or the step graph as Graphviz dot text or an SVG picture.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (as --format json).")
@foreach_option
@scheduler_options("First ask this cluster's workers whether they see the inputs and can write the outputs' "
                   "folders (as validate --scheduler).")
@handle_errors
def plan(spec: str, sets: tuple[str, ...], params_file: str | None, fmt: str, as_json: bool,
         foreach: tuple[str, ...], **cluster: str | None) -> None:
    """Show the steps of SPEC in order: shapes, dtypes, chunks, tasks, bytes, peak memory per worker.

    Of a batch (--foreach, or the spec's foreach: block), every item is compiled and checked as run
    checks it, and the plan shown is the first item's.
    """
    batch = _parse_foreach(foreach)
    with checking_only():  # the spec's callables are checked in their source, never imported
        loaded = pipeline.load(spec, _parse_sets(sets), params_file, batch)
        items = pipeline.expand(loaded, batch)
        # taken output paths are run's and validate's to refuse: plan writes nothing
        plans = pipeline.plan_items(items, True, params_file) if len(items) > 1 else [pipeline.compile(loaded)]
        if cluster["address"] is not None:
            pipeline.validate(loaded, foreach=batch, cluster=cluster, allow_spec_address=True)
        desc = pipeline.describe(plans[0])
    if len(items) > 1:
        click.echo(f"plan of batch item 1 of {len(items)} ({items[0].label}); every item was checked", err=True)
    fmt = "json" if as_json else fmt
    if fmt == "json":
        click.echo(jsontext.dumps(desc, indent=2))
    elif fmt in ("dot", "svg"):
        graph = stepgraph.from_description(desc)
        click.echo(stepgraph.to_dot(graph) if fmt == "dot" else stepgraph.to_svg(graph), nl=False)
    else:
        render_plan(desc, _console(stderr=False))

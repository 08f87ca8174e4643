"""``flowgpu cluster start | status | stop``: a local cluster that stays up between runs
(:mod:`flowgpu.runtime.standing` does the work)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from flowgpu.cli.common import (EXIT_FAILED, EXIT_INVALID, _fail, handle_errors, protocol_option, session_option,
                                worker_options)
from flowgpu.diagnostics import jsontext, monitor, workers_line
from flowgpu.errors import ClusterRunningError
from flowgpu.runtime import standing
from flowgpu.runtime.session import Session


DASHBOARD_NOTE = ("note: the dashboard is plain HTTP with no login: any user of this host can read its pages (step "
                  "names, paths, errors){tls}. Start with --dashboard-address '' to turn it off")


@click.group()
def cluster() -> None:
    """A local cluster that stays up between runs: 'flowgpu run' uses it while it runs (and says so)."""


@cluster.command()
@worker_options
@session_option("--threads-per-worker", "threads-per-worker")
@session_option("--memory-limit", "memory-limit", metavar="SIZE", more=" For example 4GiB, 0.5 (of the machine), 0 (none).")
@click.option("--dashboard-address", default=None, metavar="ADDR",
              help="Where the dashboard listens (default 127.0.0.1:8787; '' turns it off).")
@click.option("--no-tls", is_flag=True,
              help="Plain TCP instead of TLS: then any process on this host, another user's too, can run code in it.")
@protocol_option
@handle_errors
def start(memory_limit: str | None, no_tls: bool, **options: Any) -> None:
    """Start a local cluster in the background and return once its workers are ready.

    It speaks TLS with credentials made for it, kept with its state in flowgpu.cluster.directory
    (~/.cache/flowgpu/cluster/HOST, readable by you only). Exit 2 if one is already running.
    """
    try:
        state = standing.start(tls=not no_tls, memory_limit=_number(memory_limit), **options)
    except ClusterRunningError as e:
        _fail(str(e), EXIT_INVALID)
    page = _install_page() if state["dashboard"] else None
    click.echo(f"cluster running at {state['address']}: {state['backend']}, {state['n_workers']} worker(s)")
    click.echo(f"dashboard: {page or state['dashboard'] or 'off'}")
    if state["dashboard"]:
        click.echo(DASHBOARD_NOTE.format(tls="" if no_tls else "; the scheduler itself speaks TLS"), err=True)
    click.echo("'flowgpu run' uses it until you stop it: flowgpu cluster stop")


def _install_page() -> str | None:
    """The flowgpu page on the new cluster's dashboard now, before any run (a run would add it too)."""
    joined = standing.session_kwargs()
    if joined is None:
        return None
    with Session(joined.pop("address", None), **joined) as s:
        return monitor.page_link(s.dashboard_link) if monitor.install(s.client) else None


def _number(text: str | None) -> str | float | None:
    """``0.5`` (a fraction of the machine) or ``0`` as a number, as the Session takes them; sizes stay strings."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return text


def _uptime(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m{s:02d}s" if hours else f"{m}m{s:02d}s"


@cluster.command()
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@handle_errors
def status(as_json: bool) -> None:
    """Say what runs: address, dashboard, backend, workers, uptime.

    Exit status: 0 a cluster is running (and its scheduler answers), 1 none is (or it does not answer).
    """
    state = standing.status()
    if state is None:
        click.echo("null" if as_json else "no cluster running")
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(jsontext.dumps(state, indent=2))
    else:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["started"]))
        plain = "UCX, no TLS" if str(state["address"]).startswith(("ucx://", "ucxx://")) else "plain TCP"
        click.echo(f"cluster running at {state['address']} ({'TLS' if state['tls'] else plain})")
        click.echo(f"dashboard: {monitor.page_link(state['dashboard']) or 'off'}")  # the page start printed
        now = "" if state["answers"] in (None, state["n_workers"]) else f", {state['answers']} connected now"
        click.echo(f"backend: {state['backend']}, workers: {state['n_workers']} x {state['threads_per_worker']} "
                   f"thread(s) (pids {', '.join(map(str, state['worker_pids']))}{now})")
        places = workers_line(state.get("places") or [])
        if places:
            click.echo(places)
        click.echo(f"up {_uptime(state['uptime'])} since {started} (daemon pid {state['daemon']['pid']}, "
                   f"flowgpu {state['flowgpu']}); log: {state['log']}")
    if state["answers"] is None:
        _fail(f"the scheduler at {state['address']} does not answer ({state['error']}); see {state['log']}, or "
              "'flowgpu cluster stop' and start again", EXIT_FAILED)


@cluster.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=standing.STOP_TIMEOUT, show_default=True,
              metavar="SECONDS", help="How long the workers may take to close before what is left is killed.")
@handle_errors
def stop(timeout: float) -> None:
    """Stop the cluster: its workers close, and every process of it is gone when this returns.

    Exit status: 0 stopped, 1 none was running.
    """
    state = standing.stop(timeout)
    if state is None:
        _fail("no cluster running; nothing to stop", EXIT_FAILED)
    click.echo(f"stopped the cluster at {state['address']} ({state['n_workers']} worker(s))")

"""What every ``flowgpu`` command shares: consoles, one-line errors and exit codes (see
:mod:`flowgpu.cli`), common options."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from flowgpu import config
from flowgpu.errors import BackendError, ConfigError, FlowgpuError, OpError, OutputExistsError, SpecError
from flowgpu.registry import trusting

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT


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
        except (SpecError, ConfigError, OpError, OutputExistsError, BackendError) as e:
            _fail(str(e), EXIT_INVALID)
        except FlowgpuError as e:
            _fail(str(e), EXIT_FAILED)
        except KeyboardInterrupt as e:  # 130 as Unix tools exit on Ctrl-C (143 on SIGTERM), one line
            _fail(getattr(e, "flowgpu_outcome", None) or "interrupted; no output was moved into place",
                  getattr(e, "exit_code", EXIT_INTERRUPTED))
        except BrokenPipeError:  # `flowgpu ... | head`: the reader has gone; say nothing more
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_FAILED)
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


def options(*decorators: Callable) -> Callable:
    """One decorator for several click options, listed as they would be stacked above a command."""

    def apply(func: Callable) -> Callable:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def session_option(flag: str, key: str, dest: str | None = None, *, metavar: str | None = None,
                   more: str = "") -> Callable:
    """The flag for the Session option ``key`` of flowgpu-schema.yaml, where it is declared once: its
    choices, its lower bound and its help come from there (``more`` adds to the help)."""
    schema = config.SCHEMA["properties"][key]
    kinds = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "enum" in schema:
        kind: Any = click.Choice([str(v) for v in schema["enum"]])
    elif "integer" in kinds:
        kind = click.IntRange(min=schema.get("minimum"))
    else:
        kind = None  # strings of a format ("4GiB", "0,1"): the Session parses and checks them
    names = (flag, dest) if dest else (flag,)
    return click.option(*names, type=kind, default=None, metavar=metavar,
                        help=(schema.get("description", "") + more).strip())


allow_address_option = click.option(
    "--allow-spec-address", is_flag=True,
    help="Let the spec's cluster.address (another scheduler) or a dashboard_address open to the network take "
         "effect; otherwise they are refused.")

# --tls-ca-file, --tls-cert and --tls-key (PEM files to join a tls:// scheduler with), as `dask scheduler` and
# `dask worker` name them; they reach the command as tls_ca_file, tls_cert and tls_key
tls_options = options(*(
    click.option(flag, type=click.Path(dir_okay=False), default=None, metavar="PEM",
                 help=f"Joining a tls:// --scheduler: the {what} (else dask's distributed.comm.tls.* "
                      "config).")
    for flag, what in (("--tls-ca-file", "CA certificate(s) of the cluster"),
                       ("--tls-cert", "certificate the cluster's CA signed, presented to the scheduler"),
                       ("--tls-key", "private key of --tls-cert, unless that file holds it"))))


def scheduler_options(text: str) -> Callable:
    """--scheduler ADDRESS (help: ``text``; it reaches the command as ``address``), and its PEM files."""
    return options(click.option("--scheduler", "address", default=None, metavar="ADDRESS", help=text),
                   tls_options)


def spec_options(command: Callable) -> Callable:
    """--set, --params and --trust, shared by run, validate and plan (--trust applies while the command
    runs)."""

    @functools.wraps(command)
    def trusted(*args: Any, trust: tuple[str, ...] = (), **kwargs: Any) -> Any:
        with trusting(trust):
            return command(*args, **kwargs)

    return options(
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Set a value, e.g. params.n=1000 or cluster.n_workers=2 (repeatable)."),
        click.option("--params", "params_file", type=click.Path(dir_okay=False),
                     help="YAML file of param values (name: value)."),
        click.option("--trust", "trust", multiple=True, metavar="MODULE",
                     help="Let the spec import callables from MODULE (and its submodules) only, with the "
                          "flowgpu.trusted-modules setting; repeatable. A spec's callables run when it "
                          "runs."))(trusted)


# --cluster KIND, --jobs N and --gpus-per-job G: workers in batch jobs through dask-jobqueue
# (flowgpu.runtime.hpc); they reach the command as kind, jobs and gpus_per_job
cluster_kind_options = options(
    session_option("--cluster", "kind", "kind",
                   more=" Queue, account, walltime, cores and memory come from dask-jobqueue's config "
                        "(~/.config/dask/jobqueue.yaml)."),
    session_option("--jobs", "jobs", metavar="N"),
    session_option("--gpus-per-job", "gpus-per-job", metavar="G", more=" On Slurm: --gres=gpu:G."))

# --protocol tcp|ucx, and --gpus, --backend and --workers, shared by run and cluster start
protocol_option = session_option("--protocol", "protocol", more=" No TLS with ucx.")
worker_options = options(session_option("--gpus", "gpus", metavar="0,1,..."),
                         session_option("--backend", "backend"),
                         session_option("--workers", "n-workers", "n_workers"))

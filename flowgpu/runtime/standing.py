"""A local cluster that stays up between runs: ``flowgpu cluster start``, ``status``, ``stop``.

:func:`start` spawns a detached daemon (:mod:`flowgpu.runtime.daemon`) that opens a Session and
records it in ``flowgpu.cluster.directory`` (default ``~/.cache/flowgpu/cluster/HOST``, mode 0700):
``cluster.json`` (address, pids, version; also a dask scheduler file), the TLS files a client joins
with (0600; only their user can run code in the cluster), ``cluster.log`` and ``cluster.lock``
(one daemon per folder). Workers never outlive the daemon, even a ``kill -9`` of it: each watches a
pipe only the daemon holds (distributed's nanny); :func:`stop` also kills any recorded worker left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
from distributed import Client
from distributed.security import Security

from flowgpu import __version__, config
from flowgpu.errors import ClusterError, ClusterRunningError, ConfigError
from flowgpu.io import lock
from flowgpu.io.atomic import write_text
from flowgpu.runtime import probe, security
from flowgpu.runtime.options import resolve

__all__ = ["CREDENTIALS", "directory", "join", "session_kwargs", "start", "status", "stop"]

STATE, LOG, LOCK = "cluster.json", "cluster.log", "cluster.lock"
# Session keyword -> file of the credentials a client joins with (the cluster's CA and a certificate it signed)
CREDENTIALS = {"tls_ca_file": "tls-ca.pem", "tls_cert": "tls-cert.pem", "tls_key": "tls-key.pem"}
DAEMON = "flowgpu.runtime.daemon"
START_TIMEOUT = 120.0  # seconds for the workers to start (dask-cuda on 8 GPUs takes tens of seconds)
STOP_TIMEOUT = 30.0  # seconds for a clean close before what is left is killed
STANDALONE_HINT = "--standalone for a cluster of its own"

Notify = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the folder -----------------------------------------------------------------------------------
def directory(create: bool = False) -> str:
    """The standing cluster's folder; refused when another user could write there (a planted state
    would send runs to their scheduler)."""
    configured = config.get("cluster.directory", default=None)
    if configured:
        path = os.path.abspath(os.path.expanduser(str(configured)))
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(cache, "flowgpu", "cluster", socket.gethostname())
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    if os.path.isdir(path):
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            whose = "is owned by another user" if st.st_uid != os.getuid() else f"is open to others (mode {st.st_mode & 0o777:o})"
            raise ConfigError(f"the cluster folder {path} {whose}; it holds the address and TLS key of a cluster that "
                              "stays up, so only you may open it: chmod 700 it, or set flowgpu.cluster.directory "
                              "(DASK_FLOWGPU__CLUSTER__DIRECTORY) to a folder of your own")
    return path


def make_credentials(folder: str) -> Security:
    """TLS credentials made for a new cluster, also written (0600) into ``folder`` for clients."""
    made = security.for_local("temporary")
    pems = {"tls_ca_file": made.tls_ca_file, "tls_cert": made.tls_client_cert, "tls_key": made.tls_client_key}
    for key, name in CREDENTIALS.items():
        write_text(os.path.join(folder, name), pems[key])
    return made


def record(folder: str, state: dict) -> None:
    write_text(os.path.join(folder, STATE), json.dumps(state, indent=2, default=str))


def forget(folder: str) -> None:
    """Remove the state and the credentials (the log stays, for what happened)."""
    for name in (STATE, *CREDENTIALS.values()):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))


def _read(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, STATE), encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: a state no daemon can own, removed as stale
    return state if isinstance(state, dict) else {}


# -- processes ------------------------------------------------------------------------------------
def _runs(p: psutil.Process) -> bool:
    """Whether ``p`` runs (not a zombie; one this process started is reaped here)."""
    with contextlib.suppress(psutil.Error):
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
            return True
        p.wait(timeout=0)
    return False


def _process(rec: Any) -> psutil.Process | None:
    """The process of an :func:`flowgpu.io.lock.owner` record, if that very process still runs."""
    if not lock.alive(rec):
        return None
    try:
        p = psutil.Process(int(rec["pid"]))
    except psutil.Error:
        return None
    return p if _runs(p) else None


def _processes(state: dict) -> list[psutil.Process]:
    """The daemon (first, when alive), every process below it now, and every recorded worker still there."""
    found: dict[int, psutil.Process] = {}
    daemon = _process(state.get("daemon"))
    if daemon is not None:
        found[daemon.pid] = daemon
        with contextlib.suppress(psutil.Error):
            found.update((p.pid, p) for p in daemon.children(recursive=True))
    for rec in (state.get("workers") or {}).values():
        p = _process(rec)
        if p is not None:
            found.setdefault(p.pid, p)
    return list(found.values())


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in procs if _runs(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _end(procs: list[psutil.Process], timeout: float, notify: Notify | None) -> None:
    """Wait up to ``timeout`` s for ``procs`` to exit, then kill what is left."""
    left = _wait_gone(procs, timeout)
    if not left:
        return
    if notify:
        notify(f"pid(s) {', '.join(str(p.pid) for p in left)} did not exit within {timeout:g}s; killing them")
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    left = _wait_gone(left, 10)
    if left:
        raise ClusterError(f"pid(s) {', '.join(str(p.pid) for p in left)} would not die after SIGKILL; "
                           "see 'ps -o pid,stat,cmd -p PID' (a process in state D waits on a device or disk)")


def _stale(folder: str, state: dict, notify: Notify | None) -> None:
    left = _processes(state)  # the daemon is gone: only workers that outlived it, if any
    if left:
        _end(left, 0, None)
    forget(folder)
    if notify:
        pid = (state.get("daemon") or {}).get("pid", "?")
        killed = f", and killed {len(left)} process(es) it left" if left else ""
        notify(f"the cluster at {state.get('address', '?')} is no longer running (daemon pid {pid} is gone); removed "
               f"its state{killed}; its log: {os.path.join(folder, LOG)}")


def _running(folder: str, notify: Notify | None) -> dict | None:
    """The state of a cluster whose daemon runs, or None (a stale state is removed, and said)."""
    state = _read(folder)
    if state is None:
        return None
    if _process(state.get("daemon")) is None:
        _stale(folder, state, notify)
        return None
    return state


# -- the commands ---------------------------------------------------------------------------------
def start(*, tls: bool = True, timeout: float = START_TIMEOUT, notify: Notify | None = _say, **options: Any) -> dict:
    """Start a cluster that stays up, in the background; its state once its workers are ready.

    ``options``: Session keywords for a local cluster (None: configured), checked before anything
    starts. ``tls=False``: plain TCP, which any local process can join. :class:`ClusterRunningError`
    while one runs.
    """
    folder = directory(create=True)
    running = _running(folder, notify)
    if running is not None:
        raise ClusterRunningError(
            f"a cluster is already running at {running['address']} (daemon pid {running['daemon']['pid']}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(running['started']))}); 'flowgpu run' uses it as "
            "it is; to start another, stop it first: flowgpu cluster stop")
    options = {k: v for k, v in options.items() if v is not None}
    if tls and config.get("protocol", options.get("protocol")) == "ucx":
        raise ConfigError("--protocol ucx: distributed's UCX comm has no TLS, and a cluster that stays up speaks TLS "
                          "unless told not to; add --no-tls (then any process on this host can connect to it), or "
                          "use --protocol tcp")
    if resolve(None, security="none", **options).address is not None:  # every check before anything starts
        raise ConfigError("flowgpu.scheduler-address is set, but a cluster that stays up is a local one; unset it "
                          "(DASK_FLOWGPU__SCHEDULER_ADDRESS) for 'flowgpu cluster start'")
    log_path = os.path.join(folder, LOG)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    offset = os.lseek(log_fd, 0, os.SEEK_END)
    env = dict(os.environ)  # the daemon imports this flowgpu, from a working directory of its own
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.Popen([sys.executable, "-m", DAEMON, folder, json.dumps({"tls": tls, "options": options})],
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd=os.sep, env=env,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(log_fd)
    if notify:
        notify(f"starting a cluster that stays up (daemon pid {proc.pid}, log {log_path}) ...")
    return _wait_ready(folder, proc, timeout, log_path, offset)


def _last_error(log_path: str, offset: int) -> str | None:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            lines = [line.strip() for line in f if line.startswith("error: ")]
    except OSError:
        return None
    return lines[-1][len("error: "):] if lines else None


def _wait_ready(folder: str, proc: subprocess.Popen, timeout: float, log_path: str, offset: int) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        state = _read(folder)
        if state and (state.get("daemon") or {}).get("pid") == proc.pid:
            return state
        if code is not None:
            said = _last_error(log_path, offset)
            if code == 2 and said:
                raise ClusterRunningError(said)
            raise ClusterError(f"the cluster did not start: {said or f'its process exited with status {code}'}; "
                               f"its log: {log_path}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # the daemon and its workers: a process group of their own
            proc.wait()
            raise ClusterError(f"the cluster was not ready after {timeout:g}s and was stopped; its log: {log_path}")
        time.sleep(0.1)


def _ask(state: dict, timeout: float = 5.0) -> tuple[int | None, str | None]:
    """How many workers the scheduler has, or why it does not answer."""
    creds = state.get("tls")  # Session keywords -> the cluster's TLS files; None: plain TCP
    sec = (Security(tls_ca_file=creds["tls_ca_file"], tls_client_cert=creds["tls_cert"],
                    tls_client_key=creds["tls_key"], require_encryption=True) if creds else None)
    try:
        with Client(state["address"], security=sec, timeout=timeout, set_as_default=False) as client:
            return len(client.scheduler_info(n_workers=-1)["workers"]), None
    except Exception as e:  # noqa: BLE001 - any failure to answer is what status reports
        return None, f"{type(e).__name__}: {e}"


def status(check: bool = True, notify: Notify | None = _say) -> dict | None:
    """The running standing cluster's state (``uptime`` in seconds), or None; a stale state is
    removed and said. ``check`` also asks the scheduler: ``answers`` workers (None: ``error`` says why).
    """
    state = _running(directory(), notify)
    if state is None:
        return None
    state = dict(state, uptime=time.time() - float(state["started"]))
    if check:
        state["answers"], state["error"] = _ask(state)
    return state


def stop(timeout: float = STOP_TIMEOUT, notify: Notify | None = _say) -> dict | None:
    """SIGTERM the daemon (it closes the Session), kill what is left after ``timeout`` s, remove the
    state; the state stopped, or None when none ran."""
    folder = directory()
    state = _running(folder, notify)
    if state is None:
        return None
    procs = _processes(state)
    with contextlib.suppress(psutil.NoSuchProcess):
        procs[0].send_signal(signal.SIGTERM)
    _end(procs, timeout, notify)
    forget(folder)  # the daemon removes them too; not when it was killed
    return state


def join(wanted: dict[str, Any] | None = None, notify: Notify | None = _say) -> tuple[dict, str] | None:
    """Session keywords to join the running standing cluster, and the line that says so (naming
    what of ``wanted``, the run's cluster options, it lacks); None when none runs, or when ``wanted``
    or the config names a scheduler, TLS files or batch jobs of its own.
    """
    wanted = {k: v for k, v in (wanted or {}).items() if v is not None}
    own = wanted.keys() & {"address", *security.TLS_FILES}  # a scheduler of its own, or its TLS files
    if (own or config.get("scheduler-address", default=None) is not None
            or wanted.get("kind", config.get("kind", default="local")) != "local"):
        return None
    state = _running(directory(), notify)
    if state is None:
        return None
    kwargs = {"address": state["address"], **(state.get("tls") or {})}
    kwargs.update((k, wanted[k]) for k in ("connect_timeout", "batch_interval") if k in wanted)
    if wanted.get("backend") == "cpu":
        kwargs["backend"] = "cpu"  # NumPy chunks, on GPU workers too
    unmet = _unmet(state, wanted)
    lacks = f"; not the {', '.join(unmet)} asked for" if unmet else ""
    if state.get("flowgpu") != __version__:
        lacks += f"; it runs flowgpu {state.get('flowgpu')}, this is {__version__}"
    line = (f"using the running cluster at {state['address']} (flowgpu cluster start; {state['backend']}, "
            f"{state['n_workers']} worker(s){lacks}); {STANDALONE_HINT}")
    return kwargs, line


def session_kwargs() -> dict | None:
    """Session keywords to join the running cluster that stays up (address and TLS files), or None."""
    joined = join(notify=None)
    return joined[0] if joined else None


# the options a local cluster is started with, which a Session joining it cannot change
STARTED_WITH = ("n_workers", "threads_per_worker", "memory_limit", "device_memory_limit", "rmm_pool_size",
                "local_directory", "dashboard_address")


def unmet(wanted: dict[str, Any]) -> list[str]:
    """``key=value`` of each option in ``wanted`` the running cluster was not started with ([]: none runs)."""
    state = _read(directory())
    return _unmet(state, {k: v for k, v in wanted.items() if v is not None}) if state else []


def _unmet(state: dict, wanted: dict) -> list[str]:
    """``key=value`` of each option in ``wanted`` the running cluster was not started with."""
    have = {"protocol": "tcp", **(state.get("options") or {}), "n_workers": state.get("n_workers"),
            "threads_per_worker": state.get("threads_per_worker")}
    unmet = []
    for key, value in wanted.items():
        if key == "backend":
            if value == "gpu" and state.get("backend") != "gpu":
                unmet.append(f"backend={value}")
        elif key == "gpus":
            if list(config.parse_gpus(value)) != list(state.get("gpus") or []):
                unmet.append(f"gpus={','.join(map(str, config.parse_gpus(value)))}")
        elif key in (*STARTED_WITH, "protocol") and have.get(key) != value:
            unmet.append(f"{key}={value}")
    return unmet


def describe(session: Any, given: dict, folder: str) -> dict:
    """The state of a cluster the daemon started: what :func:`status` returns and clients join with."""
    workers = session.client.run(lock.owner)
    return {
        "address": session.client.scheduler.address,
        "dashboard": session.dashboard_link,
        "backend": session.backend,
        "n_workers": session.n_workers,
        "threads_per_worker": session.threads_per_worker,
        "gpus": list(session.options.gpus),
        "daemon": lock.owner(),
        "workers": workers,
        "worker_pids": sorted(w["pid"] for w in workers.values()),
        "places": probe.where(session.workers),  # each worker's host and working directory
        "started": time.time(),
        "flowgpu": __version__,
        "tls": {k: os.path.join(folder, name) for k, name in CREDENTIALS.items()} if given["tls"] else None,
        "log": os.path.join(folder, LOG),
        "options": given["options"],
    }

"""``flowgpu.Session``: the one place a cluster is started (LocalCUDACluster on GPUs, LocalCluster
otherwise, batch jobs) or joined (an address, a scheduler file, a cluster object).

While open it publishes in dask.config what the layers below read (array code never imports the
runtime): ``array.backend``, ``flowgpu.worker.budget`` / ``flowgpu.worker.threads`` (they size
``chunks="auto"``) and dask's ``array_optimize`` hook (fusion); closing puts back what was there.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import difflib
import inspect
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import dask.config
import psutil
from distributed import Client, LocalCluster, Nanny, Worker
from distributed import client as distributed_client
from distributed.core import Status

from flowgpu import backend as _backend
from flowgpu.backend import Facts
from flowgpu import memory
from flowgpu.errors import BackendError, ClusterError, ConfigError, FlowgpuError, SessionError
from flowgpu.fusion.classic import require_classic_graphs
from flowgpu.fusion.graph import CONFIG_KEY as FUSE_KEY
from flowgpu.fusion.graph import Fusing
from flowgpu.runtime import hpc, latency, nohttp, probe, security, standing
from flowgpu.runtime.options import SessionOptions, resolve

__all__ = ["Session", "current_session"]

_lock = threading.Lock()
_stack: list["Session"] = []


GUARD = ("a script that starts a Session needs an 'if __name__ == \"__main__\":' guard around it: each worker "
         "process imports the script again, and without the guard starts another Session there")


def main_unguarded() -> bool:
    """Whether the main script lacks a top-level ``if __name__ == "__main__":`` (spawned workers rerun it)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    spawns = dask.config.get("distributed.worker.multiprocessing-method", default="spawn") != "fork"
    if not spawns or not path or not str(path).endswith(".py"):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return False
    return not any(isinstance(n, ast.If) and "'__name__'" in ast.dump(n.test) for n in body)


def _said_by_the_run(record: logging.LogRecord) -> bool:
    """Drop what a run says in its own words: asyncio's 'Task exception was never retrieved' for the
    ``AllExit`` that a gather interrupted by Ctrl-C leaves (it says what was and was not written), and
    distributed's 'Failed to reconnect to scheduler' (it says the cluster went away: runsession.cluster_gone)."""
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, getattr(distributed_client, "AllExit", ()))
                or str(record.msg).startswith("Failed to reconnect to scheduler"))


def current_session() -> "Session | None":
    """The most recently started Session that is still open, or None."""
    with _lock:
        return _stack[-1] if _stack else None


@contextlib.contextmanager
def terminal_interrupts_ignored():
    """SIGINT ignored while a local cluster spawns, so its processes inherit that: a terminal's Ctrl-C
    reaches the whole process group, and only the client should hear it (and close the workers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextlib.contextmanager
def spawn_environ(values: dict[str, str]):
    """``values`` in this process's environment while a cluster spawns, then restored: the nanny
    writes pre-spawn-environ into ``os.environ`` and leaves it, so it leaked into later Sessions."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_STARTS_ONLY = {*standing.STARTED_WITH, "gpus", "host"}  # only for a cluster the Session starts


def _check_keywords(extra: dict, cluster: type) -> None:
    """Refuse a keyword no cluster, nanny or worker takes (``nworkers``) before it fails every nanny."""
    known = {name for c in (cluster, LocalCluster, Nanny, Worker) for name in inspect.signature(c.__init__).parameters}
    for name in extra:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known | set(SessionOptions.__dataclass_fields__)), n=1)
            raise ConfigError(f"Session got an unknown keyword {name!r}" + (f"; did you mean {close[0]!r}?" if close
                                                                           else "; see help(flowgpu.Session)"))


class Session:
    """Start or join a Dask cluster and own its client.

    Parameters
    ----------
    address : join the scheduler at ``tcp://host:port`` (or a scheduler file) instead of starting one;
        ``tls://`` needs ``tls_ca_file``, ``tls_cert`` and ``tls_key``, or dask's ``distributed.comm.tls.*``.
    cluster : a cluster object of the caller's to join (the caller closes it).
    backend : ``"auto"`` (GPU when there is one), ``"gpu"`` or ``"cpu"``.
    gpus : GPU ordinals to use (default: all visible GPUs), one worker each.
    n_workers, threads_per_worker, memory_limit, device_memory_limit, local_directory, rmm_pool_size,
        host, dashboard_address : for the local cluster.
    connect_timeout : how long to try to reach ``address``.
    security : for a cluster the Session starts: ``"temporary"`` (TLS credentials held by this
        Session only), ``"none"``/``"auto"`` (plain TCP), or a ``distributed.security.Security``.
    batch_interval : how long distributed may hold control messages to batch them (``"1ms"``).
    protocol : ``"tcp"`` or ``"ucx"`` (GPU workers, chunks move GPU to GPU; no TLS).
    fuse : fuse the ufunc chains (and the reductions they feed) of every dask.array graph computed
        while open; None takes ``flowgpu.fuse-ufuncs``.

    Each is a top-level option of ``flowgpu.yaml`` (``memory_limit`` is ``flowgpu.memory-limit``),
    checked against its schema before anything starts; None takes the configured value. Other
    keywords go to the cluster's constructor. :meth:`running` joins ``flowgpu cluster start``'s cluster.

    Examples
    --------
    >>> import flowgpu as fg
    >>> with fg.Session(backend="cpu", n_workers=1, dashboard_address=None) as s:  # doctest: +SKIP
    ...     x = fg.random((1000, 1000), seed=0)
    ...     float(x.sum().compute())
    """

    def __init__(self, address: str | None = None, *, cluster: Any = None, **kwargs: Any):
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # a spawned worker importing the main script again: say why once (the parent says it too)
            raise SystemExit(f"error: in a worker process: {GUARD}")
        require_classic_graphs()
        fuse = kwargs.pop("fuse", None)
        if fuse is not None and not isinstance(fuse, bool):
            raise ConfigError(f"fuse={fuse!r}: give True, False or None (flowgpu.fuse-ufuncs)")
        if cluster is not None and (address is not None or kwargs.get("kind") not in (None, "local")):
            raise ConfigError("give one of address=, cluster= and kind=: each says which cluster to use")
        self.options: SessionOptions = resolve(address, **kwargs)
        if (cluster is not None or self.options.address is not None) and self.options.extra:
            name = next(iter(self.options.extra))  # only a cluster the Session starts takes such keywords
            raise ConfigError(f"Session got keyword {name!r}, which no Session joining a cluster takes (it is for "
                              "a cluster the Session starts); leave it out")
        self.cluster = None  # a cluster this Session started, closed with it
        self.given = cluster  # a cluster object the caller made (and closes)
        self.client: Client | None = None
        self._published: list = []  # dask.config.set contexts, undone in reverse order on close
        self._closed = False
        self.workers: dict[str, dict] = {}
        for logger in ("asyncio", "distributed.client"):
            logging.getLogger(logger).addFilter(_said_by_the_run)  # once: the same filter object
        try:
            if cluster is not None or self.options.address is not None:
                self._join(cluster)
            elif self.options.kind != "local":
                self._start_jobs()
            else:
                self._start_local()
        except BaseException as e:
            self._teardown()
            if isinstance(e, FlowgpuError) or not isinstance(e, Exception):
                raise
            if self.options.address is None and main_unguarded():
                raise SessionError(f"could not start the local workers: {GUARD}") from None
            where = (self.options.address or (f"{type(cluster).__name__} {getattr(cluster, 'scheduler_address', '')}"
                                              if cluster is not None else None)
                     or f"{self.options.host} ({self.options.backend})")
            raise SessionError(f"could not start or join the cluster at {where}: {e.__class__.__name__}: {e}; "
                               "check host, ports and memory options") from e
        self.fuse = bool(dask.config.get(FUSE_KEY, True) if fuse is None else fuse)
        gpu = self.array_backend == "cupy"  # host NumPy operands of CuPy chunks move to the device (fusion.device)
        if self.fuse:  # dask optimises graphs in the client's process, where compute() is called
            self._publish({"array_optimize": Fusing(enabled=True, bare=gpu, device=gpu), FUSE_KEY: True})
        elif gpu:
            self._publish({"array_optimize": Fusing(enabled=False, device=True)})
        with _lock:
            _stack.append(self)

    # -- starting -------------------------------------------------------------------------------
    def _publish(self, settings: dict) -> None:
        """Set ``settings`` in dask.config until the session closes."""
        self._published.append(dask.config.set(settings))

    def _set_array_backend(self, name: str) -> None:
        self.array_backend = name
        self._publish({"array.backend": name})

    def _publish_workers(self) -> None:
        """Publish what chunk sizing needs to know about the probed workers."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        self.threads_per_worker = min((w.get("nthreads", 1) for w in info.values()), default=1)
        self._publish({"flowgpu.worker.budget": self.worker_budget,
                       "flowgpu.worker.threads": self.threads_per_worker})

    def _start_local(self) -> None:
        o = self.options
        spill_kwargs = {} if "data" in o.extra else memory.worker_data_kwargs(o)
        extra, http = dict(o.extra), {}
        if not o.dashboard_address:  # distributed serves HTTP pages even then: none at all (runtime/nohttp.py)
            extra["scheduler_kwargs"], http = {**nohttp.SCHEDULER, **extra.get("scheduler_kwargs", {})}, nohttp.ROUTES
        common = dict(
            threads_per_worker=o.threads_per_worker,
            memory_limit=o.memory_limit,
            local_directory=o.local_directory,
            host=o.host,
            dashboard_address=o.dashboard_address or None,
            scheduler_port=0,
            # the client reports each task failure in one line; the workers' logs would repeat it
            silence_logs=logging.CRITICAL,
            **({"security": o.security} if o.security is not None else {}),  # TLS: the client takes it from the cluster
            **extra,
        )
        if o.backend == "gpu":
            self._set_array_backend("cupy")  # before the workers start: the nanny passes config on
            from dask_cuda import LocalCUDACluster  # noqa: PLC0415 - GPU-only import

            _check_keywords(o.extra, LocalCUDACluster)

            visible = _backend.physical_devices()
            devices = [visible[g] for g in o.gpus]
            gpu_kwargs: dict[str, Any] = dict(CUDA_VISIBLE_DEVICES=",".join(devices), n_workers=len(devices))
            if o.device_memory_limit not in (None, "default"):
                gpu_kwargs["device_memory_limit"] = o.device_memory_limit
            if o.protocol == "ucx":  # UCX picks the transports (NVLink, PCIe peer to peer): dask-cuda's automatic way
                gpu_kwargs["protocol"] = "ucx"
            if o.rmm_pool_size:
                gpu_kwargs["rmm_pool_size"] = o.rmm_pool_size
                gpu_kwargs["rmm_allocator_external_lib_list"] = ["cupy"]
            env = memory.worker_environ(o)
            spill_env = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in env.items()}
            with dask.config.set({**spill_env, **http}), spawn_environ(env), terminal_interrupts_ignored():
                self.cluster = LocalCUDACluster(**gpu_kwargs, **spill_kwargs, **common)
        else:
            _check_keywords(o.extra, LocalCluster)
            self._set_array_backend("numpy")
            with dask.config.set(http), terminal_interrupts_ignored():
                self.cluster = LocalCluster(n_workers=o.n_workers, processes=True, **spill_kwargs, **common)
        self.client = Client(self.cluster, set_as_default=True)
        expected = len(self.cluster.worker_spec)
        try:
            self.client.wait_for_workers(expected, timeout=60)
        except TimeoutError:
            got = len(self.client.scheduler_info(n_workers=-1)["workers"])
            raise SessionError(f"only {got} of {expected} local workers started; a script that starts a Session "
                               "needs an 'if __name__ == \"__main__\":' guard, and the workers' log above says why "
                               "they failed") from None
        if http:
            nohttp.install(self.client)
        if spill_kwargs:
            memory.install(self.client, o)
        latency.tune(self.client, o.batch_interval, cluster=True)
        self.backend = o.backend
        self.workers = probe.ask_workers(self.client)
        self._publish_workers()

    def _start_jobs(self) -> None:
        """A cluster of batch jobs (:mod:`flowgpu.runtime.hpc`), owned by this Session, then joined."""
        o = self.options
        extra = dict(o.extra)
        if o.host:
            extra.setdefault("scheduler_options", {"host": o.host, "dashboard_address": o.dashboard_address or None})
        self.cluster = hpc.make(o.kind, jobs=o.jobs, gpus_per_job=o.gpus_per_job, gpu=o.backend == "gpu",
                                threads_per_worker=o.threads_per_worker,
                                memory_limit=o.memory_limit, local_directory=o.local_directory,
                                dashboard_address=o.dashboard_address, security=o.security, **extra)
        self._join(self.cluster, timeout=o.job_timeout, expected=hpc.workers_expected(self.cluster),
                   hint=f"the {o.kind} jobs did not start a worker within {o.job_timeout:g}s: see the queue (squeue, "
                        "qstat, bjobs) and the jobs' logs, or raise flowgpu.job-timeout")

    def _join(self, cluster: Any = None, timeout: float | None = None, hint: str | None = None,
              expected: int = 1) -> None:
        """Use workers started elsewhere (an address, or a cluster object: up to ``timeout`` for
        ``expected`` workers, at least one); the array backend follows what they have."""
        o = self.options
        if cluster is not None:
            self.client = Client(cluster, set_as_default=True)
        else:
            where = {"scheduler_file": o.address} if security.is_scheduler_file(o.address) else {"address": o.address}
            try:
                self.client = Client(**where, security=o.security, timeout=o.connect_timeout, set_as_default=True)
            except (OSError, TimeoutError) as e:
                tls = ", and that its CA signed the TLS certificate given" if o.security is not None else ""
                raise SessionError(
                    f"could not reach the scheduler at {o.address} within {o.connect_timeout:g}s "
                    f"({e.__class__.__name__}); check the address and that the scheduler is running{tls}, "
                    "or raise connect_timeout") from None
        where = o.address or self.client.scheduler.address
        try:
            self.client.wait_for_workers(expected, timeout=timeout or o.connect_timeout)
        except TimeoutError:
            have = len(self.client.scheduler_info(n_workers=-1)["workers"])
            if not have:
                raise SessionError(hint or (
                    f"the scheduler at {where} has no workers after {o.connect_timeout:g}s; start some, e.g. "
                    f"'dask cuda worker {where}' or 'dask worker {where}'")) from None
            warnings.warn(f"{have} of the {expected} workers asked for are up after {timeout:g}s; carrying on with "
                          "them (the others join when their jobs start)", stacklevel=3)
        latency.tune(self.client, o.batch_interval, cluster=False)  # the scheduler and workers are not ours to retune
        self.workers = probe.ask_workers(self.client)
        all_gpu = all(w["gpus"] > 0 and w["cupy"] for w in self.workers.values())
        if o.backend == "gpu" and not all_gpu:
            raise BackendError(f"backend='gpu' but not every worker of {where} has a GPU and CuPy")
        use_gpu = all_gpu and o.backend != "cpu"
        if use_gpu and _backend.import_cupy(strict=False) is None:
            warnings.warn("the cluster's workers have GPUs but this client has no CuPy, so flowgpu builds NumPy "
                          "arrays; " + _backend.INSTALL_HINT, stacklevel=3)
            use_gpu = False
        name = "cupy" if use_gpu else "numpy"
        self._set_array_backend(name)
        self.client.run(probe.set_array_backend, name)
        self.backend = "gpu" if use_gpu else "cpu"
        self._publish_workers()

    @classmethod
    def running(cls, **kwargs: Any) -> "Session":
        """A Session joined to the cluster ``flowgpu cluster start`` left running (its address and TLS
        files), as ``flowgpu run`` joins it; :class:`ClusterError` when none runs."""
        joined = standing.session_kwargs()
        if joined is None:
            raise ClusterError(f"no cluster started with 'flowgpu cluster start' is running (looked in "
                               f"{standing.directory()}); start one with 'flowgpu cluster start', or use "
                               "fg.Session() for a cluster of this Session's own")
        if unmet := standing.unmet(kwargs):  # used as it is, as `flowgpu run` uses it: say what it is not
            warnings.warn(f"the running cluster at {joined['address']} was not started with {', '.join(unmet)}; "
                          "it is used as it is (flowgpu cluster stop, then start it so)", stacklevel=2)
        return cls(**{**joined, **{k: v for k, v in kwargs.items() if k not in _STARTS_ONLY}})

    # -- facts ------------------------------------------------------------------------------------
    @property
    def may_serve_dashboard(self) -> bool:
        """False when no dashboard can be open; known without asking the scheduler."""
        return self.client is not None and (self.cluster is None or bool(self.options.dashboard_address))

    @property
    def dashboard_link(self) -> str | None:
        """URL of the Dask dashboard, or None when it is off."""
        if not self.may_serve_dashboard:
            return None  # the scheduler still serves /health and metrics over HTTP, but no dashboard
        try:
            info = self.client.scheduler_info()
            if "dashboard" not in info.get("services", {}):
                return None
            # dask's link names the scheduler's host; say where the dashboard listens (0.0.0.0: open)
            hosts = self.client.run_on_scheduler(_dashboard_hosts)
            if hosts is None:  # a joined scheduler whose dashboard is off: its link would be a 404
                return None
            link = urlsplit(self.client.dashboard_link)
            if not hosts or link.hostname in hosts:
                return link.geturl()
            host = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
            return link._replace(netloc=f"{host}:{link.port}" if link.port else host).geturl()
        except Exception:
            return None

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    @property
    def worker_budget(self) -> int:
        """Bytes one worker can hold for chunks: device memory on GPU workers, host memory on CPU."""
        return worker_budget(self.workers, self.backend)

    @property
    def facts(self) -> Facts:
        """What a graph for these workers is built with (a pipeline is compiled with them)."""
        return Facts(self.array_backend, self.worker_budget, self.threads_per_worker)

    def memory_summary(self) -> dict | None:
        """The workers' store accounting summed (:func:`flowgpu.memory.summary`); None when not every
        worker keeps its data in flowgpu's store, or one cannot answer."""
        return self.memory_summary_soon()()

    def memory_summary_soon(self) -> Callable[[], dict | None]:
        """:meth:`memory_summary` asked for now, on the client's event loop; the function returned
        waits for the answer."""
        if self.client is None:
            return lambda: None
        try:
            asked = asyncio.run_coroutine_threadsafe(self.client.run(memory.stats, asynchronous=True),
                                                     self.client.loop.asyncio_loop)
        except Exception:  # noqa: BLE001 - a closing client: no accounting, as when a worker cannot answer
            return lambda: None

        def answer() -> dict | None:
            try:
                out = memory.summary(asked.result())
            except Exception:  # noqa: BLE001 - the accounting is a report; a worker that cannot answer must not fail
                return None
            return out if out["stores"] == ["flowgpu"] else None

        return answer

    def info(self) -> dict:
        """A summary for reports: backend, workers, memory budget, dashboard."""
        return {
            "backend": self.backend,
            "array_backend": self.array_backend,
            "address": self.client.scheduler.address if self.client else None,
            "n_workers": self.n_workers,
            "threads_per_worker": self.threads_per_worker,
            "worker_budget": self.worker_budget,
            "dashboard": self.dashboard_link,
            "started_cluster": self.cluster is not None,
            "kind": self.options.kind if self.cluster is not None else None,
            "workers": probe.where(self.workers),
        }

    # -- closing ----------------------------------------------------------------------------------
    def _teardown(self) -> None:
        if self.cluster is not None:
            _wait_for_restarts(self.cluster)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close(timeout=60)
        while self._published:
            self._published.pop().__exit__(None, None, None)

    def close(self) -> None:
        """Close the client; shut down the cluster if this Session started it."""
        if self._closed:
            return
        self._closed = True
        with _lock, contextlib.suppress(ValueError):
            _stack.remove(self)
        self._teardown()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.n_workers} worker(s)"
        return f"<flowgpu.Session backend={getattr(self, 'backend', '?')} {state} dashboard={self.dashboard_link}>"


def _wait_for_restarts(cluster: Any, limit: float = 15.0) -> None:
    """Until no worker process that a nanny of ``cluster`` is (re)starting is still starting, ``limit`` s
    at most. A run that failed because its workers were killed ends while the nannies start new ones;
    a local cluster closed then stops a worker in mid-start, and distributed closes it twice and prints
    the second close's traceback (``RuntimeError: ConnectionPool is closed``) on the user's terminal."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not any(_restarting(n) for n in list(getattr(cluster, "workers", {}).values())):
            return
        time.sleep(0.05)


def _restarting(nanny: Any) -> bool:
    """Whether running ``nanny`` is starting a worker process, or is about to: its process has died and
    the nanny has not yet noticed (the run that failed may end first: then nothing seemed to restart)."""
    proc = getattr(nanny, "process", None)
    if nanny.status != Status.running or proc is None:
        return False
    if proc.status in (Status.init, Status.starting, Status.stopped):  # stopped: died, about to restart
        return True
    pid = getattr(getattr(proc, "process", None), "pid", None)
    try:
        return pid is not None and psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _dashboard_hosts(dask_scheduler: Any = None) -> list[str] | None:
    """The addresses the scheduler's dashboard listens on (run on the scheduler); None when its HTTP
    server has no dashboard (started with it off, it still serves /health and metrics)."""
    apps = getattr(getattr(dask_scheduler, "http_application", None), "applications", [])
    if not any("BokehTornado" in {c.__name__ for c in type(a).__mro__} for a in apps):  # its pages (bokeh)
        return None
    server = getattr(dask_scheduler, "http_server", None)
    return [str(sock.getsockname()[0]) for sock in getattr(server, "_sockets", {}).values()]


def worker_budget(workers: dict[str, dict], backend: str) -> int:
    """Smallest per-worker memory budget for chunks among ``workers``' probe results."""
    # share of a CPU worker's memory_limit it can fill: distributed pauses it at ``pause``, kills it at ``terminate``
    marks = [dask.config.get(f"distributed.worker.memory.{k}", default=False) for k in ("pause", "terminate")]
    usable = min([float(m) for m in marks if m and not isinstance(m, bool)] or [1.0])
    budgets = []
    for w in workers.values():
        if backend == "gpu":
            b = w.get("device_memory_limit") or w.get("device_memory") or 0
        else:  # what the worker may fill before distributed pauses (or kills) it, less what its process holds
            limit = w.get("memory_limit") or psutil.virtual_memory().total // max(len(workers), 1)
            b = max(int(limit * usable) - int(w.get("rss") or 0), 0)
        budgets.append(int(b))
    return min(budgets) if budgets else psutil.virtual_memory().total

"""Session options: keyword arguments over the ``flowgpu`` section of dask.config, held to
``flowgpu-schema.yaml``; what only this machine can answer (a GPU, the scheduler file, memory that
fits) is checked here too, before any worker starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

import dask.config
import psutil
from dask.utils import format_bytes
from distributed.security import Security

from flowgpu import backend as _backend
from flowgpu import config
from flowgpu.errors import BackendError, ConfigError, MemoryLimitError, SessionError
from flowgpu.runtime import hpc
from flowgpu.runtime import protocol as _protocol
from flowgpu.runtime import security as _security

__all__ = ["GPU_THREADS", "SessionOptions", "parse_memory", "resolve"]

# Threads per GPU worker by default: each computes on its own stream, so distributed's ~1 ms per task
# overlaps other kernels (H200, BENCHMARKS.md: a 32 GiB fused pass took 54 ms with 1 thread, 38 with 4).
GPU_THREADS = 4

# Keyword names are the options' names with "_" for "-", but for these.
_KEYWORDS = {"scheduler-address": "address"}
# An explicit None passed for these is a value (turn the dashboard off), not "take the config".
_NONE_IS_A_VALUE = {"dashboard-address"}


@dataclass(frozen=True)
class SessionOptions:
    """Everything a :class:`~flowgpu.Session` needs, validated."""

    backend: str  # "gpu" or "cpu" once resolved for a local cluster; "auto" when joining
    address: str | None = None
    gpus: tuple[int, ...] = ()
    n_workers: int | None = None
    threads_per_worker: int | None = None
    memory_limit: int | float | str = "auto"
    device_memory_limit: int | float | str = "default"
    local_directory: str | None = None
    rmm_pool_size: int | float | None = None
    host: str = "127.0.0.1"
    dashboard_address: str | None = "127.0.0.1:8787"
    connect_timeout: float = 10.0
    batch_interval: float | None = 0.001  # seconds; None keeps distributed's (flowgpu.batch-interval)
    security: Any = None  # the distributed.security.Security of the cluster and client; None: plain TCP
    protocol: str = "tcp"  # "tcp" or "ucx" (flowgpu.runtime.protocol); joining: the address's scheme
    kind: str = "local"  # local, or a batch system through dask-jobqueue (flowgpu.runtime.hpc)
    jobs: int = 1
    gpus_per_job: int = 0
    job_timeout: float = 600.0
    extra: dict = field(default_factory=dict)


SMALLEST = 32 << 20  # a memory option below this many bytes is a mistake (a worker alone takes more)


def parse_memory(value: Any) -> int | float | str | None:
    """A schema-checked memory option as the cluster takes it: None, ``"auto"``, a fraction in (0, 1],
    or whole bytes (``"4GiB"`` -> 4294967296)."""
    if value is None or value in ("auto", "default"):
        return value
    n = config.parse_size(value) if isinstance(value, str) else value
    return n if isinstance(n, float) and 0 < n <= 1 else int(n)


def _merged(address: str | None, kwargs: dict) -> tuple[dict, dict, dict]:
    """The checked ``flowgpu`` section with the keywords over it; each option's name for messages;
    the keywords that are no option (for the cluster)."""
    values, names, extra = config.tree(), {}, {}
    keys = {_KEYWORDS.get(k, k.replace("-", "_")): k for k in config.options()}
    for kw, value in {**kwargs, "address": address}.items():
        key = keys.get(kw)
        if key is None:
            extra[kw] = value
        elif value is not None or key in _NONE_IS_A_VALUE:
            values[key], names[key] = value, kw
    config.check(values, names)
    names = {k: names.get(k, f"flowgpu.{k}") for k in keys.values()}
    for key in ("memory-limit", "device-memory-limit", "rmm-pool-size"):  # parsed once, here
        given, n = values[key], parse_memory(values[key])
        if isinstance(n, int) and 0 < n < SMALLEST:  # memory_limit=2.0 is 2 bytes, not 2 GB: every worker would die
            raise MemoryLimitError(f"{names[key]}={given!r} is {n} bytes per worker; give a size such as "
                                   "'4GiB', a fraction of the memory in (0, 1] such as 0.5, or 0 for none")
        values[key] = n
    return values, names, extra


def _common(values: dict, names: dict, extra: dict) -> dict:
    """The options of local and joined clusters alike."""
    value = values["batch-interval"]
    seconds = None if value is None else config.parse_seconds(value)
    if seconds is not None and seconds > 1:
        raise ConfigError(f"{names['batch-interval']}={value!r} is longer than 1s; give e.g. '1ms', or None to keep "
                          "distributed's own batching")
    return dict(batch_interval=seconds, host=values["host"], dashboard_address=values["dashboard-address"],
                connect_timeout=config.parse_seconds(values["connect-timeout"]), extra=extra)


def _gpus(values: dict, names: dict) -> tuple[tuple[int, ...] | None, list[int]]:
    """The GPUs asked for (None: all) and those visible, refusing what this machine lacks."""
    backend = values["backend"]
    wanted = None if values["gpus"] is None else config.parse_gpus(values["gpus"])
    visible = _backend.visible_gpus() if backend != "cpu" else []
    if backend == "gpu" and not visible:
        raise BackendError("backend='gpu' but no GPU is visible here (none found through NVML or the CUDA driver, "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use backend='cpu' or "
                           "'auto'")
    missing = [g for g in wanted or () if g not in visible]
    if missing and backend != "cpu":
        raise ConfigError(f"{names['gpus']}={list(wanted)} names GPU(s) {missing} that are not visible; "
                          f"visible GPUs: {visible if visible else 'none'}")
    return wanted, visible


MIN_SPILL_FREE = 64 << 20  # bytes a spill directory needs free when a local cluster starts


def check_spill_directory(directory: str | None, name: str) -> None:
    """Refuse a spill directory that cannot be written or lacks :data:`MIN_SPILL_FREE`: workers that
    cannot spill pause, and a run then waits for ever."""
    where = directory or dask.config.get("temporary-directory", default=None) or tempfile.gettempdir()
    fix = f"give {name} a writable directory on a disk with room, or free space there"
    try:
        os.makedirs(where, exist_ok=True)
        with tempfile.TemporaryFile(dir=where) as f:
            f.write(b"flowgpu")
            f.flush()
            os.fsync(f.fileno())
        free = shutil.disk_usage(where).free
    except OSError as e:
        raise SessionError(f"the spill directory {where!r} cannot be written ({e.strerror}); {fix}") from None
    if free < MIN_SPILL_FREE:
        raise SessionError(f"the spill directory {where!r} has {format_bytes(free)} free, less than the "
                           f"{format_bytes(MIN_SPILL_FREE)} a worker needs to spill; {fix}")


def _local_options(values: dict, names: dict, gpus: tuple[int, ...] | None, common: dict) -> SessionOptions:
    """A local cluster: one worker per GPU of ``gpus``, or CPU workers (None)."""
    if gpus is not None:
        _backend.import_cupy()  # a clear install hint before any worker starts
    check_spill_directory(values["local-directory"], names["local-directory"])
    if gpus is None:
        memory, total = values["memory-limit"], psutil.virtual_memory().total
        if isinstance(memory, int) and memory > total:
            raise MemoryLimitError(f"{names['memory-limit']}={memory} bytes is larger than this machine's "
                                   f"{total} bytes")
        return SessionOptions(backend="cpu", n_workers=values["n-workers"], **common)
    device = values["device-memory-limit"]
    if isinstance(device, int) and device:
        total = min(_backend.device_total_memory(g) for g in gpus)
        if device > total:
            raise MemoryLimitError(f"{names['device-memory-limit']}={device} bytes is larger than the GPU's "
                                   f"{total} bytes; give at most the device's memory, e.g. a fraction like 0.8")
    return SessionOptions(backend="gpu", gpus=gpus, n_workers=len(gpus), device_memory_limit=device,
                          rmm_pool_size=values["rmm-pool-size"],
                          **{**common, "threads_per_worker": common["threads_per_worker"] or GPU_THREADS})


def _hpc_options(values: dict, names: dict, common: dict, own: Any) -> SessionOptions:
    """Batch jobs (:mod:`flowgpu.runtime.hpc`) run on other hosts: only the client's CuPy is checked here."""
    kind, gpus = values["kind"], values["gpus-per-job"]
    if not hpc.available():
        raise ConfigError(f"{names['kind']}={kind!r} needs dask-jobqueue, which is not installed: {hpc.INSTALL}")
    if values["protocol"] == "ucx":
        raise ConfigError(f"{names['protocol']}='ucx' is for local GPU clusters; a {kind} cluster speaks tcp or TLS")
    # GPU jobs: asked for (gpus-per-job), or backend gpu with the request in jobqueue's job-extra-directives
    backend = "gpu" if (gpus and values["backend"] != "cpu") or values["backend"] == "gpu" else "cpu"
    if backend == "gpu":
        _backend.import_cupy()  # the client builds CuPy graphs: a clear install hint before any job is submitted
    mode = own or values["security"]
    security = None if mode == "none" else (own if own is not None else True)  # auto: TLS, the jobs span hosts
    host = values["host"] if names["host"] == "host" else None  # the jobs' hosts must reach the scheduler
    return SessionOptions(
        backend=backend, kind=kind, jobs=values["jobs"], gpus_per_job=gpus if backend == "gpu" else 0,
        job_timeout=config.parse_seconds(values["job-timeout"]), security=security,
        **{**common, "host": host},
    )


def resolve(address: str | None = None, **kwargs: Any) -> SessionOptions:
    """Merge the Session's keywords over ``flowgpu.*`` config and check them; starts nothing.

    Each top-level option is a keyword (``address`` for ``flowgpu.scheduler-address``); None takes the
    configured value, but ``dashboard_address=None`` turns the dashboard off. ``tls_ca_file``,
    ``tls_cert`` and ``tls_key`` join a ``tls://`` scheduler. Other keywords go to the cluster.
    """
    files = {k: kwargs.pop(k, None) for k in _security.TLS_FILES}
    own = kwargs.pop("security") if isinstance(kwargs.get("security"), Security) else None
    values, names, extra = _merged(address, kwargs)
    common = _common(values, names, extra)
    if values["scheduler-address"] is not None:
        address = values["scheduler-address"]
        if _security.is_scheduler_file(address) and not os.path.exists(address):
            raise ConfigError(f"scheduler file {address!r} does not exist; give 'tcp://host:port' or an existing "
                              "scheduler file")
        mode = own or (values["security"] if names["security"] == "security" else "auto")
        common["security"] = _security.for_joining(address, mode, files)
        common["protocol"] = _protocol.for_joining(address, values["protocol"], names["protocol"],
                                                   names["protocol"] == "protocol")
        return SessionOptions(backend=values["backend"], address=address, **common)
    if any(v is not None for v in files.values()):
        raise ConfigError("--tls-ca-file, --tls-cert and --tls-key (tls_ca_file, tls_cert, tls_key) are for joining a "
                          "tls:// scheduler (--scheduler / address); a cluster the Session starts makes its own "
                          "with security='temporary'")
    # the workers of every cluster the Session starts (local, or batch jobs)
    common.update(threads_per_worker=values["threads-per-worker"], memory_limit=values["memory-limit"],
                  local_directory=values["local-directory"])
    if values["kind"] != "local":
        return _hpc_options(values, names, common, own)
    protocol = values["protocol"]
    _protocol.check_local(protocol, names["protocol"], values["backend"], own or values["security"])
    wanted, visible = _gpus(values, names)
    gpu = values["backend"] == "gpu" or (values["backend"] == "auto" and visible)
    options = _local_options(values, names, (wanted or tuple(visible)) if gpu else None, common)
    _protocol.check_gpu_workers(protocol, names["protocol"], options.backend)
    return replace(options, security=_security.for_local(own or values["security"]), protocol=protocol)

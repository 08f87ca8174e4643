"""Session options: read from dask.config, overridden by arguments, checked before any cluster starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import psutil
from dask.utils import parse_bytes, parse_timedelta

from flowgpu import backend as _backend
from flowgpu import config
from flowgpu.errors import BackendError, ConfigError, MemoryLimitError

BACKENDS = ("auto", "gpu", "cpu")
_UNSET: Any = object()


# Threads per GPU worker when none are given. Each thread computes on its own CUDA stream
# (flowgpu.spill.per-thread-streams), so several tasks are in flight per GPU: the ~1 ms each task
# costs in distributed overlaps the kernels of the others, and copies overlap compute. Measured on
# the H200 (BENCHMARKS.md): a 32 GiB fused pass took 54 ms with 1 thread and 38 ms with 4.
GPU_THREADS = 4


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
    extra: dict = field(default_factory=dict)


def parse_memory(value: Any, name: str, *, allow: tuple[str, ...] = ("auto",)) -> int | float | str | None:
    """Parse a memory size: bytes, a string such as ``"4GiB"``, a fraction in (0, 1], or a keyword."""
    if value is None or (isinstance(value, str) and value in allow):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a memory size; give bytes, e.g. '4GiB', or a fraction like 0.8")
    if isinstance(value, (int, float)):
        n = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            n = float(text) if text.replace(".", "", 1).lstrip("-").isdigit() else parse_bytes(text)
        except (ValueError, TypeError):
            allowed = ", ".join(repr(a) for a in allow)
            raise ConfigError(
                f"{name}={value!r} is not a memory size; give bytes such as '4GiB' or '512MB', "
                f"a fraction like 0.8{', or ' + allowed if allow else ''}"
            ) from None
    else:
        raise ConfigError(f"{name}={value!r} is not a memory size; give bytes such as '4GiB' or a fraction like 0.8")
    if n < 0:
        raise ConfigError(f"{name}={value!r} is negative; give a positive size such as '4GiB' or a fraction like 0.8")
    if isinstance(n, float) and 0 < n <= 1:
        return n
    return int(n)


def _parse_gpus(gpus: Any) -> tuple[int, ...] | None:
    if gpus is None:
        return None
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        gpus = [gpus]
    if isinstance(gpus, str):
        gpus = [g for g in gpus.replace(" ", "").split(",") if g]
    try:
        out = tuple(int(g) for g in gpus)
    except (TypeError, ValueError):
        raise ConfigError(f"gpus={gpus!r} is not a list of GPU ordinals; give e.g. gpus=[0, 1] or '0,1'") from None
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise ConfigError(f"gpus={gpus!r}: give distinct, non-negative GPU ordinals, e.g. gpus=[0, 1]")
    return out


def _positive_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: give a whole number >= 1")
    return value


def resolve(
    address: str | None = None,
    *,
    backend: str | None = None,
    gpus: Any = None,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit: Any = None,
    device_memory_limit: Any = None,
    local_directory: str | None = None,
    rmm_pool_size: Any = None,
    host: str | None = None,
    dashboard_address: str | None = _UNSET,
    connect_timeout: Any = None,
    **extra: Any,
) -> SessionOptions:
    """Merge arguments over ``flowgpu.*`` config and check them; starts nothing."""
    backend = config.get("backend", backend)
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    address = config.get("scheduler-address", address)
    timeout_raw = config.get("connect-timeout", connect_timeout)
    try:
        timeout = float(parse_timedelta(timeout_raw, default="s"))
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"connect_timeout={timeout_raw!r} is not a duration; give seconds or e.g. '30s'") from None
    interval_raw = config.get("batch-interval")
    try:
        interval = None if interval_raw is None else float(parse_timedelta(interval_raw, default="s"))
    except (ValueError, TypeError, KeyError):
        interval = -1.0
    if isinstance(interval_raw, bool) or interval is not None and not 0 <= interval <= 1:
        raise ConfigError(f"flowgpu.batch-interval={interval_raw!r} is not a duration between 0 and 1s; "
                          "give e.g. '1ms', or null to keep distributed's own batching")
    common = dict(
        batch_interval=interval,
        host=config.get("host", host),
        # an explicit None turns the dashboard off; leaving it out takes the configured address
        dashboard_address=config.get("dashboard-address") if dashboard_address is _UNSET else dashboard_address,
        connect_timeout=timeout,
        extra=extra,
    )
    if address is not None:
        if not isinstance(address, str) or not address:
            raise ConfigError(f"address={address!r}: give 'tcp://host:port' or the path of a scheduler file")
        if "://" not in address and ":" not in address and not os.path.exists(address):
            raise ConfigError(
                f"scheduler file {address!r} does not exist; give 'tcp://host:port' or an existing scheduler file"
            )
        return SessionOptions(backend=backend, address=address, **common)

    n_workers = _positive_int(config.get("n-workers", n_workers), "n_workers")
    threads = _positive_int(config.get("threads-per-worker", threads_per_worker), "threads_per_worker")
    mem = parse_memory(config.get("memory-limit", memory_limit), "memory_limit", allow=("auto",))
    dev_mem = parse_memory(
        config.get("device-memory-limit", device_memory_limit), "device_memory_limit", allow=("default", "auto")
    )
    pool = parse_memory(config.get("rmm-pool-size", rmm_pool_size), "rmm_pool_size", allow=())
    local_directory = config.get("local-directory", local_directory)
    wanted = _parse_gpus(config.get("gpus", gpus))

    visible = _backend.visible_gpus() if backend != "cpu" else []
    if backend == "gpu" and not visible:
        raise BackendError(
            "backend='gpu' but no GPU is visible here (none found through NVML or the CUDA driver, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use backend='cpu' or 'auto'"
        )
    if wanted is not None and backend != "cpu":
        missing = [g for g in wanted if g not in visible]
        if missing:
            raise ConfigError(
                f"gpus={list(wanted)} names GPU(s) {missing} that are not visible; "
                f"visible GPUs: {visible if visible else 'none'}"
            )
    use_gpu = backend == "gpu" or (backend == "auto" and bool(visible))
    if use_gpu:
        _backend.import_cupy()  # a clear install hint before any worker starts
        chosen = tuple(wanted) if wanted is not None else tuple(visible)
        if isinstance(dev_mem, int) and dev_mem:
            total = min(_backend.device_total_memory(g) for g in chosen)
            if dev_mem > total:
                raise MemoryLimitError(
                    f"device_memory_limit={dev_mem} bytes is larger than the GPU's {total} bytes; "
                    "give at most the device's memory, e.g. a fraction like 0.8"
                )
        return SessionOptions(
            backend="gpu",
            gpus=chosen,
            n_workers=len(chosen),
            threads_per_worker=threads or GPU_THREADS,
            memory_limit=mem,
            device_memory_limit=dev_mem,
            local_directory=local_directory,
            rmm_pool_size=pool,
            **common,
        )
    if isinstance(mem, int) and mem and mem > psutil.virtual_memory().total:
        raise MemoryLimitError(
            f"memory_limit={mem} bytes is larger than this machine's {psutil.virtual_memory().total} bytes"
        )
    return SessionOptions(
        backend="cpu",
        n_workers=n_workers,
        threads_per_worker=threads,
        memory_limit=mem,
        local_directory=local_directory,
        **common,
    )

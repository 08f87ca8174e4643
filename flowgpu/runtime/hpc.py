"""Clusters of batch jobs (Slurm, PBS, LSF, SGE) through dask-jobqueue: ``Session(kind="slurm", jobs=2)``.

jobqueue's own configuration (``jobqueue.<kind>``) says queue, walltime and the like; flowgpu fills
what it leaves unset: ``cores``, ``memory``, and for TLS a ``shared-temp-directory`` the nodes must
mount. GPU jobs (``gpus_per_job``) ask for GPUs (:data:`GPU_DIRECTIVES`) and run ``dask cuda worker``,
one worker per GPU. The scheduler runs in the client's process.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import Any

import dask.config

from flowgpu.errors import ConfigError

__all__ = ["KINDS", "GPU_DIRECTIVES", "DEFAULT_MEMORY", "available", "cluster_kwargs", "make", "workers_expected"]

# kind -> dask-jobqueue's cluster class (its config section is jobqueue.<kind>)
KINDS = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster", "sge": "SGECluster"}
# A job's header line for G GPUs; only Slurm's is tested (tests/deploy). Sites that spell it otherwise
# set backend gpu and write their own in jobqueue's job-extra-directives.
GPU_DIRECTIVES = {"slurm": "--gres=gpu:{gpus}", "pbs": "-l ngpus={gpus}", "lsf": '-gpu "num={gpus}"',
                  "sge": "-l gpu={gpus}"}
DEFAULT_MEMORY = 4 << 30  # bytes per worker, when neither jobqueue's config nor memory_limit says
GPU_WORKER = "dask cuda worker"  # run as `python -m dask cuda worker ...` (dask-cuda's CLI)
INSTALL = 'pip install "flowgpu[hpc]" (dask-jobqueue)'


def available() -> bool:
    """Whether dask-jobqueue is installed."""
    return importlib.util.find_spec("dask_jobqueue") is not None


def _cluster_class(kind: str) -> Any:
    if kind not in KINDS:
        raise ConfigError(f"cluster kind {kind!r} is not one of local, {', '.join(KINDS)}")
    try:
        module = importlib.import_module("dask_jobqueue")
    except ImportError:
        raise ConfigError(f"a {kind} cluster needs dask-jobqueue, which is not installed: {INSTALL}") from None
    return getattr(module, KINDS[kind])


def _configured(kind: str, key: str) -> Any:
    return dask.config.get(f"jobqueue.{kind}.{key}", default=None)


def workers_expected(cluster: Any) -> int:
    """How many workers ``cluster``'s jobs start once all run."""
    return len(getattr(cluster, "worker_spec", {})) * max(int(getattr(cluster, "_job_kwargs", {}).get("processes") or 1), 1)


def cluster_kwargs(kind: str, *, gpus_per_job: int, threads_per_worker: int | None, memory_limit: Any,
                   local_directory: str | None, dashboard_address: str | None, security: Any, gpu: bool = False,
                   **extra: Any) -> dict:
    """The keyword arguments for jobqueue's cluster class of ``kind``: what its config leaves unset,
    and what GPU jobs need (``gpu`` alone: the config's job-extra-directives ask for the GPUs)."""
    gpu = gpu or gpus_per_job > 0
    processes = gpus_per_job or (_configured(kind, "processes") or 1)
    threads = threads_per_worker or (4 if gpu else None)
    cores = _configured(kind, "cores")
    if threads is not None or cores is None:
        cores = (threads or 1) * processes
    memory = _configured(kind, "memory")
    if isinstance(memory_limit, (int, float)) and memory_limit > 1:
        memory = int(memory_limit) * processes
    elif memory is None:
        memory = DEFAULT_MEMORY * processes
    kwargs: dict[str, Any] = dict(cores=cores, memory=memory, processes=processes,
                                  scheduler_options={"dashboard_address": dashboard_address or None},
                                  # the client reports task failures in one line; the scheduler's own logs
                                  # (in this process) would repeat them, and log its shutdown as an error
                                  silence_logs=logging.CRITICAL)
    if gpus_per_job:
        directives = list(_configured(kind, "job-extra-directives") or [])
        kwargs["job_extra_directives"] = [*directives, GPU_DIRECTIVES[kind].format(gpus=gpus_per_job)]
    if gpu:
        kwargs["worker_command"] = GPU_WORKER
    if local_directory:
        kwargs["local_directory"] = local_directory
    if security is not None:
        kwargs["security"] = security
        if _configured(kind, "shared-temp-directory") is None:
            kwargs["shared_temp_directory"] = os.path.join(os.path.expanduser("~"), ".cache", "flowgpu", "jobqueue")
    kwargs.update(extra)
    return kwargs


def make(kind: str, *, jobs: int, **options: Any) -> Any:
    """dask-jobqueue's cluster of ``kind`` (``options``: :func:`cluster_kwargs`'s), scaled to ``jobs``
    jobs that start in the background."""
    cls = _cluster_class(kind)
    kwargs = cluster_kwargs(kind, **options)
    if kwargs.get("shared_temp_directory"):  # the workers' TLS files: readable by this user only
        os.makedirs(os.path.expanduser(kwargs["shared_temp_directory"]), mode=0o700, exist_ok=True)
    try:
        cluster = cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"dask-jobqueue's {KINDS[kind]} refused its options: {e}; see jobqueue.{kind} in "
                          "~/.config/dask/jobqueue.yaml (DASK_JOBQUEUE__" f"{kind.upper()}__*)") from None
    cluster.scale(jobs=jobs)
    return cluster

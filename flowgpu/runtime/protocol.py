"""How a cluster's processes talk (``flowgpu.protocol``): ``tcp`` (the default), or ``ucx`` through
distributed-ucxx, UCX choosing the transports (dask-cuda's automatic way), so a CuPy chunk moves GPU
to GPU. UCX is for GPU workers only and has no TLS; what cannot work is refused before anything
starts. Joining, the address's scheme says the protocol.
"""

from __future__ import annotations

import importlib
from typing import Any

from distributed.security import Security

from flowgpu.errors import ConfigError
from flowgpu.runtime import security as _security

__all__ = ["INSTALL_HINT", "UCX_SCHEMES", "require_ucx", "check_local", "check_gpu_workers", "for_joining"]

UCX_SCHEMES = ("ucx", "ucxx")  # the schemes of an address distributed-ucxx serves
INSTALL_HINT = ("pip install distributed-ucxx-cu13 (for CUDA 13; distributed-ucxx-cu12 for CUDA 12, or "
                "conda install -c conda-forge distributed-ucxx)")


def require_ucx(what: str) -> None:
    """Refuse ``what`` unless distributed-ucxx can be imported (it imports UCX itself only when used)."""
    try:
        importlib.import_module("distributed_ucxx")  # optional, GPU-only: imported where asked for
    except ImportError:
        raise ConfigError(f"{what} needs distributed-ucxx (UCX for dask's distributed), which is not installed "
                          f"here: {INSTALL_HINT}; or use protocol 'tcp' (the default)") from None


def check_local(protocol: str, name: str, backend: str, security: str | Security) -> None:
    """Refuse a protocol the Session's own cluster cannot have, before GPUs are looked for
    (``name``: the option's name in messages; ``security``: the mode or credentials asked for)."""
    if protocol != "ucx":
        return
    if backend == "cpu":
        raise ConfigError(f"{name}='ucx' moves chunks GPU to GPU, but backend='cpu' starts CPU workers; "
                          f"use {name}='tcp' (the default) on CPU, or a GPU backend")
    if isinstance(security, Security) or security == "temporary":
        raise ConfigError(f"{name}='ucx' cannot be combined with TLS (security='temporary' or credentials of "
                          "your own): distributed's UCX comm has no TLS; use security='none' (then any process "
                          f"on this host that reaches the cluster's ports can connect) or {name}='tcp'")
    require_ucx(f"{name}='ucx'")


def check_gpu_workers(protocol: str, name: str, backend: str) -> None:
    """Refuse ``ucx`` when the backend ``auto`` found no GPU and so starts CPU workers."""
    if protocol == "ucx" and backend != "gpu":
        raise ConfigError(f"{name}='ucx' moves chunks GPU to GPU, but no GPU is visible here, so the cluster "
                          f"would have CPU workers; use {name}='tcp' (the default)")


def for_joining(address: str, protocol: Any, name: str, given: bool) -> str:
    """The scheme of ``address``, checked against a ``protocol`` given as an argument (``given``)."""
    scheme = _security.scheme(address)
    if scheme in UCX_SCHEMES:
        require_ucx(f"joining {address}")
        return "ucx"
    if given and protocol == "ucx":
        raise ConfigError(f"{name}='ucx' is for a cluster the Session starts, but the scheduler at {address} "
                          f"speaks {scheme}://; give its ucx:// address to join it over UCX, or drop {name}")
    return scheme

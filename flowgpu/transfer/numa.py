"""NUMA: pinned memory on the node of the worker's GPU (a copy from the other socket's memory
crosses the socket link, at a fraction of PCIe speed).

:func:`local_node` reads the node from sysfs (the GPU's PCI device, else the node holding this
process's CPUs, which dask-cuda pins to its GPU's), and :func:`prefer` asks the kernel (``mbind``,
``MPOL_PREFERRED``: a full node spills over instead of failing) to place pages there. The functions
take the sysfs root, so tests fake the topology.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
from typing import Iterable

from flowgpu.backend import import_cupy

__all__ = ["SYS", "parse_cpulist", "nodes", "pci_node", "cpus_node", "node_for", "local_node", "prefer",
           "policy_of"]

SYS = "/sys"
MPOL_PREFERRED = 1
_MPOL_F_ADDR = 2
_SYSCALLS = {"x86_64": {"mbind": 237, "get_mempolicy": 239}, "aarch64": {"mbind": 235, "get_mempolicy": 236}}


def parse_cpulist(text: str) -> frozenset[int]:
    """The CPUs of a sysfs list such as ``"0-3,8,10-11"``.

    Examples
    --------
    >>> sorted(parse_cpulist("0-2,8\\n"))
    [0, 1, 2, 8]
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def nodes(root: str = SYS) -> dict[int, frozenset[int]]:
    """``node -> its CPUs`` of this host (``{}`` where sysfs has no NUMA information)."""
    base = os.path.join(root, "devices", "system", "node")
    out = {}
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                with open(os.path.join(base, name, "cpulist"), encoding="ascii") as f:
                    out[int(name[4:])] = parse_cpulist(f.read())
            except (OSError, ValueError):
                out[int(name[4:])] = frozenset()
    return dict(sorted(out.items()))


def _bus_id(bus_id: str) -> str:
    """sysfs's spelling of a PCI bus id (NVML's ``00000000:1B:00.0`` -> ``0000:1b:00.0``)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else domain


def pci_node(bus_id: str, root: str = SYS) -> int | None:
    """The NUMA node of the PCI device ``bus_id``; None when sysfs does not say (-1, or no such file)."""
    try:
        with open(os.path.join(root, "bus", "pci", "devices", _bus_id(bus_id), "numa_node"), encoding="ascii") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def cpus_node(cpus: Iterable[int], topology: dict[int, frozenset[int]]) -> int | None:
    """The node that holds all of ``cpus`` (a process pinned to one node's cores); None when they span nodes."""
    cpus = frozenset(cpus)
    homes = [n for n, held in topology.items() if cpus and cpus <= held]
    return homes[0] if len(homes) == 1 else None


def node_for(bus_id: str | None, cpus: Iterable[int], root: str = SYS) -> int | None:
    """The node pinned memory for the GPU at ``bus_id`` belongs on; None on one node, or unknown."""
    topology = nodes(root)
    if len(topology) < 2:
        return None
    node = pci_node(bus_id, root) if bus_id else None
    if node is None or node not in topology:
        node = cpus_node(cpus, topology)
    return node


@functools.lru_cache(maxsize=1)
def local_node() -> int | None:
    """The NUMA node of this process's current GPU (asked once per process; None: nothing to place)."""
    if len(nodes()) < 2:
        return None  # one node: CuPy is not asked
    bus_id = None
    cp = import_cupy(strict=False)
    with contextlib.suppress(Exception):  # no device in this process: the CPUs still say where it runs
        bus_id = cp.cuda.Device().pci_bus_id if cp is not None else None
    return node_for(bus_id, os.sched_getaffinity(0))


def _syscall(name: str):
    number = _SYSCALLS.get(platform.machine(), {}).get(name)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return functools.partial(libc.syscall, ctypes.c_long(number))


def _mask(node: int) -> tuple[ctypes.Array, int]:
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    return mask, words * 64 + 1  # the kernel reads maxnode - 1 bits


def prefer(address: int, length: int, node: int) -> bool:
    """Prefer NUMA ``node`` for the untouched pages at ``address``; False where the kernel refuses."""
    mbind = _syscall("mbind")
    if mbind is None or node < 0:
        return False
    mask, maxnode = _mask(node)
    done = mbind(ctypes.c_void_p(address), ctypes.c_ulong(length), ctypes.c_int(MPOL_PREFERRED), mask,
                 ctypes.c_ulong(maxnode), ctypes.c_uint(0))
    return done == 0


def policy_of(address: int) -> tuple[int, list[int]] | None:
    """The NUMA policy ``(mode, nodes)`` of the page at ``address``; None where the kernel cannot say."""
    get = _syscall("get_mempolicy")
    if get is None:
        return None
    mode = ctypes.c_int(-1)
    mask, maxnode = _mask(63)
    if get(ctypes.byref(mode), mask, ctypes.c_ulong(maxnode), ctypes.c_void_p(address), ctypes.c_ulong(_MPOL_F_ADDR)):
        return None
    return mode.value, [i for i in range(64) if mask[0] >> i & 1]

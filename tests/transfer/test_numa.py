"""NUMA: the topology read from a fake /sys tree, and pinned staging memory placed on the GPU's node."""

from __future__ import annotations

import mmap
import os
import types

import numpy as np
import pytest

from flowgpu.transfer import numa, pinned


def _fake_sys(root, cpus_per_node: dict[int, str], devices: dict[str, str]) -> str:
    for node, cpulist in cpus_per_node.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (root / "devices" / "system" / "node" / "possible").write_text("0-1\n")  # not a node folder
    for bus_id, node in devices.items():
        d = root / "bus" / "pci" / "devices" / bus_id
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    return str(root)


@pytest.fixture
def two_sockets(tmp_path):
    """Two nodes of 4 CPUs; a GPU on each, and one whose node the firmware does not say (-1)."""
    return _fake_sys(tmp_path, {0: "0-3", 1: "4-7"},
                     {"0000:1b:00.0": "0", "0000:b1:00.0": "1", "0000:c1:00.0": "-1"})


@pytest.mark.parametrize("text, cpus", [("0-3", {0, 1, 2, 3}), ("0,2,4-5\n", {0, 2, 4, 5}), ("7", {7}), ("", set()),
                                        ("0-1,64-65", {0, 1, 64, 65})])
def test_cpulists(text, cpus):
    assert numa.parse_cpulist(text) == cpus


def test_topology_of_two_sockets(two_sockets):
    assert numa.nodes(two_sockets) == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    # NVML spells the bus id with an 8-digit domain and capitals, CUDA with 4 digits: the same device
    assert numa.pci_node("00000000:B1:00.0", two_sockets) == 1
    assert numa.pci_node("0000:1b:00.0", two_sockets) == 0
    assert numa.pci_node("0000:c1:00.0", two_sockets) is None  # -1: unknown
    assert numa.pci_node("0000:99:00.0", two_sockets) is None  # no such device


def test_the_gpus_node_then_the_cpus_node(two_sockets):
    assert numa.node_for("00000000:B1:00.0", {0, 1}, two_sockets) == 1  # the GPU's own node wins
    assert numa.node_for("0000:1B:00.0", {4}, two_sockets) == 0
    # the firmware does not say: the node of the CPUs the worker is pinned to (dask-cuda's CPUAffinity)
    assert numa.node_for("0000:c1:00.0", {4, 5, 6, 7}, two_sockets) == 1
    assert numa.node_for(None, {1, 2}, two_sockets) == 0
    assert numa.node_for(None, {3, 4}, two_sockets) is None  # spans both: no choice to make
    assert numa.node_for("0000:c1:00.0", set(), two_sockets) is None


def test_one_node_or_no_numa_information_means_nothing_to_place(tmp_path):
    one = _fake_sys(tmp_path / "one", {0: "0-7"}, {"0000:1b:00.0": "0"})
    assert numa.node_for("0000:1b:00.0", {0}, one) is None
    assert numa.nodes(str(tmp_path / "none")) == {}
    assert numa.node_for("0000:1b:00.0", {0}, str(tmp_path / "none")) is None


def _mapping(size: int):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return m, np.frombuffer(m, dtype=np.uint8)


def test_prefer_places_a_mapping_on_a_node(rng):
    node = min(numa.nodes() or {0: None})
    m, view = _mapping(8 << 20)
    addr = int(view.ctypes.data)
    if not numa.prefer(addr, len(view), node):
        pytest.skip("this kernel (or its seccomp filter) refuses mbind")
    assert numa.policy_of(addr) == (numa.MPOL_PREFERRED, [node])
    data = rng.integers(0, 256, len(view), dtype=np.uint8)
    view[:] = data  # the pages fault in under the policy, and hold what was written
    assert np.array_equal(view, data)
    assert numa.policy_of(addr + (4 << 20)) == (numa.MPOL_PREFERRED, [node])


@pytest.fixture
def fake_cuda(monkeypatch):
    """registered_pinned_allocator without a GPU: cudaHostRegister / Unregister recorded, not done."""
    calls = []
    runtime = types.SimpleNamespace(hostRegister=lambda ptr, size, flags: calls.append(("register", ptr, size)),
                                    hostUnregister=lambda ptr: calls.append(("unregister", ptr)))
    monkeypatch.setattr(pinned, "import_cupy", lambda strict=True: types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=runtime)))
    return calls


@pytest.mark.parametrize("size", [1 << 20, 32 << 20])
def test_pinned_buffers_go_to_the_gpus_node(monkeypatch, fake_cuda, rng, size):
    node = min(numa.nodes() or {0: None})
    probe, view = _mapping(1 << 16)
    if not numa.prefer(int(view.ctypes.data), len(view), node):
        pytest.skip("this kernel (or its seccomp filter) refuses mbind")
    monkeypatch.setattr(pinned.numa, "local_node", lambda: node)  # a worker whose GPU is on `node`
    buf = pinned.registered_pinned_allocator(size)
    assert buf.pinned and fake_cuda[0] == ("register", buf.ptr, size)
    assert numa.policy_of(buf.ptr) == (numa.MPOL_PREFERRED, [node])
    assert numa.policy_of(buf.ptr + size - 1) == (numa.MPOL_PREFERRED, [node])
    data = rng.random(size // 8)
    buf.array((size // 8,), np.float64)[:] = data
    assert np.array_equal(buf.array((size // 8,), np.float64), data)

    monkeypatch.setattr(pinned.numa, "local_node", lambda: None)  # one node: the kernel's default
    other = pinned.registered_pinned_allocator(size)
    assert numa.policy_of(other.ptr)[0] == 0  # MPOL_DEFAULT


@pytest.mark.gpu
def test_a_gpu_workers_node_is_its_gpus():
    cp = pytest.importorskip("cupy")
    node = numa.local_node()
    topology = numa.nodes()
    if len(topology) < 2:
        assert node is None
    else:
        want = numa.pci_node(cp.cuda.Device().pci_bus_id)
        assert node == (want if want is not None else numa.cpus_node(os.sched_getaffinity(0), topology))

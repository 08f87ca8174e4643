"""``protocol``: tcp by default, ucx for GPU workers through distributed-ucxx, refused clearly otherwise.

The refusals are checked on any machine: distributed-ucxx is hidden (``sys.modules`` in process,
a shadowing package on PYTHONPATH in a real ``python -m flowgpu``) or stood in for, and the GPUs
the options see are faked, so no test depends on what this machine has installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import dask
import numpy as np
import pytest
from distributed.security import Security

import flowgpu as fg
from flowgpu.errors import ConfigError, FlowgpuError
from flowgpu.runtime import options as _options
from flowgpu.runtime import standing
from flowgpu.runtime.options import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = """\
inputs:
  x: {source: random, shape: [64, 8], seed: 3}
steps:
  s: {op: sum, inputs: [x]}
outputs:
  s: {from: s}
"""


@pytest.fixture
def no_ucxx(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed_ucxx", None)  # `import distributed_ucxx` raises ImportError


@pytest.fixture
def fake_ucxx(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed_ucxx", types.ModuleType("distributed_ucxx"))


@pytest.fixture
def gpus(monkeypatch):
    """Two GPUs as far as the options can tell (no worker is started)."""
    monkeypatch.setattr(_options._backend, "visible_gpus", lambda: [0, 1])
    monkeypatch.setattr(_options._backend, "import_cupy", lambda strict=True: object())


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(_options._backend, "visible_gpus", lambda: [])


def _refused(words, **kwargs):
    with pytest.raises(ConfigError) as info:
        resolve(**kwargs)
    msg = str(info.value)
    assert isinstance(info.value, (FlowgpuError, ValueError)) and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_tcp_is_the_default_and_ucx_is_kept_for_gpu_workers(fake_ucxx, gpus):
    assert resolve(backend="cpu", n_workers=1).protocol == "tcp"
    o = resolve(protocol="ucx")
    assert (o.backend, o.protocol, o.gpus, o.security) == ("gpu", "ucx", (0, 1), None)
    with dask.config.set({"flowgpu.protocol": "ucx"}):  # the configured value applies too
        assert resolve(gpus=[1]).protocol == "ucx"
    assert resolve(protocol="tcp").protocol == "tcp"


def test_unknown_protocol_is_refused_by_the_schema():
    _refused(["protocol 'udp'", "tcp, ucx"], backend="cpu", protocol="udp")


def test_ucx_on_cpu_workers_is_refused(fake_ucxx, no_gpu):
    _refused(["protocol='ucx' moves chunks GPU to GPU", "backend='cpu'", "protocol='tcp'"], backend="cpu",
             protocol="ucx")
    _refused(["no GPU is visible here", "protocol='tcp'"], protocol="ucx")  # auto found no GPU
    with dask.config.set({"flowgpu.protocol": "ucx"}):  # named as it was set
        _refused(["flowgpu.protocol='ucx'"], backend="cpu")


def test_ucx_without_distributed_ucxx_says_what_to_install(no_ucxx, gpus):
    _refused(["distributed-ucxx", "not installed", "pip install distributed-ucxx-cu13", "protocol 'tcp'"],
             protocol="ucx")


def test_ucx_and_tls_are_refused_together(fake_ucxx, gpus):
    _refused(["no TLS", "security='none'"], protocol="ucx", security="temporary")
    _refused(["no TLS"], protocol="ucx", security=Security())
    assert resolve(protocol="ucx", security="none").security is None
    assert resolve(protocol="ucx", security="auto").security is None  # auto means none for UCX


def test_joining_takes_the_protocol_from_the_address(no_ucxx):
    _refused(["joining ucx://10.0.0.1:8786 needs distributed-ucxx", "pip install"], address="ucx://10.0.0.1:8786")
    _refused(["protocol='ucx' is for a cluster the Session starts", "tcp://"], address="tcp://10.0.0.1:8786",
             protocol="ucx")
    assert resolve(address="tcp://10.0.0.1:8786").protocol == "tcp"


def test_joining_a_ucx_scheduler_with_distributed_ucxx(fake_ucxx):
    assert resolve(address="ucx://10.0.0.1:8786").protocol == "ucx"
    with dask.config.set({"flowgpu.protocol": "ucx"}):  # configured, not asked for: the address decides
        assert resolve(address="tcp://10.0.0.1:8786").protocol == "tcp"


def test_a_standing_cluster_that_lacks_ucx_says_so():
    assert "protocol=ucx" in standing._unmet({"options": {}}, {"protocol": "ucx"})
    assert standing._unmet({"options": {"protocol": "ucx"}}, {"protocol": "ucx"}) == []
    assert standing._unmet({"options": {}}, {"protocol": "tcp"}) == []


# -- through the command line, in real processes ----------------------------------------------------
def _flowgpu(args, cwd, shadow=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [shadow, ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def shadow(tmp_path):
    """A folder whose ``distributed_ucxx`` fails to import, as where it is not installed."""
    pkg = tmp_path / "shadow" / "distributed_ucxx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('distributed_ucxx is hidden by the test')\n")
    return str(pkg.parent)


def _one_error(result, *words):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(180)
def test_run_protocol_ucx_without_distributed_ucxx_exits_2(tmp_path, shadow):
    (tmp_path / "spec.yaml").write_text(SPEC)
    _one_error(_flowgpu(["run", "spec.yaml", "--protocol", "ucx", "-q"], tmp_path, shadow),
               "spec.yaml", "pip install distributed-ucxx-cu13")
    assert not (tmp_path / ".flowgpu").exists() or not any((tmp_path / ".flowgpu").rglob("*.json"))


@pytest.mark.timeout(180)
def test_spec_cluster_protocol_on_cpu_exits_2_with_its_place(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC + "cluster: {backend: cpu, protocol: ucx}\n")
    _one_error(_flowgpu(["run", "spec.yaml", "-q"], tmp_path), "spec.yaml:", "backend='cpu'", "protocol='tcp'")
    (tmp_path / "bad.yaml").write_text(SPEC + "cluster: {protocol: udp}\n")
    line = _one_error(_flowgpu(["validate", "bad.yaml"], tmp_path), "bad.yaml:7:", "cluster.protocol")
    assert "'tcp'" in line and "'ucx'" in line


@pytest.mark.timeout(120)
def test_cluster_start_over_ucx_needs_no_tls(tmp_path, shadow):
    result = _flowgpu(["cluster", "start", "--protocol", "ucx"], tmp_path, shadow)
    _one_error(result, "no TLS", "--no-tls")
    assert standing.status(notify=None) is None  # nothing was started
    # with --no-tls the next check speaks: here distributed-ucxx is missing
    _one_error(_flowgpu(["cluster", "start", "--protocol", "ucx", "--no-tls"], tmp_path, shadow),
               "pip install distributed-ucxx-cu13")
    assert standing.status(notify=None) is None


# -- on GPUs (the lead runs these) -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_ucx_session_computes_what_numpy_does(rng):
    pytest.importorskip("distributed_ucxx", reason="needs distributed-ucxx (pip install distributed-ucxx-cu13)")
    seed = int(rng.integers(1 << 30))
    with fg.Session(protocol="ucx", dashboard_address=None) as s:
        assert s.client.scheduler.address.startswith(("ucx://", "ucxx://"))
        assert all(a.startswith(("ucx://", "ucxx://")) for a in s.workers)
        x = fg.random((4096, 1024), dtype="float32", seed=seed, chunks=(512, 1024))
        got = float(((x * 2 + 1) ** 2).sum(dtype="float64").compute())
    with dask.config.set({"array.backend": "numpy"}):
        want = float(((fg.random((4096, 1024), dtype="float32", seed=seed, chunks=(512, 1024)) * 2 + 1) ** 2)
                     .sum(dtype="float64").compute(scheduler="threads"))
    assert np.isclose(got, want, rtol=1e-6)


def test_a_session_refuses_before_starting_anything(no_ucxx):
    before = fg.current_session()  # another test's session may be open: none is added
    with pytest.raises(ConfigError, match="pip install distributed-ucxx-cu13"):
        fg.Session(protocol="ucx", dashboard_address=None)
    with pytest.raises(ConfigError, match="backend='cpu' starts CPU workers"):
        fg.Session(backend="cpu", protocol="ucx", dashboard_address=None)
    assert fg.current_session() is before

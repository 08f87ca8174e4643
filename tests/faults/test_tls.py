"""Secure clusters: a Session's own cluster with temporary TLS credentials, and a remote TLS cluster
(a real `dask scheduler` and `dask worker` on 127.0.0.1 with certificates made here) joined by
`python -m flowgpu run --scheduler tls://... --tls-*`.

Every refusal is checked from the cluster's side too: a client without the credentials never
becomes one of the scheduler's clients, so it cannot run code in the workers.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from distributed import Client
from distributed.security import Security

import flowgpu as fg
from flowgpu.errors import ConfigError
from tests.tolerance import assert_within_terms

ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"

pytestmark = pytest.mark.timeout(180)


# -- certificates ---------------------------------------------------------------------------------
def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(folder: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    crt, pem = folder / f"{stem}.pem", folder / f"{stem}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return str(crt), str(pem)


def make_ca(folder: Path, name: str = "flowgpu test CA") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, str]:
    """A self-signed CA: its key, certificate and PEM path."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = folder / f"{name.replace(' ', '-')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, str(path)


def make_leaf(folder: Path, stem: str, ca_key, ca_cert) -> tuple[str, str]:
    """A certificate for 127.0.0.1 / localhost signed by the CA, for servers and clients: (cert, key) paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _write(folder, stem, key, cert)


# -- processes ------------------------------------------------------------------------------------
def _env() -> dict:
    """This environment, less any TLS settings of dask's, with this checkout first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM__")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(60)


def _scheduler_clients(address: str, security: Security) -> set[str]:
    """The clients the scheduler knows, less the one that asks."""
    with Client(address, security=security, timeout=60, set_as_default=False) as c:
        return set(c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.clients))) - {c.id}


@pytest.fixture
def tls_cluster(tmp_path):
    """A TLS scheduler and one worker, real processes on 127.0.0.1, with certificates of a CA made
    here; yields (address, {"ca", "cert", "key"} of a client certificate the CA signed, folder)."""
    certs = tmp_path / "certs"
    certs.mkdir()
    ca_key, ca_cert, ca = make_ca(certs)
    node_cert, node_key = make_leaf(certs, "node", ca_key, ca_cert)
    client_cert, client_key = make_leaf(certs, "client", ca_key, ca_cert)
    tls = ["--tls-ca-file", ca, "--tls-cert", node_cert, "--tls-key", node_key]
    file = tmp_path / "scheduler.json"
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with open(logs / "scheduler.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                 "--port", "0", "--no-dashboard", "--scheduler-file", str(file), *tls],
                env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            assert procs[0].poll() is None, (logs / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the TLS scheduler did not start within 60 s"
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        with open(logs / "worker.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", "127.0.0.1", "--nworkers", "1",
                 "--nthreads", "2", "--memory-limit", "1GiB", "--no-dashboard", *tls],
                env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        yield address, {"ca": ca, "cert": client_cert, "key": client_key}, tmp_path
    finally:
        _stop(procs)


def _spec(tmp: Path, x: Path) -> Path:
    spec = tmp / "spec.yaml"
    spec.write_text(f"""
inputs:
  x: {{source: npy, path: "{x}", chunks: [64, 32]}}
steps:
  y: {{op: expr, inputs: {{x: x}}, args: {{expression: "x * 3.0 + 1.0"}}}}
  total: {{op: sum, inputs: [y]}}
outputs:
  y: {{from: y, sink: zarr, path: "{tmp}/out/y.zarr"}}
  total: {{from: total}}
""")
    return spec


def _flowgpu(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)


# -- the tests ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_flowgpu_run_joins_a_tls_cluster_that_refuses_clients_without_certificates(tls_cluster, rng):
    address, creds, tmp = tls_cluster
    data = rng.standard_normal((256, 96))
    np.save(tmp / "x.npy", data)
    spec = _spec(tmp, tmp / "x.npy")
    flags = ["--tls-ca-file", creds["ca"], "--tls-cert", creds["cert"], "--tls-key", creds["key"]]
    mine = Security(tls_ca_file=creds["ca"], tls_client_cert=creds["cert"], tls_client_key=creds["key"])
    before = _scheduler_clients(address, mine)

    # a tls:// address without credentials: one line saying what to set, exit 2, nothing written
    bare = _flowgpu("run", str(spec), "--scheduler", address, "-q", cwd=tmp)
    assert bare.returncode == 2, bare.stderr
    assert "--tls-ca-file" in bare.stderr and "distributed.comm.tls.ca-file" in bare.stderr, bare.stderr
    assert TRACEBACK not in bare.stderr and "ssl_context" not in bare.stderr, bare.stderr
    assert not any((tmp / "out").glob("*")), "a refused run wrote nothing, not even a staging dir"

    done = _flowgpu("run", str(spec), "--scheduler", address, *flags, "--summary", str(tmp / "s.json"), "-q", cwd=tmp)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp / "s.json").read_text())
    assert summary["status"] == "ok" and summary["session"]["address"] == address  # ran on that cluster
    want = data * 3.0 + 1.0
    got = zarr.open_array(str(tmp / "out" / "y.zarr"), mode="r")[...]
    assert_within_terms(got, want, np.abs(data * 3.0) + 1.0, 2)  # every element written: nothing lost
    assert_within_terms(summary["outputs"]["total"]["value"], want.sum(), (np.abs(data * 3.0) + 1.0).sum(), 64)

    # a plain-TCP client, one with no certificate and one whose certificate another CA signed
    # are refused before they can run anything
    other_key, other_ca_cert, other_ca = make_ca(tmp, "another CA")
    stranger_cert, stranger_key = make_leaf(tmp, "stranger", other_key, other_ca_cert)
    attempts = {
        "tcp": dict(address=address.replace("tls://", "tcp://")),
        "tls, another CA": dict(address=address, security=Security(
            tls_ca_file=creds["ca"], tls_client_cert=stranger_cert, tls_client_key=stranger_key)),
    }
    for what, kwargs in attempts.items():
        started = time.monotonic()
        with pytest.raises((OSError, TimeoutError)):
            Client(**kwargs, timeout=5, set_as_default=False).close()
        assert time.monotonic() - started < 60, what  # refused, not left hanging
    # distributed itself will not connect over TLS without a certificate; a bare TLS socket that
    # trusts the cluster's CA but shows none is refused by the scheduler at the handshake
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=creds["ca"])
    context.check_hostname = False
    with pytest.raises(OSError):  # ssl.SSLError (certificate required) or a reset connection
        with socket.create_connection((host, int(port)), timeout=60) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"\0" * 64)
            assert tls.recv(1), "the scheduler closed the connection"
    assert _scheduler_clients(address, mine) == before, "no refused client became one of the scheduler's"


def test_session_with_temporary_tls_refuses_clients_without_its_credentials(rng):
    data = rng.standard_normal((400, 300))
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=2, memory_limit="1GiB", dashboard_address=None,
                    security="temporary") as s:
        address = s.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:") and s.info()["address"] == address
        x = fg.from_array(data, chunks=(100, 300))
        got = (x @ x.T).compute()
        assert_within_terms(got, data @ data.T, np.abs(data) @ np.abs(data).T, 2 * data.shape[1])

        clients = set(s.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.clients)))
        refused = {
            "tcp": dict(address=address.replace("tls://", "tcp://")),
            "tls, other temporary credentials": dict(address=address, security=Security.temporary()),
        }
        for what, kwargs in refused.items():
            with pytest.raises((OSError, TimeoutError)):
                Client(**kwargs, timeout=5, set_as_default=False).close()
        with pytest.raises(TypeError, match="ssl_context"):  # no credentials at all: distributed's own refusal
            Client(address, timeout=5, set_as_default=False).close()
        now = set(s.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.clients)))
        assert now == clients, "no refused client became one of the scheduler's"


@pytest.mark.gpu
def test_gpu_session_with_temporary_tls_runs_and_refuses_plain_tcp(rng):
    data = rng.standard_normal((512, 256)).astype(np.float32)
    with fg.Session(backend="gpu", dashboard_address=None, security="temporary") as s:
        address = s.client.scheduler.address
        assert address.startswith("tls://") and s.backend == "gpu"
        got = fg.to_numpy((fg.from_array(data, chunks=(128, 256)) * 2.0).sum(axis=0))
        assert_within_terms(got, (2.0 * data.astype(np.float64)).sum(axis=0),
                            np.abs(2.0 * data.astype(np.float64)).sum(axis=0), 64, np.float32)
        with pytest.raises((OSError, TimeoutError)):
            Client(address.replace("tls://", "tcp://"), timeout=5, set_as_default=False).close()


def test_a_tls_scheduler_with_no_credentials_points_to_the_running_cluster_join(tmp_path):
    """`fg.Session(<the standing cluster's scheduler file>)` was refused for its TLS with no word of
    fg.Session.running(), which joins that cluster with its own credentials."""
    file = tmp_path / "scheduler.json"
    file.write_text(json.dumps({"address": "tls://127.0.0.1:1"}))
    for given in ("tls://127.0.0.1:1", str(file)):
        with pytest.raises(ConfigError, match=r"speaks TLS and no credentials are set; give .* joined with its own "
                                              r"by fg\.Session\.running\(\)"):
            fg.Session(given, connect_timeout="1s")

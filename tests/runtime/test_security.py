"""The security option and TLS credentials, resolved before any cluster starts (no cluster here;
tests/faults/test_tls.py runs real TLS clusters)."""

from __future__ import annotations

import json

import dask.config
import pytest
from distributed.security import Security

from flowgpu.errors import ConfigError
from flowgpu.runtime.options import resolve
from flowgpu.runtime.security import scheme

NO_TLS_CONFIG = {"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None,
                 "distributed.comm.tls.client.key": None}


@pytest.fixture
def pem(tmp_path):
    """Three files standing in for PEM files (resolving checks they exist; only a connection reads them)."""
    paths = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("-----BEGIN CERTIFICATE-----\n")
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


def test_a_local_cluster_is_plain_tcp_unless_asked_for_temporary_tls():
    assert resolve(backend="cpu").security is None  # auto: one run's own cluster stays as distributed starts it
    assert resolve(backend="cpu", security="none").security is None
    temporary = resolve(backend="cpu", security="temporary").security
    assert isinstance(temporary, Security) and temporary.require_encryption
    assert temporary.tls_ca_file and temporary.tls_client_cert  # made in memory, for this cluster only
    with dask.config.set({"flowgpu.security": "temporary"}):
        assert resolve(backend="cpu").security is not None
    own = Security.temporary()
    assert resolve(backend="cpu", security=own).security is own


def test_a_bad_security_value_names_what_is_allowed():
    with pytest.raises(ConfigError, match="security.*'open'.*auto, temporary, none"):
        resolve(backend="cpu", security="open")


def test_a_tls_address_without_credentials_says_what_to_set():
    with dask.config.set(NO_TLS_CONFIG), pytest.raises(ConfigError) as e:
        resolve("tls://127.0.0.1:8786")
    message = str(e.value)
    for name in ("--tls-ca-file", "--tls-cert", "--tls-key", "tls_ca_file", "distributed.comm.tls.ca-file",
                 "distributed.comm.tls.client.cert", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"):
        assert name in message
    assert "ssl_context" not in message


def test_a_tls_address_takes_the_files_given_or_dasks_config(pem):
    given = resolve("tls://127.0.0.1:8786", tls_ca_file=pem["ca"], tls_cert=pem["cert"], tls_key=pem["key"]).security
    assert (given.tls_ca_file, given.tls_client_cert, given.tls_client_key) == (pem["ca"], pem["cert"], pem["key"])
    configured = {"distributed.comm.tls.ca-file": pem["ca"], "distributed.comm.tls.client.cert": pem["cert"],
                  "distributed.comm.tls.client.key": pem["key"]}
    with dask.config.set(configured):
        from_config = resolve("tls://127.0.0.1:8786").security
    assert (from_config.tls_ca_file, from_config.tls_client_cert) == (pem["ca"], pem["cert"])
    assert resolve("tcp://127.0.0.1:8786").security is None  # plain TCP: distributed's default, as before


def test_tls_options_that_cannot_apply_are_refused(pem, tmp_path):
    with pytest.raises(ConfigError, match="--tls-ca-file.*speaks tcp://"):
        resolve("tcp://127.0.0.1:8786", tls_ca_file=pem["ca"], tls_cert=pem["cert"])
    with pytest.raises(ConfigError, match="are for joining a tls:// scheduler"):
        resolve(backend="cpu", tls_ca_file=pem["ca"])
    with pytest.raises(ConfigError, match="--tls-key / tls_key=.*no such file"):
        resolve("tls://127.0.0.1:8786", tls_ca_file=pem["ca"], tls_cert=pem["cert"], tls_key=str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match="needs both --tls-ca-file and --tls-cert"):
        resolve("tls://127.0.0.1:8786", tls_ca_file=pem["ca"])
    with pytest.raises(ConfigError, match="security='temporary' makes credentials for a cluster the Session starts"):
        resolve("tls://127.0.0.1:8786", security="temporary", tls_ca_file=pem["ca"], tls_cert=pem["cert"])
    with dask.config.set({"flowgpu.security": "temporary"}):  # a configured default is for local clusters only
        assert resolve("tcp://127.0.0.1:8786").security is None


def test_a_scheduler_files_protocol_is_that_of_its_address(tmp_path, pem):
    file = tmp_path / "scheduler.json"
    file.write_text(json.dumps({"address": "tls://127.0.0.1:8786"}))
    assert scheme(str(file)) == "tls" and scheme("127.0.0.1:8786") == "tcp" and scheme("tls://h:1") == "tls"
    with dask.config.set(NO_TLS_CONFIG), pytest.raises(ConfigError, match=f"scheduler at {file} speaks TLS"):
        resolve(str(file))
    assert resolve(str(file), tls_ca_file=pem["ca"], tls_cert=pem["cert"]).security.tls_ca_file == pem["ca"]

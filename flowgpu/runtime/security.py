"""Who may use a cluster: TLS credentials of the clusters a Session starts or joins.

Any process that reaches a scheduler's port can run code in its workers unless the cluster speaks
TLS. ``flowgpu.security`` for a cluster the Session starts: ``temporary`` (credentials made for it,
in memory only), ``none`` (plain TCP on 127.0.0.1), or ``auto``: none, since TLS cost 0.2 s to
start and moved data at 0.57 instead of 1.53 GiB/s between two CPU workers (a cluster that stays
up uses temporary). Joining ``tls://`` needs ``tls_ca_file``/``tls_cert``/``tls_key``, else dask's
``distributed.comm.tls.*``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from distributed.security import Security

from flowgpu.errors import ConfigError

__all__ = ["TLS_FILES", "for_joining", "for_local", "is_scheduler_file", "scheme"]

# Session keyword -> the CLI option and dask's config key that give the same file
TLS_FILES = {
    "tls_ca_file": ("--tls-ca-file", "distributed.comm.tls.ca-file"),
    "tls_cert": ("--tls-cert", "distributed.comm.tls.client.cert"),
    "tls_key": ("--tls-key", "distributed.comm.tls.client.key"),
}
_NEEDED = (f"give the cluster's CA certificate and a certificate and key it signed: "
           f"--tls-ca-file, --tls-cert and --tls-key (Python: Session(..., tls_ca_file=..., tls_cert=..., "
           f"tls_key=...)), or dask's config {', '.join(c for _, c in TLS_FILES.values())} "
           "(DASK_DISTRIBUTED__COMM__TLS__CA_FILE, ..._TLS__CLIENT__CERT, ..._TLS__CLIENT__KEY)")


def is_scheduler_file(address: str) -> bool:
    """Whether ``address`` names a scheduler file rather than ``[proto://]host:port``."""
    return not ("://" in address or ":" in address and not address.endswith((".json", ".yaml")))


def scheme(address: str) -> str:
    """The protocol of ``address``: ``tls``, ``tcp``, ...; a scheduler file's is that of the address it holds."""
    if is_scheduler_file(address):
        try:
            with open(address, encoding="utf-8") as f:
                address = str(json.load(f).get("address", ""))
        except (OSError, ValueError, AttributeError):
            return "tcp"  # distributed's own message says what is wrong with the file
    return address.partition("://")[0] if "://" in address else "tcp"


def for_local(security: str | Security) -> Security | None:
    """The credentials of a cluster the Session starts (None: plain TCP)."""
    if isinstance(security, Security):
        return security
    if security != "temporary":
        return None
    try:
        return Security.temporary()
    except ImportError:
        raise ConfigError("security='temporary' makes TLS credentials with the 'cryptography' package, which is "
                          "not installed: pip install cryptography, or use security='none'") from None


def _exists(option: str, path: Any) -> str:
    if not isinstance(path, str) or not os.path.isfile(path):
        flag = TLS_FILES[option][0]
        raise ConfigError(f"{flag} / {option}={path!r}: no such file; give the PEM file's path")
    return path


def for_joining(address: str, security: str | Security, files: dict[str, Any]) -> Security | None:
    """The credentials to join ``address`` with (None: distributed's default), from ``files`` (the
    Session's TLS keywords) or dask's config; a ``tls://`` address with neither is refused here,
    instead of distributed's ``TypeError`` about ``ssl_context``."""
    if isinstance(security, Security):
        return security
    given = {k: _exists(k, v) for k, v in files.items() if v is not None}
    if security == "temporary":  # given as an argument (a configured default applies to local clusters only)
        raise ConfigError(f"security='temporary' makes credentials for a cluster the Session starts, but the "
                          f"Session joins {address}, which has its own; drop it (a tls:// address needs the "
                          "cluster's certificates: --tls-ca-file, --tls-cert, --tls-key)")
    proto = scheme(address)
    if proto != "tls":
        if given:
            flags = ", ".join(TLS_FILES[k][0] for k in given)
            raise ConfigError(f"{flags} given, but the scheduler at {address} speaks {proto}://, not TLS; "
                              "give its tls:// address, or drop the TLS options")
        return None
    if given:
        if "tls_ca_file" not in given or "tls_cert" not in given:
            raise ConfigError(f"joining {address} with TLS needs both --tls-ca-file and --tls-cert (--tls-key too, "
                              "unless the certificate file holds the key)")
        return Security(tls_ca_file=given["tls_ca_file"], tls_client_cert=given["tls_cert"],
                        tls_client_key=given.get("tls_key"))
    configured = Security()
    if not configured.tls_ca_file or not configured.tls_client_cert:
        raise ConfigError(f"the scheduler at {address} speaks TLS and no credentials are set; {_NEEDED}; the "
                          "cluster 'flowgpu cluster start' keeps up is joined with its own by fg.Session.running() "
                          "(flowgpu run joins it unasked)")
    return configured

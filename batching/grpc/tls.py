"""gRPC's server credentials from :class:`~batching.tls.CertificateFiles`, re-read per connection.

grpcio's ``dynamic_ssl_server_credentials`` calls a fetcher each time it accepts a connection
(from its own threads, also under ``grpc.aio``); the fetcher hands over the newest reading when
it changed since the last one, and None (keep what you have) otherwise, so a handshake costs one
comparison. Connections already open keep their certificate.

Client certificates: ``required`` makes gRPC ask for one and refuse a connection without a
certificate signed by ``--ssl-ca-certs``. grpcio offers no "ask but do not require": with
``require_client_authentication=False`` the server does not ask for a certificate at all (gRPC
core's ``GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE``), so under ``optional`` gRPC takes every TLS
client and verifies no certificate, as under ``none``; ``server.py`` says so when it starts.
"""

from __future__ import annotations

import threading

import grpc

from batching.tls import CertificateFiles, Certificates

__all__ = ["server_credentials"]


def _configuration(certificates: Certificates, with_roots: bool) -> object:
    return grpc.ssl_server_certificate_configuration(
        [(certificates.private_key, certificates.certificate_chain)],
        root_certificates=certificates.root_certificates if with_roots else None,
    )


def server_credentials(files: CertificateFiles) -> grpc.ServerCredentials:
    """TLS credentials for ``add_secure_port`` that follow ``files`` for new connections."""
    required = files.config.client_cert == "required"
    lock = threading.Lock()
    served = files.current

    def fetch() -> object | None:
        nonlocal served
        current = files.current
        with lock:
            if current is served:
                return None
            served = current
        return _configuration(current, required)

    return grpc.dynamic_ssl_server_credentials(
        _configuration(served, required), fetch, require_client_authentication=required
    )

"""TLS and mutual TLS on both doors (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs``,
``--ssl-client-cert``), and certificates re-read for new connections when their files change.

The settings and the reload rule are tested in-process; the doors against a real ``server.py``
on 127.0.0.1 with the real clients: curl, ``tritonclient.http``, ``tritonclient.grpc`` and the
``openai`` SDK. Certificates are made per run (``tests/support/tls.py``).
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import re
import shlex
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import batching.tls
from batching.settings.cli import parse_settings
from batching.tls import CertificateFiles, TlsConfig, TlsError, load_certificates
from tests.support.server_process import MODEL, ROOT, ServerProcess
from tests.support.servers import free_port
from tests.support.tls import Pki, encrypted_key, make_pki, peer_fingerprint

TEXTS = ["ab", "c"]
VECTORS = np.array([[2, 97, 1, -1], [1, 99, 1, -1]], dtype=np.float32)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA's certificates: never trusted by the servers here."""
    return make_pki(tmp_path_factory.mktemp("foreign"), "some other CA")


def replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` the way rotation tools do: a new file renamed over it."""
    part = path.with_name(path.name + ".part")
    part.write_bytes(data)
    os.replace(part, path)


# -- settings --------------------------------------------------------------------------------


def test_the_flags_and_their_batching_twins_give_the_same_settings(pki: Pki) -> None:
    flags = parse_settings(
        [
            *MODEL,
            "--ssl-certfile",
            str(pki.cert),
            "--ssl-keyfile",
            str(pki.key),
            "--ssl-ca-certs",
            str(pki.ca),
            "--ssl-client-cert",
            "required",
        ],
        {},
    )
    environ = {
        "BATCHING_SSL_CERTFILE": str(pki.cert),
        "BATCHING_SSL_KEYFILE": str(pki.key),
        "BATCHING_SSL_CA_CERTS": str(pki.ca),
        "BATCHING_SSL_CLIENT_CERT": "required",
    }
    twins = parse_settings(MODEL, environ)
    assert flags.tls == twins.tls == TlsConfig(str(pki.cert), str(pki.key), str(pki.ca), "required")
    assert parse_settings(MODEL, {}).tls is None


def test_the_certfile_alone_may_hold_the_key(tmp_path: Path, pki: Pki) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(pki.server.key + pki.server.cert)
    read = load_certificates(TlsConfig(str(both)))
    # gRPC gets the key and the chain apart, each as its own PEM.
    assert read.private_key.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert b"CERTIFICATE" not in read.private_key
    assert read.certificate_chain.startswith(b"-----BEGIN CERTIFICATE-----")
    assert b"PRIVATE KEY" not in read.certificate_chain
    assert read.fingerprint == pki.server.fingerprint


BAD_STARTS: list[tuple[str, list[str], str]] = [
    (
        "key without certificate",
        ["--ssl-keyfile", "{key}"],
        "--ssl-keyfile needs --ssl-certfile: TLS is on only with a certificate",
    ),
    (
        "client certificates without certificate",
        ["--ssl-ca-certs", "{ca}", "--ssl-client-cert", "required"],
        "--ssl-ca-certs, --ssl-client-cert required needs --ssl-certfile",
    ),
    (
        "required without CA",
        ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-client-cert", "required"],
        "--ssl-client-cert required needs --ssl-ca-certs",
    ),
    (
        "optional without CA",
        ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-client-cert", "optional"],
        "--ssl-client-cert optional needs --ssl-ca-certs",
    ),
    (
        "CA nobody uses",
        ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-ca-certs", "{ca}"],
        "--ssl-ca-certs is only used to verify client certificates",
    ),
    (
        "missing certificate",
        ["--ssl-certfile", "{missing}", "--ssl-keyfile", "{key}"],
        "--ssl-certfile {missing}: cannot read it (No such file or directory)",
    ),
    (
        "key of another certificate",
        ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{client_key}"],
        "the private key in --ssl-keyfile {client_key} does not match the certificate in "
        "--ssl-certfile {cert}",
    ),
    (
        "encrypted key",
        ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{encrypted}"],
        "--ssl-keyfile {encrypted}: the private key is encrypted; give it unencrypted",
    ),
    (
        "certificate file without a certificate",
        ["--ssl-certfile", "{key}", "--ssl-keyfile", "{key}"],
        "--ssl-certfile {key}: no PEM certificate in it",
    ),
    (
        "half-written certificate",
        ["--ssl-certfile", "{half}", "--ssl-keyfile", "{key}"],
        "--ssl-certfile {half}: no PEM certificate in it",
    ),
    (
        "CA file without a certificate",
        [
            "--ssl-certfile",
            "{cert}",
            "--ssl-keyfile",
            "{key}",
            "--ssl-ca-certs",
            "{key}",
            "--ssl-client-cert",
            "optional",
        ],
        "--ssl-ca-certs {key}: no PEM certificate in it",
    ),
]


def bad_files(pki: Pki, folder: Path) -> dict[str, str]:
    (folder / "encrypted.key").write_bytes(encrypted_key(b"secret"))
    (folder / "half.pem").write_bytes(pki.server.cert[: len(pki.server.cert) // 2])
    return {
        "cert": str(pki.cert),
        "key": str(pki.key),
        "ca": str(pki.ca),
        "client_key": str(pki.client_key),
        "missing": str(folder / "missing.pem"),
        "encrypted": str(folder / "encrypted.key"),
        "half": str(folder / "half.pem"),
    }


@pytest.mark.parametrize(
    ("flags", "says"), [case[1:] for case in BAD_STARTS], ids=[case[0] for case in BAD_STARTS]
)
def test_a_bad_tls_configuration_stops_the_start_in_one_line(
    flags: list[str], says: str, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = bad_files(pki, tmp_path)
    with pytest.raises(SystemExit) as stopped:
        parse_settings([*MODEL, *(flag.format(**files) for flag in flags)], {})
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error  # one line, no usage text
    assert error.startswith("server.py: error: ")
    assert says.format(**files) in error


def test_a_client_cert_mode_from_the_environment_is_checked_too(
    pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = {
        "BATCHING_SSL_CERTFILE": str(pki.cert),
        "BATCHING_SSL_KEYFILE": str(pki.key),
        "BATCHING_SSL_CLIENT_CERT": "maybe",
    }
    with pytest.raises(SystemExit) as stopped:
        parse_settings(MODEL, environ)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "server.py: error: --ssl-client-cert must be one of required, optional, none, not 'maybe'\n"
    )


@pytest.mark.slow
def test_server_py_exits_non_zero_with_one_line_before_it_binds(pki: Pki) -> None:
    port = free_port()
    finished = subprocess.run(
        [
            sys.executable,
            str(ROOT / "server.py"),
            *MODEL,
            "--port",
            str(port),
            "--grpc-port",
            "0",
            "--ssl-certfile",
            str(pki.cert),
            "--ssl-keyfile",
            str(pki.client_key),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [
        f"server.py: error: the private key in --ssl-keyfile {pki.client_key} does not match "
        f"the certificate in --ssl-certfile {pki.cert}"
    ]


# -- the reload rule, in-process -------------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path, pki: Pki) -> Iterator[tuple[Path, Path]]:
    """Certificate and key files a test may rewrite, holding ``pki``'s server's at first."""
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki.server.cert)
    key.write_bytes(pki.server.key)
    yield cert, key


def kept_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "kept the current certificate" in r.message]


def test_new_files_are_taken_for_new_connections(
    live: tuple[Path, Path], pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = live
    files = CertificateFiles(TlsConfig(str(cert), str(key)))
    first = files.current
    assert first.fingerprint == pki.server.fingerprint
    listening = files.listening_context()  # what uvicorn listens with
    assert listening is first.context and listening.sni_callback is not None
    assert not files.check()  # nothing changed: nothing read
    assert files.current is first
    renewed = pki.authority.issue("batching server, renewed", server=True)
    replace(key, renewed.key)
    replace(cert, renewed.cert)
    caplog.set_level(logging.INFO, "batching")
    assert files.check()
    assert files.current.fingerprint == renewed.fingerprint
    assert f"new connections get the certificate sha256 {renewed.fingerprint[:16]}" in caplog.text
    # Each new handshake is handed the newest context (OpenSSL calls this on every one).
    handshake = SimpleNamespace(context=listening)
    listening.sni_callback(handshake, None, listening)  # type: ignore[arg-type]
    assert handshake.context is files.current.context is not listening


def test_a_bad_new_file_keeps_the_old_certificate_logs_one_line_and_is_retried(
    live: tuple[Path, Path], pki: Pki, foreign: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = live
    files = CertificateFiles(TlsConfig(str(cert), str(key)))
    first = files.current
    caplog.set_level(logging.INFO, "batching")
    renewed = pki.authority.issue("batching server, renewed", server=True)
    replace(cert, renewed.cert)  # the certificate first: the key does not match it yet
    assert not files.check()
    assert files.current is first
    (line,) = kept_lines(caplog)
    assert line == (
        f"TLS: kept the current certificate (sha256 {first.fingerprint[:16]}): the private key "
        f"in --ssl-keyfile {key} does not match the certificate in --ssl-certfile {cert}; the "
        "files are read again when they change"
    )
    assert not files.check()  # the same bad files: no second line
    assert len(kept_lines(caplog)) == 1
    replace(cert, renewed.cert[:300])  # half written
    assert not files.check()
    assert len(kept_lines(caplog)) == 2 and "no PEM certificate" in kept_lines(caplog)[1]
    os.remove(key)  # gone for a moment
    assert not files.check()
    assert "cannot read it (No such file or directory)" in kept_lines(caplog)[2]
    replace(key, renewed.key)
    replace(cert, renewed.cert)
    assert files.check()  # retried once the files changed again
    assert files.current.fingerprint == renewed.fingerprint
    assert len(kept_lines(caplog)) == 3


def test_files_that_change_while_read_are_left_for_the_next_look(
    live: tuple[Path, Path],
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cert, key = live
    files = CertificateFiles(TlsConfig(str(cert), str(key)))
    first = files.current
    renewed = pki.authority.issue("batching server, renewed", server=True)
    real_load = batching.tls.load_certificates
    writes = [lambda: replace(key, renewed.key)]

    def load_while_the_key_is_written(config: TlsConfig) -> Any:
        try:
            return real_load(config)
        finally:
            if writes:
                writes.pop()()  # the writer finishes the key just after this read

    monkeypatch.setattr(batching.tls, "load_certificates", load_while_the_key_is_written)
    replace(cert, renewed.cert)
    caplog.set_level(logging.INFO, "batching")
    assert not files.check()  # a bad reading, but the files moved on: no line
    assert files.current is first and kept_lines(caplog) == []
    assert files.check()
    assert files.current.fingerprint == renewed.fingerprint


@pytest.mark.anyio
async def test_the_poll_looks_at_the_files_every_poll_seconds(
    live: tuple[Path, Path], pki: Pki
) -> None:
    cert, key = live
    waits: list[float] = []
    asleep: asyncio.Queue[None] = asyncio.Queue()
    wake: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asleep.put(None)
        await wake.get()

    files = CertificateFiles(TlsConfig(str(cert), str(key)), sleep=sleep)
    files.start()
    try:
        await asleep.get()
        renewed = pki.authority.issue("batching server, renewed", server=True)
        replace(key, renewed.key)
        replace(cert, renewed.cert)
        assert files.current.fingerprint == pki.server.fingerprint  # not before the tick
        await wake.put(None)
        await asleep.get()  # the look after the tick is done: asleep again
        assert files.current.fingerprint == renewed.fingerprint
        assert waits == [batching.tls.POLL_SECONDS] * 2 == [10.0, 10.0]
    finally:
        await files.stop()


def test_the_ca_bundle_is_what_grpc_verifies_client_certificates_with(pki: Pki) -> None:
    required = TlsConfig(str(pki.cert), str(pki.key), str(pki.ca), "required")
    assert load_certificates(required).root_certificates == pki.ca.read_bytes().strip() + b"\n"
    with pytest.raises(TlsError):
        TlsConfig(str(pki.cert), str(pki.key), None, "optional")


# -- a real server.py ------------------------------------------------------------------------


def tls_flags(pki: Pki, client_cert: str) -> list[str]:
    flags = ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key)]
    if client_cert != "none":
        flags += ["--ssl-ca-certs", str(pki.ca), "--ssl-client-cert", client_cert]
    return flags


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def curl_infer(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return curl(*args, "--data-binary", "ab", f"{server.url}/")


def client_cert_args(pki: Pki) -> list[str]:
    return ["--cert", str(pki.client_cert), "--key", str(pki.client_key)]


def http_vectors(server: ServerProcess, ssl_options: dict[str, str]) -> np.ndarray:
    client = triton_http.InferenceServerClient(
        server.url.removeprefix("https://"), ssl=True, ssl_options=ssl_options
    )
    try:
        text = triton_http.InferInput("text", [len(TEXTS), 1], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object).reshape(-1, 1))
        return np.asarray(client.infer("vectors", [text]).as_numpy("embedding"))
    finally:
        client.close()


def grpc_client(server: ServerProcess, pki: Pki, *, client: Pki | None = None) -> Any:
    certs: dict[str, str] = {}
    if client is not None:
        certs = {
            "private_key": str(client.client_key),
            "certificate_chain": str(client.client_cert),
        }
    return triton_grpc.InferenceServerClient(
        server.grpc_target, ssl=True, root_certificates=str(pki.ca), **certs
    )


def grpc_vectors(server: ServerProcess, pki: Pki, *, client: Pki | None = None) -> np.ndarray:
    channel = grpc_client(server, pki, client=client)
    try:
        text = triton_grpc.InferInput("text", [len(TEXTS), 1], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object).reshape(-1, 1))
        return np.asarray(channel.infer("vectors", [text]).as_numpy("embedding"))
    finally:
        channel.close()


def openai_vectors(server: ServerProcess, context: ssl.SSLContext) -> np.ndarray:
    with httpx.Client(verify=context) as http_client:
        client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", http_client=http_client
        )
        answer = client.embeddings.create(model="vectors", input=TEXTS, encoding_format="float")
    return np.array([item.embedding for item in answer.data], dtype=np.float32)


@pytest.fixture(scope="module")
def required(pki: Pki) -> Iterator[ServerProcess]:
    server = ServerProcess(*tls_flags(pki, "required"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def optional(pki: Pki) -> Iterator[ServerProcess]:
    server = ServerProcess(*tls_flags(pki, "optional"))
    yield server
    server.stop()


@pytest.mark.slow
def test_required_curl_with_the_ca_and_a_client_certificate_is_served(
    required: ServerProcess, pki: Pki
) -> None:
    done = curl_infer(required, "--cacert", str(pki.ca), *client_cert_args(pki))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('{"model":"vectors","outputs":[[2.0,97.0,1.0,-1.0]]')
    line = required.wait_for("ready: serving")
    assert f"at https://127.0.0.1:{required.port} (" in line


@pytest.mark.slow
def test_required_refuses_curl_without_a_client_certificate_or_with_a_foreign_one(
    required: ServerProcess, pki: Pki, foreign: Pki
) -> None:
    bare = curl_infer(required, "--cacert", str(pki.ca))
    assert bare.returncode != 0 and bare.stdout == "", bare
    alien = curl_infer(required, "--cacert", str(pki.ca), *client_cert_args(foreign))
    assert alien.returncode != 0 and alien.stdout == "", alien
    untrusted = curl_infer(required, *client_cert_args(pki))  # the server's CA not trusted
    assert untrusted.returncode == 60, untrusted.stderr
    plain = curl("--data-binary", "ab", f"http://127.0.0.1:{required.port}/")
    assert '"outputs"' not in plain.stdout


@pytest.mark.slow
def test_required_tritonclient_http_and_grpc_with_a_client_certificate(
    required: ServerProcess, pki: Pki, foreign: Pki
) -> None:
    mutual = {
        "ca_certs": str(pki.ca),
        "certfile": str(pki.client_cert),
        "keyfile": str(pki.client_key),
    }
    np.testing.assert_array_equal(http_vectors(required, mutual), VECTORS)
    np.testing.assert_array_equal(grpc_vectors(required, pki, client=pki), VECTORS)
    # TLS 1.3: the server's refusal (an alert) arrives after the client's handshake is done,
    # so geventhttpclient sees the connection closed (or, sooner, an SSL error).
    with pytest.raises((http.client.HTTPException, ssl.SSLError, ConnectionError)):
        http_vectors(required, {"ca_certs": str(pki.ca)})
    for client in (None, foreign):
        with pytest.raises(InferenceServerException) as refused:
            grpc_vectors(required, pki, client=client)
        assert "UNAVAILABLE" in str(refused.value.status())


@pytest.mark.slow
def test_required_openai_sdk_with_a_custom_ca_and_a_client_certificate(
    required: ServerProcess, pki: Pki
) -> None:
    np.testing.assert_array_equal(
        openai_vectors(required, pki.client_context(with_client_cert=True)), VECTORS
    )
    with pytest.raises(openai.APIConnectionError):
        openai_vectors(required, pki.client_context())


@pytest.mark.slow
def test_optional_serves_clients_with_and_without_a_certificate_on_both_doors(
    optional: ServerProcess, pki: Pki, foreign: Pki
) -> None:
    for extra in ([], client_cert_args(pki)):
        done = curl_infer(optional, "--cacert", str(pki.ca), *extra)
        assert done.returncode == 0, done.stderr
        assert '"outputs":[[2.0,97.0,1.0,-1.0]]' in done.stdout
    np.testing.assert_array_equal(http_vectors(optional, {"ca_certs": str(pki.ca)}), VECTORS)
    np.testing.assert_array_equal(openai_vectors(optional, pki.client_context()), VECTORS)
    np.testing.assert_array_equal(grpc_vectors(optional, pki), VECTORS)
    np.testing.assert_array_equal(grpc_vectors(optional, pki, client=pki), VECTORS)


@pytest.mark.slow
def test_optional_http_refuses_a_certificate_it_cannot_verify_and_grpc_asks_for_none(
    optional: ServerProcess, pki: Pki, foreign: Pki
) -> None:
    alien = curl_infer(optional, "--cacert", str(pki.ca), *client_cert_args(foreign))
    assert alien.returncode != 0 and alien.stdout == "", alien
    # gRPC cannot ask for a certificate without requiring one: it asks for none, so a foreign
    # one is never sent, and the server said so when it started.
    np.testing.assert_array_equal(grpc_vectors(optional, pki, client=foreign), VECTORS)
    optional.wait_for("--ssl-client-cert optional: gRPC cannot ask for a client certificate")


@pytest.mark.slow
def test_renewed_files_reach_new_connections_on_both_doors_and_open_ones_keep_working(
    tmp_path: Path, pki: Pki
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server.cert)
    key.write_bytes(pki.server.key)
    server = ServerProcess("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    try:
        # Open connections: HTTP keep-alive, and a gRPC channel.
        kept = http.client.HTTPSConnection("localhost", server.port, context=pki.client_context())
        kept.request("GET", "/v2/health/ready")
        assert kept.getresponse().read() == b'{"ready":true}'
        assert kept.sock is not None
        old_socket = kept.sock
        assert peer_fingerprint(old_socket) == pki.server.fingerprint
        old_channel = grpc_client(server, pki)
        assert old_channel.is_server_live()

        # A new CA and certificate, as a Secret update or cert-manager renewal writes them.
        renewed = make_pki(tmp_path / "renewed", "the renewed CA")
        replace(key, renewed.server.key)
        replace(cert, renewed.server.cert)
        server.sighup()
        server.wait_for(
            f"new connections get the certificate sha256 {renewed.server.fingerprint[:16]}"
        )

        def new_fingerprint(trusting: Pki) -> str:
            with (
                socket.create_connection(("localhost", server.port)) as raw,
                trusting.client_context().wrap_socket(raw, server_hostname="localhost") as tls,
            ):
                return peer_fingerprint(tls)

        assert new_fingerprint(renewed) == renewed.server.fingerprint
        with pytest.raises(ssl.SSLCertVerificationError):
            new_fingerprint(pki)
        done = curl_infer(server, "--cacert", str(renewed.ca))
        assert done.returncode == 0 and '"outputs"' in done.stdout, done.stderr
        np.testing.assert_array_equal(grpc_vectors(server, renewed), VECTORS)
        with pytest.raises(InferenceServerException):
            grpc_vectors(server, pki)

        # The open connections still work, with the certificate they started with.
        kept.request("GET", "/v2/health/ready")
        assert kept.getresponse().read() == b'{"ready":true}'
        assert kept.sock is old_socket and peer_fingerprint(old_socket) == pki.server.fingerprint
        assert old_channel.is_server_live()
        old_channel.close()
        kept.close()

        # A bad renewal (a key that is not the certificate's) keeps the current certificate.
        third = renewed.authority.issue("batching server, third", server=True)
        replace(key, third.key)
        server.sighup()
        line = server.wait_for("kept the current certificate")
        assert f"(sha256 {renewed.server.fingerprint[:16]})" in line
        assert "does not match the certificate" in line
        assert new_fingerprint(renewed) == renewed.server.fingerprint
        np.testing.assert_array_equal(grpc_vectors(server, renewed), VECTORS)
        # Retried once the files change again.
        replace(cert, third.cert)
        server.sighup()
        server.wait_for(f"new connections get the certificate sha256 {third.fingerprint[:16]}")
        assert new_fingerprint(renewed) == third.fingerprint
        assert server.count("kept the current certificate") == 1
    finally:
        server.stop()


# -- the docs' example -------------------------------------------------------------------------


def readme_tls_block() -> list[str]:
    """The commands of docs/access.md's TLS example (its one bash block), continuations
    joined."""
    text = (ROOT / "docs" / "access.md").read_text()
    section = text.split("\n## TLS\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands, pending = [], ""
    for raw in block.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line and not pending:
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        commands.append(pending + line)
        pending = ""
    return commands


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    commands = readme_tls_block()
    setup = [c for c in commands if c.startswith("openssl ")]
    (serve,) = [c for c in commands if c.startswith("python server.py ")]
    clients = [c for c in commands if c.startswith("curl ")]
    assert setup and clients
    for command in setup:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{command}:\n{done.stderr}"
    flags = shlex.split(serve)[2:]
    absolute = [str(tmp_path / flag) if (tmp_path / flag).is_file() else flag for flag in flags]
    server = ServerProcess(*absolute)
    try:
        for command in clients:
            command = command.replace("localhost:8000", f"localhost:{server.port}")
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, f"{command}:\n{done.stderr}"
            assert '"outputs"' in done.stdout or '"ready"' in done.stdout, done.stdout
    finally:
        server.stop()

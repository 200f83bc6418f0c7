"""Start ``deploy/haproxy/run.sh`` for tests and scripts, and read HAProxy's stats socket."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent.parent
RUN_SH = ROOT / "deploy" / "haproxy" / "run.sh"

INSTALL_HINT = (
    "HAProxy is not installed: `apt-get install -y haproxy` (.ci/run does it where it is missing)"
)


def require_haproxy() -> str:
    """The haproxy binary; fails (never skips) when it is missing."""
    found = shutil.which(os.environ.get("HAPROXY", "haproxy"))
    if found is None:
        raise AssertionError(INSTALL_HINT)
    return found


def free_port_block(count: int) -> int:
    """A base port B such that B..B+count-1 were all free a moment ago."""
    for _ in range(200):
        base = random.randint(20000, 60000 - count)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no block of {count} free ports")


def haproxy_stat(socket_path: Path) -> dict[str, dict[str, str]]:
    """``show stat`` on HAProxy's stats socket: server name -> its CSV fields by name."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(socket_path))
        sock.sendall(b"show stat\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    lines = b"".join(chunks).decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        if not line:
            continue
        fields = dict(zip(header, line.split(","), strict=False))
        if fields.get("pxname") == "replicas":
            rows[fields["svname"]] = fields
    return rows


def checked_status(row: dict[str, str]) -> str:
    """A server's status, UP only once a health check passed (``check_status`` L7OK, or
    ``* L7OK`` while the next check runs)."""
    status = row["status"]
    if status.startswith("UP") and not row.get("check_status", "").lstrip("* ").startswith("L7OK"):
        return f"UNCHECKED ({status})"
    return status


class Fleet:
    """``with Fleet(2, server_flags, run_dir) as fleet:`` runs ``run.sh`` until the block ends.

    :param replicas: replicas behind HAProxy.
    :param server_flags: ``server.py`` flags for every replica.
    :param run_dir: run.sh's files (config, stats socket, pid files, logs).
    :param tls_pem: run.sh's ``--tls-pem``: HAProxy serves HTTPS on its port with this PEM.
    """

    def __init__(
        self,
        replicas: int,
        server_flags: Sequence[str],
        run_dir: Path,
        *,
        env: dict[str, str] | None = None,
        ready_timeout: float = 120.0,
        tls_pem: Path | None = None,
    ) -> None:
        require_haproxy()
        self.replicas = replicas
        self.run_dir = run_dir
        self.port = free_port_block(2 * replicas + 1)
        self.url = f"{'http' if tls_pem is None else 'https'}://127.0.0.1:{self.port}"
        self.argv = [
            "bash",
            str(RUN_SH),
            "--replicas",
            str(replicas),
            "--port",
            str(self.port),
            "--run-dir",
            str(run_dir),
            *([] if tls_pem is None else ["--tls-pem", str(tls_pem)]),
            "--",
            *server_flags,
        ]
        self.env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def stats_socket(self) -> Path:
        return self.run_dir / "haproxy.sock"

    def replica_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.port + index}"

    def replica_pid(self, index: int) -> int:
        return int((self.run_dir / f"replica-{index}.pid").read_text().strip())

    def log(self) -> str:
        parts = []
        for path in sorted(self.run_dir.glob("*.log")) + [self.run_dir / "run.out"]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-15:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def status(self) -> dict[str, str]:
        """Server name (r1, r2, ...) -> HAProxy's status of it (UP, DOWN, ...).

        HAProxy lists a server as UP from its start, before its first health check has run;
        such a server shows as ``UNCHECKED (UP)`` here, so that waiting for UP waits for a
        check that passed (a replica still loading would refuse the first request)."""
        try:
            rows = haproxy_stat(self.stats_socket)
        except OSError:
            return {}
        return {name: checked_status(row) for name, row in rows.items()}

    def wait_until(self, wanted: dict[str, str], timeout: float) -> None:
        """Poll HAProxy until the servers named in ``wanted`` have those statuses."""
        deadline = time.monotonic() + timeout
        status: dict[str, str] = {}
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"run.sh exited ({self.process.returncode}):\n{self.log()}")
            status = self.status()
            if all(status.get(name, "").startswith(state) for name, state in wanted.items()):
                return
            time.sleep(0.05)  # polling HAProxy's stats socket
        raise AssertionError(f"HAProxy never showed {wanted}, last {status}:\n{self.log()}")

    def __enter__(self) -> Fleet:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "run.out", "wb") as out:
            self.process = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self.wait_until(
                {f"r{i}": "UP" for i in range(1, self.replicas + 1)}, self.ready_timeout
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM run.sh and wait for it; returns its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired as exc:
                self.process.kill()
                self.process.wait(10)
                message = f"run.sh did not stop within {timeout}s:\n{self.log()}"
                raise AssertionError(message) from exc
        return self.process.returncode

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

"""A real ``python server.py`` in a subprocess, for tests that need the server as it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.servers import free_port

__all__ = ["MODEL", "ROOT", "ServerProcess"]

ROOT = Path(__file__).resolve().parent.parent.parent
#: The model every :class:`ServerProcess` serves: vectors of its texts, named ``vectors``.
MODEL = ["--model", "tests.support.models:VectorModel", "--name", "vectors"]


class ServerProcess:
    """``python server.py`` serving :data:`MODEL` (with ``flags``: TLS on HTTP and gRPC with
    ``--ssl-certfile``); its log lines are collected as they come, and :meth:`wait_for` waits on
    them (no sleeping)."""

    def __init__(self, *flags: str, model: list[str] | None = None, ready_s: float = 90) -> None:
        """:param model: the flags that say what to serve (:data:`MODEL` by default).
        :param ready_s: how long the server may take to log that it is ready."""
        self.port, self.grpc_port = free_port(), free_port()
        self.scheme = "https" if "--ssl-certfile" in flags else "http"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "server.py",
                *(MODEL if model is None else model),
                "--port",
                str(self.port),
                "--grpc-port",
                str(self.grpc_port),
                "--shutdown-timeout-s",
                "5",
                *flags,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.wait_for("ready: serving", ready_s)
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 30) -> str:
        def found() -> str | None:
            if self.lines and self.lines[-1] == "<exited>":
                raise AssertionError("server.py exited:\n" + "\n".join(self.lines[-20:]))
            return next((line for line in self.lines if text in line), None)

        with self._changed:
            line = self._changed.wait_for(found, timeout)
        assert line, f"never logged {text!r}:\n" + "\n".join(self.lines[-20:])
        return line

    def count(self, text: str) -> int:
        with self._changed:
            return sum(text in line for line in self.lines)

    def sighup(self) -> None:
        self.process.send_signal(signal.SIGHUP)

    @property
    def url(self) -> str:
        return f"{self.scheme}://localhost:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"localhost:{self.grpc_port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise
        self._reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()

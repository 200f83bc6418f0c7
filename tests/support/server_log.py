"""A real ``python server.py`` started in a fresh interpreter and its log read up to the
ready line (or its exit); the process is stopped before the lines are returned."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY = "ready: serving"


def log_until_ready(*flags: str, budget_s: float = 100) -> list[str]:
    """``server.py flags``' log lines up to and including the ready line, or all of them if it
    exits first; reading stops after ``budget_s`` of a start that never gets ready."""
    process = subprocess.Popen(
        [sys.executable, "server.py", *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + budget_s
        for line in process.stderr:  # ends when the process exits
            lines.append(line.rstrip("\n"))
            if READY in line or time.monotonic() > deadline:
                break
    finally:
        process.terminate()
        process.wait(30)
        if process.stderr is not None:
            process.stderr.close()
    return lines

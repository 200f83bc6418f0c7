"""The peak resident memory a piece of code adds, measured in a fresh interpreter.

The child runs ``setup`` (imports, inputs, a warm-up), then resets the kernel's record of its
peak resident set (``/proc/self/clear_refs``, Linux), runs ``work`` and reports how far its
peak rose above its resident set just before: what ``work`` cost at its worst, whatever it
freed before it returned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_START = """
import re as _re
def _status(key):
    with open("/proc/self/status") as status:
        return int(_re.search(key + r":\\s+(\\d+)", status.read()).group(1)) * 1024
with open("/proc/self/clear_refs", "w") as _refs:
    _refs.write("5")
_before = _status("VmRSS")
"""

_REPORT = """
print("PEAK", _status("VmHWM") - _before)
"""


def peak_bytes(setup: str, work: str) -> int:
    """The bytes ``work`` raised the child's peak resident memory by, after ``setup``."""
    code = textwrap.dedent(setup) + _START + textwrap.dedent(work) + _REPORT
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
    assert lines, done.stdout[-2000:]
    return int(lines[-1].split()[1])

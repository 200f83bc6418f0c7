"""Shared by the scale-out benchmarks: one closed-loop run of the load tool, summarised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load(url: str, concurrency: int, seconds: float, out_dir: Path, label: str) -> dict[str, Any]:
    """``python -m load_test run`` against ``url``; returns throughput, latency and outcomes."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "load_test",
            "run",
            "--url",
            url,
            "-c",
            str(concurrency),
            "-d",
            str(seconds),
            "--warmup",
            str(2 * concurrency),
            "--no-plots",
            "--no-progress",
            "--label",
            label,
            "--out-dir",
            str(out_dir),
        ],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    summary = json.loads((out_dir / "result.json").read_text())["summary"]
    return {
        "label": label,
        "items_per_s": summary["throughput"]["items_per_s"],
        "p50_ms": summary["latency"]["p50_ms"],
        "p99_ms": summary["latency"]["p99_ms"],
        "requests": summary["requests"],
        "ok_requests": summary["ok_requests"],
        "error_rate": summary["error_rate"],
    }


def report(doc: dict[str, Any], json_path: Path | None) -> None:
    """Print ``doc`` as JSON, and also write it to ``json_path`` when given."""
    text = json.dumps(doc, indent=2)
    print(text)
    if json_path:
        json_path.write_text(text + "\n")

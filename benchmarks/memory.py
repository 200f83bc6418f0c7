"""Resident memory of the server per instance kind and count, on the default model.

For each setting, starts ``python server.py``, waits until every instance is ready, sends a
few batches of maximum-length text so the allocator reaches its working size, and reads the
RSS of the server process and of each child process (process instances) with psutil.

    python benchmarks/memory.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from load_test.metrics_scrape import parse_samples  # noqa: E402
from load_test.procstat import child_pids, rss_bytes  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

SETTINGS = {
    "1 thread instance": ["--instances", "1"],
    "2 thread instances": ["--instances", "2"],
    "1 process instance": ["--instances", "1", "--instance-kind", "process"],
    "2 process instances": ["--instances", "2", "--instance-kind", "process"],
}


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (2**20 bytes); 0 for one that is gone."""
    return (rss_bytes(pid) or 0) / 2**20


def instances_ready(client: httpx.Client, url: str) -> int:
    for name, _, value in parse_samples(client.get(f"{url}/metrics").text):
        if name == "batching_instances_ready":
            return int(value)
    return 0


def main() -> int:
    long_text = " ".join(["measurement"] * 300)
    print("| setting | server process MB | child processes MB | total MB |")
    print("|---|---|---|---|")
    for name, flags in SETTINGS.items():
        wanted = int(flags[1])
        log = ROOT / "load_test_results" / "memory-server.log"
        with (
            ServerProcess(flags, cwd=ROOT, log_path=log) as server,
            httpx.Client(timeout=120) as client,
        ):
            deadline = time.monotonic() + 300
            while instances_ready(client, server.url) < wanted:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: instances never all became ready")
                time.sleep(0.2)  # polling a child process's readiness probe
            for _ in range(3 * wanted):
                client.post(server.url, json={"inputs": [long_text] * 32})
            assert server.pid is not None
            own = rss_mb(server.pid)
            kids = [rss_mb(child) for child in child_pids(server.pid)]
            print(
                f"| {name} | {own:.0f} | {' + '.join(f'{k:.0f}' for k in kids) or '-'} | "
                f"{own + sum(kids):.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Resident memory of the server per instance kind and count, on the default model.

For each setting, starts ``python server.py``, waits until every instance is ready, sends a
few batches of maximum-length text so the allocator reaches its working size, and reads the
RSS of the server process and of each child process (process instances) from /proc.

    python benchmarks/memory.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from load_test.serverproc import ServerProcess  # noqa: E402

SETTINGS = {
    "1 thread instance": ["--instances", "1"],
    "2 thread instances": ["--instances", "2"],
    "1 process instance": ["--instances", "1", "--instance-kind", "process"],
    "2 process instances": ["--instances", "2", "--instance-kind", "process"],
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def instances_ready(client: httpx.Client, url: str) -> int:
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("batching_instances_ready{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def main() -> int:
    long_text = " ".join(["measurement"] * 300)
    print("| setting | server process MB | child processes MB | total MB |")
    print("|---|---|---|---|")
    for name, flags in SETTINGS.items():
        wanted = int(flags[1])
        log = ROOT / "load_test_results" / "memory-server.log"
        with ServerProcess(flags, cwd=ROOT, log_path=log) as server, httpx.Client(
            timeout=120
        ) as client:
            deadline = time.monotonic() + 300
            while instances_ready(client, server.url) < wanted:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: instances never all became ready")
                time.sleep(0.2)  # polling a child process's readiness probe
            for _ in range(3 * wanted):
                client.post(server.url, json={"inputs": [long_text] * 32})
            assert server.pid is not None
            own = rss_mb(server.pid)
            kids = [rss_mb(child) for child in children(server.pid)]
            print(
                f"| {name} | {own:.0f} | {' + '.join(f'{k:.0f}' for k in kids) or '-'} | "
                f"{own + sum(kids):.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

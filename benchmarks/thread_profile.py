"""Where the server's CPU goes under load, thread by thread.

Starts ``python server.py`` (arguments after ``--``), runs ``--clients`` closed-loop
one-sentence clients for ``--seconds`` (after 2 s unrecorded), and reads every thread's CPU
time from ``/proc`` (through psutil) before and after: the cores each thread kept busy, by
thread name (the event loop is ``MainThread``'s, the model's are the engine's workers), next to
the items/s served and the load generator's own CPU. This is the per-thread profile behind the
"close to the limit" figures: what the model gets of the two cores, and what serving costs.

    python benchmarks/thread_profile.py                       # 64 clients, 10 s
    python benchmarks/thread_profile.py --clients 1 -- --engine torch
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.serving import closed_loop, sentences  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402


def thread_times(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid`` (and its children): name and user+system CPU seconds."""
    out: dict[int, tuple[str, float]] = {}
    processes = [psutil.Process(pid)]
    processes += processes[0].children(recursive=True)
    for process in processes:
        for thread in process.threads():
            # Python does not name its threads for the OS: tell the event loop (the main
            # thread) from the rest by id; the rest are the instance's thread and the
            # engine's workers.
            if thread.id == process.pid:
                name = "main thread (event loop)" if process.pid == pid else f"child {process.pid}"
            else:
                name = f"thread {thread.id}"
            out[thread.id] = (name, thread.user_time + thread.system_time)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients (64)")
    parser.add_argument("--seconds", type=float, default=10.0, help="recorded seconds (10)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)
    texts = sentences(600)
    log = ROOT / "load_test_results" / "thread-profile-server.log"
    with ServerProcess(args.server_args, cwd=ROOT, log_path=log) as server:
        assert server.pid is not None
        asyncio.run(closed_loop(server.port, args.clients, 2.0, texts))
        before = thread_times(server.pid)
        me_before = psutil.Process(os.getpid()).cpu_times()
        started = time.monotonic()
        result = asyncio.run(closed_loop(server.port, args.clients, args.seconds, texts))
        wall = time.monotonic() - started
        after = thread_times(server.pid)
        me_after = psutil.Process(os.getpid()).cpu_times()
    by_name: dict[str, float] = defaultdict(float)
    for tid, (name, seconds) in after.items():
        by_name[name] += seconds - before.get(tid, (name, 0.0))[1]
    client = (me_after.user + me_after.system) - (me_before.user + me_before.system)
    rows = sorted(by_name.items(), key=lambda row: -row[1])
    print(f"{args.clients} clients, {result['items_per_s']:.0f} items/s over {wall:.1f} s")
    print("| thread | cores kept busy |")
    print("|---|---|")
    for name, seconds in rows:
        if seconds / wall >= 0.005:
            print(f"| {name} | {seconds / wall:.2f} |")
    total = sum(by_name.values()) / wall
    print(f"| server, all threads | {total:.2f} |")
    print(f"| load generator (this process) | {client / wall:.2f} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "items_per_s": result["items_per_s"],
                    "clients": args.clients,
                    "cores_by_thread": {name: s / wall for name, s in rows},
                    "server_cores": total,
                    "client_cores": client / wall,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

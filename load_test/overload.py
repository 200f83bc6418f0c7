"""Overload: open-loop arrivals at a multiple of the server's capacity, for a bounded time.

Starts the server itself, measures its capacity (closed loop), then sends Poisson arrivals at
``--factor`` x that capacity for ``--duration`` seconds and reports what a server must get
right on its worst day: every request answered (none lost, none hung), no unexpected 5xx,
refusals (503) answered fast, accepted requests within their deadline, memory that does not
grow.

    python -m load_test.overload                          # default model, 5x for 20 s
    python -m load_test.overload --factor 10 --duration 30 -- --timeout-ms 1000

Arguments after ``--`` go to ``server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from load_test.client import (
    CONNECTION_ERROR,
    INVALID,
    TIMEOUT,
    LoadSpec,
    RunResult,
    Target,
    run_load,
)
from load_test.payloads import build_payloads
from load_test.procstat import rss_bytes
from load_test.schedule import Segment
from load_test.serverproc import ServerProcess
from load_test.stats import percentile

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "lost_or_hung": 0,
    "unexpected_5xx": 0,
    "p99_503_ms_below": 10.0,
    "rss_growth_mb_below": 50.0,
}


#: Distinct request bodies (more than a run sends: none is sent twice).
DISTINCT_BODIES = 65536

#: The server must reach at least this share of the model's offline items/s at batch 32 (64
#: one-text clients form batches of 32) for an overload run to describe the server at all.
MIN_CAPACITY_SHARE = 0.5
CAPACITY_CHECK = "capacity at least half the model's offline capacity"


def offline_capacity(server_args: Sequence[str], seconds: float) -> float:
    """Items/s of the served model called directly at batch 32 (``benchmarks/offline.py``)."""
    flags: dict[str, str | None] = {"--model": None, "--task": None}
    for index, arg in enumerate(server_args[:-1]):
        if arg in flags:
            flags[arg] = server_args[index + 1]
    command = [sys.executable, str(ROOT / "benchmarks" / "offline.py"), "--batch", "32"]
    command += ["--seconds", str(seconds)]
    for flag, value in flags.items():
        if value is not None:
            command += [flag, value]
    finished = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if finished.returncode != 0:
        raise RuntimeError(f"measuring the model offline failed: {finished.stderr.strip()}")
    return float(json.loads(finished.stdout.strip().splitlines()[-1])["items_per_s"])


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB (2**20 bytes)."""
    rss = rss_bytes(pid)
    if rss is None:
        raise RuntimeError(f"no resident memory reading for pid {pid}")
    return rss / 2**20


def outcome_table(result: RunResult) -> dict[str, Any]:
    records = result.records
    statuses = Counter(records.status)
    latencies: dict[int, list[float]] = {}
    for index, status in enumerate(records.status):
        latencies.setdefault(status, []).append(records.done[index] - records.intended[index])
    for values in latencies.values():
        values.sort()

    def p99_ms(status: int) -> float | None:
        values = latencies.get(status)
        return None if not values else 1000 * percentile(values, 99)

    accepted = statuses[200] + statuses[504]
    return {
        "sent": len(records),
        "ok_200": statuses[200],
        "overloaded_503": statuses[503],
        "deadline_504": statuses[504],
        "client_timeouts_or_hung": statuses[TIMEOUT],
        "connection_errors": statuses[CONNECTION_ERROR],
        "invalid_answers": statuses[INVALID],
        "other": {
            str(code): count
            for code, count in statuses.items()
            if code not in (200, 503, 504, TIMEOUT, CONNECTION_ERROR, INVALID)
        },
        "accepted": accepted,
        "p99_200_ms": p99_ms(200),
        "p50_200_ms": None if not latencies.get(200) else 1000 * percentile(latencies[200], 50),
        "p99_503_ms": p99_ms(503),
        "p50_503_ms": None if not latencies.get(503) else 1000 * percentile(latencies[503], 50),
        "items_per_s_served": sum(
            records.items[i] for i, s in enumerate(records.status) if s == 200
        )
        / result.wall_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m load_test.overload", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--factor", type=float, default=5.0, help="arrival rate / capacity")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of overload")
    parser.add_argument("--capacity-seconds", type=float, default=8.0)
    parser.add_argument(
        "--deadline-ms", type=float, default=2000.0, help="the server's --timeout-ms"
    )
    parser.add_argument(
        "--offline-seconds",
        type=float,
        default=4.0,
        help="measure the model offline this long first, to tell a starved server from a slow "
        "model (0: skip; needs the server's own repository)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--server-cmd",
        default="{python} server.py",
        help="how to start the server ({python} is this interpreter); run from the project root",
    )
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)

    # Every request a text of its own, as distinct clients send: the same body again from one
    # address is a resend, which the server holds until the queue could take it
    # (batching/http/resends.py), and the refusals measured would be those holds.
    payloads = build_payloads(api="plain", items=(1, 1), count=DISTINCT_BODIES, seed=1)
    # Before the server starts, so that the two never compete for the cores.
    offline = (
        offline_capacity(args.server_args, args.offline_seconds) if args.offline_seconds else None
    )
    log = ROOT / "load_test_results" / "overload-server.log"
    server_args = ["--timeout-ms", str(args.deadline_ms), *args.server_args]
    with ServerProcess(server_args, command=args.server_cmd, cwd=ROOT, log_path=log) as server:
        pid = server.pid
        assert pid is not None  # the with block started the server
        target = Target.parse(server.url)
        warm = LoadSpec(payloads=payloads, concurrency=64, duration=2.0)
        asyncio.run(run_load(target, warm))
        capacity_run = asyncio.run(
            run_load(
                target,
                LoadSpec(payloads=payloads, concurrency=64, duration=args.capacity_seconds),
            )
        )
        capacity = capacity_run.records.ok / capacity_run.wall_s
        rss_before = rss_mb(pid)
        rate = args.factor * capacity
        print(
            f"capacity {capacity:.0f} requests/s (64 clients); sending {rate:.0f}/s "
            f"Poisson for {args.duration:.0f} s; server RSS {rss_before:.0f} MB",
            flush=True,
        )
        overload = asyncio.run(
            run_load(
                target,
                LoadSpec(
                    payloads=payloads,
                    segments=(Segment(rate, rate, args.duration),),
                    process="poisson",
                    duration=args.duration,
                    # A request that gets no answer within 3 deadlines is counted as hung.
                    timeout=3 * args.deadline_ms / 1000,
                    max_connections=4096,
                ),
            )
        )
        rss_after = rss_mb(pid)
        # The server must still serve normally afterwards.
        after = asyncio.run(
            run_load(target, LoadSpec(payloads=payloads, concurrency=4, requests=50))
        )
    report = outcome_table(overload)
    report.update(
        capacity_requests_per_s=capacity,
        offline_items_per_s_batch_32=offline,
        arrival_rate=rate,
        deadline_ms=args.deadline_ms,
        rss_before_mb=rss_before,
        rss_after_mb=rss_after,
        rss_growth_mb=rss_after - rss_before,
        served_after=after.records.ok,
        client_cpu_s=overload.cpu_s,
        max_in_flight=overload.max_in_flight,
    )
    lost = report["client_timeouts_or_hung"] + report["connection_errors"]
    unexpected = (
        sum(count for code, count in report["other"].items() if int(code) >= 500)
        + report["invalid_answers"]
    )
    checks = {
        CAPACITY_CHECK: offline is None or capacity >= MIN_CAPACITY_SHARE * offline,
        "0 lost or hung requests": lost == 0,
        "0 unexpected 5xx": unexpected == 0,
        "p99 of 503 answers < 10 ms": (report["p99_503_ms"] or 0) < 10,
        "accepted p99 within the deadline": (report["p99_200_ms"] or 0) <= args.deadline_ms,
        "RSS growth < 50 MB": report["rss_growth_mb"] < 50,
        "serves normally afterwards": after.records.ok == 50,
    }
    report["checks"] = checks
    print(json.dumps({k: v for k, v in report.items() if k != "checks"}, indent=2))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    if offline is not None and not checks[CAPACITY_CHECK]:
        print(
            f"the server's capacity ({capacity:.0f} requests/s of one text, 64 clients) is far "
            f"below the model's offline capacity on this machine ({offline:.0f} items/s at batch "
            "32): something starves the server (another process on the cores, too many "
            "threads), so the overload figures above describe that, not the server",
            file=sys.stderr,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""How fast the server says no when the model is not computing: the web stack alone.

Starts ``python server.py`` with a model that holds its only instance (``tests.support.models:
GatedModel``) and a queue of 4, so every request but the first few is refused with 503, then
sends Poisson arrivals at ``--rate`` for ``--seconds`` and prints the 503 latency. Set beside
``python -m load_test.overload``, whose refusals compete with a busy model for the CPU, it
separates what the HTTP path costs from what CPU contention adds.

    python benchmarks/rejections.py --rate 1800
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from load_test.client import LoadSpec, Target, run_load  # noqa: E402
from load_test.payloads import build_payloads  # noqa: E402
from load_test.schedule import Segment  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.stats import percentile  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1800.0, help="requests/s")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    # Every request a text of its own: the same body again from one address is a resend,
    # which the server holds until the queue could take it (batching/http/resends.py).
    count = int(args.rate * args.seconds) + 1
    payloads = build_payloads(api="plain", items=(1, 1), count=count, seed=1)
    log = ROOT / "load_test_results" / "rejections-server.log"
    flags = [
        "--model",
        "tests.support.models:GatedModel",
        "--max-queue-size",
        "4",
        "--timeout-ms",
        "3000",
    ]
    with ServerProcess(flags, cwd=ROOT, log_path=log) as server:
        # One request takes the instance and never comes back; the queue fills behind it.
        with httpx.Client(timeout=0.2) as client:
            try:
                client.post(server.url, content=b"holds the instance")
            except httpx.TimeoutException:
                pass
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(args.rate, args.rate, args.seconds),),
            duration=args.seconds,
            timeout=5.0,
            max_connections=4096,
        )
        result = asyncio.run(run_load(Target.parse(server.url), spec))
    records = result.records
    refused = sorted(
        records.done[i] - records.intended[i]
        for i in range(len(records))
        if records.status[i] == 503
    )
    print(f"outcomes: {dict(Counter(records.status))}")
    print(
        f"503 answers: {len(refused)}, p50 {1000 * percentile(refused, 50):.1f} ms, "
        f"p99 {1000 * percentile(refused, 99):.1f} ms, max {1000 * refused[-1]:.1f} ms"
    )
    print(f"load generator CPU: {result.cpu_s / result.wall_s:.0%} of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

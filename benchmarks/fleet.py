"""One replica against N replicas behind HAProxy (deploy/haproxy/run.sh), same load tool,
same closed-loop load, on this machine.

    python benchmarks/fleet.py --replicas 2 --concurrency 64 --seconds 20 [-- server flags]

Each replica gets an equal share of the cores: unless ``--torch-threads`` is among the server
flags, each run passes ``--torch-threads cores // replicas`` (2 for one replica on 2 cores, 1
for each of two), so the replicas do not oversubscribe the cores they share. Prints the
results and their ratio as JSON; ``--json FILE`` writes them too. Arguments after ``--`` go to
every ``server.py``. On one machine the fleet shares the cores: the ratio shows what HAProxy
and N processes cost or gain here, not what N machines would give.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._load import load, report  # noqa: E402
from tests.support.fleet import Fleet  # noqa: E402


def share(replicas: int) -> int:
    return max(1, (os.cpu_count() or 1) // replicas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("server_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    flags = [flag for flag in args.server_flags if flag != "--"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for replicas in (1, args.replicas):
            label = f"{replicas} replica(s) behind HAProxy"
            run_dir = Path(tmp) / f"fleet-{replicas}"
            threads = ["--torch-threads", str(share(replicas))]
            if "--torch-threads" in flags:
                threads = []
            with Fleet(replicas, [*flags, *threads], run_dir, ready_timeout=600) as f:
                out = Path(tmp) / f"load-{replicas}"
                results.append(load(f.url, args.concurrency, args.seconds, out, label))
                # The single replica also straight, without HAProxy, to show HAProxy's cost.
                if replicas == 1:
                    results.append(
                        load(
                            f.replica_url(1),
                            args.concurrency,
                            args.seconds,
                            Path(tmp) / "load-direct",
                            "1 replica, direct",
                        )
                    )
    doc = {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "server_flags": flags,
        "results": results,
        "fleet_over_one_replica": round(results[2]["items_per_s"] / results[1]["items_per_s"], 3),
    }
    report(doc, args.json)


if __name__ == "__main__":
    main()

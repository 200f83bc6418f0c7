"""Time to ready: ``python server.py`` from launch until ``/v2/health/ready`` answers 200, and
the server process's resident memory once it is idle.

Each round starts the server on an engine cache of its own: a *fresh* start (an empty cache:
export, check and time every variant) and then *cached* starts on the cache the fresh one
wrote. The figures are medians over ``--rounds``; the CPU time other processes took during
each timing is printed beside it, since a start on a busy machine is slower.

    python benchmarks/startup.py                      # 3 rounds: fresh, then 3 cached
    python benchmarks/startup.py --rounds 5 --no-fresh --cache-dir /var/cache/engines
    python benchmarks/startup.py --server-arg=--engine=torch
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from load_test.procstat import rss_bytes  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402


def _others_cpu_s(before: psutil._common.scputimes, after: psutil._common.scputimes) -> float:
    """CPU seconds the whole machine spent busy between two readings."""
    busy = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(getattr(after, name) - getattr(before, name) for name in busy)


def start_once(cache: Path, args: argparse.Namespace, label: str) -> tuple[float, float, float]:
    """One start: seconds to ready, the idle RSS in MB, and the CPU seconds other processes
    used meanwhile."""
    log = ROOT / "load_test_results" / f"startup-{label}.log"
    env = {"BATCHING_ENGINE_CACHE": str(cache)}
    machine = psutil.cpu_times()
    with ServerProcess(args.server_arg, cwd=ROOT, log_path=log, env=env) as server:
        machine_after = psutil.cpu_times()
        assert server.pid is not None
        tree = psutil.Process(server.pid)
        own = sum(
            p.cpu_times().user + p.cpu_times().system
            for p in [tree, *tree.children(recursive=True)]
            if p.is_running()
        )
        others = max(0.0, _others_cpu_s(machine, machine_after) - own)
        time.sleep(args.settle)  # idle: no request has been sent
        rss = (rss_bytes(server.pid) or 0) / 2**20
        return server.startup_s, rss, others


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="cached starts (3)")
    parser.add_argument("--no-fresh", action="store_true", help="only cached starts")
    parser.add_argument("--cache-dir", type=Path, help="the engine cache (default: a temp dir)")
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before the RSS")
    parser.add_argument(
        "--server-arg", action="append", default=[], metavar="ARG", help="server flag"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="engines-") as temporary:
        cache = args.cache_dir or Path(temporary)
        rows: list[tuple[str, float, float, float]] = []
        if not args.no_fresh:
            rows.append(("fresh", *start_once(cache, args, "fresh")))
            print(
                f"fresh: ready in {rows[-1][1]:.1f} s, idle RSS {rows[-1][2]:.0f} MB, "
                f"other processes {rows[-1][3]:.1f} CPU s",
                flush=True,
            )
        for round_ in range(args.rounds):
            rows.append(("cached", *start_once(cache, args, "cached")))
            print(
                f"cached {round_ + 1}: ready in {rows[-1][1]:.1f} s, idle RSS "
                f"{rows[-1][2]:.0f} MB, other processes {rows[-1][3]:.1f} CPU s",
                flush=True,
            )
    print("| start | ready s (median) | idle RSS MB (median) | other processes' CPU s |")
    print("|---|---|---|---|")
    for kind in ("fresh", "cached"):
        chosen = [row for row in rows if row[0] == kind]
        if chosen:
            print(
                f"| {kind} (x{len(chosen)}) | {statistics.median(r[1] for r in chosen):.2f} | "
                f"{statistics.median(r[2] for r in chosen):.0f} | "
                f"{'/'.join(f'{r[3]:.1f}' for r in chosen)} |"
            )
    print(f"server flags: {args.server_arg or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

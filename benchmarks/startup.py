"""Time to ready: ``python server.py`` from launch until ``/v2/health/ready`` answers 200, and
the server process's resident memory once it is idle.

Each round starts the server on an engine cache of its own: a *fresh* start (an empty cache:
export, check and time every variant) and then a *cached* start on the cache the fresh one
wrote (``--no-fresh``: cached starts only, on one cache). The figures are medians over
``--rounds``; the CPU time other processes took during
each timing is printed beside it, since a start on a busy machine is slower.

    python benchmarks/startup.py                      # 3 rounds: fresh, then cached
    python benchmarks/startup.py --rounds 5 --no-fresh --cache-dir /var/cache/engines
    python benchmarks/startup.py --server-arg=--engine=torch
    # this checkout against another (an export of an older commit), interleaved: each round
    # starts each checkout fresh on an empty cache of its own, then once on that cache
    python benchmarks/startup.py --compare-dir ../before --rounds 3
"""

from __future__ import annotations

import argparse
import shlex
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


def start_once(
    cache: Path, args: argparse.Namespace, label: str, root: Path = ROOT
) -> tuple[float, float, float]:
    """One start of ``root``'s server: seconds to ready, the idle RSS in MB, and the CPU
    seconds other processes used meanwhile."""
    log = ROOT / "load_test_results" / f"startup-{label}.log"
    env = {"BATCHING_ENGINE_CACHE": str(cache)}
    command = "{python} " + shlex.quote(str(root / "server.py"))
    machine = psutil.cpu_times()
    with ServerProcess(args.server_arg, command=command, cwd=root, log_path=log, env=env) as server:
        machine_after = psutil.cpu_times()
        assert server.pid is not None
        tree = psutil.Process(server.pid)
        # The server's own CPU time: its processes', and that of the children it has reaped
        # (the process that exported and timed the engines exits before the server is ready).
        own = sum(
            sum(p.cpu_times()[:4])  # user, system, children_user, children_system
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
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--no-fresh", action="store_true", help="only cached starts")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="the engine cache (default: a temp dir); fresh starts take a folder per round in it",
    )
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before the RSS")
    parser.add_argument(
        "--server-arg", action="append", default=[], metavar="ARG", help="server flag"
    )
    parser.add_argument(
        "--compare-dir",
        type=Path,
        help="another checkout (an export of an older commit) started the same way, interleaved",
    )
    args = parser.parse_args(argv)
    roots = [("this", ROOT)]
    if args.compare_dir is not None:
        roots.append((args.compare_dir.name, args.compare_dir.resolve()))
    rows: list[tuple[str, str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="engines-") as temporary:

        def cache_of(name: str, round_: int) -> Path:
            base = Path(args.cache_dir or temporary)
            if args.cache_dir is None or len(roots) > 1:
                base = base / name
            # Fresh starts get an empty cache each round; cached-only runs share one.
            return base if args.no_fresh else base / f"round-{round_ + 1}"

        for round_ in range(args.rounds):
            for name, root in roots if round_ % 2 == 0 else roots[::-1]:
                cache = cache_of(name, round_)
                kinds = ("cached",) if args.no_fresh else ("fresh", "cached")
                for kind in kinds:
                    row = start_once(cache, args, f"{name}-{kind}", root)
                    rows.append((name, kind, *row))
                    print(
                        f"round {round_ + 1}, {name}, {kind}: ready in {row[0]:.1f} s, idle RSS "
                        f"{row[1]:.0f} MB, other processes {row[2]:.1f} CPU s",
                        flush=True,
                    )
    print("| checkout | start | ready s (median) | idle RSS MB (median) | others' CPU s |")
    print("|---|---|---|---|---|")
    for name, _ in roots:
        for kind in ("fresh", "cached"):
            chosen = [row for row in rows if row[0] == name and row[1] == kind]
            if chosen:
                print(
                    f"| {name} | {kind} (x{len(chosen)}) | "
                    f"{statistics.median(r[2] for r in chosen):.2f} | "
                    f"{statistics.median(r[3] for r in chosen):.0f} | "
                    f"{'/'.join(f'{r[4]:.1f}' for r in chosen)} |"
                )
    print(f"server flags: {args.server_arg or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Resident memory of the server, on the default model: idle after the first and after a cached
start, per instance kind and count, and over a soak of mixed traffic.

Idle: starts ``python server.py`` (default settings plus ``--server-arg`` flags) on an empty
engine cache (the first start: export, check and time in a child process), waits until it is
ready and ``--settle`` seconds more (the engines give their buffers back after 5 idle seconds),
and reads the server process's RSS; then starts it again on that cache (a cached start) and
reads it the same way.

The table: for each setting, starts ``python server.py``, waits until every instance is
ready, sends a few batches of maximum-length text so the allocator reaches its working size,
and reads the RSS of the server process and of each child process (process instances) with
psutil.

The soak: starts ``python server.py`` (1 thread instance, plus ``--server-arg`` flags and
``--env`` variables), reads the process tree's RSS idle, after ``--warmup-seconds`` of mixed
traffic and after ``--soak-seconds`` more (closed-loop clients sending 1 to 1,024 texts of 2
to 256 words each), and reports the growth from warm-up to the end (target: under 5 %).

After a prepared start (``--prepared``, on by default): runs ``python server.py --prepare`` into
an empty engine cache, starts the server on it, and reads its RSS (with the anonymous and the
file-backed part, from ``/proc/PID/smaps_rollup``) idle, after 200 one-text requests (target:
350 MB, goal 300), and at 10 s and 60 s of load from ``--load-clients`` closed-loop clients
sending one text of 4 to 128 words each: the growth between those two (target: under 5 %).

    python benchmarks/memory.py                           # idle, the table, a 600 s soak
    python benchmarks/memory.py --no-table --no-soak      # idle after a first/cached start
    python benchmarks/memory.py --no-idle --no-table --soak-seconds 60 --warmup-seconds 10
    python benchmarks/memory.py --no-table --soak-seconds 600 --server-arg=--malloc=off
    python benchmarks/memory.py --no-table --server-arg=--malloc=off --env MALLOC_ARENA_MAX=2
    python benchmarks/memory.py --no-table --warmup-seconds 5 --soak-seconds 10   # smoke
    python benchmarks/memory.py --no-idle --no-table --no-soak     # after a prepared start
    python benchmarks/memory.py --no-idle --no-table --no-soak --server-arg=--precision \
        --server-arg=fp32
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from load_test.metrics_scrape import parse_samples  # noqa: E402
from load_test.procstat import child_pids, rss_bytes, tree_rss_bytes  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402
from load_test.soak import Mix, run_soak, summary  # noqa: E402

#: Mixed requests carry up to 1,024 texts of 256 words: over the default 1 MiB body limit, and
#: about 30 s of compute on 2 cores, over the default 30 s deadline once the queue is counted
#: (admission would refuse them all, and the soak would measure an idle server).
SOAK_FLAGS = ["--max-body-bytes", str(16 << 20), "--timeout-ms", "600000"]

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


def tree_mb(pid: int) -> float:
    return (tree_rss_bytes(pid) or 0) / 2**20


def soak(args: argparse.Namespace) -> int:
    env = dict(item.split("=", 1) for item in args.env)
    log = ROOT / "load_test_results" / "memory-soak-server.log"
    with ServerProcess([*SOAK_FLAGS, *args.server_arg], cwd=ROOT, log_path=log, env=env) as server:
        assert server.pid is not None
        pid = server.pid
        time.sleep(2.0)  # let start-up settle before the idle reading
        idle = tree_mb(pid)
        mix = Mix(small=0, big=0, mixed=args.clients)
        warm = summary(run_soak(server.url, mix, duration=args.warmup_seconds, seed=1))
        warmed = tree_mb(pid)
        print(
            f"idle {idle:.0f} MB; after {args.warmup_seconds:.0f} s warm-up {warmed:.0f} MB",
            flush=True,
        )

        def progress(window: dict[str, object]) -> None:
            print(f"  t={window['end']:.0f}s rss {window.get('rss_mb')} MB", flush=True)

        result = run_soak(
            server.url,
            mix,
            duration=args.soak_seconds,
            window=args.window,
            server_pid=pid,
            seed=2,
            on_window=progress,
        )
        soaked = tree_mb(pid)
        # Idle again: the engines give their buffers back after 5 s, and the thread governor's
        # spare compiled copies after 60 s (wait for the requests still running first).
        time.sleep(args.rest_seconds)
        rested = tree_mb(pid)
    figures = summary(result)
    peak = figures.get("rss_mb", {}).get("max", soaked)
    growth = (soaked - warmed) / warmed * 100 if warmed else 0.0
    requests = figures["kinds"].get("mixed", {})
    print("| reading | process tree RSS MB |")
    print("|---|---|")
    print(f"| idle (ready, no request yet) | {idle:.0f} |")
    print(f"| after {args.warmup_seconds:.0f} s warm-up | {warmed:.0f} |")
    print(f"| after {args.soak_seconds:.0f} s mixed soak | {soaked:.0f} (peak {peak:.0f}) |")
    print(f"| idle {args.rest_seconds:.0f} s after the soak | {rested:.0f} |")
    print(f"growth from warm-up to the end of the soak: {growth:+.1f}% (target < 5%)")
    print(
        f"soak traffic: {requests.get('ok', 0)} answered requests, "
        f"{requests.get('items_per_s', 0):.0f} items/s, warm-up {warm['kinds']}; "
        f"server flags {[*SOAK_FLAGS, *args.server_arg]}, env {env or '-'}"
    )
    return 0 if growth < 5 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-idle", action="store_true", help="skip the idle readings")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="idle seconds before an idle reading (10)"
    )
    parser.add_argument(
        "--rest-seconds", type=float, default=75.0, help="idle seconds after the soak (75)"
    )
    parser.add_argument("--no-table", action="store_true", help="skip the per-setting table")
    parser.add_argument("--no-soak", action="store_true", help="skip the mixed soak")
    parser.add_argument(
        "--no-prepared", action="store_true", help="skip the readings after a prepared start"
    )
    parser.add_argument("--load-clients", type=int, default=4, help="clients of the 60 s load (4)")
    parser.add_argument("--soak-seconds", type=float, default=600.0, help="soak length (600)")
    parser.add_argument("--warmup-seconds", type=float, default=60.0, help="warm-up (60)")
    parser.add_argument("--clients", type=int, default=2, help="mixed closed-loop clients (2)")
    parser.add_argument("--window", type=float, default=30.0, help="RSS reading every (30) s")
    parser.add_argument(
        "--server-arg", action="append", default=[], metavar="ARG", help="server flag"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="server variable"
    )
    args = parser.parse_args(argv)
    code = 0
    if not args.no_idle:
        idle(args)
    if not args.no_table:
        code = table()
    if not args.no_soak:
        code = soak(args) or code
    if not args.no_prepared:
        code = prepared(args) or code
    return code


def rollup_mb(pid: int) -> str:
    """The anonymous and file-backed parts of a process's RSS (``/proc/PID/smaps_rollup``)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return "-"
    kb = {name: int(fields.get(name, "0 kB").split()[0]) for name in ("Anonymous", "Rss")}
    return f"{kb['Anonymous'] / 1024:.0f} anon + {(kb['Rss'] - kb['Anonymous']) / 1024:.0f} file"


def _load(url: str, stop: threading.Event, seed: int, done: list[int]) -> None:
    """One closed-loop client: one text of 4 to 128 words per request, until ``stop``."""
    rng = random.Random(seed)
    words = ["measure", "memory", "server", "batch", "text", "engine", "short", "long"]
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            text = " ".join(rng.choices(words, k=rng.randint(4, 128)))
            if client.post(url, json={"inputs": [text]}).status_code == 200:
                done[0] += 1


def prepared(args: argparse.Namespace) -> int:
    """RSS after ``--prepare`` and a start from its cache: idle, after 200 one-text requests,
    and at 10 s and 60 s of load; 1 when over 350 MB or growing 5 % or more."""
    log = ROOT / "load_test_results" / "memory-prepared-server.log"
    with tempfile.TemporaryDirectory(prefix="engines-") as cache:
        env = {"BATCHING_ENGINE_CACHE": cache}
        started = time.monotonic()
        subprocess.run(
            [sys.executable, str(ROOT / "server.py"), "--prepare", *args.server_arg],
            cwd=ROOT,
            env={**os.environ, **env},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        prepare_s = time.monotonic() - started
        with ServerProcess(args.server_arg, cwd=ROOT, log_path=log, env=env) as server:
            assert server.pid is not None
            pid = server.pid
            time.sleep(args.settle)  # idle: no request has been sent
            rows = [("idle after the start", rss_mb(pid), rollup_mb(pid))]
            with httpx.Client(timeout=120) as client:
                for number in range(200):
                    client.post(server.url, json={"inputs": [f"a short sentence, {number}"]})
            rows.append(("after 200 one-text requests", rss_mb(pid), rollup_mb(pid)))
            stop, done = threading.Event(), [0]
            clients = [
                threading.Thread(target=_load, args=(server.url, stop, seed, done), daemon=True)
                for seed in range(args.load_clients)
            ]
            for client_thread in clients:
                client_thread.start()
            stop.wait(10.0)  # the load runs meanwhile: readings at 10 s and 60 s
            at_10 = rss_mb(pid)
            rows.append(("after 10 s of load", at_10, rollup_mb(pid)))
            stop.wait(50.0)
            at_60 = rss_mb(pid)
            rows.append(("after 60 s of load", at_60, rollup_mb(pid)))
            stop.set()
            for client_thread in clients:
                client_thread.join()
            startup_s = server.startup_s
    print("| after a prepared start | server process RSS MB | of which |")
    print("|---|---|---|")
    for name, mb, parts in rows:
        print(f"| {name} | {mb:.0f} | {parts} |")
    growth = (at_60 - at_10) / at_10 * 100 if at_10 else 0.0
    after_requests = rows[1][1]
    print(
        f"--prepare {prepare_s:.1f} s, ready {startup_s:.1f} s after launch; after 200 "
        f"requests {after_requests:.0f} MB (target 350, goal 300); growth 10 s -> 60 s of load "
        f"{growth:+.1f}% (target < 5%), {done[0]} requests from {args.load_clients} clients; "
        f"server flags {args.server_arg or '-'}"
    )
    return 0 if after_requests <= 350 and growth < 5 else 1


def idle(args: argparse.Namespace) -> None:
    """Idle RSS of the server process after its first start and after a cached start."""
    print("| start | ready after s | idle server process RSS MB | process tree MB |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="engines-") as cache:
        for name in ("first start (empty engine cache)", "cached start"):
            log = ROOT / "load_test_results" / "memory-idle-server.log"
            env = {"BATCHING_ENGINE_CACHE": cache}
            with ServerProcess(args.server_arg, cwd=ROOT, log_path=log, env=env) as server:
                assert server.pid is not None
                time.sleep(args.settle)  # idle: no request has been sent
                print(
                    f"| {name} | {server.startup_s:.1f} | {rss_mb(server.pid):.0f} | "
                    f"{tree_mb(server.pid):.0f} |",
                    flush=True,
                )
    print(f"server flags {args.server_arg or '-'}; idle {args.settle:.0f} s before reading")


def table() -> int:
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

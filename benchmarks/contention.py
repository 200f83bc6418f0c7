"""The server beside other work: default settings against fixed thread counts, when the cores
are free, when one CPU-bound process competes for them, and when ``taskset`` leaves one core.

For each setting (the defaults, then ``--torch-threads N`` for each N of ``--threads``) and each
round (settings rotated, so drift hits them alike) it starts ``python server.py`` and measures
``--clients`` closed-loop one-sentence clients for ``--seconds``:

- **idle**: nothing else runs;
- **one competing process**: a Python busy loop, unpinned, runs beside the server (the load
  runs ``--settle-seconds`` unrecorded first: this measures the condition, not the change);
- **one core by taskset**: the server is started under ``taskset -c 0`` (the load generator is not).

It prints items/s per condition and setting (medians over rounds), the best fixed setting, and
the defaults as a share of it. Targets (the "machine's limit" issue): at least 0.8x beside one
competing process, at least 0.9x on one core.

    python benchmarks/contention.py                          # 3 rounds of 10 s
    python benchmarks/contention.py --rounds 1 --seconds 3   # a smoke run
    python benchmarks/contention.py --server-arg=--engine=torch
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.serving import closed_loop, sentences  # noqa: E402
from load_test.serverproc import DEFAULT_COMMAND, ServerProcess  # noqa: E402

CONDITIONS = ("idle", "compete", "taskset")
TITLES = {
    "idle": "idle",
    "compete": "one competing process",
    "taskset": "one core by taskset",
}
TARGETS = {"compete": 0.8, "taskset": 0.9}
BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def competitor() -> Iterator[None]:
    """One CPU-bound process for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def measure(port: int, clients: int, seconds: float, texts: list[str]) -> float:
    result = asyncio.run(closed_loop(port, clients, seconds, texts))
    return float(result["items_per_s"])


def one_round(
    settings: dict[str, list[str]], args: argparse.Namespace, texts: list[str]
) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {condition: {} for condition in CONDITIONS}
    log = ROOT / "load_test_results" / "contention-server.log"
    for name, flags in settings.items():
        flags = [*flags, *args.server_arg]
        with ServerProcess(flags, cwd=ROOT, log_path=log) as server:
            measure(server.port, args.clients, 2.0, texts)  # the first requests, unrecorded
            figures["idle"][name] = measure(server.port, args.clients, args.seconds, texts)
            with competitor():
                # The condition's steady state: the load runs unrecorded while the server
                # (and the scheduler) settle on the new condition, for every setting alike.
                measure(server.port, args.clients, args.settle_seconds, texts)
                figures["compete"][name] = measure(server.port, args.clients, args.seconds, texts)
        pinned = f"taskset -c {args.core} {DEFAULT_COMMAND}"
        with ServerProcess(flags, command=pinned, cwd=ROOT, log_path=log) as server:
            measure(server.port, args.clients, 2.0, texts)
            figures["taskset"][name] = measure(server.port, args.clients, args.seconds, texts)
        print(
            f"  {name}: "
            + " | ".join(f"{TITLES[c]} {figures[c][name]:.0f} items/s" for c in CONDITIONS),
            flush=True,
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement (10)")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients (64)")
    parser.add_argument(
        "--threads", default="1,2", help="fixed --torch-threads values to compare (1,2)"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=3.0,
        help="load run unrecorded after the competitor starts (3)",
    )
    parser.add_argument("--core", type=int, default=0, help="the core taskset leaves (0)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    fixed = {f"--torch-threads {n}": ["--torch-threads", n] for n in args.threads.split(",")}
    names = ["defaults", *fixed]
    settings_all = {"defaults": [], **fixed}
    texts = sentences(600)
    rounds: list[dict[str, dict[str, float]]] = []
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        print(f"round {index + 1}: {', '.join(order)}", flush=True)
        rounds.append(one_round({name: settings_all[name] for name in order}, args, texts))

    table: dict[str, Any] = {}
    print()
    print(f"| condition | {' | '.join(names)} | best fixed | defaults / best fixed | target |")
    print(f"|---|{'---|' * len(names)}---|---|---|")
    for condition in CONDITIONS:
        medians = {n: statistics.median(r[condition][n] for r in rounds) for n in names}
        best_name = max(fixed, key=lambda n: medians[n])
        ratio = medians["defaults"] / medians[best_name] if medians[best_name] else 0.0
        target = TARGETS.get(condition)
        verdict = (
            "-" if target is None else f">= {target} ({'met' if ratio >= target else 'NOT met'})"
        )
        table[condition] = {"items_per_s": medians, "best_fixed": best_name, "ratio": ratio}
        cells = " | ".join(f"{medians[n]:.0f}" for n in names)
        print(f"| {TITLES[condition]} | {cells} | {best_name} | {ratio:.2f} | {verdict} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "rounds": rounds, "table": table},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Compare server settings under the same loads, in one run, and print a Markdown table.

Each ``--setting NAME=FLAGS`` starts ``python server.py FLAGS`` in turn; each ``--load``
is run against it:

- ``cN``: closed loop, N concurrent clients;
- ``rateX``: open loop, Poisson arrivals at X requests/s;
- ``capX``: open loop at X times the capacity measured by the first ``cN`` load of the first
  setting (so every setting gets the same absolute rate).

``--rounds`` repeats the whole grid, settings interleaved, and reports medians, because
this 2-core machine is noisy. Examples (the commands behind docs/benchmarks.md):

    python benchmarks/compare.py --setting "fixed 0 ms=--max-queue-delay-ms 0" \\
        --setting "fixed 5 ms=--max-queue-delay-ms 5" --setting "adaptive=--batching adaptive" \\
        --load c64 --load c1 --load cap0.7
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.client import LoadSpec, Target  # noqa: E402
from load_test.measure import measure  # noqa: E402
from load_test.payloads import build_payloads, load_texts, make_sentence  # noqa: E402
from load_test.schedule import Segment  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402


def parse_setting(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"a setting is NAME=FLAGS, not {text!r}")
    return name.strip(), shlex.split(flags)


def run_point(
    url: str, load: str, capacity: float | None, args: argparse.Namespace, payloads: Any
) -> dict[str, Any]:
    target = Target.parse(url)
    if load.startswith("c") and load[1:].isdigit():
        spec = LoadSpec(payloads=payloads, concurrency=int(load[1:]), duration=args.seconds)
    else:
        if load.startswith("cap"):
            if capacity is None:
                raise SystemExit("a capX load needs a cN load before it")
            rate = float(load[3:]) * capacity
        else:
            rate = float(load.removeprefix("rate"))
        spec = LoadSpec(
            payloads=payloads,
            segments=(Segment(rate, rate, args.seconds),),
            duration=args.seconds,
            seed=args.seed,
            max_connections=512,
        )
    doc = measure(target, spec, warmup=args.warmup).doc
    summary = doc["summary"]
    batches = doc.get("server_batches") or {}
    mean_batch = next(iter(batches.values()), {}).get("mean_size") if batches else None
    return {
        "requests_per_s": summary["throughput"]["requests_per_s"],
        "items_per_s": summary["throughput"]["items_per_s"],
        "p50_ms": summary["latency"]["p50_ms"],
        "p99_ms": summary["latency"]["p99_ms"],
        "error_rate": summary["error_rate"],
        "mean_batch": mean_batch,
        "warnings": doc["client"].get("warnings", []),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", action="append", type=parse_setting, required=True)
    parser.add_argument("--load", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0, help="per load")
    parser.add_argument("--warmup", type=int, default=50, help="unrecorded requests first")
    parser.add_argument("--items", default="1", help="inputs per request, N or A-B")
    parser.add_argument("--words", default="12", help="words per sentence, N or A-B")
    parser.add_argument("--payload-file", type=Path, help="inputs, one per line")
    parser.add_argument(
        "--mixed",
        metavar="SHORT:LONG:SHARE",
        help="a mixed-length workload: texts of SHORT or LONG words, LONG ones in SHARE of "
        "the inputs (e.g. 12:200:0.25), interleaved at random",
    )
    parser.add_argument("--api", default="json", choices=("plain", "json", "v2"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args(argv)

    def span(text: str) -> tuple[int, int]:
        low, _, high = text.partition("-")
        return int(low), int(high or low)

    texts = load_texts(args.payload_file) if args.payload_file else None
    if args.mixed:
        short, long, share = args.mixed.split(":")
        rng = random.Random(args.seed)
        texts = [
            make_sentence(rng, int(long) if rng.random() < float(share) else int(short))
            for _ in range(2000)
        ]
    payloads = build_payloads(
        api=args.api, items=span(args.items), words=span(args.words), texts=texts, seed=args.seed
    )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    capacity: float | None = None
    log = ROOT / "load_test_results" / "compare-server.log"
    for round_index in range(args.rounds):
        for name, flags in args.setting:
            with ServerProcess(flags, cwd=ROOT, log_path=log) as server:
                for load in args.load:
                    point = run_point(server.url, load, capacity, args, payloads)
                    if capacity is None and load[1:].isdigit():
                        capacity = point["requests_per_s"]
                    results.setdefault((name, load), []).append(point)
                    print(
                        f"round {round_index + 1} {name:>16} {load:>8}: "
                        f"{point['items_per_s']:8.1f} items/s  p50 {point['p50_ms']} ms  "
                        f"p99 {point['p99_ms']} ms  batch {point['mean_batch']}  "
                        f"errors {point['error_rate']:.3f}",
                        flush=True,
                    )
                    for warning in point["warnings"]:
                        print(f"    client warning: {warning}", flush=True)

    def med(name: str, load: str, key: str) -> float:
        values = [p[key] for p in results[(name, load)] if p[key] is not None]
        return statistics.median(values) if values else float("nan")

    print()
    header = "| setting | " + " | ".join(
        f"{load}: items/s | {load}: p50 ms | {load}: p99 ms | {load}: batch" for load in args.load
    )
    print(header + " |")
    print("|---" * (1 + 4 * len(args.load)) + "|")
    for name, _ in args.setting:
        cells = []
        for load in args.load:
            cells += [
                f"{med(name, load, 'items_per_s'):.0f}",
                f"{med(name, load, 'p50_ms'):.1f}",
                f"{med(name, load, 'p99_ms'):.1f}",
                f"{med(name, load, 'mean_batch'):.1f}",
            ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if capacity is not None:
        print(f"\ncapacity used for capX loads: {capacity:.1f} requests/s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {f"{name} | {load}": points for (name, load), points in results.items()},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

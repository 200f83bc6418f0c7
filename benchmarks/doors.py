"""What each front door costs: the same load through every door of one server, with the load tool.

Starts ``python server.py`` (the default model, HTTP and gRPC) once, then, round after round,
runs a closed loop of one-sentence requests at each concurrency through each door in turn
(interleaved, so drift on a shared machine hits them alike): plain JSON (``POST /``), KServe
v2 over HTTP with JSON and with binary tensors, KServe v2 over gRPC, and the OpenAI embeddings
API (base64, as the SDK asks). Prints items/s and p50/p99 medians over the rounds, and each
door's throughput as a ratio of plain JSON's at the same concurrency.

    python benchmarks/doors.py                          # c=1 and c=64, 3 rounds of 8 s
    python benchmarks/doors.py --rounds 5 --seconds 10 --json doors.json -- --max-batch-size 64
    # this checkout against another (an export of an older commit), both servers up at once,
    # every measurement interleaved:
    python benchmarks/doors.py --compare-dir ../base --rounds 2

Arguments after ``--`` go to ``server.py``. This is a benchmark: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.client import LoadSpec, Target, run_load  # noqa: E402
from load_test.payloads import build_payloads  # noqa: E402
from load_test.serverproc import ServerProcess, free_port  # noqa: E402
from load_test.stats import percentile  # noqa: E402

#: (label, load-tool api) in the order each round runs them.
DOORS = (
    ("plain JSON", "json"),
    ("v2 HTTP JSON", "v2"),
    ("v2 HTTP binary", "v2-binary"),
    ("v2 gRPC", "grpc"),
    ("OpenAI base64", "openai"),
)


def measure(
    target: Target,
    grpc: str,
    api: str,
    concurrency: int,
    seconds: float,
    model: str,
    server_pid: int | None = None,
) -> dict[str, float]:
    payloads = build_payloads(api=api, items=(1, 1), count=1024, seed=7, model_name=model)
    spec = LoadSpec(payloads=payloads, concurrency=concurrency, duration=seconds, grpc_target=grpc)
    result = asyncio.run(run_load(target, spec, server_pid=server_pid))
    records = result.records
    latencies = sorted(
        1000 * (done - sent)
        for done, sent, status in zip(records.done, records.sent, records.status, strict=True)
        if status == 200
    )
    failed = len(records) - records.ok
    return {
        "items_per_s": records.ok / result.wall_s,
        "p50_ms": percentile(latencies, 50) if latencies else float("nan"),
        "p99_ms": percentile(latencies, 99) if latencies else float("nan"),
        "errors": float(failed),
        "client_cpu_s": result.cpu_s,
        # The server's CPU per item served: the door's own cost, whatever the client spends.
        "server_cpu_ms_per_item": (
            1000 * result.server_cpu_s / max(1, sum(records.items))
            if result.server_cpu_s is not None
            else float("nan")
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--concurrency", default="1,64", help="comma list of client counts")
    parser.add_argument("--model-name", default="all-MiniLM-L6-v2", help="the served model")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument(
        "--compare-dir",
        type=Path,
        help="another checkout of this project: its server.py runs beside this one's, and "
        "each door's figures are compared with it",
    )
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    roots = [("this", ROOT)]
    if args.compare_dir is not None:
        roots.append((args.compare_dir.resolve().name, args.compare_dir.resolve()))
    doors = [
        (label if len(roots) == 1 else f"{label} [{tag}]", api, tag)
        for label, api in DOORS
        for tag, _ in roots
    ]
    results: dict[str, dict[int, list[dict[str, float]]]] = {
        label: {level: [] for level in levels} for label, _, _ in doors
    }
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[Target, str, int]] = {}
        for tag, root in roots:
            grpc_port = free_port()
            log = ROOT / "load_test_results" / f"doors-server-{tag}.log"
            log.parent.mkdir(exist_ok=True)
            server = stack.enter_context(
                ServerProcess(
                    ["--grpc-port", str(grpc_port), *args.server_args], cwd=root, log_path=log
                )
            )
            servers[tag] = (Target.parse(server.url), f"127.0.0.1:{grpc_port}", server.pid)
        for _, api, tag in doors:  # every door's first requests, unrecorded
            target, grpc, _pid = servers[tag]
            measure(target, grpc, api, 8, 1.0, args.model_name)
        for round_ in range(args.rounds):
            for level in levels:
                for label, api, tag in doors:
                    target, grpc, pid = servers[tag]
                    figures = measure(target, grpc, api, level, args.seconds, args.model_name, pid)
                    results[label][level].append(figures)
                    print(
                        f"round {round_ + 1} c={level} {label}: "
                        f"{figures['items_per_s']:.0f} items/s, p50 {figures['p50_ms']:.1f} ms, "
                        f"p99 {figures['p99_ms']:.1f} ms, errors {figures['errors']:.0f}, "
                        f"server CPU {figures['server_cpu_ms_per_item']:.2f} ms/item",
                        flush=True,
                    )
    print()
    print(
        "| door | clients | items/s | p50 ms | p99 ms | ÷ plain JSON "
        "| server CPU ms/item | ÷ plain JSON | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    plain = doors[0][0]
    for level in levels:
        base = statistics.median(r["items_per_s"] for r in results[plain][level])
        base_cpu = statistics.median(r["server_cpu_ms_per_item"] for r in results[plain][level])
        for label, _, _ in doors:
            rounds = results[label][level]
            rate = statistics.median(r["items_per_s"] for r in rounds)
            p50 = statistics.median(r["p50_ms"] for r in rounds)
            p99 = statistics.median(r["p99_ms"] for r in rounds)
            errors = sum(r["errors"] for r in rounds)
            cpu = statistics.median(r["server_cpu_ms_per_item"] for r in rounds)
            summary.setdefault(label, {})[level] = {
                "items_per_s": rate,
                "p50_ms": p50,
                "p99_ms": p99,
                "ratio": rate / base,
                "server_cpu_ms_per_item": cpu,
                "cpu_ratio": cpu / base_cpu,
                "errors": errors,
            }
            print(
                f"| {label} | {level} | {rate:.0f} | {p50:.1f} | {p99:.1f} | "
                f"{rate / base:.3f} | {cpu:.2f} | {cpu / base_cpu:.3f} | {errors:.0f} |"
            )
    if len(roots) > 1:
        other = roots[1][0]
        print()
        print(f"| door | clients | items/s, this ÷ {other} | server CPU per item, this ÷ {other} |")
        print("|---|---|---|---|")
        for level in levels:
            for label, _ in DOORS:
                mine = summary[f"{label} [this]"][level]
                theirs = summary[f"{label} [{other}]"][level]
                print(
                    f"| {label} | {level} | {mine['items_per_s'] / theirs['items_per_s']:.3f} "
                    f"| {mine['server_cpu_ms_per_item'] / theirs['server_cpu_ms_per_item']:.3f} |"
                )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rounds": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

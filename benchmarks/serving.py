"""The server against the model it serves, in one run on this machine.

Measures the default model offline (in this process: tokenise, forward, pool) at batch 1 and
batch 32, and the server (a ``python server.py`` subprocess) at 1 and at 64 concurrent
closed-loop clients sending one short sentence each. Rounds alternate the four measurements so
that drift on a shared machine hits them alike; medians and ratios are printed, and written
as JSON with ``--json``.

    python benchmarks/serving.py                      # 3 rounds of 5 s per measurement
    python benchmarks/serving.py --rounds 5 --seconds 8 -- --max-queue-delay-ms 0

Arguments after ``--`` go to ``server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from load_test.http1 import ConnectionPool, build_request  # noqa: E402
from load_test.metrics_scrape import parse_samples  # noqa: E402
from load_test.serverproc import ServerProcess  # noqa: E402

SUBJECTS = ["The cat", "A scientist", "My neighbour", "The old train", "A small robot", "Anna"]
VERBS = ["reads", "builds", "watches", "paints", "repairs", "finds"]
OBJECTS = ["a book", "the bridge", "the sunset", "a fence", "an engine", "the keys"]


def sentences(count: int) -> list[str]:
    """Distinct short sentences (8-12 tokens), as an embedding service mostly sees."""
    out = []
    for index in range(count):
        subject = SUBJECTS[index % len(SUBJECTS)]
        verb = VERBS[(index // 6) % len(VERBS)]
        obj = OBJECTS[(index // 36) % len(OBJECTS)]
        out.append(f"{subject} {verb} {obj} on day {index}.")
    return out


def offline_rate(model: Any, batch: int, seconds: float, texts: list[str]) -> float:
    """Items per second of ``model.predict`` at ``batch``, for about ``seconds``."""
    done, cursor = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        chunk = [texts[(cursor + k) % len(texts)] for k in range(batch)]
        cursor += batch
        model.predict(chunk)
        done += batch
    return done / (time.perf_counter() - started)


async def closed_loop(
    port: int, clients: int, seconds: float, texts: list[str]
) -> dict[str, float]:
    """``clients`` keep-alive clients, each sending its next request when answered."""
    pool = ConnectionPool("127.0.0.1", port, clients)
    host = f"127.0.0.1:{port}"
    bodies = [build_request(host, "/", "text/plain", text.encode()) for text in texts]
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    counter = 0

    async def client() -> None:
        nonlocal errors, counter
        while time.monotonic() < stop:
            body = bodies[counter % len(bodies)]
            counter += 1
            conn = await pool.acquire()
            sent = time.monotonic()
            response = await conn.request(body)
            pool.release(conn, response.keep_alive)
            if response.status != 200:
                errors += 1
            latencies.append(response.done - sent)

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.monotonic() - started
    pool.close()
    latencies.sort()
    return {
        "items_per_s": len(latencies) / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "errors": float(errors),
    }


def batch_stats(port: int) -> tuple[float, float]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    total = count = 0.0
    for name, _labels, value in parse_samples(text):
        if name == "batching_batch_size_items_sum":
            total += value
        elif name == "batching_batch_size_items_count":
            count += value
    return total, count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("server_args", nargs="*", help="after --: flags for server.py")
    args = parser.parse_args(argv)

    import torch

    from batching.models.embedding.sentence import SentenceEmbedder

    texts = sentences(600)
    model = SentenceEmbedder()
    model.load("cpu")
    for batch in model.warmup_inputs(32):
        model.predict(batch)
    rounds: list[dict[str, Any]] = []
    log = ROOT / "load_test_results" / "benchmark-server.log"
    log.parent.mkdir(exist_ok=True)
    with ServerProcess(args.server_args, cwd=ROOT, log_path=log) as server:
        asyncio.run(closed_loop(server.port, 8, 2.0, texts))  # the server's first requests
        for index in range(args.rounds):
            result: dict[str, Any] = {
                "offline_b1": offline_rate(model, 1, args.seconds, texts),
                "offline_b32": offline_rate(model, 32, args.seconds, texts),
            }
            before = batch_stats(server.port)
            result["server_c1"] = asyncio.run(closed_loop(server.port, 1, args.seconds, texts))
            middle = batch_stats(server.port)
            result["server_c64"] = asyncio.run(closed_loop(server.port, 64, args.seconds, texts))
            after = batch_stats(server.port)
            result["mean_batch_c1"] = (middle[0] - before[0]) / max(1.0, middle[1] - before[1])
            result["mean_batch_c64"] = (after[0] - middle[0]) / max(1.0, after[1] - middle[1])
            rounds.append(result)
            print(
                f"round {index + 1}: offline b1 {result['offline_b1']:.0f}/s "
                f"b32 {result['offline_b32']:.0f}/s | server c1 "
                f"{result['server_c1']['items_per_s']:.0f}/s "
                f"(p50 {result['server_c1']['p50_ms']:.1f} ms) c64 "
                f"{result['server_c64']['items_per_s']:.0f}/s "
                f"(p50 {result['server_c64']['p50_ms']:.1f} ms, "
                f"mean batch {result['mean_batch_c64']:.1f})",
                flush=True,
            )

    def median(key: str, field: str | None = None) -> float:
        values = [r[key][field] if field else r[key] for r in rounds]
        return statistics.median(values)

    summary = {
        "torch_threads": torch.get_num_threads(),
        "server_args": args.server_args,
        "offline_b1_items_per_s": median("offline_b1"),
        "offline_b32_items_per_s": median("offline_b32"),
        "server_c1_items_per_s": median("server_c1", "items_per_s"),
        "server_c1_p50_ms": median("server_c1", "p50_ms"),
        "server_c1_p99_ms": median("server_c1", "p99_ms"),
        "server_c64_items_per_s": median("server_c64", "items_per_s"),
        "server_c64_p50_ms": median("server_c64", "p50_ms"),
        "server_c64_p99_ms": median("server_c64", "p99_ms"),
        "server_c64_mean_batch": median("mean_batch_c64"),
        "errors": sum(r["server_c1"]["errors"] + r["server_c64"]["errors"] for r in rounds),
    }
    summary["ratio_c1_vs_offline_b1"] = (
        summary["server_c1_items_per_s"] / summary["offline_b1_items_per_s"]
    )
    summary["ratio_c64_vs_offline_b32"] = (
        summary["server_c64_items_per_s"] / summary["offline_b32_items_per_s"]
    )
    print()
    print("| measure | median |")
    print("|---|---|")
    print(f"| offline, batch 1 | {summary['offline_b1_items_per_s']:.0f} items/s |")
    print(f"| offline, batch 32 | {summary['offline_b32_items_per_s']:.0f} items/s |")
    print(
        f"| server, 1 client | {summary['server_c1_items_per_s']:.0f} items/s, "
        f"p50 {summary['server_c1_p50_ms']:.1f} ms, p99 {summary['server_c1_p99_ms']:.1f} ms |"
    )
    print(
        f"| server, 64 clients | {summary['server_c64_items_per_s']:.0f} items/s, "
        f"p50 {summary['server_c64_p50_ms']:.1f} ms, p99 {summary['server_c64_p99_ms']:.1f} ms,"
        f" mean batch {summary['server_c64_mean_batch']:.1f} |"
    )
    print(f"| server 1 client / offline batch 1 | {summary['ratio_c1_vs_offline_b1']:.2f} |")
    print(f"| server 64 clients / offline batch 32 | {summary['ratio_c64_vs_offline_b32']:.2f} |")
    print(f"| errors | {summary['errors']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

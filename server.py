"""Serve a model with dynamic batching: ``python server.py --help``.

The composition root: it reads the settings, builds the app and runs uvicorn, and it alone
changes process-wide state (environment defaults, the garbage collector, logging), which an app
embedded in someone else's server must leave alone.

``uvicorn server:app`` works too; it reads the same settings from ``BATCHING_*`` variables.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

from batching.models.hub import remember_offline_choice  # noqa: E402

# Read once, when the Hugging Face libraries are first imported (by an instance, later; process
# instances inherit them): a server never reaches for the hub, and a progress bar per weight
# load would only garble a log that is read line by line. A hub id in --model is fetched before
# that, once, online unless the user set HF_HUB_OFFLINE=1 (batching/models/hub.py).
remember_offline_choice(os.environ)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

from batching.app import create_app  # noqa: E402
from batching.http.connections import protocol_class  # noqa: E402
from batching.http.uvicorn_check import UvicornMismatch  # noqa: E402
from batching.log_settings import LogSettings  # noqa: E402
from batching.logs import configure_logging, uvicorn_log_config  # noqa: E402
from batching.models.engines.engine_options import ADAPTIVE_THREADS_VARIABLE  # noqa: E402
from batching.runtime.allocator import tune_malloc  # noqa: E402
from batching.runtime.collector import (  # noqa: E402
    release_unloaded_objects,
    settle_loaded_objects,
)
from batching.runtime.deployment import Deployment  # noqa: E402
from batching.runtime.prepare import prepare_models  # noqa: E402
from batching.runtime.warmup import InstanceInfo  # noqa: E402
from batching.settings.cli import ServerSettings, parse_settings  # noqa: E402
from batching.settings.flags import fail  # noqa: E402
from batching.tls import CertificateFiles, TlsError  # noqa: E402

logger = logging.getLogger("batching")

#: Told why a model cannot be loaded.
OnLoadFailure = Callable[[Deployment, int, str], None]


def freeze_loaded_objects(deployment: Deployment, index: int, info: InstanceInfo) -> None:
    """Take everything loaded so far out of the cyclic garbage collector's sight, and let
    request-scoped objects die young (:mod:`batching.runtime.collector` says why: both were
    measured stalls of the event loop)."""
    settle_loaded_objects()


def build(
    settings: ServerSettings,
    on_load_failure: OnLoadFailure | None = None,
    on_grpc_failure: Callable[[str], None] | None = None,
    on_all_ready: Callable[[], None] | None = None,
    tls: CertificateFiles | None = None,
) -> Starlette:
    """The app for ``settings`` (``tls``: the certificates of ``settings.tls``, read)."""
    _thread_environment(settings)
    if settings.malloc == "auto":
        # Before any model loads; process instances inherit it through the environment.
        tune_malloc()
    # HTTP and gRPC each cap their own connections at --max-connections.
    ports = 2 if settings.grpc_port else 1
    _raise_file_limit(settings.connections.max_connections * ports)
    return create_app(
        settings.models,
        max_body_bytes=settings.max_body_bytes,
        shutdown_timeout=settings.shutdown_timeout,
        on_ready=freeze_loaded_objects,
        on_load_failure=on_load_failure,
        grpc_port=settings.grpc_port,
        grpc_host=settings.host,
        grpc_port_explicit=settings.grpc_port_explicit,
        on_grpc_failure=on_grpc_failure,
        on_all_ready=on_all_ready,
        tls=tls,
        api_keys=settings.api_keys,
        admin_keys=settings.admin_keys,
        cors_allow_origins=settings.cors_allow_origins,
        metrics_port=settings.metrics_port,
        connection_limits=settings.connections,
        # A model unloaded or replaced at run time: its memory goes back to the system.
        model_control=dataclasses.replace(
            settings.model_control, on_released=release_unloaded_objects
        ),
        log_settings=LogSettings(settings.log_format),
        tracing=settings.tracing,
    )


def _thread_environment(settings: ServerSettings) -> None:
    # torch reads these when it is first imported (by an instance, later); process
    # instances inherit them. Each instance's thread team then fits its share of the cores.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(settings.torch_threads)
    # A fixed count is kept for every batch; otherwise the engines' thread governor adapts it.
    os.environ[ADAPTIVE_THREADS_VARIABLE] = "1" if settings.adaptive_threads else "0"


def prepare(settings: ServerSettings) -> int:
    """``--prepare``: the engine cache of every model filled (batching/runtime/prepare.py);
    the exit status (1, with one line, when a model cannot be prepared)."""
    _thread_environment(settings)
    failures = prepare_models(settings.models)
    if failures:
        print(f"server.py: error: {failures[0]}", file=sys.stderr)
        return 1
    logger.info("prepare: done; the engine cache is ready")
    return 0


def read_certificates(settings: ServerSettings) -> CertificateFiles | None:
    """The certificates ``--ssl-*`` name, read and checked; None without TLS.

    :raises SystemExit: they cannot be used (checked at parse time too; this read may find
        files changed since), with one line that says why.
    """
    if settings.tls is None:
        return None
    try:
        return CertificateFiles(settings.tls)
    except TlsError as exc:
        fail(str(exc))


def _log_tls(settings: ServerSettings, tls: CertificateFiles | None) -> None:
    if tls is None:
        return
    logger.info(
        "TLS on HTTP%s: certificate sha256 %s; %s (and on SIGHUP)",
        " and gRPC" if settings.grpc_port else "",
        tls.current.fingerprint[:16],
        tls.config.describe(),
    )
    if tls.config.client_cert == "optional" and settings.grpc_port:
        logger.warning(
            "--ssl-client-cert optional: gRPC cannot ask for a client certificate without "
            "requiring one, so gRPC takes every TLS client and verifies no certificate; "
            "HTTP asks for one and verifies it when sent"
        )


def _listeners(config: uvicorn.Config, settings: ServerSettings) -> list[socket.socket] | None:
    """The sockets uvicorn serves: None (uvicorn binds ``--host:--port`` itself), or with
    ``--metrics-port`` the main socket and the metrics one, both on ``--host``; the app tells
    them apart by their local port (batching/http/listeners.py)."""
    if settings.metrics_port is None:
        return None
    host, port = settings.host, settings.metrics_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    metrics = socket.socket(family, socket.SOCK_STREAM)
    metrics.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        metrics.bind((host, port))
    except OSError as exc:
        metrics.close()
        shown = f"[{host}]" if ":" in host else host
        print(
            f"server.py: error: cannot serve metrics on {shown}:{port}: "
            f"{exc.strerror or exc} (--metrics-port picks another port)",
            file=sys.stderr,
        )
        sys.exit(1)
    metrics.set_inheritable(True)
    # The main socket second: uvicorn's bind says "running on" it, which must not be said of
    # a server that then fails to start.
    return [config.bind_socket(), metrics]


def _raise_file_limit(connections: int) -> None:
    """Let the process hold its connection cap's sockets plus room for models and logs: a
    soft limit of 1,024 would make accept() fail (and stall) long before the cap."""
    wanted = connections + 1024
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        logger.warning("could not raise the open-file limit for %d connections", connections)


class _Server(uvicorn.Server):
    """uvicorn that drains before it closes its listener: on SIGTERM the app first refuses new
    work (503, and ``/v2/health/ready`` answers 503 for load balancers to see) and stops taking
    gRPC calls, while the accepted work finishes; only then does uvicorn stop accepting
    connections and shut down, all within the same shutdown timeout."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: Starlette,
        grace: float,
        tls: CertificateFiles | None = None,
    ) -> None:
        super().__init__(config)
        self.batching_app = app
        self.grace = grace
        #: Read again at once on SIGHUP (besides the periodic look).
        self.tls = tls
        #: Said once the models are ready and uvicorn listens, whichever comes last.
        self.ready_line: Callable[[], str] | None = None
        #: The metrics listener's port (``--metrics-port``), not the one :attr:`url` names.
        self.metrics_port: int | None = None
        self._models_ready = False

    def models_ready(self) -> None:
        """Every model is loaded and warm: say so, and where, once uvicorn listens too."""
        self._models_ready = True
        if self.started:
            self._announce()

    def _announce(self) -> None:
        if self.ready_line is not None:
            logger.info("%s", self.ready_line())

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.tls is not None:
            # SIGHUP: look at the certificate files now (e.g. right after a renewal).
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.tls.check)
        await super().startup(sockets)
        if self.started and self._models_ready:
            self._announce()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        started = time.monotonic()
        logger.info("draining: not ready, refusing new requests, finishing accepted ones")
        await self.batching_app.state.drain(self.grace)
        # What is left of the grace for uvicorn's own wait on open connections (at least a
        # second, so that answers being written are not cut off).
        left = self.grace - (time.monotonic() - started)
        self.config.timeout_graceful_shutdown = max(1, math.ceil(left))
        await super().shutdown(sockets)

    @property
    def url(self) -> str:
        """The base URL it listens on (the bound port when ``--port 0`` asked for any)."""
        config = self.config
        port = config.port
        for server in getattr(self, "servers", []):
            for sock in server.sockets or []:
                bound = int(sock.getsockname()[1])
                if bound != self.metrics_port:
                    port = bound
                    break
        host = f"[{config.host}]" if ":" in config.host else config.host
        scheme = "https" if config.is_ssl else "http"
        return f"{scheme}://{host}:{port}"


def _ready_line(settings: ServerSettings, server: _Server, app: Starlette) -> str:
    names = ", ".join(model.name for model in settings.models)
    url = server.url
    doors = [f"v2 at {url}/v2"]
    grpc_server = app.state.grpc
    if grpc_server is not None and grpc_server.serving:
        doors.append(f"gRPC at {grpc_server.address}")
    if settings.metrics_port is not None:
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        doors.append(f"metrics at http://{host}:{settings.metrics_port}/metrics")
    if settings.api_keys is not None:
        doors.append(f"{settings.api_keys.count} API keys")
    if settings.admin_keys is not None:
        doors.append(f"{settings.admin_keys.count} admin keys")
    if settings.tracing is not None:
        doors.append(f"traces to {settings.tracing.endpoint} ({settings.tracing.protocol})")
    return f"ready: serving {names} at {url} ({', '.join(doors)})"


def _log_start(settings: ServerSettings) -> None:
    cpu_instances = sum(
        len([d for d in model.devices if not d.startswith("cuda")]) for model in settings.models
    )
    logger.info(
        "CPU: %s; %d torch threads for each of %d CPU instances; at most %d model instances in all",
        settings.cpu_budget.describe(),
        settings.torch_threads,
        cpu_instances,
        settings.model_control.instances.limit,
    )
    for model in settings.models:
        batching = model.batching
        logger.info(
            "serving %s (%s) on %s as %s instances; batching %s: max_batch_size=%d "
            "max_queue_delay=%.1fms max_queue_size=%d timeout=%.0fms; %d torch threads each",
            model.name,
            model.model_source.describe(),
            ",".join(model.devices),
            model.instance_kind,
            batching.policy,
            batching.max_batch_size,
            batching.max_queue_delay * 1000,
            batching.max_queue_size,
            batching.timeout * 1000,
            settings.torch_threads,
        )


def find_models_from_here() -> None:
    """Let ``--model mypackage.models:Name`` find ``mypackage`` in the directory the server is
    started in, as ``python -m`` and uvicorn do, however it is started (``python
    /path/to/server.py`` puts only this file's folder on the path, a console script its bin
    folder). Appended, so it never shadows an installed package."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def main(argv: Sequence[str] | None = None) -> None:
    find_models_from_here()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prepare"]:  # batching-server prepare
        argv = ["--prepare", *argv[1:]]
    settings = parse_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    if settings.prepare:
        sys.exit(prepare(settings))
    try:
        # uvicorn's own protocol plus header and body timeouts, a connection cap and a
        # lingering close (batching/http/connections.py); its keep-alive timeout too.
        http = protocol_class(settings.connections)
    except UvicornMismatch as exc:
        fail(str(exc))
    _log_start(settings)
    failures: list[str] = []
    server: _Server | None = None

    def stop_on_load_failure(deployment: Deployment, index: int, reason: str) -> None:
        # A server that stays live but never ready helps nobody: stop, and say why.
        failures.append(
            f"model {deployment.name!r} ({deployment.config.model_source.describe()}) cannot "
            f"be loaded: {reason}"
        )
        if server is not None:
            server.should_exit = True

    def stop_on_grpc_failure(reason: str) -> None:
        failures.append(reason)
        if server is not None:
            server.should_exit = True

    def announce_ready() -> None:
        if server is not None:
            server.models_ready()

    tls = read_certificates(settings)
    _log_tls(settings, tls)
    app = build(settings, stop_on_load_failure, stop_on_grpc_failure, announce_ready, tls)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=uvicorn_log_config(settings.log_level, settings.log_format),
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        access_log=False,
        http=http,
        # TLS: the certificates' context, whose handshakes follow renewed files.
        ssl_context_factory=None
        if tls is None
        else lambda config, default: tls.listening_context(),
    )
    server = _Server(config, app, settings.shutdown_timeout, tls)
    server.ready_line = lambda: _ready_line(settings, server, app)
    server.metrics_port = settings.metrics_port
    try:
        server.run(sockets=_listeners(config, settings))
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn has shut down gracefully and re-raises the signal; exit as a
        # process stopped by SIGINT does, without a traceback.
        sys.exit(128 + signal.SIGINT)
    if failures:
        print(f"server.py: error: {failures[0]}", file=sys.stderr)
        sys.exit(1)


def _stop_this_process(deployment: Deployment, index: int, reason: str) -> None:
    # Under ``uvicorn server:app`` the server object is uvicorn's own: SIGTERM is how to
    # ask it to stop, the same way an orchestrator would.
    logger.error("model %s cannot be loaded; stopping the server", deployment.name)
    signal.raise_signal(signal.SIGTERM)


def _stop_this_process_for_grpc(reason: str) -> None:
    logger.error("%s; stopping the server", reason)
    signal.raise_signal(signal.SIGTERM)


def __getattr__(name: str) -> Starlette:
    # ``uvicorn server:app`` asks for ``app``; build it from BATCHING_* variables only then,
    # so importing this module (the console script does) costs nothing.
    if name != "app":
        raise AttributeError(name)
    settings = parse_settings([], os.environ)
    if settings.metrics_port is not None:
        # uvicorn binds the one listener it is told of; the second is server.py's to bind.
        fail(
            "BATCHING_METRICS_PORT needs python server.py; under uvicorn server:app, /metrics "
            "is served on uvicorn's port"
        )
    configure_logging(settings.log_level, settings.log_format)
    tls = read_certificates(settings)
    if tls is not None:
        # uvicorn's own listener: its --ssl-* flags decide HTTP's TLS here.
        logger.warning(
            "under uvicorn server:app, BATCHING_SSL_* apply to gRPC only; HTTP serves TLS "
            "with uvicorn's own --ssl-certfile and --ssl-keyfile (read once)"
        )
    return build(settings, _stop_this_process, _stop_this_process_for_grpc, tls=tls)


if __name__ == "__main__":
    main(sys.argv[1:])

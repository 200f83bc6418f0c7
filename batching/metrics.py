"""Prometheus metrics, bound to one registry per app so tests and embedded apps never collide,
and each model's running statistics (what Triton's statistics extension reports)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from batching.core.events import BatchRun, RequestRun
from batching.runtime.deployment import Deployment

__all__ = [
    "Duration",
    "Metrics",
    "ModelEvents",
    "ModelStatistics",
    "Signals",
    "autoscaling_signals",
]

_LATENCY_BUCKETS = tuple(0.0005 * 2**i for i in range(16))  # 0.5 ms .. ~16 s


def _powers_of_two(limit: int) -> tuple[float, ...]:
    buckets, size = [], 1
    while size < limit:
        buckets.append(float(size))
        size *= 2
    buckets.append(float(limit))
    return tuple(buckets)


class Metrics:
    """Every metric family the server exports, named ``batching_*``."""

    def __init__(
        self, registry: CollectorRegistry | None = None, max_batch_size: int = 1024
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "batching_requests",
            "Requests answered, by model and status code.",
            ["model", "code"],
            registry=r,
        )
        self.request_latency = Histogram(
            "batching_request_duration_seconds",
            "Time from admission to answer.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "batching_queue_depth_items",
            "Items waiting in the model's queue.",
            ["model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "batching_queue_wait_seconds",
            "Time a batch's oldest item waited before it ran.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        sizes = _powers_of_two(max(2, max_batch_size))
        self.batch_size = Histogram(
            "batching_batch_size_items",
            "Items per batch run.",
            ["model"],
            buckets=sizes,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "batching_batch_size_tokens",
            "Padded tokens (items x longest) per batch run.",
            ["model"],
            buckets=_powers_of_two(1 << 16),
            registry=r,
        )
        self.batch_compute = Histogram(
            "batching_batch_compute_seconds",
            "Time the model took per batch.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_release = Counter(
            "batching_batch_release",
            "Batches run, by why they were released.",
            ["model", "reason"],
            registry=r,
        )
        self.rejected = Counter(
            "batching_rejected",
            "Requests answered without a result, by reason: too_large (413), overloaded and "
            "would_miss_deadline (503 at admission), not_ready (503), deadline (504).",
            ["model", "reason"],
            registry=r,
        )
        self.truncated = Counter(
            "batching_truncated_inputs",
            "Texts cut at the model's maximum length (embedding requests that allow it).",
            ["model"],
            registry=r,
        )
        self.dropped = Counter(
            "batching_dropped_items",
            "Queued items never computed: caller gone or too late.",
            ["model", "reason"],
            registry=r,
        )
        # Generation token by token (the streaming doors' decode loop).
        self.first_token = Histogram(
            "batching_time_to_first_token_seconds",
            "Time from admission to the first generated token (streamed generation).",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter(
            "batching_generated_tokens",
            "Tokens generated token by token (streamed generation).",
            ["model"],
            registry=r,
        )
        self.generation_sequences = Gauge(
            "batching_generation_sequences",
            "Sequences accepted by the decode loop and not finished (running or waiting).",
            ["model"],
            registry=r,
        )
        self.generation_reserved = Gauge(
            "batching_generation_reserved_tokens",
            "Tokens (prompt and max_new_tokens) the accepted sequences hold of the budget.",
            ["model"],
            registry=r,
        )
        # Autoscaling signals: set at each scrape from the batcher's counters, so they are
        # true at the instant of the scrape (not averages over completed requests).
        self.queue_requests = Gauge(
            "batching_queue_depth_requests",
            "Requests admitted whose items have not started running yet.",
            ["model"],
            registry=r,
        )
        self.inflight_items = Gauge(
            "batching_inflight_items",
            "Items in batches running on the model's instances now.",
            ["model"],
            registry=r,
        )
        self.capacity = Gauge(
            "batching_capacity_items_per_second",
            "Measured drain rate: items per second across the ready instances.",
            ["model"],
            registry=r,
        )
        self.expected_wait = Gauge(
            "batching_expected_wait_seconds",
            "Expected wait of a request arriving now: (queued + in-flight items) / drain rate.",
            ["model"],
            registry=r,
        )
        self.busy_ratio = Gauge(
            "batching_instances_busy_ratio",
            "Fraction of the ready instances running a batch now (0 with none ready).",
            ["model"],
            registry=r,
        )
        self.instances_ready = Gauge(
            "batching_instances_ready",
            "Model instances loaded, warm and serving.",
            ["model"],
            registry=r,
        )
        self.memory = Gauge(
            "batching_model_memory_bytes",
            "Resident memory each model's ready instances added as they loaded and warmed up "
            "(loads run one at a time; a copy sharing another's engine adds only its own).",
            ["model"],
            registry=r,
        )
        self.warmup = Gauge(
            "batching_warmup_seconds",
            "Warm-up time of the most recently started instance.",
            ["model"],
            registry=r,
        )

        self.unauthorized = Counter(
            "batching_unauthorized",
            "Requests and gRPC calls refused for want of a valid API key (401, UNAUTHENTICATED), "
            "by door (http, grpc); no label comes from the request.",
            ["door"],
            registry=r,
        )
        for door in ("http", "grpc"):
            self.unauthorized.labels(door)

        self.engine_info = Gauge(
            "batching_model_engine_info",
            "What runs each model's batches, as chosen at start-up: 1 per engine and "
            "precision, with the batch sizes it serves.",
            ["model", "engine", "precision", "batch_sizes"],
            registry=r,
        )

    def for_model(self, model: str) -> ModelEvents:
        return ModelEvents(self, model)

    def observe_deployment(self, deployment: Deployment) -> None:
        """Set the gauges that describe ``deployment`` now (at the scrape)."""
        batcher = deployment.batcher
        name = deployment.name
        self.queue_depth.labels(name).set(batcher.queued_items)
        self.instances_ready.labels(name).set(batcher.ready_instances)
        signals = autoscaling_signals(
            queued_items=batcher.queued_items,
            running_items=batcher.running_items,
            busy_instances=batcher.busy_instances,
            ready_instances=batcher.ready_instances,
            per_instance=batcher.throughput.per_instance,
        )
        self.queue_requests.labels(name).set(batcher.queued_requests)
        self.inflight_items.labels(name).set(batcher.running_items)
        self.capacity.labels(name).set(signals.capacity)
        self.expected_wait.labels(name).set(signals.expected_wait)
        self.busy_ratio.labels(name).set(signals.busy_ratio)
        decoder = deployment.decoder
        if decoder is not None:
            self.generation_sequences.labels(name).set(decoder.active)
            self.generation_reserved.labels(name).set(decoder.reserved)
        if deployment.warmup_s:
            self.warmup.labels(deployment.name).set(deployment.warmup_s[-1])
        self.memory.labels(name).set(sum(deployment.memory_bytes.values()))
        engine = deployment.metadata.get("engine")
        if isinstance(engine, dict):
            for route in engine.get("routes", []):
                first, last = route["batch_sizes"]
                self.engine_info.labels(
                    name, route["engine"], route["precision"], f"{first}-{last}"
                ).set(1)


@dataclass(frozen=True, slots=True)
class Signals:
    """What an autoscaler reads about one model, derived from its counters at one instant."""

    #: Items per second the ready instances drain, at the measured rate of one instance.
    capacity: float
    #: Seconds until a request arriving now would start: the work ahead at that rate.
    expected_wait: float
    #: Busy instances over ready ones.
    busy_ratio: float


def autoscaling_signals(
    *,
    queued_items: int,
    running_items: int,
    busy_instances: int,
    ready_instances: int,
    per_instance: float,
) -> Signals:
    """The derived signals. With no instance ready, the wait is priced at one instance (as
    admission prices Retry-After), so the gauge stays finite for an autoscaler to read."""
    capacity = per_instance * ready_instances
    rate = per_instance * max(1, ready_instances)
    expected_wait = (queued_items + running_items) / rate if rate > 0 else 0.0
    busy_ratio = busy_instances / ready_instances if ready_instances else 0.0
    return Signals(capacity=capacity, expected_wait=expected_wait, busy_ratio=min(1.0, busy_ratio))


@dataclass(slots=True)
class Duration:
    """A count and the nanoseconds they took in all."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, round(seconds * 1e9))


class ModelStatistics:
    """One model's cumulative request and batch statistics since the server started, in
    Triton's terms, fed by the batcher's events on the event loop.

    Per request (as Triton counts them): ``success`` and ``fail`` time the whole stay in the
    batcher, from enqueue to answer; for successful requests, ``queue`` is the time until the
    request's first batch started and ``compute_infer`` the model's compute time of every batch
    it ran in (a batch's full time for each request in it). Per batch: ``executions`` and
    ``inference_count`` (items), and for each batch size the batches run and their compute.

    :param clock: wall-clock seconds since the epoch, for the time of the last inference.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_infer = Duration()
        #: Items run (each item of a batch counts once).
        self.inference_count = 0
        #: Batches run.
        self.execution_count = 0
        #: Milliseconds since the epoch when the last batch finished; 0 before the first.
        self.last_inference_ms = 0
        #: Batch size -> batches of that size run and their compute time.
        self.batches: dict[int, Duration] = {}

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        if not ok:
            self.fail.add(total_s)
            return
        self.success.add(total_s)
        self.queue.add(queue_s)
        self.compute_infer.add(compute_s)

    def request_refused(self) -> None:
        """A request refused at admission: a failure that took no time in the batcher."""
        self.fail.add(0.0)

    def batch_done(self, items: int, compute_s: float) -> None:
        self.inference_count += items
        self.execution_count += 1
        self.last_inference_ms = int(self._clock() * 1000)
        size = self.batches.get(items)
        if size is None:
            size = self.batches[items] = Duration()
        size.add(compute_s)


class ModelEvents:
    """The batcher's observer for one model: turns its events into samples and statistics."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        #: What Triton's statistics extension reports about this model.
        self.statistics = ModelStatistics()
        self._batch_size = metrics.batch_size.labels(model)
        self._batch_tokens = metrics.batch_tokens.labels(model)
        self._compute = metrics.batch_compute.labels(model)
        self._queue_wait = metrics.queue_wait.labels(model)
        self._release = metrics.batch_release
        self._rejected = metrics.rejected
        self._dropped = metrics.dropped
        self._model = model

    def batch_done(
        self, items: int, tokens: int, reason: str, queue_wait: float, compute_s: float
    ) -> None:
        self._batch_size.observe(items)
        if tokens:
            self._batch_tokens.observe(tokens)
        self._compute.observe(compute_s)
        self._queue_wait.observe(queue_wait)
        self._release.labels(self._model, reason).inc()
        self.statistics.batch_done(items, compute_s)

    def request_done(self, queue_s: float, compute_s: float, total_s: float, ok: bool) -> None:
        self.statistics.request_done(queue_s, compute_s, total_s, ok)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self._model, reason).inc()
        self.statistics.request_refused()

    def dropped(self, reason: str, items: int) -> None:
        self._dropped.labels(self._model, reason).inc(items)

    def batch_ran(self, batch: BatchRun) -> None:
        return None  # traces' business (batching.tracing); batch_done counted it

    def request_ran(self, trace: object, run: RequestRun) -> None:
        return None  # likewise

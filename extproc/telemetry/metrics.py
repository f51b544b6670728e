"""Every TruthLens metric, defined once, exported for Prometheus via OpenTelemetry.

Each Metrics object owns its own MeterProvider and prometheus_client registry,
so tests can build as many as they like without colliding in the global
REGISTRY. The OTel exporter appends `_total` to counters and the unit suffix
(`_seconds`) to histograms with unit "s"; the instrument names below are
chosen so the scraped names are exactly the documented ones (see
docs/telemetry.md, checked by tests that scrape the text exposition).
Labels take plain strings: this package imports nothing else from TruthLens.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Thread
from typing import Iterable

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

SCORE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITERATION_BUCKETS = (0, 1, 2, 3, 4, 5, 8)
DEFAULT_DECISION = "default"  # label value when no decision matched


class Metrics:
    """The instruments; methods take plain values so callers never touch OTel types."""

    def __init__(self, service_name: str = "truthlens") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=self.registry, disable_target_info=True, scope_info_enabled=False)
        # Exemplars never reach the Prometheus text exposition; sampling them costs ~2 us per record.
        self._provider = MeterProvider(
            metric_readers=[reader], resource=Resource.create({"service.name": service_name}),
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
        meter = self._provider.get_meter("truthlens")
        self._detections = meter.create_counter(  # -> truthlens_detections_total
            "truthlens_detections", description="Finished checks, by decision, mode and outcome"
        )
        self._score = meter.create_histogram(
            "truthlens_score",
            description="Response-level hallucination score of finished checks",
            explicit_bucket_boundaries_advisory=SCORE_BUCKETS,
        )
        self._latency = meter.create_histogram(  # unit "s" -> truthlens_latency_seconds
            "truthlens_latency",
            unit="s",
            description="Time spent per TruthLens operation (sentinel, detect, explain, refine, total)",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )
        self._iterations = meter.create_histogram(
            "truthlens_iterations",
            description="Detector passes per checked response (refinement loops add passes)",
            explicit_bucket_boundaries_advisory=ITERATION_BUCKETS,
        )
        self._models = meter.create_gauge(
            "truthlens_models_used", description="1 for each model loaded, by model name and role"
        )
        self._skipped = meter.create_counter(
            "truthlens_skipped", description="Requests the sentinel judged non-factual (no check needed)"
        )
        self._unverified = meter.create_counter(
            "truthlens_unverified", description="Factual requests without grounding context to check against"
        )
        self._unchecked = meter.create_counter(
            "truthlens_unchecked", description="Responses that should have been checked but were not, by reason"
        )
        # Unlabelled counters exist from the first scrape, so rate() works before the first event.
        self._skipped.add(0)
        self._unverified.add(0)

    def record_detection(self, decision: str | None, mode: str, detected: bool, score: float, iterations: int) -> None:
        self._detections.add(
            1, {"decision": decision or DEFAULT_DECISION, "mode": mode, "detected": "true" if detected else "false"}
        )
        self._score.record(score)
        self._iterations.record(iterations)

    def record_latency(self, mode: str, operation: str, seconds: float) -> None:
        self._latency.record(seconds, {"mode": mode, "operation": operation})

    def record_skipped(self) -> None:
        self._skipped.add(1)

    def record_unverified(self) -> None:
        self._unverified.add(1)

    def record_unchecked(self, reason: str) -> None:
        self._unchecked.add(1, {"reason": reason})

    def set_models(self, models: Iterable[tuple[str, str]]) -> None:
        """(model name, role) pairs that are loaded; call again after a reload."""
        for model, role in models:
            self._models.set(1, {"model": model, "role": role})

    def set_model_unloaded(self, model: str, role: str) -> None:
        self._models.set(0, {"model": model, "role": role})

    def exposition(self) -> bytes:
        """The Prometheus text format, exactly what /metrics serves."""
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self._provider.shutdown()


@dataclass(slots=True)
class MetricsServer:
    host: str
    port: int  # the bound port (useful when configured with port 0)
    _server: object
    _thread: Thread

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


def start_metrics_server(address: str, metrics: Metrics) -> MetricsServer:
    """Serve `metrics` on http://address/metrics from a daemon thread; `host:port`, port 0 picks one."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    server, thread = start_http_server(int(port_text), addr=host, registry=metrics.registry)
    return MetricsServer(host, server.server_address[1], server, thread)

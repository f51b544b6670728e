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
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

SCORE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITERATION_BUCKETS = (0, 1, 2, 3, 4, 5, 8)
DEFAULT_DECISION = "default"  # label value when no decision matched


def _by_label(counts: dict[str, int], label: str) -> list[Observation]:
    """One observation per label value of a single-label counter."""
    return [Observation(n, {label: value}) for value, n in list(counts.items())]  # list(): one atomic copy


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
        # Counters are plain Python counts read by OTel at scrape time (observable counters):
        # a synchronous add() costs ~6 us on the request path, an int increment ~50 ns.
        self._n_detections: dict[tuple[str, str, str], int] = {}
        self._n_skipped = 0
        self._n_unverified = 0
        self._n_unchecked: dict[str, int] = {}
        self._n_sentinel: dict[str, int] = {}
        self._n_refinements: dict[str, int] = {}
        self._n_verifier_calls: dict[tuple[str, str], int] = {}
        meter.create_observable_counter(  # -> truthlens_detections_total
            "truthlens_detections", callbacks=[self._observe_detections],
            description="Finished checks, by decision, mode and outcome",
        )
        self._score = meter.create_histogram(
            "truthlens_score",
            description="Response-level hallucination score of finished checks",
            explicit_bucket_boundaries_advisory=SCORE_BUCKETS,
        )
        self._latency = meter.create_histogram(  # unit "s" -> truthlens_latency_seconds
            "truthlens_latency",
            unit="s",
            description="Time spent per TruthLens operation (sentinel, sentinel_wait, detect, mitigate, total)",
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
        # Unlabelled counters report 0 from the first scrape, so rate() works before the first event.
        meter.create_observable_counter(
            "truthlens_skipped", callbacks=[lambda _options: [Observation(self._n_skipped)]],
            description="Requests the sentinel judged non-factual (no check needed)",
        )
        meter.create_observable_counter(
            "truthlens_unverified", callbacks=[lambda _options: [Observation(self._n_unverified)]],
            description="Factual requests without grounding context to check against",
        )
        meter.create_observable_counter(
            "truthlens_unchecked", callbacks=[lambda _options: _by_label(self._n_unchecked, "reason")],
            description="Responses that should have been checked but were not, by reason",
        )
        meter.create_observable_counter(  # -> truthlens_sentinel_decisions_total
            "truthlens_sentinel_decisions", callbacks=[lambda _options: _by_label(self._n_sentinel, "by")],
            description="Prompts classified, by who decided: the lexical prefilter or the sentinel model",
        )
        meter.create_observable_counter(  # -> truthlens_refinements_total
            "truthlens_refinements", callbacks=[lambda _options: _by_label(self._n_refinements, "outcome")],
            description="Standard-mode rewrites, by outcome: accepted, or why not (refusal, meta_text, artefact, "
                        "off_topic, empty, not_better, upstream_error, timeout, error)",
        )
        meter.create_observable_counter(  # -> truthlens_verifier_calls_total
            "truthlens_verifier_calls", callbacks=[self._observe_verifier_calls],
            description="Premium-mode verifier calls, by verifier name and outcome (answered, failed)",
        )

    def _observe_detections(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"decision": d, "mode": m, "detected": x})
                for (d, m, x), n in list(self._n_detections.items())]  # list(): one atomic copy under the GIL

    def _observe_verifier_calls(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"verifier": v, "outcome": o}) for (v, o), n in list(self._n_verifier_calls.items())]

    def record_detection(self, decision: str | None, mode: str, detected: bool, score: float, iterations: int) -> None:
        key = (decision or DEFAULT_DECISION, mode, "true" if detected else "false")
        self._n_detections[key] = self._n_detections.get(key, 0) + 1
        self._score.record(score)
        self._iterations.record(iterations)

    def record_latency(self, mode: str, operation: str, seconds: float) -> None:
        self._latency.record(seconds, {"mode": mode, "operation": operation})

    def record_sentinel_decision(self, by: str) -> None:
        """`by`: "prefilter" (settled lexically, microseconds) or "model" (the encoder ran)."""
        self._n_sentinel[by] = self._n_sentinel.get(by, 0) + 1

    def record_refinement(self, outcome: str) -> None:
        """One standard-mode rewrite: "accepted" or the reason it was not taken."""
        self._n_refinements[outcome] = self._n_refinements.get(outcome, 0) + 1

    def record_verifier_call(self, verifier: str, answered: bool) -> None:
        """One premium-mode verifier call: it answered usable text, or it failed (error, timeout, empty)."""
        key = (verifier, "answered" if answered else "failed")
        self._n_verifier_calls[key] = self._n_verifier_calls.get(key, 0) + 1

    def record_skipped(self) -> None:
        self._n_skipped += 1

    def record_unverified(self) -> None:
        self._n_unverified += 1

    def record_unchecked(self, reason: str) -> None:
        self._n_unchecked[reason] = self._n_unchecked.get(reason, 0) + 1

    def set_models(self, models: Iterable[tuple[str, str]]) -> None:
        """(model name, role) pairs that are loaded; call again after a reload."""
        for model, role in models:
            self._models.set(1, {"model": model, "role": role})

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

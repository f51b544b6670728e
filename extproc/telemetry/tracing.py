"""One trace span per request stage; free when tracing is off.

Tracing is process-wide configuration (set once at startup by the server),
so `stage()` reads a module-level tracer instead of threading one through
every call. The OTLP exporter is an optional extra (`pip install 'truthlens[otlp]'`);
enabling tracing without it fails at startup, not on the first request.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter


class TracingUnavailable(RuntimeError):
    """Tracing was switched on but cannot work (missing exporter package)."""


_state: dict[str, Any] = {"tracer": None, "provider": None}
_NOOP = nullcontext(trace.INVALID_SPAN)  # callers may set attributes unconditionally


def configure_tracing(
    enabled: bool,
    otlp_endpoint: str = "http://127.0.0.1:4317",
    service_name: str = "truthlens",
    exporter: SpanExporter | None = None,
) -> TracerProvider | None:
    """Install the process tracer. `exporter` replaces OTLP (tests pass an in-memory one)."""
    shutdown_tracing()
    if not enabled:
        return None
    if exporter is None:
        exporter = _otlp_exporter(otlp_endpoint)
        processor: Any = BatchSpanProcessor(exporter)
    else:
        processor = SimpleSpanProcessor(exporter)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(processor)
    _state["provider"] = provider
    _state["tracer"] = provider.get_tracer("truthlens")
    return provider


def _otlp_exporter(endpoint: str) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise TracingUnavailable(
            "telemetry.tracing.enabled is true but the OTLP exporter is not installed; "
            "install it with: pip install 'truthlens[otlp]' (or set telemetry.tracing.enabled: false)"
        ) from exc
    return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


def shutdown_tracing() -> None:
    """Flush pending spans (BatchSpanProcessor) and go back to no-op."""
    provider = _state["provider"]
    _state["tracer"] = _state["provider"] = None
    if provider is not None:
        provider.shutdown()


def tracing_enabled() -> bool:
    return _state["tracer"] is not None


def stage(name: str, **attributes: Any) -> ContextManager[Any]:
    """`with stage("detect", mode="lightweight"):` -> a span named truthlens.detect, or nothing when off."""
    tracer = _state["tracer"]
    if tracer is None:
        return _NOOP
    return _span(tracer, name, attributes)


@contextmanager
def _span(tracer: trace.Tracer, name: str, attributes: dict[str, Any]) -> Iterator[trace.Span]:
    clean = {k: v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(f"truthlens.{name}", attributes=clean) as span:
        yield span

"""Tracing stages (in-memory exporter), the missing-OTLP startup error, and log redaction."""

from __future__ import annotations

import ast
import io
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from extproc.telemetry import tracing
from extproc.telemetry.logging import bind_request, configure_logging, get_logger, reset_logging, unbind_request


@contextmanager
def request_logging(request_id: str) -> Iterator[None]:
    """As the stream loop does: bind the stream's request for its log lines, unbind at the end."""
    token = bind_request(request_id)
    try:
        yield
    finally:
        unbind_request(token)


@pytest.fixture(autouse=True)
def reset_process_telemetry() -> Iterator[None]:
    """Tracing and logging are process-wide: leave them as other tests expect."""
    yield
    tracing.shutdown_tracing()
    reset_logging()


def test_stage_is_a_noop_when_disabled() -> None:
    assert tracing.configure_tracing(False) is None
    assert tracing.tracing_enabled() is False
    with tracing.stage("detect", mode="lightweight") as span:
        span.set_attribute("x", 1)  # safe to call unconditionally
        assert not span.is_recording()


def test_one_span_per_stage_nested_under_request() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure_tracing(True, service_name="truthlens-test", exporter=exporter)
    with tracing.stage("request", request_id="r1"):
        with tracing.stage("sentinel", mode="lightweight"):
            pass
        with pytest.raises(ValueError):
            with tracing.stage("detect", mode="lightweight", decision=None):
                raise ValueError("boom")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"truthlens.request", "truthlens.sentinel", "truthlens.detect"}
    root = spans["truthlens.request"]
    assert spans["truthlens.sentinel"].parent.span_id == root.context.span_id
    assert dict(spans["truthlens.detect"].attributes) == {"mode": "lightweight"}  # None attributes dropped
    assert spans["truthlens.detect"].status.is_ok is False
    assert root.resource.attributes["service.name"] == "truthlens-test"


def test_enabled_without_otlp_package_fails_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(tracing.TracingUnavailable, match=r"pip install 'truthlens\[otlp\]'"):
        tracing.configure_tracing(True, "http://127.0.0.1:4317")


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_logs_are_json_with_request_id_and_level_filter() -> None:
    out = io.StringIO()
    configure_logging("info", log_content=False, stream=out)
    log = get_logger("test")
    with request_logging("req-42"):
        log.info("checked", score=0.5)
        log.debug("not shown")
    log.warning("outside")
    first, second = lines(out)
    assert first["event"] == "checked" and first["request_id"] == "req-42" and first["level"] == "info"
    assert first["logger"] == "test" and "ts" in first
    assert "request_id" not in second and second["level"] == "warning"


def test_content_is_redacted_unless_switched_on() -> None:
    out = io.StringIO()
    configure_logging("debug", log_content=False, stream=out)
    log = get_logger()
    log.info("detected", prompt="my secret prompt", answer="Paris is in Spain", score=0.9,
             spans=[{"start": 0, "end": 5, "text": "Paris"}], body=b"{}", context=["doc one", "doc two"])
    (event,) = lines(out)
    raw = out.getvalue()
    for secret in ("my secret prompt", "Paris", "doc one"):
        assert secret not in raw
    assert event["prompt"] == "[redacted 16 chars]"
    assert event["context"] == "[redacted 2 items]"
    assert event["body"] == "[redacted 2 bytes]"
    assert event["spans"] == [{"start": 0, "end": 5, "text": "[redacted 5 chars]"}]
    assert event["score"] == 0.9

    out = io.StringIO()
    configure_logging("debug", log_content=True, stream=out)
    get_logger().info("detected", prompt="my secret prompt")
    assert lines(out)[0]["prompt"] == "my secret prompt"


def test_stdlib_logging_goes_through_the_same_pipeline() -> None:
    out = io.StringIO()
    configure_logging("info", log_content=False, stream=out)
    with request_logging("req-7"):
        logging.getLogger("truthlens.service").info("request %s done", "req-7", extra={"answer": "Paris"})
        logging.getLogger("truthlens.service").debug("filtered by level")
    (event,) = lines(out)
    assert event["event"] == "request req-7 done" and event["request_id"] == "req-7"
    assert event["logger"] == "truthlens.service" and event["level"] == "info"
    assert event["answer"] == "[redacted 5 chars]"


def test_reconfiguring_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", stream=first)
    configure_logging("info", stream=second)
    logging.getLogger("x").warning("once")
    assert first.getvalue() == "" and len(lines(second)) == 1


def test_exception_logs_do_not_include_local_variables() -> None:
    out = io.StringIO()
    configure_logging("info", log_content=False, stream=out)
    try:
        prompt_text = "top secret question"  # noqa: F841 (a local that must not leak)
        raise RuntimeError("failed")
    except RuntimeError:
        get_logger().exception("boom")
    assert "top secret question" not in out.getvalue()
    assert lines(out)[0]["exception"][0]["exc_type"] == "RuntimeError"


def test_telemetry_imports_no_other_truthlens_layer() -> None:
    package = Path(__file__).resolve().parents[3] / "extproc" / "telemetry"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.startswith("extproc") and not n.startswith("extproc.telemetry")], path


def test_a_bound_request_object_is_read_only_when_a_line_is_logged() -> None:
    from extproc.telemetry.logging import bind_request, unbind_request

    class Source:
        reads = 0

        @property
        def request_id(self) -> str:
            Source.reads += 1
            return "req-lazy"

    out = io.StringIO()
    configure_logging("info", log_content=False, stream=out)
    token = bind_request(Source())
    try:
        logging.getLogger("truthlens.service").debug("filtered by level")
        assert Source.reads == 0
        logging.getLogger("truthlens.service").info("logged")
    finally:
        unbind_request(token)
    logging.getLogger("truthlens.service").info("after")
    first, second = lines(out)
    assert first["request_id"] == "req-lazy" and Source.reads == 1
    assert "request_id" not in second

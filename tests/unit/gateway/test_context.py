"""RequestContext reads the request headers lazily: method and path at once, the rest on first use."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.gateway.context import RequestContext


def http(pairs: list[tuple[str, str]]) -> pb.HttpHeaders:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]))


ENVOY_ORDER = [(":authority", "gw"), (":path", "/v1/chat/completions"), (":method", "POST"), (":scheme", "http"),
               ("content-type", "application/json"), ("x-request-id", "rid-1"), ("authorization", "Bearer k")]


def test_pseudo_headers_first_leaves_the_rest_undecoded_until_read() -> None:
    ctx = RequestContext.from_http(http(ENVOY_ORDER))
    assert (ctx.method, ctx.path) == ("POST", "/v1/chat/completions")
    assert ctx._headers is None  # nothing decoded beyond the two pseudo-headers
    assert ctx.request_id == "rid-1"
    assert ctx.request_headers["authorization"] == "Bearer k" and ctx.request_headers[":authority"] == "gw"


def test_any_other_order_falls_back_to_the_full_dict() -> None:
    ctx = RequestContext.from_http(http([("x-request-id", "rid-2"), (":method", "GET"), (":path", "/v1/models")]))
    assert (ctx.method, ctx.path, ctx.request_id) == ("GET", "/v1/models", "rid-2")
    missing = RequestContext.from_http(http([(":method", "POST")]))
    assert (missing.method, missing.path) == ("POST", "")


def test_request_id_without_x_request_id_is_generated_once() -> None:
    ctx = RequestContext.from_http(http([(":method", "POST"), (":path", "/x")]))
    rid = ctx.request_id
    assert len(rid) == 32 and ctx.request_id == rid
    assert RequestContext.from_headers({":method": "POST", "x-request-id": "r"}).request_id == "r"

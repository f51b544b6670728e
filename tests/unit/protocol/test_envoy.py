"""ext_proc builders and header helpers, checked through real protobuf serialization and gRPC."""

from __future__ import annotations

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.protocol import envoy as E

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _wire(msg):
    """Serialize and parse back, as Envoy would see it."""
    return type(msg).FromString(msg.SerializeToString())


def _request_headers(pairs, raw=True) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest()
    for key, value in pairs:
        header = req.request_headers.headers.headers.add()
        header.key = key
        if raw:
            header.raw_value = value.encode()
        else:
            header.value = value
    return _wire(req)


def _set_headers(mutation) -> dict[str, bytes]:
    for opt in mutation.set_headers:
        assert opt.append_action == OVERWRITE
        assert opt.header.value == ""  # Envoy rejects value + raw_value together
    return {opt.header.key: opt.header.raw_value for opt in mutation.set_headers}


@pytest.mark.parametrize("raw", [True, False])
def test_headers_dict_reads_raw_value_and_value(raw):
    req = _request_headers([(":method", "POST"), ("Content-Type", "application/json"), ("accept", "a"),
                            ("Accept", "b"), ("x-note", "caf\u00e9")], raw=raw)
    assert req.WhichOneof("request") == "request_headers"
    headers = E.headers_dict(req.request_headers)
    assert headers == {":method": "POST", "content-type": "application/json", "accept": "a, b", "x-note": "caf\u00e9"}
    assert E.headers_dict(req.request_headers.headers) == headers


def test_truthlens_header_names_from_proto_and_mapping():
    req = _request_headers([("X-TruthLens-Score", "0"), ("x-truthlens-status", "clean"), ("x-truthlens-status", "a"),
                            ("x-truthlensx", "no"), ("x-other", "1")])
    assert E.truthlens_header_names(req.request_headers) == ("x-truthlens-score", "x-truthlens-status")
    assert E.truthlens_header_names({"x-truthlens-mode": "premium", "host": "h"}) == ("x-truthlens-mode",)
    assert E.truthlens_header_names({"X-TruthLens-Mode": "premium", "a": "b"}) == ("x-truthlens-mode",)
    assert E.truthlens_header_names({"host": "h", "not-x-truthlens-mode": "1"}) == ()


def test_request_headers_response_sets_removes_and_overrides_mode():
    resp = _wire(E.request_headers_response({"accept-encoding": "identity", "x-raw": b"\x01"},
                                            ["x-truthlens-score"], mode_override=E.SKIP_REST_MODE))
    assert resp.WhichOneof("response") == "request_headers"
    mutation = resp.request_headers.response.header_mutation
    assert _set_headers(mutation) == {"accept-encoding": b"identity", "x-raw": b"\x01"}
    assert list(mutation.remove_headers) == ["x-truthlens-score"]
    assert resp.mode_override == E.SKIP_REST_MODE
    assert resp.mode_override.response_body_mode == E.ProcessingMode.NONE


def test_nothing_to_change_gives_plain_continue():
    for resp, arm in [(E.request_headers_response(), "request_headers"), (E.request_body_response(None), "request_body"),
                      (E.response_headers_response(), "response_headers"),
                      (E.response_body_response(None), "response_body"), (E.streamed_chunk_response(None), "response_body")]:
        wire = _wire(resp)
        assert wire.WhichOneof("response") == arm
        common = getattr(wire, arm).response
        assert not common.HasField("header_mutation") and not common.HasField("body_mutation")
        assert common.status == ep.CommonResponse.CONTINUE
    assert E.request_headers_response() is E.request_headers_response()  # precomputed, not rebuilt


@pytest.mark.parametrize("builder,arm", [(E.request_body_response, "request_body"),
                                         (E.response_body_response, "response_body")])
def test_body_replacement_sets_matching_content_length(builder, arm):
    body = "{\"a\":\"\u00e9\"}".encode()
    resp = _wire(builder(body, [("content-length", "1"), ("x-truthlens-status", "checked")], ["content-length", "x"]))
    common = getattr(resp, arm).response
    assert common.body_mutation.body == body
    assert _set_headers(common.header_mutation) == {"x-truthlens-status": b"checked",
                                                   "content-length": str(len(body)).encode()}
    assert list(common.header_mutation.remove_headers) == ["x"]


def test_body_response_headers_only_keeps_body():
    resp = _wire(E.response_body_response(None, {"x-truthlens-status": "clean"}))
    common = resp.response_body.response
    assert not common.HasField("body_mutation")
    assert _set_headers(common.header_mutation) == {"x-truthlens-status": b"clean"}


def test_streamed_mode_override_drops_content_length():
    resp = _wire(E.response_headers_response({"content-length": "10", "x-truthlens-mode": "stream"},
                                             mode_override=E.STREAMED_RESPONSE_MODE))
    mutation = resp.response_headers.response.header_mutation
    assert _set_headers(mutation) == {"x-truthlens-mode": b"stream"}
    assert list(mutation.remove_headers) == ["content-length"]
    mode = resp.mode_override
    assert mode.response_body_mode == E.ProcessingMode.STREAMED
    assert mode.request_header_mode == mode.response_header_mode == E.ProcessingMode.SEND
    assert mode.request_body_mode == E.ProcessingMode.BUFFERED
    assert mode.response_trailer_mode == E.ProcessingMode.SKIP


def test_streamed_chunk_replacement_and_drop_survive_the_wire():
    resp = _wire(E.streamed_chunk_response(b"data: x\n\n"))
    assert resp.response_body.response.body_mutation.body == b"data: x\n\n"
    dropped = _wire(E.streamed_chunk_response(b""))
    assert dropped.response_body.response.body_mutation.WhichOneof("mutation") == "body"  # empty body still set


def test_immediate_response_and_timeout_extension():
    resp = _wire(E.immediate_response(422, {"content-type": "application/json"}, b'{"error":{}}', "truthlens_block"))
    imm = resp.immediate_response
    assert imm.status.code == 422 and imm.body == b'{"error":{}}' and imm.details == "truthlens_block"
    assert _set_headers(imm.headers) == {"content-type": b"application/json"}
    timeout = _wire(E.timeout_extension_response(2.25)).override_message_timeout
    assert (timeout.seconds, timeout.nanos) == (2, 250_000_000)


class _Echo(ep_grpc.ExternalProcessorServicer):
    """A minimal processor built from the builders: the same shapes the gateway sends."""

    async def Process(self, request_iterator, context):
        async for req in request_iterator:
            phase = req.WhichOneof("request")
            if phase == "request_headers":
                yield E.request_headers_response({"accept-encoding": "identity"},
                                                 E.truthlens_header_names(req.request_headers))
            elif phase == "response_headers":
                yield E.response_headers_response(mode_override=E.STREAMED_RESPONSE_MODE)
            elif phase == "response_body":
                yield E.streamed_chunk_response(req.response_body.body.upper())


async def test_builders_over_a_real_grpc_aio_stream():
    server = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = ep_grpc.ExternalProcessorStub(channel)
            headers = _request_headers([("x-truthlens-status", "clean"), ("host", "h")])
            resp_headers = ep.ProcessingRequest()
            resp_headers.response_headers.headers.headers.add(key=":status", raw_value=b"200")
            chunk = ep.ProcessingRequest()
            chunk.response_body.body = b"data: hi\n\n"
            replies = [r async for r in stub.Process(iter([headers, resp_headers, chunk]))]
    finally:
        await server.stop(None)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "response_headers", "response_body"]
    assert list(replies[0].request_headers.response.header_mutation.remove_headers) == ["x-truthlens-status"]
    assert replies[1].mode_override.response_body_mode == E.ProcessingMode.STREAMED
    assert replies[2].response_body.response.body_mutation.body == b"DATA: HI\n\n"

"""Hostile requests through the stream loop (#19): the RAG field never goes upstream, lone surrogates
never crash a phase, every spelling of the chat path is judged."""

from __future__ import annotations

import json

import pytest

from tests.unit.gateway.test_service import (
    CHAT,
    drive,
    req_body,
    req_headers,
    resp_body,
    resp_headers,
    service,
    set_headers,
)
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def raw_body(body: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


def forwarded(reply: pb.ProcessingResponse) -> bytes | None:
    """The body that goes upstream (None: the original bytes)."""
    common = reply.request_body.response
    return common.body_mutation.body if common.HasField("body_mutation") else None


@pytest.mark.parametrize("body", [
    {"messages": [], "truthlens_context": ["doc"]},  # valid JSON, invalid schema
    {"messages": "hi", "truthlens_context": "doc"},
    {"model": "m", "truthlens_context": "doc"},
])
async def test_schema_invalid_request_goes_on_without_the_rag_field(body: dict) -> None:
    replies = await drive(service(), [req_headers(), req_body(body), resp_headers()])
    sent = forwarded(replies[1])
    assert sent is not None and b"truthlens_context" not in sent
    assert json.loads(sent) == {k: v for k, v in body.items() if k != "truthlens_context"}
    h = set_headers(replies[2].response_headers.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("unchecked", "bad_json")


@pytest.mark.parametrize("value", [42, [1, 2], {"a": 1}, [{"x": "no text key"}], True, [[["nested"]]]])
async def test_wrongly_typed_rag_field_is_refused_with_400_naming_it(value: object) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "truthlens_context": value}
    replies = await drive(service(), [req_headers(), req_body(body), resp_headers()])
    assert len(replies) == 2  # nothing after the refusal: the request never reached the upstream
    imm = replies[1].immediate_response
    assert imm.status.code == 400
    err = json.loads(imm.body)["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "truthlens_context"
    assert "truthlens_context" in err["message"] and err["code"] == "invalid_truthlens_context"


async def test_oversized_body_with_the_rag_field_is_refused_413() -> None:
    cfg = {"truthlens": {"max_body_bytes": 1024}}
    big = dict(CHAT, messages=[{"role": "user", "content": "x" * 2000}])
    replies = await drive(service(cfg=cfg), [req_headers(), req_body(big), resp_headers()])
    assert len(replies) == 2 and replies[1].immediate_response.status.code == 413
    assert json.loads(replies[1].immediate_response.body)["error"]["param"] == "truthlens_context"
    # without the field an oversized body still goes on, unchecked
    plain = {"messages": [{"role": "user", "content": "x" * 2000}]}
    replies = await drive(service(cfg=cfg), [req_headers(), req_body(plain), resp_headers()])
    assert forwarded(replies[1]) is None
    assert set_headers(replies[2].response_headers.response)["x-truthlens-reason"] == "too_large"


@pytest.mark.parametrize("body", [b'{"messages": [}, "truthlens_context": "d"', b'[{"truthlens_context": "d"}]'])
async def test_unparsable_body_carrying_the_rag_field_is_refused(body: bytes) -> None:
    replies = await drive(service(), [req_headers(), raw_body(body), resp_headers()])
    assert len(replies) == 2 and replies[1].immediate_response.status.code == 400
    assert json.loads(replies[1].immediate_response.body)["error"]["param"] == "truthlens_context"


async def test_unparsable_body_without_the_rag_field_goes_on_unchecked() -> None:
    replies = await drive(service(), [req_headers(), raw_body(b"{nope"), resp_headers()])
    assert forwarded(replies[1]) is None
    assert set_headers(replies[2].response_headers.response)["x-truthlens-reason"] == "bad_json"


async def test_lone_surrogates_in_request_and_answer_are_judged(caplog: pytest.LogCaptureFixture) -> None:
    """The fuzzer's input: a lone surrogate in the question made the request phase raise
    UnicodeEncodeError (unchecked/error, the RAG field forwarded, a traceback logged)."""
    body = b'{"messages":[{"role":"user","content":"Where is it? \\ud800"}],"truthlens_context":"It is in Oslo."}'
    answer = b'{"id":"\\udc00","choices":[{"index":0,"message":{"role":"assistant","content":"In Oslo \\ud800."}}]}'
    caplog.set_level("ERROR")
    replies = await drive(service(), [req_headers(), raw_body(body), resp_headers(), resp_body(answer)])
    sent = forwarded(replies[1])
    assert sent == b'{"messages":[{"role":"user","content":"Where is it? \\ud800"}]}'  # kept as the client wrote it
    h = set_headers(replies[3].response_body.response)
    assert h["x-truthlens-status"] == "checked"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize("path", [
    "/v1/chat/./completions", "/v1/chat%2Fcompletions", "/v1/chat%2fcompletions", "/v1/chat/completions;x",
    "/V1/CHAT/COMPLETIONS", "/v1//chat/completions", "/v1/%63hat/completions", "/v1/models/../chat/completions",
    "/v1/chat/completions/", "/v1/chat\\completions",
])
async def test_every_spelling_of_the_chat_path_is_judged(path: str) -> None:
    replies = await drive(service(), [req_headers(path=path), req_body(CHAT), resp_headers()])
    assert set_headers(replies[0].request_headers.response)["accept-encoding"] == "identity"  # the chat route
    assert b"truthlens_context" not in forwarded(replies[1])
    assert replies[2].HasField("response_headers")  # the answer is asked for, to be judged


async def test_compressed_answers_are_decoded_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """#19: decoding (br could take GBs and seconds before the cap) ran on the event loop."""
    import gzip
    import threading

    from extproc.gateway import exchange
    from tests.unit.gateway.test_service import INJECTED_CLAIM, completion_json

    threads: list[str] = []
    real = exchange.decode_body

    def spy(*args: object):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(exchange, "decode_body", spy)
    answer = gzip.compress(json.dumps(completion_json(f"It is in Oslo. {INJECTED_CLAIM}", "m")).encode())
    replies = await drive(service(), [req_headers(), req_body(CHAT), resp_headers(extra={"content-encoding": "gzip"}),
                                      resp_body(answer)])
    assert set_headers(replies[3].response_body.response)["x-truthlens-status"] == "checked"
    assert threads and threads[0] != threading.main_thread().name


async def test_compressed_request_carrying_the_rag_field_is_refused() -> None:
    """The field inside a gzip request body cannot be removed: refused, not forwarded compressed."""
    import gzip

    body = gzip.compress(json.dumps(CHAT).encode())
    replies = await drive(service(), [req_headers({"content-encoding": "gzip"}), raw_body(body), resp_headers()])
    assert len(replies) == 2 and replies[1].immediate_response.status.code == 400
    err = json.loads(replies[1].immediate_response.body)["error"]
    assert (err["param"], err["code"]) == ("truthlens_context", "compressed_truthlens_context")
    plain = gzip.compress(json.dumps({k: v for k, v in CHAT.items() if k != "truthlens_context"}).encode())
    replies = await drive(service(), [req_headers({"content-encoding": "gzip"}), raw_body(plain), resp_headers()])
    assert forwarded(replies[1]) is None  # without the field: forwarded as before, unchecked

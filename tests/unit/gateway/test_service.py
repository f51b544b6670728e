"""The stream loop driven directly with ext_proc messages (no Envoy): replies per phase."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import AsyncIterator

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.config import parse_config
from extproc.devtools.demo_upstream import INJECTED_CLAIM, completion_json, completion_sse_chunks
from extproc.inference.api import NullEngine
from extproc.gateway.service import TruthLensService
from extproc.gateway.wiring import GatewayRuntime
from tests.e2e.harness import ScriptedTestEngine

Mode = processing_mode_pb2.ProcessingMode


def headers(pairs: dict[str, str], eos: bool = False) -> pb.HttpHeaders:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])
    return pb.HttpHeaders(headers=hm, end_of_stream=eos)


def req_headers(extra: dict[str, str] | None = None, path: str = "/v1/chat/completions", method: str = "POST"):
    return pb.ProcessingRequest(request_headers=headers(
        {":method": method, ":path": path, ":authority": "gw", "x-request-id": "r1", **(extra or {})}))


def req_body(obj: dict) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=json.dumps(obj).encode(), end_of_stream=True))


def resp_headers(ctype: str = "application/json", status: str = "200", extra: dict | None = None):
    return pb.ProcessingRequest(response_headers=headers({":status": status, "content-type": ctype, **(extra or {})}))


def resp_body(body: bytes, eos: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=eos))


CHAT = {"model": "m", "messages": [{"role": "user", "content": "How tall is it?"}],
        "truthlens_context": ["The tower is 330 metres tall."]}


def service(engine=None, cfg: dict | None = None) -> TruthLensService:
    return TruthLensService(GatewayRuntime(parse_config(cfg or {}), engine or ScriptedTestEngine()))


async def drive(svc: TruthLensService, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    async def it() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    return [r async for r in svc.Process(it(), None)]


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


async def test_request_headers_strip_spoofed_and_force_identity() -> None:
    [r] = await drive(service(), [req_headers({"x-truthlens-status": "checked", "X-TruthLens-Score": "0"})])
    common = r.request_headers.response
    assert sorted(common.header_mutation.remove_headers) == ["x-truthlens-score", "x-truthlens-status"]
    assert set_headers(common) == {"accept-encoding": "identity"}
    assert not r.HasField("mode_override")


async def test_non_chat_route_skips_everything_after_headers() -> None:
    [r] = await drive(service(), [req_headers(path="/v1/models", method="GET")])
    mo = r.mode_override
    assert (mo.request_body_mode, mo.response_body_mode, mo.response_header_mode) == (Mode.NONE, Mode.NONE, Mode.SKIP)


async def test_rag_field_removed_with_content_length() -> None:
    _, rb = await drive(service(), [req_headers(), req_body(CHAT)])
    common = rb.request_body.response
    sent = json.loads(common.body_mutation.body)
    assert "truthlens_context" not in sent
    assert set_headers(common)["content-length"] == str(len(common.body_mutation.body))


async def test_body_without_rag_field_is_not_mutated() -> None:
    body = {k: v for k, v in CHAT.items() if k != "truthlens_context"}
    _, rb = await drive(service(), [req_headers(), req_body(body)])
    assert not rb.request_body.response.HasField("body_mutation")


async def test_json_response_checked_headers() -> None:
    answer = completion_json("It is 330 metres tall. " + INJECTED_CLAIM, "m")
    replies = await drive(service(), [req_headers(), req_body(CHAT), resp_headers(),
                                      resp_body(json.dumps(answer).encode())])
    rh, rbody = replies[2], replies[3]
    assert not rh.HasField("mode_override")  # JSON stays BUFFERED
    h = set_headers(rbody.response_body.response)
    assert h["x-truthlens-status"] == "checked" and h["x-truthlens-detected"] == "true"
    assert not rbody.response_body.response.HasField("body_mutation")


async def test_sse_switches_to_streamed_and_inserts_verdict_before_done() -> None:
    chunks = completion_sse_chunks("It is tall. " + INJECTED_CLAIM, "m")
    msgs = [req_headers(), req_body(CHAT), resp_headers("text/event-stream")]
    msgs += [resp_body(c, eos=False) for c in chunks] + [resp_body(b"", eos=True)]
    replies = await drive(service(), msgs)
    rh = replies[2]
    assert rh.mode_override.response_body_mode == Mode.STREAMED
    assert set_headers(rh.response_headers.response)["x-truthlens-status"] == "streaming"
    body_replies = replies[3:]
    for r in body_replies[:-2]:  # content events go on untouched
        assert not r.response_body.response.HasField("body_mutation")
    done_reply = body_replies[-2].response_body.response.body_mutation.body
    assert done_reply.endswith(b"data: [DONE]\n\n")
    assert b'"truthlens":{' in done_reply
    assert not body_replies[-1].response_body.response.HasField("body_mutation")


async def test_without_detector_status_is_unchecked_models_unavailable() -> None:
    replies = await drive(service(NullEngine()), [req_headers(), req_body(CHAT), resp_headers()])
    rh = replies[2]
    assert rh.mode_override.response_body_mode == Mode.NONE  # nothing to judge: body not sent to us
    h = set_headers(rh.response_headers.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("unchecked", "models_unavailable")


async def test_gzip_json_response_decoded_and_warned() -> None:
    answer = json.dumps(completion_json("Tall. " + INJECTED_CLAIM, "m")).encode()
    replies = await drive(service(cfg={"truthlens": {"default_action": "warn"}}), [
        req_headers(), req_body(CHAT), resp_headers(extra={"content-encoding": "gzip"}),
        resp_body(gzip.compress(answer))])
    common = replies[3].response_body.response
    new = common.body_mutation.body
    assert "[TruthLens]" in json.loads(new)["choices"][0]["message"]["content"]
    assert "content-encoding" in common.header_mutation.remove_headers
    assert set_headers(common)["content-length"] == str(len(new))


async def test_phase_exception_passes_through_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    svc = service()

    def boom(*_a: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("extproc.gateway.exchange.parse_chat_response", boom)
    replies = await drive(svc, [req_headers(), req_body(CHAT), resp_headers(), resp_body(b'{"choices":[]}')])
    common = replies[3].response_body.response
    assert not common.HasField("body_mutation")
    assert set_headers(common)["x-truthlens-reason"] == "error"


async def test_cancelled_stream_leaves_nothing_behind() -> None:
    engine = ScriptedTestEngine(delay_s=30)
    svc = service(engine)
    answer = json.dumps(completion_json("It is tall.", "m")).encode()
    gate = asyncio.Event()

    async def it() -> AsyncIterator[pb.ProcessingRequest]:
        for m in (req_headers(), req_body(CHAT), resp_headers(), resp_body(answer)):
            yield m
        await gate.wait()

    async def consume() -> None:
        async for _ in svc.Process(it(), None):
            pass

    task = asyncio.create_task(consume())
    while not any(kind == "detect" for kind, _ in engine.calls):
        await asyncio.sleep(0.01)
    assert svc.active_streams == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.active_streams == 0
    assert not [k for k in vars(svc) if k not in ("rt", "early_replies", "active_streams")]  # no per-request registry


async def test_verdicts_reach_the_metrics() -> None:
    from extproc.telemetry.metrics import Metrics

    metrics = Metrics()
    svc = TruthLensService(GatewayRuntime(parse_config({}), ScriptedTestEngine(), metrics=metrics))
    answer = json.dumps(completion_json("Tall. " + INJECTED_CLAIM, "m")).encode()
    await drive(svc, [req_headers(), req_body(CHAT), resp_headers(), resp_body(answer)])
    no_context = {"model": "m", "messages": [{"role": "user", "content": "How tall?"}]}
    await drive(svc, [req_headers(), req_body(no_context), resp_headers()])
    text = metrics.exposition().decode()
    assert 'truthlens_detections_total{decision="default",detected="true",mode="lightweight"} 1.0' in text
    assert "truthlens_unverified_total 1.0" in text
    assert 'operation="detect"' in text
    assert 'operation="prefilter"' not in text
    total = 'truthlens_latency_seconds_count{mode="lightweight",operation="total"} 2.0'
    assert total in text  # both waited on a model: the detector, the sentinel
    sure = {"model": "m", "messages": [{"role": "user", "content": "PREFILTER_SKIP a haiku"}]}
    await drive(svc, [req_headers(), req_body(sure), resp_headers()])
    text = metrics.exposition().decode()
    assert total in text  # settled in the request phase: counted, not timed
    assert 'truthlens_sentinel_decisions_total{by="prefilter"} 1.0' in text
    # the microsecond request phase and prefilter are part of `total`, not histograms of their own
    ops = {line.split('operation="')[1].split('"')[0] for line in text.splitlines()
           if line.startswith("truthlens_latency_seconds_count")}
    assert ops == {"sentinel", "sentinel_wait", "detect", "total"}
    assert "truthlens_skipped_total 1.0" in text
    metrics.shutdown()


async def test_request_body_failure_makes_the_verdict_unchecked_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("extproc.gateway.exchange.parse_chat_request", boom)
    no_rag = {k: v for k, v in CHAT.items() if k != "truthlens_context"}
    replies = await drive(service(), [req_headers(), req_body(no_rag), resp_headers()])
    assert not replies[1].request_body.response.HasField("body_mutation")  # request went on unchanged
    h = set_headers(replies[2].response_headers.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("unchecked", "error")
    assert replies[2].mode_override.response_body_mode == Mode.NONE
    # with the RAG field in the body it cannot go on unchanged (#19): refused, the stream ends
    replies = await drive(service(), [req_headers(), req_body(CHAT), resp_headers()])
    assert len(replies) == 2 and replies[1].immediate_response.status.code == 500
    assert json.loads(replies[1].immediate_response.body)["error"]["param"] == "truthlens_context"


@pytest.mark.parametrize(
    ("method", "path", "chat"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/openai/deployments/gpt/chat/completions?api-version=2024-02-01", True),
        ("POST", "/v1/chat/completions/", True),
        ("GET", "/v1/chat/completions", False),
        ("POST", "/v1/completions", False),
        ("POST", "/v1/embeddings", False),
    ],
)
def test_chat_route_detection(method: str, path: str, chat: bool) -> None:
    from extproc.gateway.exchange import is_chat_route

    assert is_chat_route(method, path) is chat


async def test_sentinel_runs_while_the_request_is_upstream() -> None:
    engine = ScriptedTestEngine()
    engine.sentinel_gate = asyncio.Event()
    svc = service(engine)
    poem = {"model": "m", "messages": [{"role": "user", "content": "Write a poem about the sea"}]}
    to_send: asyncio.Queue = asyncio.Queue()
    for m in (req_headers(), req_body(poem)):
        to_send.put_nowait(m)

    async def it() -> AsyncIterator[pb.ProcessingRequest]:
        while True:
            m = await to_send.get()
            if m is None:
                return
            yield m

    replies = svc.Process(it(), None)
    await replies.__anext__()
    body_reply = await replies.__anext__()  # the request goes upstream before the sentinel answered
    assert body_reply.HasField("request_body")
    await asyncio.sleep(0.01)
    assert engine.calls == [("sentinel", "Write a poem about the sea")] and not engine.sentinel_gate.is_set()
    to_send.put_nowait(resp_headers())
    pending = asyncio.ensure_future(replies.__anext__())
    await asyncio.sleep(0.05)
    assert not pending.done()  # the response waits for the sentinel's verdict
    engine.sentinel_gate.set()
    h = set_headers((await pending).response_headers.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("skipped", "non_factual")
    to_send.put_nowait(None)
    assert [r async for r in replies] == []


async def test_stream_aborted_before_response_cancels_the_sentinel() -> None:
    engine = ScriptedTestEngine()
    engine.sentinel_gate = asyncio.Event()  # never set: the sentinel would wait forever
    svc = service(engine, {"truthlens": {"grounding": {"check_when_grounded": False}}})  # CHAT is grounded
    seen: list[asyncio.Task] = []

    def sentinel_tasks() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "SentinelCall.classify" and not t.done()]

    async def it() -> AsyncIterator[pb.ProcessingRequest]:
        yield req_headers()
        yield req_body(CHAT)
        while not engine.calls:
            await asyncio.sleep(0.01)
        seen.extend(sentinel_tasks())  # the sentinel is running ... and Envoy resets the stream

    assert [r async for r in svc.Process(it(), None)]
    assert len(seen) == 1
    await asyncio.sleep(0.01)
    assert seen[0].cancelled()
    assert sentinel_tasks() == []
    assert svc.active_streams == 0


async def test_a_confident_prefilter_settles_the_prompt_without_the_model() -> None:
    engine = ScriptedTestEngine()
    svc = service(engine)
    prompt = {"model": "m", "messages": [{"role": "user", "content": "PREFILTER_SKIP a limerick please"}]}
    replies = await drive(svc, [req_headers(), req_body(prompt), resp_headers()])
    h = set_headers(replies[2].response_headers.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("skipped", "non_factual")
    assert replies[2].mode_override.response_body_mode == Mode.NONE  # the body never comes to the sidecar
    assert engine.calls == [("prefilter", "PREFILTER_SKIP a limerick please")]  # no model call, no task


async def test_an_unsure_prefilter_leaves_the_prompt_to_the_model() -> None:
    engine = ScriptedTestEngine()
    svc = service(engine)
    prompt = {"model": "m", "messages": [{"role": "user", "content": "Write a poem about the sea"}]}
    replies = await drive(svc, [req_headers(), req_body(prompt), resp_headers()])
    assert set_headers(replies[2].response_headers.response)["x-truthlens-status"] == "skipped"
    assert engine.calls == [("sentinel", "Write a poem about the sea")]


async def test_early_verdict_replies_are_the_planned_headers_even_when_shared() -> None:
    """Sub-millisecond early verdicts share prebuilt replies: each must still be exactly the plan."""
    from extproc.policy.actions import plan_actions
    from extproc.policy.verdict import Verdict
    from extproc.gateway.replies import SHARED_REPLY_MAX_MS

    svc = service(ScriptedTestEngine(), {"decisions": [
        {"name": "quiet", "priority": 1, "rules": {"conditions": [{"type": "header", "name": "x-quiet"}]},
         "plugins": {"truthlens": {"action": "none"}}}]})
    default = svc.rt.policy.default
    prompt = {"model": "m", "messages": [{"role": "user", "content": "PREFILTER_SKIP a limerick please"}]}
    for _ in range(3):
        replies = await drive(svc, [req_headers(), req_body(prompt), resp_headers()])
        got = set_headers(replies[2].response_headers.response)
        latency = float(got["x-truthlens-latency-ms"])
        planned = plan_actions(Verdict.skipped(default, latency_ms=latency), default, svc.rt.config.truthlens)
        assert got == dict(planned.headers)
        assert replies[2].mode_override.response_body_mode == Mode.NONE
    # a slow early verdict gets its own reply with its own latency, never a shared one
    early = svc.early_replies

    def reply(v: Verdict):
        return early.get(v, default, lambda: plan_actions(v, default, svc.rt.config.truthlens).headers)

    slow = [reply(Verdict.skipped(default, latency_ms=SHARED_REPLY_MAX_MS + d)) for d in (0.3, 5.0)]
    assert [set_headers(r.response_headers.response)["x-truthlens-latency-ms"] for r in slow] == ["1.3", "6.0"]
    fast = [reply(Verdict.skipped(default, latency_ms=ms)) for ms in (0.04, 0.02, 0.51)]
    assert fast[0] is fast[1] and fast[0] is not fast[2]  # "0.0" twice, then "0.5"
    # a decision with action none gets no verdict headers at all, shared or not
    for _ in range(2):
        replies = await drive(svc, [req_headers({"x-quiet": "1"}), req_body(prompt), resp_headers()])
        assert set_headers(replies[2].response_headers.response) == {}
        assert replies[2].mode_override.response_body_mode == Mode.NONE


async def test_upstream_cannot_forge_verdict_headers() -> None:
    """x-truthlens-* headers from the upstream are removed, on the early path and the judged one."""
    forged = {"x-truthlens-status": "checked", "X-TruthLens-Custom": "1"}
    svc = service()
    skip = {"model": "m", "messages": [{"role": "user", "content": "PREFILTER_SKIP a limerick please"}]}
    early = (await drive(svc, [req_headers(), req_body(skip), resp_headers(extra=forged)]))[2]
    assert sorted(early.response_headers.response.header_mutation.remove_headers) == [
        "x-truthlens-custom", "x-truthlens-status"]
    assert set_headers(early.response_headers.response)["x-truthlens-status"] == "skipped"
    judged = (await drive(svc, [req_headers(), req_body(CHAT), resp_headers(extra=forged)]))[2]
    assert sorted(judged.response_headers.response.header_mutation.remove_headers) == [
        "x-truthlens-custom", "x-truthlens-status"]
    clean = (await drive(svc, [req_headers(), req_body(skip), resp_headers()]))[2]
    assert list(clean.response_headers.response.header_mutation.remove_headers) == []


async def drive_counting(svc: TruthLensService, messages: list[pb.ProcessingRequest]) -> tuple[int, int]:
    """(replies, messages the service pulled from the stream); the reader is closed either way."""
    pulled = 0

    async def it() -> AsyncIterator[pb.ProcessingRequest]:
        nonlocal pulled
        for m in messages:
            pulled += 1
            yield m

    reader = it()
    replies = [r async for r in svc.Process(reader, None)]
    # Closed by the service, not left for the garbage collector (asyncio would schedule a task per stream).
    assert reader.ag_frame is None
    return len(replies), pulled


async def test_the_stream_ends_once_envoy_has_nothing_more_to_send() -> None:
    """After SKIP_REST or an early verdict (body not wanted) the service closes the stream itself."""
    svc = service()
    skip = {"model": "m", "messages": [{"role": "user", "content": "PREFILTER_SKIP a limerick please"}]}
    stray = resp_body(b"{}")  # Envoy never sends it after these replies; if it were read, it would count
    assert await drive_counting(svc, [req_headers(path="/v1/models", method="GET"), stray]) == (1, 1)
    assert await drive_counting(svc, [req_headers(), req_body(skip), resp_headers(), stray]) == (3, 3)
    # a judged answer needs the body: the stream stays open for it
    answer = json.dumps(completion_json("The tower is 330 metres tall.", "m")).encode()
    assert await drive_counting(svc, [req_headers(), req_body(CHAT), resp_headers(), resp_body(answer)]) == (4, 4)


async def test_log_lines_of_a_stream_carry_its_request_id() -> None:
    """The id is bound per stream and read from the request headers only when a line is logged."""
    import io
    import logging

    from extproc.telemetry.logging import configure_logging, reset_logging

    out = io.StringIO()
    configure_logging("info", stream=out)
    try:
        bad = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{not json", end_of_stream=True))
        await drive(service(), [req_headers({"x-request-id": "rid-77"}), bad, resp_headers()])
        logging.getLogger("truthlens.test").info("after the stream")
    finally:
        reset_logging()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    judged = [x for x in lines if "not a judgeable chat request" in x["event"]]
    assert judged and judged[0]["request_id"] == "rid-77" and "rid-77" in judged[0]["event"]
    assert "request_id" not in lines[-1]  # unbound when the stream ended

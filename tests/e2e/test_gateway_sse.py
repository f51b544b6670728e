"""Streamed (SSE) chat completions through real Envoy: chunks flow, the verdict comes last."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM, Script, completion_sse_chunks
from tests.e2e.conftest import Gateway
from tests.e2e.test_gateway_json import chat

pytestmark = pytest.mark.e2e


def sse_events(raw: bytes) -> list[str]:
    """The data of each event, in order (the test's own tiny parser: LF framing only)."""
    out = []
    for block in raw.decode().split("\n\n"):
        data = [line[len("data: "):] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            out.append("\n".join(data))
    return out


def stream_raw(gw: Gateway, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
    r = httpx.post(gw.base_url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30)
    return r


def test_sse_verdict_event_precedes_done(gateway: Gateway) -> None:
    r = stream_raw(gateway, chat("How tall is the Eiffel Tower?"))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-truthlens-status"] == "streaming"
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    verdict = json.loads(events[-2])
    assert verdict["choices"] == [] and verdict["object"] == "chat.completion.chunk"
    tl = verdict["truthlens"]
    assert tl["status"] == "checked" and tl["detected"] is True
    assert tl["spans"][0]["text"] == INJECTED_CLAIM
    # every upstream event arrives unchanged and in order before the verdict
    upstream = [e for e in sse_events(b"".join(completion_sse_chunks(
        "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall. " + INJECTED_CLAIM,
        "truthlens-demo")))]
    assert events[:-2] == upstream[:-1]


def test_sse_with_openai_client_streaming(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="test", max_retries=0)
    stream = client.chat.completions.create(**chat("How tall is the Eiffel Tower?"), stream=True)
    text, verdicts = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        extra = (chunk.model_extra or {}).get("truthlens")
        if extra is not None:
            verdicts.append(extra)
    assert text.endswith(INJECTED_CLAIM)
    assert len(verdicts) == 1 and verdicts[0]["status"] == "checked"


def test_sse_chunks_arrive_before_the_stream_ends(gateway: Gateway) -> None:
    """Pass-through streaming: the first content event reaches the client long before [DONE]."""
    chunks = completion_sse_chunks("one two three four five six. " + INJECTED_CLAIM, "m", words_per_chunk=1)
    gateway.upstream.scripts["slow"] = Script(content_type="text/event-stream", chunks=chunks, delay_s=0.15)
    t0 = time.monotonic()
    arrivals = []
    with httpx.stream("POST", gateway.base_url + "/v1/chat/completions", json={**chat("q?"), "stream": True},
                      headers={"x-demo-script": "slow"}, timeout=30) as r:
        for piece in r.iter_raw():
            arrivals.append((time.monotonic() - t0, piece))
    total = arrivals[-1][0]
    first_content = next(t for t, p in arrivals if b'"content": "one"' in p)
    assert total > 1.5  # 15 chunks x 0.15 s upstream pacing
    assert first_content < total / 2
    assert b"[DONE]" in arrivals[-1][1]


def test_sse_frames_split_across_chunks_are_reassembled(gateway: Gateway) -> None:
    whole = b"".join(completion_sse_chunks("Split answer. " + INJECTED_CLAIM, "m"))
    pieces = [whole[i:i + 7] for i in range(0, len(whole), 7)]  # frames, lines and [DONE] all split
    gateway.upstream.scripts["split"] = Script(content_type="text/event-stream", chunks=pieces, delay_s=0.001)
    r = stream_raw(gateway, chat("q?"), headers={"x-demo-script": "split"})
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    tl = json.loads(events[-2])["truthlens"]
    assert tl["status"] == "checked" and tl["detected"] is True
    assert r.content.startswith(whole[: whole.index(b"data: [DONE]")])


def test_sse_without_done_gets_verdict_at_end_of_stream(gateway: Gateway) -> None:
    chunks = completion_sse_chunks("No done marker here. " + INJECTED_CLAIM, "m")[:-1]
    gateway.upstream.scripts["nodone"] = Script(content_type="text/event-stream", chunks=chunks)
    r = stream_raw(gateway, chat("q?"), headers={"x-demo-script": "nodone"})
    events = sse_events(r.content)
    assert json.loads(events[-1])["truthlens"]["status"] == "checked"
    assert "[DONE]" not in events


def test_sse_warn_adds_warning_delta_before_verdict(gateway: Gateway) -> None:
    r = stream_raw(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-action": "warn"})
    events = sse_events(r.content)
    warning = json.loads(events[-3])
    assert "[TruthLens]" in warning["choices"][0]["delta"]["content"]
    assert json.loads(events[-2])["truthlens"]["detected"] is True


def test_sse_block_buffers_and_blocks(gateway: Gateway) -> None:
    r = stream_raw(gateway, chat("How tall is the Eiffel Tower?"), headers={"x-tl-action": "block"})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "truthlens_blocked"


def test_sse_block_clean_answer_gets_verdict_event(gateway: Gateway) -> None:
    chunks = completion_sse_chunks("The tower is 330 metres tall.", "m")
    gateway.upstream.scripts["cleansse"] = Script(content_type="text/event-stream", chunks=chunks)
    r = stream_raw(gateway, chat("q?"), headers={"x-tl-action": "block", "x-demo-script": "cleansse"})
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["truthlens"]["detected"] is False
    assert r.headers["x-truthlens-status"] == "checked"


def test_sse_early_statuses_go_in_headers_and_stream_is_byte_identical(gateway: Gateway) -> None:
    chunks = completion_sse_chunks("Some answer. " + INJECTED_CLAIM, "m")
    gateway.upstream.scripts["early"] = Script(content_type="text/event-stream", chunks=chunks)
    r = stream_raw(gateway, chat("How tall is the Eiffel Tower?", tool=None), headers={"x-demo-script": "early"})
    assert r.headers["x-truthlens-status"] == "unverified"
    assert r.content == b"".join(chunks)


def test_client_disconnect_mid_stream_leaves_no_state(gateway: Gateway) -> None:
    chunks = completion_sse_chunks("a b c d e f g h i j k l m n o p. " + INJECTED_CLAIM, "m", words_per_chunk=1)
    gateway.upstream.scripts["long"] = Script(content_type="text/event-stream", chunks=chunks, delay_s=0.2)
    with httpx.stream("POST", gateway.base_url + "/v1/chat/completions", json={**chat("q?"), "stream": True},
                      headers={"x-demo-script": "long"}, timeout=30) as r:
        for _ in r.iter_raw():
            break  # first bytes, then hang up
    assert gateway.service.active_streams >= 0
    deadline = time.monotonic() + 10
    while gateway.service.active_streams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.service.active_streams == 0
    # and the gateway still serves afterwards
    assert stream_raw(gateway, chat("How tall?")).status_code == 200

"""Streams judged while they arrive, through real Envoy: sentence hold-back, early stop, cut streams."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM, Script, completion_sse_chunks
from tests.e2e.conftest import Gateway
from tests.e2e.test_gateway_json import chat
from tests.e2e.test_gateway_sse import sse_events

pytestmark = pytest.mark.e2e

GROUNDED = "The Eiffel Tower was built from 1887 to 1889 in Paris. It is 330 metres tall."


def scripted(gw: Gateway, name: str, chunks: list[bytes], headers: dict[str, str]) -> httpx.Response:
    gw.upstream.scripts[name] = Script(content_type="text/event-stream", chunks=chunks, delay_s=0.002)
    return httpx.post(gw.base_url + "/v1/chat/completions", json={**chat("How tall is it?"), "stream": True},
                      headers={"x-demo-script": name, **headers}, timeout=30)


def test_hold_back_passes_a_clean_stream_byte_identical(gateway: Gateway) -> None:
    chunks = completion_sse_chunks(GROUNDED, "m", words_per_chunk=1)
    r = scripted(gateway, "clean-hold", chunks, {"x-tl-hold": "sentence"})
    assert r.status_code == 200 and r.headers["x-truthlens-decision"] == "hold"
    body = b"".join(chunks)
    done = body.index(b"data: [DONE]")
    assert r.content.startswith(body[:done]) and r.content.endswith(body[done:])  # upstream bytes, in order
    verdict = json.loads(sse_events(r.content)[-2])["truthlens"]
    assert (verdict["status"], verdict["detected"]) == ("checked", False)


def test_hold_back_with_block_stops_the_stream_before_the_claim(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="t", max_retries=0,
                           default_headers={"x-tl-hold": "block"})
    stream = client.chat.completions.create(**chat("How tall is the Eiffel Tower?"), stream=True)
    text, finish, verdicts = "", None, []
    for chunk in stream:  # the official client reads the stopped stream without an error
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
        if (chunk.model_extra or {}).get("truthlens"):
            verdicts.append(chunk.model_extra["truthlens"])
    assert "330 metres" in text and "Oslo" not in text  # the flagged sentence never reached the client
    assert finish == "content_filter"
    (v,) = verdicts
    assert (v["status"], v["detected"], v["decision"]) == ("checked", True, "hold-block")
    assert v["spans"][0]["text"] == INJECTED_CLAIM


def test_a_stream_cut_upstream_still_ends_with_a_verdict(gateway: Gateway) -> None:
    chunks = completion_sse_chunks(GROUNDED, "m", words_per_chunk=3)[:-2]  # no finish reason, no [DONE]
    r = scripted(gateway, "cut", chunks, {})
    assert r.status_code == 200
    assert r.content.startswith(b"".join(chunks))
    verdict = json.loads(sse_events(r.content)[-1])["truthlens"]
    assert (verdict["status"], verdict["reason"]) == ("unchecked", "incomplete")


def test_events_split_across_chunks_arrive_whole_and_in_order(gateway: Gateway) -> None:
    body = b"".join(completion_sse_chunks(GROUNDED, "m", words_per_chunk=2))
    pieces = [body[i:i + 37] for i in range(0, len(body), 37)]  # boundaries anywhere, [DONE] split too
    r = scripted(gateway, "split", pieces, {"x-tl-hold": "sentence"})
    done = body.index(b"data: [DONE]")
    assert r.content.startswith(body[:done]) and r.content.endswith(body[done:])
    assert json.loads(sse_events(r.content)[-2])["truthlens"]["status"] == "checked"

"""The demo upstream speaks real HTTP and answers deterministically."""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM, DemoUpstreamServer, Script, demo_answer, load_scripts, start_demo_upstream


@pytest.fixture()
def upstream() -> Iterator[DemoUpstreamServer]:
    up = start_demo_upstream(chunk_delay_s=0)
    yield up
    up.stop()


def test_answer_repeats_grounding_then_adds_the_unsupported_claim() -> None:
    msgs = [{"role": "tool", "content": "A is B. C is D. E is F."}, {"role": "user", "content": "What is A?"}]
    assert demo_answer(msgs) == "A is B. C is D. " + INJECTED_CLAIM
    assert demo_answer(msgs) == demo_answer(msgs)
    assert demo_answer([{"role": "user", "content": "Why?"}]).endswith(INJECTED_CLAIM)


def test_without_context_a_known_subject_is_answered_from_memory() -> None:
    """The README example sends its document in truthlens_context, which never reaches upstream."""
    answer = demo_answer([{"role": "user", "content": "When was the Eiffel Tower built?"}])
    assert answer == "The Eiffel Tower was built from 1887 to 1889 in Paris. " + INJECTED_CLAIM
    assert demo_answer([{"role": "user", "content": "Who won?"}]).startswith("Here is a short answer about Who won")


def test_json_and_sse_over_http(upstream: DemoUpstreamServer) -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "Sky is blue."}, {"role": "user", "content": "?"}]}
    r = httpx.post(upstream.url + "/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == "Sky is blue. " + INJECTED_CLAIM
    s = httpx.post(upstream.url + "/v1/chat/completions", json={**body, "stream": True})
    assert s.headers["content-type"] == "text/event-stream"
    events = [e for e in s.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "Sky is blue. " + INJECTED_CLAIM
    assert upstream.requests[-1].path == "/v1/chat/completions"
    assert httpx.get(upstream.url + "/v1/models").json()["data"][0]["id"] == "truthlens-demo"


def test_scripts_from_file_give_exact_bytes(upstream: DemoUpstreamServer, tmp_path) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"x": {"status": 201, "content_type": "text/plain", "body": "exact\n", "gzip": True}}))
    upstream.scripts.update(load_scripts(f))
    r = httpx.get(upstream.url + "/anything", headers={"x-demo-script": "x", "accept-encoding": "identity"})
    assert r.status_code == 201
    assert r.headers["content-encoding"] == "gzip"
    assert r.content == b"exact\n"  # httpx undid the gzip the script applied
    assert Script.from_json({"chunks": ["a", "b"]}).chunks == [b"a", b"b"]

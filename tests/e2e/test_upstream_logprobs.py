"""Upstream logprobs through real Envoy: asked for when the client did not, read, and taken out again."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from extproc.devtools.demo_upstream import INJECTED_CLAIM, Script, completion_json, completion_sse_chunks
from tests.e2e.conftest import Gateway
from tests.e2e.test_gateway_json import chat
from tests.e2e.test_gateway_sse import sse_events

pytestmark = pytest.mark.e2e

ANSWER = "The Eiffel Tower is 330 metres tall. " + INJECTED_CLAIM
TOKENS = [{"token": w, "logprob": -0.1 * (i + 1), "bytes": list(w.encode()),
           "top_logprobs": [{"token": w, "logprob": -0.1 * (i + 1)}, {"token": "x", "logprob": -2.0}]}
          for i, w in enumerate(ANSWER.split()[:4])]


def with_logprobs(obj: dict, choice: dict) -> bytes:
    """The upstream's JSON spelling (indent 1, logprobs between other members): stripping must keep it."""
    obj["choices"][0] = {"index": 0, "logprobs": choice, **{k: v for k, v in obj["choices"][0].items() if k != "index"}}
    return json.dumps(obj, indent=1).encode()


def test_json_logprobs_are_read_then_removed_byte_for_byte(gateway: Gateway) -> None:
    plain = completion_json(ANSWER, "m")
    upstream_body = with_logprobs(json.loads(json.dumps(plain)), {"content": TOKENS, "refusal": None})
    gateway.upstream.scripts["lp"] = Script(body=upstream_body)
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json=chat("How tall is it?"),
                   headers={"x-demo-script": "lp", "x-tl-logprobs": "1"}, timeout=30)
    assert r.status_code == 200 and r.headers["x-truthlens-status"] == "checked"
    sent = json.loads(gateway.upstream.requests[-1].body)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5  # asked for on the client's behalf
    assert r.content == json.dumps(plain, indent=1).encode()  # the upstream's bytes, without logprobs
    mean = sum(t["logprob"] for t in TOKENS) / len(TOKENS)
    assert float(r.headers["x-truthlens-upstream-logprob"]) == pytest.approx(mean, abs=1e-4)
    assert r.headers["x-truthlens-upstream-tokens"] == str(len(TOKENS))
    # entropy over each token's two alternatives, renormalised
    def h(lp: float) -> float:
        p = [math.exp(lp), math.exp(-2.0)]
        q = [x / sum(p) for x in p]
        return -sum(x * math.log(x) for x in q)
    want = sum(h(t["logprob"]) for t in TOKENS) / len(TOKENS)
    assert float(r.headers["x-truthlens-upstream-entropy"]) == pytest.approx(want, abs=1e-4)


def test_logprobs_the_client_asked_for_stay(gateway: Gateway) -> None:
    body = with_logprobs(completion_json(ANSWER, "m"), {"content": TOKENS, "refusal": None})
    gateway.upstream.scripts["lp-own"] = Script(body=body)
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json={**chat("How tall is it?"), "logprobs": True},
                   headers={"x-demo-script": "lp-own", "x-tl-logprobs": "1"}, timeout=30)
    assert r.content == body and "x-truthlens-upstream-logprob" in r.headers


def test_sse_logprobs_are_read_then_removed_from_each_event(gateway: Gateway) -> None:
    plain = completion_sse_chunks(ANSWER, "m", words_per_chunk=3)
    events = []
    for chunk in plain:
        data = chunk[len(b"data: "):-2]
        if data == b"[DONE]":
            events.append(chunk)
            continue
        obj = json.loads(data)
        if obj["choices"] and obj["choices"][0]["delta"].get("content"):
            obj["choices"][0]["logprobs"] = {"content": TOKENS[:1]}
        events.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
    gateway.upstream.scripts["lp-sse"] = Script(content_type="text/event-stream", chunks=events)
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json={**chat("How tall is it?"), "stream": True},
                   headers={"x-demo-script": "lp-sse", "x-tl-logprobs": "1"}, timeout=30)
    assert b'"logprobs"' not in r.content
    got = sse_events(r.content)
    # every event as the upstream would have sent it without logprobs (Envoy may split events across chunks)
    assert [g for g in got if '"truthlens"' not in g] == [e[len(b"data: "):-2].decode() for e in plain]
    verdict = json.loads(got[-2])["truthlens"]
    assert verdict["status"] == "checked" and verdict["upstream"]["tokens"] == 7


def test_a_writer_fit_stacks_the_writers_own_logprobs_into_the_score(gateway: Gateway, monkeypatch) -> None:
    """truthlens.signals.upstream_fusion: a fit made for the response's model moves its score (JSON and SSE) and
    says so in the signals; a response from another model keeps its score."""
    from extproc.inference.calibration import Calibration
    from extproc.inference.upstream import WriterFusion

    fit = Calibration(1.0, 0.0, "response", fitted_on={"upstream_models": ["m"]},
                      signals={"upstream_min_logprob": -1.0})
    monkeypatch.setattr(gateway.service.rt, "writer_fusion", WriterFusion({"m": fit}))
    logit = math.log(0.9 / 0.1)  # the scripted engine scores this answer 0.9
    want = 1 / (1 + math.exp(-(logit + 1.0 * 0.4)))  # min logprob of TOKENS: -0.4
    for model, score in (("m", want), ("another-model", 0.9)):
        gateway.upstream.scripts["lp-fit"] = Script(body=with_logprobs(completion_json(ANSWER, model),
                                                                       {"content": TOKENS, "refusal": None}))
        r = httpx.post(gateway.base_url + "/v1/chat/completions", json=chat("How tall is it?"),
                       headers={"x-demo-script": "lp-fit", "x-tl-logprobs": "1"}, timeout=30)
        assert float(r.headers["x-truthlens-score"]) == pytest.approx(score, abs=1e-4)
        assert ("upstream_min_logprob" in r.headers.get("x-truthlens-signals", "")) is (model == "m")
    events = []
    for chunk in completion_sse_chunks(ANSWER, "m", words_per_chunk=3):
        data = chunk[len(b"data: "):-2]
        obj = None if data == b"[DONE]" else json.loads(data)
        if obj and obj["choices"] and obj["choices"][0]["delta"].get("content"):
            obj["choices"][0]["logprobs"] = {"content": TOKENS[:1]}  # min logprob -0.1 over the stream
        events.append(chunk if obj is None else b"data: " + json.dumps(obj).encode() + b"\n\n")
    gateway.upstream.scripts["lp-fit-sse"] = Script(content_type="text/event-stream", chunks=events)
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json={**chat("How tall is it?"), "stream": True},
                   headers={"x-demo-script": "lp-fit-sse", "x-tl-logprobs": "1"}, timeout=30)
    verdict = json.loads(sse_events(r.content)[-2])["truthlens"]
    assert verdict["score"] == pytest.approx(1 / (1 + math.exp(-(logit + 0.1))), abs=1e-4)
    assert "upstream_min_logprob" in verdict["signals"]

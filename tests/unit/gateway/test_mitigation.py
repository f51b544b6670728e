"""Standard (self-refinement) and premium (verifier cross-check) modes against a real HTTP upstream."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from extproc.config import parse_config
from extproc.devtools.demo_upstream import INJECTED_CLAIM, DemoUpstreamServer, Script, completion_json, start_demo_upstream
from extproc.gateway.service import TruthLensService
from extproc.gateway.wiring import GatewayRuntime, build_mitigator
from tests.e2e.harness import ScriptedTestEngine
from tests.unit.gateway.test_service import drive, req_body, req_headers, resp_body, resp_headers, set_headers

CONTEXT = "The tower is 330 metres tall. It opened in 1889."
CHAT = {"model": "m", "messages": [
    {"role": "user", "content": "How tall is the tower?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": CONTEXT}]}
FLAGGED = json.dumps(completion_json("The tower is 330 metres tall. " + INJECTED_CLAIM, "m")).encode()


@pytest.fixture()
def upstream() -> Iterator[DemoUpstreamServer]:
    up = start_demo_upstream(chunk_delay_s=0)
    yield up
    up.stop()


def make_service(upstream: DemoUpstreamServer, mode: str, verifiers: list[dict] | None = None,
                 action: str = "header", max_iterations: int = 2) -> TruthLensService:
    cfg = parse_config({"truthlens": {"default_mode": mode, "default_action": action, "modes": {
        "standard": {"upstream_url": upstream.url, "max_iterations": max_iterations, "timeout_ms": 5000},
        "premium": {"verifiers": verifiers or [], "timeout_ms": 5000}}}})
    engine = ScriptedTestEngine()
    return TruthLensService(GatewayRuntime(cfg, engine, mitigator=build_mitigator(cfg, engine)))


async def run_json(svc: TruthLensService, body: bytes = FLAGGED, auth: str = "Bearer caller-key"):
    replies = await drive(svc, [req_headers({"authorization": auth}), req_body(CHAT), resp_headers(),
                                resp_body(body)])
    return replies


async def test_standard_mode_refines_replaces_answer_and_counts_iterations(upstream: DemoUpstreamServer) -> None:
    svc = make_service(upstream, "standard")
    replies = await run_json(svc)
    assert replies[3].HasField("override_message_timeout")  # asked Envoy for time before re-asking
    common = replies[4].response_body.response
    new = json.loads(common.body_mutation.body)
    assert new["choices"][0]["message"]["content"] == CONTEXT  # the demo LLM took the correction
    h = set_headers(common)
    assert h["x-truthlens-iterations"] == "2"  # first check + one refinement pass
    assert h["x-truthlens-detected"] == "false"
    assert h["content-length"] == str(len(common.body_mutation.body))
    reask = upstream.requests[-1]
    assert reask.headers["authorization"] == "Bearer caller-key"  # the caller's own LLM credentials
    sent = json.loads(reask.body)
    assert "Rewrite your answer" in sent["messages"][-1]["content"]
    assert INJECTED_CLAIM in sent["messages"][-1]["content"]  # the flagged span is named
    assert sent["messages"][-2] == {"role": "assistant", "content": "The tower is 330 metres tall. " + INJECTED_CLAIM}
    await svc.rt.mitigator.close()


async def test_standard_mode_stops_after_max_iterations(upstream: DemoUpstreamServer) -> None:
    # an upstream that never improves: every re-ask returns the same flagged answer
    upstream.scripts["stubborn"] = Script(body=FLAGGED)
    svc = make_service(upstream, "standard", max_iterations=3)
    svc.rt.mitigator.standard = svc.rt.mitigator.standard.__class__(
        max_iterations=3, upstream_url=upstream.url + "/script/stubborn", timeout_ms=5000)
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert h["x-truthlens-iterations"] == "4"
    assert h["x-truthlens-detected"] == "true"
    await svc.rt.mitigator.close()


async def test_standard_mode_upstream_failure_keeps_original(upstream: DemoUpstreamServer) -> None:
    upstream.scripts["down"] = Script(status=503, body=b"{}")
    svc = make_service(upstream, "standard", action="warn")
    svc.rt.mitigator.standard = svc.rt.mitigator.standard.__class__(
        max_iterations=2, upstream_url=upstream.url + "/script/down", timeout_ms=5000)
    replies = await run_json(svc)
    common = replies[4].response_body.response
    content = json.loads(common.body_mutation.body)["choices"][0]["message"]["content"]
    assert content.startswith("The tower is 330 metres tall. " + INJECTED_CLAIM)
    assert "[TruthLens]" in content  # the warn action still applies to the unrefined answer
    assert set_headers(common)["x-truthlens-iterations"] == "1"
    await svc.rt.mitigator.close()


async def test_premium_confirms_a_span_the_verifiers_do_not_support(upstream: DemoUpstreamServer) -> None:
    upstream.scripts["v-clean"] = Script(body=json.dumps(completion_json("It is 330 metres tall.", "v")).encode())
    svc = make_service(upstream, "premium",
                       verifiers=[{"name": "v1", "base_url": upstream.url + "/script/v-clean/v1", "model": "v"}])
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert (h["x-truthlens-detected"], h["x-truthlens-iterations"]) == ("true", "2")
    assert json.loads(h["x-truthlens-spans"])  # the confirmed span is reported
    verify = json.loads(upstream.requests[-1].body)
    assert CONTEXT in verify["messages"][0]["content"] and verify["model"] == "v"
    await svc.rt.mitigator.close()


async def test_premium_drops_a_span_the_verifiers_support(upstream: DemoUpstreamServer) -> None:
    # the demo's default answer repeats the same claim: the verifier supports it
    svc = make_service(upstream, "premium",
                       verifiers=[{"name": "v1", "base_url": upstream.url, "model": "v"}])
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert (h["x-truthlens-detected"], h["x-truthlens-span-count"]) == ("false", "0")
    assert h["x-truthlens-iterations"] == "2"
    await svc.rt.mitigator.close()


async def test_lightweight_config_builds_no_mitigator(upstream: DemoUpstreamServer) -> None:
    cfg = parse_config({})
    assert build_mitigator(cfg, ScriptedTestEngine()) is None


async def test_mitigation_stops_before_envoys_cap_and_keeps_the_first_verdict(upstream: DemoUpstreamServer) -> None:
    """Envoy allows server.envoy_max_message_timeout_s at most: a slower re-ask is cut, the answer stays."""
    upstream.scripts["slow"] = Script(chunks=[FLAGGED[:10], FLAGGED[10:]], delay_s=10.0)
    cfg = parse_config({"server": {"envoy_max_message_timeout_s": 2},
                        "truthlens": {"default_mode": "standard", "modes": {"standard": {
                            "upstream_url": upstream.url + "/script/slow", "timeout_ms": 20000}}}})
    engine = ScriptedTestEngine()
    svc = TruthLensService(GatewayRuntime(cfg, engine, mitigator=build_mitigator(cfg, engine)))
    replies = await run_json(svc)
    assert replies[3].override_message_timeout.seconds == 2  # asked of Envoy: the cap, not the 55 s budget
    common = replies[4].response_body.response
    assert not common.HasField("body_mutation")  # the original answer, unchanged
    h = set_headers(common)
    assert (h["x-truthlens-iterations"], h["x-truthlens-detected"]) == ("1", "true")
    await svc.rt.mitigator.close()

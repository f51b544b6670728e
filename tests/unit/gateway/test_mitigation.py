"""Standard (self-refinement) and premium (verifier cross-check) modes against a real HTTP upstream.

One test per mode rule (#17): a rewrite replaces the answer only when it is acceptable and scores
lower (refusal / meta-text / artefact / not-better rejected, better rewrite accepted), the headers say
what happened, premium's `detected` agrees with its spans, and a dead verifier or upstream shows in
headers and metrics.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from extproc.config import parse_config
from extproc.devtools.demo_upstream import INJECTED_CLAIM, DemoUpstreamServer, Script, completion_json, start_demo_upstream
from extproc.devtools.processes import free_port
from extproc.gateway.service import TruthLensService
from extproc.gateway.wiring import GatewayRuntime, build_mitigator
from extproc.inference.api import DetectionResult
from extproc.telemetry.metrics import Metrics
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
                 action: str = "header", max_iterations: int = 2, upstream_url: str | None = None,
                 engine: ScriptedTestEngine | None = None) -> TruthLensService:
    verifiers = verifiers or [{"name": "v", "base_url": upstream.url, "model": "v"}]
    cfg = parse_config({"truthlens": {"default_mode": mode, "default_action": action, "modes": {
        "standard": {"upstream_url": upstream_url or upstream.url, "max_iterations": max_iterations,
                     "timeout_ms": 5000},
        "premium": {"verifiers": verifiers, "timeout_ms": 5000}}}})
    engine = engine or ScriptedTestEngine()
    metrics = Metrics()
    return TruthLensService(GatewayRuntime(cfg, engine, metrics=metrics,
                                           mitigator=build_mitigator(cfg, engine, metrics)))


def scripted_answer(upstream: DemoUpstreamServer, name: str, answer: str) -> str:
    """A re-ask URL whose reply is always `answer`."""
    upstream.scripts[name] = Script(body=json.dumps(completion_json(answer, "m")).encode())
    return f"{upstream.url}/script/{name}"


def counter(svc: TruthLensService, name: str) -> dict[tuple[str, ...], float]:
    """label values -> value of one counter family, from the real exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(svc.rt.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sample.labels[k] for k in sorted(sample.labels))] = sample.value
    return out


class ScoreSequenceEngine(ScriptedTestEngine):
    """Detector scores from a list, one per detect call (the answer text is ignored); spans when flagged."""

    def __init__(self, scores: list[float], spans: bool = True) -> None:
        super().__init__()
        self.scores = list(scores)
        self.spans = spans

    async def detect(self, context, question, answer, signals=None) -> DetectionResult:  # noqa: ANN001
        flagged = await super().detect(context, question, answer, signals)
        score = self.scores.pop(0) if self.scores else flagged.score
        return DetectionResult(score=score, spans=flagged.spans if self.spans else ())


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
    assert (h["x-truthlens-refined"], h["x-truthlens-original-score"]) == ("true", "0.9000")
    assert "x-truthlens-refine-rejected" not in h
    assert counter(svc, "truthlens_refinements_total") == {("accepted",): 1.0}
    assert h["content-length"] == str(len(common.body_mutation.body))
    reask = upstream.requests[-1]
    assert reask.headers["authorization"] == "Bearer caller-key"  # the caller's own LLM credentials
    sent = json.loads(reask.body)
    assert "Rewrite your answer" in sent["messages"][-1]["content"]
    assert INJECTED_CLAIM in sent["messages"][-1]["content"]  # the flagged span is named
    assert sent["messages"][-2] == {"role": "assistant", "content": "The tower is 330 metres tall. " + INJECTED_CLAIM}
    await svc.rt.mitigator.close()


@pytest.mark.parametrize(("rewrite", "reason"), [
    ("It is currently not possible to determine the exact height of the tower.", "refusal"),
    ("I made a change to the original context: the tower is 330 metres tall.", "meta_text"),
    ("[Rewite] The tower is 330 metres tall.", "artefact"),
    ("Bananas are yellow.", "off_topic"),
])
async def test_standard_mode_rejects_a_bad_rewrite_and_keeps_the_original(
        upstream: DemoUpstreamServer, rewrite: str, reason: str) -> None:
    """A refusal scores low (it claims nothing) but does not answer: the original stays, and the headers say so."""
    svc = make_service(upstream, "standard", action="warn", upstream_url=scripted_answer(upstream, "bad", rewrite))
    replies = await run_json(svc)
    common = replies[4].response_body.response
    content = json.loads(common.body_mutation.body)["choices"][0]["message"]["content"]
    assert content.startswith("The tower is 330 metres tall. " + INJECTED_CLAIM)  # the original answer...
    assert "[TruthLens]" in content  # ...with the warning its verdict calls for
    h = set_headers(common)
    assert (h["x-truthlens-refined"], h["x-truthlens-refine-rejected"]) == ("false", reason)
    assert (h["x-truthlens-detected"], h["x-truthlens-score"], h["x-truthlens-original-score"]) == (
        "true", "0.9000", "0.9000")
    assert h["x-truthlens-iterations"] == "1"  # a rejected rewrite is not re-detected
    assert len(upstream.requests) == 1  # and not asked again: the same prompt would get the same reply
    assert counter(svc, "truthlens_refinements_total") == {(reason,): 1.0}
    await svc.rt.mitigator.close()


async def test_standard_mode_keeps_the_original_when_the_rewrite_scores_no_lower(
        upstream: DemoUpstreamServer) -> None:
    # an upstream that never improves: every re-ask returns the same flagged answer
    upstream.scripts["stubborn"] = Script(body=FLAGGED)
    svc = make_service(upstream, "standard", max_iterations=3, upstream_url=upstream.url + "/script/stubborn")
    replies = await run_json(svc)
    common = replies[4].response_body.response
    assert not common.HasField("body_mutation")
    h = set_headers(common)
    assert (h["x-truthlens-iterations"], h["x-truthlens-detected"]) == ("2", "true")
    assert (h["x-truthlens-refined"], h["x-truthlens-refine-rejected"]) == ("false", "not_better")
    await svc.rt.mitigator.close()


async def test_standard_mode_keeps_the_best_of_improving_rewrites_up_to_max_iterations(
        upstream: DemoUpstreamServer) -> None:
    # first check 0.9, then each rewrite scores lower but stays above the threshold (0.65)
    svc = make_service(upstream, "standard", max_iterations=2, engine=ScoreSequenceEngine([0.9, 0.8, 0.7]))
    replies = await run_json(svc)
    common = replies[4].response_body.response
    assert json.loads(common.body_mutation.body)["choices"][0]["message"]["content"] == CONTEXT
    h = set_headers(common)
    assert (h["x-truthlens-iterations"], h["x-truthlens-score"], h["x-truthlens-detected"]) == ("3", "0.7000", "true")
    assert (h["x-truthlens-refined"], h["x-truthlens-original-score"]) == ("true", "0.9000")
    assert counter(svc, "truthlens_refinements_total") == {("accepted",): 2.0}
    await svc.rt.mitigator.close()


async def test_standard_mode_upstream_failure_keeps_original(upstream: DemoUpstreamServer) -> None:
    upstream.scripts["down"] = Script(status=503, body=b"{}")
    svc = make_service(upstream, "standard", action="warn", upstream_url=upstream.url + "/script/down")
    replies = await run_json(svc)
    common = replies[4].response_body.response
    content = json.loads(common.body_mutation.body)["choices"][0]["message"]["content"]
    assert content.startswith("The tower is 330 metres tall. " + INJECTED_CLAIM)
    assert "[TruthLens]" in content  # the warn action still applies to the unrefined answer
    h = set_headers(common)
    assert (h["x-truthlens-iterations"], h["x-truthlens-refined"]) == ("1", "false")
    assert h["x-truthlens-refine-rejected"] == "upstream_error"
    await svc.rt.mitigator.close()


async def test_standard_mode_unreachable_upstream_shows_in_headers_and_metrics(upstream: DemoUpstreamServer) -> None:
    svc = make_service(upstream, "standard", upstream_url=f"http://127.0.0.1:{free_port()}")  # nothing listens
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert (h["x-truthlens-mode"], h["x-truthlens-refined"], h["x-truthlens-refine-rejected"]) == (
        "standard", "false", "upstream_error")
    assert counter(svc, "truthlens_refinements_total") == {("upstream_error",): 1.0}
    await svc.rt.mitigator.close()


async def test_premium_confirms_a_span_the_verifiers_do_not_support(upstream: DemoUpstreamServer) -> None:
    upstream.scripts["v-clean"] = Script(body=json.dumps(completion_json("It is 330 metres tall.", "v")).encode())
    svc = make_service(upstream, "premium",
                       verifiers=[{"name": "v1", "base_url": upstream.url + "/script/v-clean/v1", "model": "v"}])
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert (h["x-truthlens-detected"], h["x-truthlens-iterations"]) == ("true", "2")
    assert json.loads(h["x-truthlens-spans"])  # the confirmed span is reported
    assert (h["x-truthlens-verifiers"], h["x-truthlens-original-score"]) == ("1/1", "0.9000")
    assert "x-truthlens-refined" not in h  # premium never rewrites
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


async def test_premium_detected_agrees_with_its_spans(upstream: DemoUpstreamServer) -> None:
    """Both detections score high but no span is confirmed: not detected, score held under the threshold."""
    svc = make_service(upstream, "premium", engine=ScoreSequenceEngine([0.9, 0.9], spans=False))
    replies = await run_json(svc)
    h = set_headers(replies[4].response_body.response)
    assert (h["x-truthlens-detected"], h["x-truthlens-span-count"], h["x-truthlens-score"]) == ("false", "0", "0.6499")
    assert (h["x-truthlens-original-score"], h["x-truthlens-verifiers"]) == ("0.9000", "1/1")
    await svc.rt.mitigator.close()


async def test_premium_dead_verifier_shows_in_headers_and_metrics(upstream: DemoUpstreamServer) -> None:
    upstream.scripts["v-clean"] = Script(body=json.dumps(completion_json("It is 330 metres tall.", "v")).encode())
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens
    svc = make_service(upstream, "premium", verifiers=[
        {"name": "alive", "base_url": upstream.url + "/script/v-clean/v1", "model": "v"},
        {"name": "dead", "base_url": dead, "model": "v"}])
    h = set_headers((await run_json(svc))[4].response_body.response)
    assert (h["x-truthlens-verifiers"], h["x-truthlens-detected"]) == ("1/2", "true")  # the live one still confirms
    assert counter(svc, "truthlens_verifier_calls_total") == {("answered", "alive"): 1.0, ("failed", "dead"): 1.0}
    await svc.rt.mitigator.close()


async def test_premium_with_no_verifier_answering_keeps_the_first_verdict_and_says_so(
        upstream: DemoUpstreamServer) -> None:
    svc = make_service(upstream, "premium", verifiers=[
        {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}", "model": "v"}])
    h = set_headers((await run_json(svc))[4].response_body.response)
    assert (h["x-truthlens-mode"], h["x-truthlens-verifiers"], h["x-truthlens-iterations"]) == ("premium", "0/1", "1")
    assert (h["x-truthlens-detected"], h["x-truthlens-span-count"]) == ("true", "1")  # lightweight's verdict
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
    assert (h["x-truthlens-refined"], h["x-truthlens-refine-rejected"]) == ("false", "timeout")
    await svc.rt.mitigator.close()

"""ChatExchange, phase by phase: each method's reply and the state it leaves for the next phase."""

from __future__ import annotations

import asyncio
import json

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from extproc.config import parse_config
from extproc.devtools.demo_upstream import INJECTED_CLAIM, completion_json, completion_sse_chunks
from extproc.gateway.exchange import BodyKind, ChatExchange, Route
from extproc.gateway.replies import EarlyReplies
from extproc.gateway.wiring import GatewayRuntime
from extproc.policy.verdict import Status
from tests.e2e.harness import ScriptedTestEngine
from tests.unit.gateway.test_service import CHAT, req_body, req_headers, resp_body, resp_headers, set_headers

Mode = processing_mode_pb2.ProcessingMode


def exchange(cfg: dict | None = None, path: str = "/v1/chat/completions", method: str = "POST",
             engine: ScriptedTestEngine | None = None) -> tuple[ChatExchange, object]:
    rt = GatewayRuntime(parse_config(cfg or {}), engine or ScriptedTestEngine())
    http = req_headers(path=path, method=method).request_headers
    ex = ChatExchange(rt, EarlyReplies(), http)
    return ex, ex.request_headers(http)


def test_request_headers_of_another_route_end_the_exchange() -> None:
    ex, reply = exchange(path="/v1/models", method="GET")
    assert ex.route is Route.PASSTHROUGH and ex.done
    assert reply.mode_override.response_body_mode == Mode.NONE
    assert ex.ctx.decision is None  # nothing decided, nothing judged


def test_request_headers_of_a_chat_route_keep_it_open_and_force_identity() -> None:
    ex, reply = exchange()
    assert ex.route is Route.CHAT and not ex.done
    assert set_headers(reply.request_headers.response) == {"accept-encoding": "identity"}
    assert ex.ctx.decision is not None  # no configured decisions: the default, chosen without the body


async def test_request_body_extracts_question_and_grounding_and_starts_the_sentinel() -> None:
    ex, _ = exchange({"truthlens": {"grounding": {"check_when_grounded": False}}})
    reply = ex.request_body(req_body(CHAT).request_body)
    assert ex.request_done and ex.ctx.question == "How tall is it?"
    assert ex.ctx.grounding == ("The tower is 330 metres tall.",)
    body = json.loads(reply.request_body.response.body_mutation.body)  # the RAG field goes no further
    assert "truthlens_context" not in body
    assert ex.sentinel_pending
    await ex.await_sentinel()
    assert not ex.sentinel_pending and ex.sentinel.result is not None and ex.sentinel.result.needs_check
    assert ex.early_status is None  # factual and grounded: the answer will be judged


def test_a_grounded_request_is_checked_without_asking_the_sentinel() -> None:
    """truthlens.grounding.check_when_grounded (default true): documents came, so the answer is checked."""
    engine = ScriptedTestEngine()
    ex, _ = exchange(engine=engine)
    poem = {"model": "m", "messages": [{"role": "user", "content": "Context: Roses are red.\nQuestion: write a poem"}]}
    ex.request_body(req_body(poem).request_body)
    assert ex.ctx.grounding == ("Roses are red.",) and ex.ctx.question == "Question: write a poem"
    assert not ex.sentinel_pending and ex.sentinel.result is None and engine.calls == []
    assert ex.early_status is None  # not skipped: the answer will be judged


async def test_with_documents_the_sentinel_judges_the_question_alone() -> None:
    engine = ScriptedTestEngine()
    ex, _ = exchange({"truthlens": {"sentinel_include_system_prompt": True,
                                    "grounding": {"check_when_grounded": False}}}, engine=engine)
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Answer from the documents.\n<documents>The tower is 330 m.</documents>"},
        {"role": "user", "content": "How tall is it?"}]}
    ex.request_body(req_body(body).request_body)
    await ex.await_sentinel()
    assert engine.calls == [("sentinel", "How tall is it?")]
    assert ex.ctx.grounding == ("The tower is 330 m.",) and ex.ctx.system_prompt == "Answer from the documents."


async def test_a_request_without_context_is_settled_before_the_answer() -> None:
    ex, _ = exchange()
    ex.request_body(req_body({"model": "m", "messages": [{"role": "user", "content": "Who won?"}]}).request_body)
    await ex.await_sentinel()
    reply = ex.response_headers(resp_headers().response_headers)
    assert ex.done and ex.verdict is not None and ex.verdict.status is Status.UNVERIFIED
    assert reply.mode_override.response_body_mode == Mode.NONE  # the body is not even sent
    assert set_headers(reply.response_headers.response)["x-truthlens-reason"] == "no_context"


def test_a_bad_request_body_is_unchecked_and_passed_on_unchanged() -> None:
    ex, _ = exchange()
    reply = ex.request_body(req_body({"messages": "not a list"}).request_body)
    assert not reply.request_body.response.HasField("body_mutation")
    assert (ex.early_status, ex.early_reason) == (Status.UNCHECKED, "bad_json")


async def test_json_answer_is_judged_and_flagged() -> None:
    ex, _ = exchange()
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers().response_headers)
    assert ex.body_kind is BodyKind.JSON and not ex.done
    answer = f"It is tall. {INJECTED_CLAIM}"
    (reply,) = await ex.response_body(resp_body(json.dumps(completion_json(answer, "m")).encode()).response_body)
    h = set_headers(reply.response_body.response)
    assert (h["x-truthlens-status"], h["x-truthlens-detected"]) == ("checked", "true")
    assert ex.verdict.detected and 0 in ex.ctx.choice_results


async def test_sse_chunks_flow_through_and_the_last_one_carries_the_verdict() -> None:
    ex, _ = exchange()
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    reply = ex.response_headers(resp_headers("text/event-stream").response_headers)
    assert ex.body_kind is BodyKind.SSE
    assert reply.mode_override.response_body_mode == Mode.STREAMED
    chunks = completion_sse_chunks("The tower is 330 metres tall.", "m")
    outs = [r for c in chunks for r in await ex.response_body(resp_body(c, eos=False).response_body)]
    assert len(outs) == len(chunks)  # one reply per chunk, in order
    assert all(not o.response_body.response.HasField("body_mutation") for o in outs[:-1])  # untouched
    last = outs[-1].response_body.response.body_mutation.body
    assert b'"truthlens"' in last and last.endswith(b"data: [DONE]\n\n")
    assert ex.stream.closed and ex.verdict.status is Status.CHECKED and not ex.verdict.detected


async def test_error_reply_marks_the_answer_unchecked_with_the_body_untouched() -> None:
    ex, _ = exchange()
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers().response_headers)
    reply = ex.error_reply("response_body")
    h = set_headers(reply.response_body.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("unchecked", "error")
    assert not reply.response_body.response.HasField("body_mutation")


def test_error_before_a_decision_just_continues() -> None:
    ex, _ = exchange(path="/v1/models", method="GET")
    reply = ex.error_reply("request_body")
    assert reply.HasField("request_body") and ex.verdict is None


class _TooLargeEngine(ScriptedTestEngine):
    async def detect(self, context, question, answer, signals=None):
        from extproc.inference.api import TooLarge

        raise TooLarge("over max_request_tokens")


async def test_an_answer_over_the_token_budget_passes_untouched_as_too_large() -> None:
    """#19: the engine's TooLarge (batching.max_request_tokens) is unchecked/too_large, JSON and SSE, body untouched."""
    ex, _ = exchange(engine=_TooLargeEngine())
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers().response_headers)
    (reply,) = await ex.response_body(resp_body(json.dumps(completion_json("It is tall.", "m")).encode()).response_body)
    h = set_headers(reply.response_body.response)
    assert (h["x-truthlens-status"], h["x-truthlens-reason"]) == ("unchecked", "too_large")
    assert not reply.response_body.response.HasField("body_mutation")

    ex, _ = exchange(engine=_TooLargeEngine())
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers("text/event-stream").response_headers)
    for c in completion_sse_chunks("The tower is 330 metres tall. It opened in 1889.", "m"):
        await ex.response_body(resp_body(c, eos=False).response_body)
    assert ex.verdict.status is Status.UNCHECKED and ex.verdict.reason == "too_large"


class _CountingEngine(ScriptedTestEngine):
    """Sentence checks that fail with `fail` after the first one, tracking how many run at once."""

    def __init__(self, fail: BaseException | None = None) -> None:
        super().__init__()
        self.fail, self.running, self.most = fail, 0, 0

    async def detect(self, context, question, answer, signals=None):
        self.calls.append(("detect", answer))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            if self.fail is not None:
                raise self.fail
            return await super().detect(context, question, answer, signals)
        finally:
            self.running -= 1


async def _stream_through(engine, answer: str) -> ChatExchange:
    ex, _ = exchange(engine=engine)
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers("text/event-stream").response_headers)
    for c in completion_sse_chunks(answer, "m", words_per_chunk=50):
        await ex.response_body(resp_body(c, eos=False).response_body)
    return ex


async def test_a_stream_runs_few_checks_at_once_and_none_after_one_failed() -> None:
    """#19: a fast 4 MB stream scheduled one check per sentence at once (thousands), filling the shared batchers:
    now at most STREAM_CHECKS_IN_FLIGHT run, and after a failure (over budget, overloaded) none is sent."""
    from extproc.gateway.exchange import STREAM_CHECKS_IN_FLIGHT
    from extproc.inference.api import TooLarge

    answer = "The tower is 330 metres tall. " * 200
    engine = _CountingEngine()
    ex = await _stream_through(engine, answer)
    assert ex.verdict.status is Status.CHECKED
    assert len(engine.calls) >= 100 and engine.most <= STREAM_CHECKS_IN_FLIGHT

    engine = _CountingEngine(fail=TooLarge("over max_request_tokens"))
    ex = await _stream_through(engine, answer)
    assert ex.verdict.status is Status.UNCHECKED and ex.verdict.reason == "too_large"
    assert len([c for c in engine.calls if c[0] == "detect"]) <= STREAM_CHECKS_IN_FLIGHT


async def test_a_stream_longer_than_the_token_budget_passes_as_too_large() -> None:
    ex, _ = exchange({"truthlens": {"batching": {"max_request_tokens": 512}}})
    ex.request_body(req_body(CHAT).request_body)
    await ex.await_sentinel()
    ex.response_headers(resp_headers("text/event-stream").response_headers)
    chunks = completion_sse_chunks("The tower is 330 metres tall. " * 200, "m", words_per_chunk=50)  # 6000 chars
    outs = [r for c in chunks for r in await ex.response_body(resp_body(c, eos=False).response_body)]
    assert len(outs) == len(chunks)
    assert ex.verdict.status is Status.UNCHECKED and ex.verdict.reason == "too_large"



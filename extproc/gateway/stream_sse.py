"""Streamed (SSE) chat completions: forward as it comes, judge at the end, verdict before [DONE].

STREAMED body mode: each chunk goes on at once (complete SSE blocks unchanged; only a block
split across chunks waits for its rest, which no SSE client could use earlier anyway). When
`[DONE]` (or the end of the stream) arrives, the assembled answer is judged and that chunk is
replaced by [warning delta per flagged choice if warn] + verdict event + the original `[DONE]`.
The verdict event is a `chat.completion.chunk` with `choices: []` and a `truthlens` object, so
OpenAI SDK clients parse it like any chunk.

action=block cannot recall bytes already sent, so a stream whose decision blocks is buffered
whole instead (BUFFERED, no mode override) and then blocked or annotated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.gateway.context import RequestContext
from extproc.policy.actions import plan_actions
from extproc.policy.verdict import Status, UncheckedReason, Verdict
from extproc.protocol import envoy as ev
from extproc.protocol.sse import ChatStreamRelay, content_delta_chunk, verdict_chunk

if TYPE_CHECKING:
    from extproc.gateway.stream_phases import Phases


async def on_chunk(ph: Phases, ctx: RequestContext, http: pb.HttpBody) -> pb.ProcessingResponse:
    relay: ChatStreamRelay = ctx.sse
    chunk = http.body
    if ctx.sse_done:
        return ev.streamed_chunk_response(None)  # after the verdict: anything else goes on unchanged
    out = relay.feed(chunk)
    if relay.done or http.end_of_stream:
        out += relay.finish(await stream_tail(ph, ctx, relay))
        ctx.sse_done = True
    return ev.streamed_chunk_response(None if out == chunk else out)


async def stream_tail(ph: Phases, ctx: RequestContext, relay: ChatStreamRelay) -> bytes:
    """[warning delta per flagged choice] + verdict event, inserted before [DONE]."""
    a = relay.assembler
    indices = a.indices()
    verdict, results = await ph.judge(ctx, [a.text(i) for i in indices])
    ctx.verdict = verdict
    if ctx.decision.action == "none":
        return b""
    plan = plan_actions(verdict, ctx.decision, ph.tl)
    out = b""
    if plan.warning:
        for pos, r in results.items():
            if r.score >= ctx.decision.threshold:
                out += content_delta_chunk(indices[pos], plan.warning, id=a.id, model=a.model, created=a.created)
    return out + verdict_chunk(verdict_payload(verdict), id=a.id, model=a.model, created=a.created)


async def on_buffered_stream(ph: Phases, ctx: RequestContext, http: pb.HttpBody) -> pb.ProcessingResponse:
    """action=block on a stream: the whole event stream was buffered; judge, then block or annotate."""
    if len(http.body) > ph.tl.max_body_bytes:
        ctx.verdict = Verdict.unchecked(ctx.decision, UncheckedReason.TOO_LARGE,
                                        latency_ms=sum(ctx.timings_ms.values()))
        return ev.response_body_response(None, plan_actions(ctx.verdict, ctx.decision, ph.tl).headers)
    relay = ChatStreamRelay()
    head = relay.feed(http.body)
    tail = await stream_tail(ph, ctx, relay)
    plan = plan_actions(ctx.verdict, ctx.decision, ph.tl)
    if plan.block is not None:
        return ev.immediate_response(plan.block.status, plan.block.headers, plan.block.body)
    return ev.response_body_response(head + relay.finish(tail), plan.headers)


def verdict_payload(v: Verdict) -> dict[str, object]:
    """The `truthlens` object of the final SSE event: the same facts as the headers, as JSON."""
    out: dict[str, object] = {
        "enabled": v.enabled,
        "status": str(v.status),
        "mode": v.mode,
        "decision": v.decision,
        "reason": None if v.reason is None else str(v.reason),
        "iterations": v.iterations,
        "latency_ms": round(v.latency_ms, 1),
    }
    if v.status is Status.CHECKED:
        out["score"] = round(v.score or 0.0, 4)
        out["detected"] = v.detected
        out["signals"] = list(v.signals)
        out["spans"] = [
            {"start": s.start, "end": s.end, "text": s.text, "score": round(s.score, 4), "label": s.nli_label}
            for s in v.spans
        ]
    return out
